//! How a setting's value is read: durations in human form (`2s`, `30s`, `24h`), bounded, and
//! counts, each error naming the setting as the environment spells it. Below every module that
//! declares settings (idempay's `config`, the processor's, the pool's in `db`, the dev tools).

use std::time::Duration;

/// The longest any duration setting may be, a year. Longer makes no sense for any of them (the processor
/// forgets its keys after a day, senders retry webhooks for days), and a job that adds a
/// duration of centuries to a clock would overflow it.
pub const LONGEST: Duration = Duration::from_secs(31_557_600);

/// Reads a duration `setting` (named in every error, as the environment spells it) from its
/// human form: at least `shortest`, at most [`LONGEST`].
pub fn duration(setting: &str, raw: &str, shortest: Duration) -> Result<Duration, String> {
    let value = humantime::parse_duration(raw).map_err(|error| format!("{setting}: {error}"))?;
    if value < shortest {
        return Err(if shortest == Duration::from_nanos(1) {
            format!("{setting} must be longer than zero")
        } else {
            format!(
                "{setting} must be at least {}",
                humantime::format_duration(shortest)
            )
        });
    }
    if value > LONGEST {
        return Err(format!(
            "{setting} must be at most {}",
            humantime::format_duration(LONGEST)
        ));
    }
    Ok(value)
}

/// The parser of an interval or a timeout: zero would spin a job (tokio refuses an interval of
/// zero, with a panic) or cut every request off.
pub fn positive(
    setting: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |raw| duration(setting, raw, Duration::from_nanos(1))
}

/// The parser of a duration for which zero means none (a simulated delay).
pub fn any_length(
    setting: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |raw| duration(setting, raw, Duration::ZERO)
}

/// The parser of a count of which there must be at least one (connections).
pub fn at_least_one(
    setting: &'static str,
) -> impl Fn(&str) -> Result<u32, String> + Clone + Send + Sync + 'static {
    move |raw| match raw.trim().parse::<u32>() {
        Ok(0) => Err(format!("{setting} must be at least 1")),
        Ok(count) => Ok(count),
        Err(error) => Err(format!("{setting}: {error}")),
    }
}

/// A lease is renewed at a third of its length, so it must leave room for that.
pub fn parse_lease(raw: &str) -> Result<Duration, String> {
    duration("IDEMPAY_LEASE", raw, Duration::from_millis(300))
}
