//! When and how long to wait before retrying: exponential backoff with full jitter, never sooner
//! than the server's `Retry-After`, within a deadline for the whole call. The deadline alone ends
//! the attempts: a count of retries would give up on a key whose holder died while its lease still
//! runs, and an application that then starts over with a new key charges twice. Pure functions of
//! the attempt, so they are tested without sleeping.

use std::time::Duration;

use rand::Rng;

/// How a call retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The backoff ceiling of the first retry; it doubles with each retry.
    pub base_delay: Duration,
    /// The largest backoff ceiling.
    pub max_delay: Duration,
    /// How long one attempt may take (less when the deadline is nearer).
    pub attempt_timeout: Duration,
    /// How long the whole call, retries included, may take: the only end of the retries.
    pub deadline: Duration,
}

impl RetryPolicy {
    /// The default deadline. A key whose instance died mid-request answers 409 until its lease
    /// runs out (`IDEMPAY_LEASE`, 30 s by default); the retry that takes it over then calls the
    /// processor (`IDEMPAY_PROCESSOR_TIMEOUT`, 10 s). Twice their sum leaves room for a slow
    /// database, a second unknown outcome and the backoff between attempts.
    pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(90);
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(10),
            deadline: Self::DEFAULT_DEADLINE,
        }
    }
}

/// What an attempt ended with, as far as retrying is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptResult {
    /// The connection could not be made: the request never left, nothing was executed.
    NotSent,
    /// No complete answer: the connection was reset, or the attempt timed out after the request
    /// was sent. It may or may not have been executed, which is exactly what the key is for.
    NoAnswer,
    /// An HTTP status, with the server's `Retry-After` if it sent one.
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
}

impl AttemptResult {
    /// Retry when no answer came, on 409 (the key is still in progress), on 429 (too many
    /// requests) and on 5xx (nothing was stored); every other answer, success or refusal, is
    /// final.
    pub fn is_retryable(self) -> bool {
        match self {
            Self::NotSent | Self::NoAnswer => true,
            // A 409 with `Retry-After` is a key still in progress; without it, a key held for an
            // operator, which no retry settles.
            Self::Status {
                status,
                retry_after,
            } => {
                (status == 409 && retry_after.is_some())
                    || status == 429
                    || (500..600).contains(&status)
            }
        }
    }

    /// Whether the request may have reached the server: anything but a connection never made.
    pub fn may_have_been_sent(self) -> bool {
        self != Self::NotSent
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

    /// Whether a retry after waiting `delay`, with `elapsed` already spent, starts at least
    /// [`Self::LEAST_ATTEMPT`] before the deadline. However many attempts came before: only the
    /// deadline ends a call. A `Retry-After` past the deadline ends it too, rather than retrying
    /// sooner than the server asked.
    pub fn allows(&self, elapsed: Duration, delay: Duration) -> bool {
        elapsed + delay + Self::LEAST_ATTEMPT <= self.deadline
    }

    /// The least time a retry is started with. An attempt the deadline cuts short while it is
    /// still connecting cannot be told from one cut short after its request was sent: both are a
    /// timeout. One started with milliseconds left would turn a call that was never sent into one
    /// whose outcome is unknown; a quarter of a second connects and is answered on any network
    /// the client is meant for.
    pub const LEAST_ATTEMPT: Duration = Duration::from_millis(250);

    /// How long the next attempt may take, `elapsed` into the call: its timeout, or what is left
    /// of the deadline when that is less.
    pub fn attempt_timeout(&self, elapsed: Duration) -> Duration {
        self.attempt_timeout
            .min(self.deadline.saturating_sub(elapsed))
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
        assert!(AttemptResult::NotSent.is_retryable());
        assert!(AttemptResult::NoAnswer.is_retryable());
        for retried in [429, 500, 502, 503, 504] {
            assert!(status(retried).is_retryable(), "{retried}");
        }
        let in_progress = AttemptResult::Status {
            status: 409,
            retry_after: Some(Duration::from_secs(1)),
        };
        assert!(in_progress.is_retryable());
    }

    #[test]
    fn a_409_without_retry_after_a_key_held_for_an_operator_is_final() {
        assert!(!status(409).is_retryable());
    }

    #[test]
    fn successes_and_other_client_errors_are_final() {
        for final_status in [200, 201, 400, 401, 402, 404, 413, 415, 422] {
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
    fn retries_stop_at_the_deadline_and_only_there() {
        let policy = RetryPolicy {
            deadline: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        let second = Duration::from_secs(1);
        assert!(policy.allows(Duration::ZERO, second));
        assert!(policy.allows(Duration::from_secs(8), second));
        assert!(!policy.allows(Duration::from_secs(9), second));
        // A retry needs time to connect and be answered: none starts in the deadline's last
        // quarter of a second.
        assert!(policy.allows(Duration::from_millis(8_750), second));
        assert!(!policy.allows(Duration::from_millis(8_751), second));
        // A Retry-After beyond the deadline ends the call: never a retry sooner than asked.
        assert!(!policy.allows(Duration::from_secs(2), Duration::from_secs(8)));
        // The last attempt ends with the deadline, not an attempt timeout later.
        assert_eq!(
            policy.attempt_timeout(Duration::from_secs(7)),
            Duration::from_secs(3)
        );
        assert_eq!(
            policy.attempt_timeout(Duration::ZERO),
            policy.attempt_timeout
        );
    }

    /// The whole schedule against a key held by a dead instance: 409 with `Retry-After: 1` (the
    /// server's hint, capped at a second) until its lease of 30 s runs out. Attempts go on until
    /// then, each at least a second after the one before, and the first after the lease is made.
    #[test]
    fn attempts_continue_until_a_dead_holder_s_30_second_lease_has_run_out() {
        let lease = Duration::from_secs(30);
        let in_flight = AttemptResult::Status {
            status: 409,
            retry_after: Some(Duration::from_secs(1)),
        };
        let policy = RetryPolicy::default();
        let mut rng = StdRng::seed_from_u64(7);
        // The clock of the schedule: each attempt takes 50 ms to be answered.
        let (mut elapsed, mut retry) = (Duration::from_millis(50), 0);
        while elapsed < lease {
            retry += 1;
            let delay = policy.delay(retry, in_flight, &mut rng);
            assert!(delay >= Duration::from_secs(1), "sooner than Retry-After");
            assert!(
                policy.allows(elapsed, delay),
                "gave up after {retry} attempts, {elapsed:?} into a {lease:?} lease"
            );
            elapsed += delay + Duration::from_millis(50);
        }
        assert!(retry > 8, "{retry} retries: more than a count of 8 allowed");
    }

    /// The server's defaults the default deadline is sized against (see
    /// [`RetryPolicy::DEFAULT_DEADLINE`]). idempay's src/config.rs tests its own default settings
    /// against the same rule, so the two cannot drift apart unnoticed.
    #[test]
    fn the_default_deadline_outlasts_twice_a_default_lease_and_processor_call() {
        let (lease, processor_timeout) = (Duration::from_secs(30), Duration::from_secs(10));
        let deadline = RetryPolicy::default().deadline;
        assert!(
            deadline >= (lease + processor_timeout) * 2,
            "{deadline:?} against a lease of {lease:?} and a processor call of {processor_timeout:?}"
        );
    }
}
