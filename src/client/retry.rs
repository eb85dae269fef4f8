//! When and how long to wait before retrying: exponential backoff with full jitter, a cap on
//! retries and a deadline for the whole call. Pure functions of the attempt, so they are tested
//! without sleeping.

use std::time::Duration;

use rand::Rng;

/// How a call retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; 0 never retries.
    pub max_retries: u32,
    /// The backoff ceiling of the first retry; it doubles with each retry.
    pub base_delay: Duration,
    /// The largest backoff ceiling.
    pub max_delay: Duration,
    /// How long one attempt may take.
    pub attempt_timeout: Duration,
    /// How long the whole call, retries included, may take.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 8,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(10),
            deadline: Duration::from_secs(60),
        }
    }
}

/// What an attempt ended with, as far as retrying is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    /// No complete answer: the connection failed, was reset, or the attempt timed out. The request
    /// may or may not have been executed, which is exactly what the idempotency key is for.
    NoAnswer,
    /// An HTTP status, with the server's `Retry-After` if it sent one.
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
}

impl AttemptResult {
    /// Retry on no answer, on 409 (the key is still in progress) and on 5xx (nothing was stored);
    /// every other answer, success or refusal, is final.
    pub fn is_retryable(self) -> bool {
        match self {
            Self::NoAnswer => true,
            Self::Status { status, .. } => status == 409 || (500..600).contains(&status),
        }
    }
}

impl RetryPolicy {
    /// The backoff ceiling before retry number `retry` (1 for the first): base × 2^(retry−1),
    /// capped at `max_delay`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32
            .checked_shl(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// How long to wait before retry number `retry`: a uniformly random time up to the ceiling
    /// ("full jitter", so clients that failed together do not retry together), but never less than
    /// the server's `Retry-After`.
    pub fn delay(&self, retry: u32, result: AttemptResult, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(retry);
        let jittered = Duration::from_nanos(
            rng.random_range(0..=u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX)),
        );
        match result {
            AttemptResult::Status {
                retry_after: Some(after),
                ..
            } => jittered.max(after),
            _ => jittered,
        }
    }

    /// Whether retry number `retry`, after waiting `delay` with `elapsed` already spent, is allowed.
    pub fn allows(&self, retry: u32, elapsed: Duration, delay: Duration) -> bool {
        retry <= self.max_retries && elapsed + delay < self.deadline
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn status(status: u16) -> AttemptResult {
        AttemptResult::Status {
            status,
            retry_after: None,
        }
    }

    #[test]
    fn connection_failures_conflicts_and_server_errors_are_retried() {
        assert!(AttemptResult::NoAnswer.is_retryable());
        for retried in [409, 500, 502, 503, 504] {
            assert!(status(retried).is_retryable(), "{retried}");
        }
    }

    #[test]
    fn successes_and_other_client_errors_are_final() {
        for final_status in [200, 201, 400, 401, 402, 404, 413, 415, 422, 429] {
            assert!(!status(final_status).is_retryable(), "{final_status}");
        }
    }

    #[test]
    fn the_ceiling_doubles_up_to_the_maximum() {
        let policy = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            ..RetryPolicy::default()
        };
        let ceilings: Vec<_> = (1..=6)
            .map(|retry| policy.ceiling(retry).as_millis())
            .collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(policy.ceiling(200), Duration::from_secs(1), "no overflow");
    }

    #[test]
    fn full_jitter_stays_within_the_ceiling_and_spreads_out() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<_> = (0..1000)
            .map(|_| policy.delay(3, AttemptResult::NoAnswer, &mut rng))
            .collect();
        assert!(delays.iter().all(|delay| *delay <= policy.ceiling(3)));
        let below_half = delays
            .iter()
            .filter(|d| **d < policy.ceiling(3) / 2)
            .count();
        assert!(
            (400..600).contains(&below_half),
            "{below_half} of 1000 below half"
        );
    }

    #[test]
    fn retry_after_is_a_floor() {
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        let conflict = AttemptResult::Status {
            status: 409,
            retry_after: Some(Duration::from_secs(1)),
        };
        for _ in 0..100 {
            assert!(policy.delay(1, conflict, &mut rng) >= Duration::from_secs(1));
        }
    }

    #[test]
    fn retries_stop_at_the_cap_and_at_the_deadline() {
        let policy = RetryPolicy {
            max_retries: 3,
            deadline: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        let second = Duration::from_secs(1);
        assert!(policy.allows(3, Duration::ZERO, second));
        assert!(!policy.allows(4, Duration::ZERO, second));
        assert!(policy.allows(1, Duration::from_secs(8), second));
        assert!(!policy.allows(1, Duration::from_secs(9), second));
    }
}
