//! When a failed delivery is tried again: a fixed list of delays, each jittered, after which the
//! delivery is given up, and sooner when the receiver's answer says when (`Retry-After`). One type
//! for every sender, the processor's and the merchant endpoints'.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::settings::LONGEST;

/// How much a delay may move either way, as a fraction of it: loops that failed together (a
/// receiver that was down) do not all come back at the same instant.
pub const JITTER: f64 = 0.1;

/// The delays between attempts, `5s,5m,30m,2h,5h,10h,10h` by default: the first retry comes 5
/// seconds after the first failure, and after the last delay's attempt fails the delivery is
/// given up. As `IDEMPAY_WEBHOOK_RETRY_SCHEDULE` takes it: comma-separated human durations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetrySchedule(Vec<Duration>);

impl RetrySchedule {
    /// The default schedule, about a day and a half in all, as Stripe retries for days and
    /// Standard Webhooks for about 28 hours.
    pub const DEFAULT: &'static str = "5s,5m,30m,2h,5h,10h,10h";

    /// A schedule of these delays; at least one, none zero, none longer than a year (the longest
    /// any duration setting may be, [`LONGEST`]: a delay of centuries overflows the arithmetic of
    /// the jitter and the span, and no sender waits that long).
    pub fn new(delays: Vec<Duration>) -> Result<Self, String> {
        if delays.is_empty() {
            return Err("a retry schedule lists at least one delay".to_owned());
        }
        if delays.iter().any(Duration::is_zero) {
            return Err("a retry delay must be longer than zero".to_owned());
        }
        if let Some(delay) = delays.iter().find(|delay| **delay > LONGEST) {
            return Err(format!(
                "a retry delay must be at most {}; `{}` is longer",
                humantime::format_duration(LONGEST),
                humantime::format_duration(*delay)
            ));
        }
        Ok(Self(delays))
    }

    /// Parses `5s,5m,30m`: comma-separated human durations.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let delays = raw
            .split(',')
            .map(|delay| {
                humantime::parse_duration(delay.trim())
                    .map_err(|error| format!("retry delay `{}`: {error}", delay.trim()))
            })
            .collect::<Result<_, _>>()?;
        Self::new(delays)
    }

    /// The wait after the `attempts`-th failed attempt (1 for the first), jittered by up to
    /// ±[`JITTER`]; `None` once the schedule is exhausted: the delivery is given up.
    pub fn after(&self, attempts: i32) -> Option<Duration> {
        let index = usize::try_from(attempts.checked_sub(1)?).ok()?;
        let delay = *self.0.get(index)?;
        let factor = 1.0 + JITTER * (2.0 * rand::random::<f64>() - 1.0);
        Some(delay.mul_f64(factor))
    }

    /// How many attempts a delivery gets in all: the first and one per delay.
    pub fn attempts(&self) -> usize {
        self.0.len() + 1
    }

    /// The longest a delivery can take from its creation to its last attempt's outcome: every
    /// delay at its longest jitter, and every attempt at its longest (`attempt_timeout`), twice
    /// over, as a claim holds a row (`Deliverer::claim`). An endpoint is disabled when it
    /// acknowledged nothing within that span, so what it acknowledged must be kept that long.
    pub fn span(&self, attempt_timeout: Duration) -> Duration {
        let waits = self
            .0
            .iter()
            .map(|delay| delay.mul_f64(1.0 + JITTER))
            .fold(Duration::ZERO, Duration::saturating_add);
        let attempts = u32::try_from(self.attempts()).unwrap_or(u32::MAX);
        waits.saturating_add(attempt_timeout.saturating_mul(2).saturating_mul(attempts))
    }

    /// The least time from a delivery's first attempt to its last: every delay at its shortest
    /// jitter, every attempt instant. A receiver that refuses an event until it can apply it
    /// (idempay's intake, about an object it has not recorded yet) is asked again for at least
    /// this long before the sender gives the event up.
    pub fn redelivers_for(&self) -> Duration {
        self.0
            .iter()
            .map(|delay| delay.mul_f64(1.0 - JITTER))
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    /// The shortest delay: a loop that polls at least this often misses no retry by much.
    pub fn shortest(&self) -> Duration {
        self.0
            .iter()
            .copied()
            .min()
            .unwrap_or(Duration::from_secs(1))
    }
}

/// The soonest a receiver's `Retry-After` brings an attempt: `Retry-After: 0` (or a date already
/// past) from a receiver that answers so every time would otherwise be called as fast as the loop
/// polls.
pub const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);

/// When the attempt after a failed one is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// The schedule's next attempt, after this wait.
    Step(Duration),
    /// Sooner than the schedule, because the receiver asked (`Retry-After`): after `wait`. It does
    /// not use up the schedule: its step stays due after `step`, if this attempt fails too.
    Early { wait: Duration, step: Duration },
    /// The failed attempt was an early one: the schedule's step it came before, when that was due.
    BackToStep,
    /// The schedule ran out: the delivery is given up.
    GiveUp,
}

impl RetrySchedule {
    /// What follows a failed attempt, the `steps`-th of the schedule's own (the first attempt is
    /// the first), or an `early` one, answered with `retry_after` (see [`retry_after`]).
    ///
    /// The receiver's time is honoured when it comes before the schedule's next attempt, at least
    /// [`MIN_RETRY_AFTER`] on, and once per step: the early attempt does not count against the
    /// schedule, so a receiver that asks for 10 s at every attempt is not given up after 80
    /// seconds instead of the schedule's day, nor called every 10 s for that day. A later time is
    /// not honoured (the schedule's next attempt comes as before): the schedule's
    /// [`span`](Self::span) is how long a delivery may last, which the retention of deliveries and the
    /// disabling of an endpoint that acknowledged nothing count on, so a receiver cannot stretch it.
    pub fn retry(&self, steps: i32, early: bool, retry_after: Option<Duration>) -> Retry {
        if early {
            return Retry::BackToStep;
        }
        let Some(step) = self.after(steps) else {
            return Retry::GiveUp;
        };
        match retry_after.map(|asked| asked.max(MIN_RETRY_AFTER)) {
            Some(wait) if wait < step => Retry::Early { wait, step },
            _ => Retry::Step(step),
        }
    }
}

/// How long a receiver asked to be left alone, from its `Retry-After`: seconds (`120`) or an HTTP
/// date (`Fri, 05 Dec 2026 10:00:00 GMT`, compared with `now`; one past is zero). `None` when the
/// value is neither.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

impl Default for RetrySchedule {
    fn default() -> Self {
        Self::parse(Self::DEFAULT).expect("the default schedule parses")
    }
}

impl FromStr for RetrySchedule {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        Self::parse(raw)
    }
}

impl fmt::Display for RetrySchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let delays: Vec<String> = self
            .0
            .iter()
            .map(|delay| humantime::format_duration(*delay).to_string())
            .collect();
        f.write_str(&delays.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_waits_five_seconds_then_longer_and_gives_up_after_eight_attempts() {
        let schedule = RetrySchedule::default();
        assert_eq!(schedule.attempts(), 8);
        assert_eq!(schedule.to_string(), "5s,5m,30m,2h,5h,10h,10h");
        let first = schedule.after(1).unwrap();
        assert!((4500..=5500).contains(&first.as_millis()), "{first:?}");
        let last = schedule.after(7).unwrap();
        assert!(last >= Duration::from_secs(9 * 3600), "{last:?}");
        assert_eq!(schedule.after(8), None);
        assert_eq!(schedule.after(0), None);
        assert_eq!(schedule.after(i32::MIN), None);
    }

    #[test]
    fn each_delay_moves_by_at_most_the_jitter() {
        let schedule = RetrySchedule::parse("1s").unwrap();
        let waits: Vec<Duration> = (0..200).map(|_| schedule.after(1).unwrap()).collect();
        assert!(
            waits
                .iter()
                .all(|wait| (900..=1100).contains(&wait.as_millis()))
        );
        assert!(waits.iter().any(|wait| *wait != waits[0]), "jittered");
    }

    #[test]
    fn a_schedule_needs_delays_longer_than_zero() {
        assert!(RetrySchedule::parse("").is_err());
        assert!(RetrySchedule::parse("5s,,5m").is_err());
        assert!(RetrySchedule::parse("5s,0s").is_err());
        assert!(RetrySchedule::parse("soon").is_err());
        let parsed = RetrySchedule::parse(" 100ms, 2s ").unwrap();
        assert_eq!(parsed.shortest(), Duration::from_millis(100));
        assert_eq!(parsed.to_string(), "100ms,2s");
    }

    /// `IDEMPAY_WEBHOOK_RETRY_SCHEDULE=550000000000years` made `serve` panic (exit 101) on the
    /// span's arithmetic: a delay is bounded as every duration setting is.
    #[test]
    fn a_delay_longer_than_a_year_is_refused_and_a_year_is_not() {
        for absurd in ["550000000000years", "5s,2years", "18446744073709551615s"] {
            let refused = RetrySchedule::parse(absurd).unwrap_err();
            assert!(
                refused.contains("must be at most 1year")
                    || refused.contains("number is too large"),
                "{absurd}: {refused}"
            );
        }
        let longest = RetrySchedule::parse("1year,1year").unwrap();
        assert!(longest.span(LONGEST) > longest.redelivers_for());
    }

    #[test]
    fn an_event_is_redelivered_for_every_delay_at_its_shortest() {
        let about = |got: Duration, millis: u64| {
            let expected = Duration::from_millis(millis);
            assert!(
                got.abs_diff(expected) < Duration::from_millis(1),
                "{got:?}, not {expected:?}"
            );
        };
        about(
            RetrySchedule::parse("1s,10s").unwrap().redelivers_for(),
            9_900,
        );
        // 27 h 35 min 5 s of delays, less a tenth.
        about(
            RetrySchedule::default().redelivers_for(),
            99_305_000 * 9 / 10,
        );
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_464_800); // 2026-12-05 10:00
        assert_eq!(retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Sat, 05 Dec 2026 10:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after("Saturday, 05-Dec-26 10:01:00 GMT", now),
            Some(Duration::from_secs(60)),
            "the obsolete RFC 850 form, which HTTP recipients must read too"
        );
        assert_eq!(
            retry_after("Sat, 05 Dec 2026 09:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date past"
        );
        assert_eq!(retry_after("-1", now), None);
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("", now), None);
    }

    #[test]
    fn a_sooner_retry_after_is_an_early_attempt_once_per_step_and_a_later_one_is_not_honoured() {
        let hour = Duration::from_secs(3600);
        let schedule = RetrySchedule::new(vec![hour, hour]).unwrap();
        let Retry::Early { wait, step } = schedule.retry(1, false, Some(Duration::from_secs(2)))
        else {
            panic!("an early attempt");
        };
        assert_eq!(wait, Duration::from_secs(2));
        assert!(step >= hour.mul_f64(1.0 - JITTER), "{step:?}");
        // Never sooner than a second, whatever the receiver says.
        assert!(matches!(
            schedule.retry(1, false, Some(Duration::ZERO)),
            Retry::Early { wait, .. } if wait == MIN_RETRY_AFTER
        ));
        // The early attempt failed: back to the step, whatever it was answered.
        assert_eq!(
            schedule.retry(2, true, Some(Duration::from_secs(1))),
            Retry::BackToStep
        );
        // Later than the schedule's own next attempt, or said nothing: the schedule.
        assert!(matches!(
            schedule.retry(1, false, Some(hour * 5)),
            Retry::Step(step) if step <= hour.mul_f64(1.0 + JITTER)
        ));
        assert!(matches!(schedule.retry(2, false, None), Retry::Step(_)));
        // The schedule ran out: given up, even if the receiver asks for a second.
        assert_eq!(
            schedule.retry(3, false, Some(Duration::from_secs(1))),
            Retry::GiveUp
        );
    }

    #[test]
    fn the_span_is_every_delay_at_its_longest_and_every_attempt_timed_out() {
        let schedule = RetrySchedule::parse("1s,10s").unwrap();
        // 1.1 s + 11 s of waits, and 3 attempts of 2 × 1 s.
        assert_eq!(
            schedule.span(Duration::from_secs(1)),
            Duration::from_millis(12_100 + 6_000)
        );
    }
}
