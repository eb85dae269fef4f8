//! How a setting's value is read: durations in human form (`2s`, `30s`, `24h`), bounded, and
//! counts, each error naming the setting as the environment spells it; and a group's defaults
//! read from its declaration ([`declared_defaults`]), so that a default is written once. Below
//! every module that declares settings (idempay's `config`, the processor's, the pool's in `db`,
//! the dev tools, and [`crate::shared_settings`]).

use std::time::Duration;

use clap::{Args, Command, FromArgMatches};

/// A group of settings as its declaration defaults it: each value is the `default_value` its
/// `#[arg]` declares, read by that setting's own parser, and the environment is not read. A
/// group's `Default` is this, so that no default is written a second time in code; a setting
/// without a default (a required one) makes it panic, which the group's tests show at once.
pub fn declared_defaults<T: Args + FromArgMatches>() -> T {
    let command = T::augment_args(Command::new("defaults").no_binary_name(true))
        .mut_args(|arg| arg.env(None));
    let matches = command
        .try_get_matches_from(std::iter::empty::<&str>())
        .unwrap_or_else(|error| panic!("a setting has no declared default: {error}"));
    T::from_arg_matches(&matches)
        .unwrap_or_else(|error| panic!("a declared default does not read: {error}"))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Declared {
        /// A duration, read by its own parser.
        #[arg(long, env = "SETTINGS_TEST_WAIT", default_value = "90m", value_parser = positive("SETTINGS_TEST_WAIT"))]
        wait: Duration,
        /// A count, with a typed default.
        #[arg(long, env = "SETTINGS_TEST_COUNT", default_value_t = 7)]
        count: u32,
        /// Nothing unless set.
        #[arg(long, env = "SETTINGS_TEST_NAME")]
        name: Option<String>,
    }

    #[test]
    fn a_group_s_defaults_are_its_declared_values_read_by_their_parsers() {
        let declared: Declared = declared_defaults();
        assert_eq!(declared.wait, Duration::from_secs(90 * 60));
        assert_eq!(declared.count, 7);
        assert_eq!(declared.name, None);
    }

    #[test]
    fn a_group_s_declared_defaults_do_not_read_the_environment() {
        // SAFETY: no other test reads or writes this variable, which only `Declared` names.
        unsafe { std::env::set_var("SETTINGS_TEST_COUNT", "9") };
        let parsed = Declared::parse_from(["declared"]);
        assert_eq!(parsed.count, 9, "the command line reads the variable");
        let declared: Declared = declared_defaults();
        assert_eq!(declared.count, 7, "the declared default does not");
    }

    #[derive(Parser, Debug)]
    struct Required {
        #[arg(long)]
        _secret: String,
    }

    #[test]
    #[should_panic(expected = "a setting has no declared default")]
    fn a_group_with_a_required_setting_has_no_declared_defaults() {
        let _: Required = declared_defaults();
    }
}
