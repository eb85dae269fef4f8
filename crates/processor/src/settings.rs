//! The processor's settings, from the command line or the environment (`idempay processor`), or
//! built in code by a process that embeds it.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::faults::Faults;
use service::outbox::RetrySchedule;
use service::settings::positive;
use service::shared_settings::SharedArgs;

/// Where `idempay processor` listens.
#[derive(Args, Clone, Debug)]
pub struct ProcessorListen {
    /// The processor's listen address.
    #[arg(
        long = "listen",
        env = "IDEMPAY_PROCESSOR_LISTEN",
        default_value = "127.0.0.1:8081"
    )]
    pub listen: SocketAddr,
}

/// How long the processor keeps its keys: idempay's default, so its retries, hours apart, still
/// find their first charge.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// Refuses a retry schedule that gives an event up sooner than its receiver may need to apply it:
/// idempay parks an event about a charge or refund it has not recorded yet, and refuses one (409)
/// while its parked events are at their bound, so that it comes again; it records the object only
/// once the call that made it is resolved, which can take up to
/// `unresolved` (`why` says what makes it that long, naming the settings). A sender that gives up
/// sooner loses the event.
pub fn check_redelivery(
    schedule: &RetrySchedule,
    unresolved: Duration,
    why: &str,
) -> Result<(), String> {
    let redelivered = schedule.redelivers_for();
    if redelivered < unresolved {
        return Err(format!(
            "IDEMPAY_WEBHOOK_RETRY_SCHEDULE ({schedule}) redelivers a refused event for {} (each \
             delay at its shortest jitter), less than {why}: an event about a charge or refund \
             not recorded yet is refused until it is, and would be given up before. Add delays to \
             the schedule.",
            humantime::format_duration(redelivered),
        ));
    }
    Ok(())
}

/// How long an authorization holds its money when nobody captures it: a card network's usual
/// bound for an online authorization.
const DEFAULT_AUTHORIZATION_TTL: &str = "7days";

/// How the simulated processor behaves.
#[derive(Args, Clone, Debug)]
pub struct ProcessorSettings {
    /// The key its clients send as `Authorization: Bearer <key>`.
    #[arg(long, env = "IDEMPAY_PROCESSOR_API_KEY", hide_env_values = true, value_parser = ProcessorApiKey::parse)]
    pub api_key: ProcessorApiKey,

    /// The lease, the slow charge, the expiry interval and the webhook delivery settings, the
    /// same as idempay's: embedded (or beside idempay in `idempay dev`), it takes idempay's.
    #[command(flatten)]
    pub shared: SharedArgs,

    /// Where the events are delivered; none are recorded or sent without it (or without a secret).
    #[arg(long, env = "IDEMPAY_PROCESSOR_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// How long an authorization (a charge made with `capture: false`) holds its money when
    /// nobody captures or voids it; then the expiry job releases it and announces
    /// `charge.expired`.
    #[arg(long, env = "IDEMPAY_PROCESSOR_AUTHORIZATION_TTL", default_value = DEFAULT_AUTHORIZATION_TTL, value_parser = positive("IDEMPAY_PROCESSOR_AUTHORIZATION_TTL"))]
    pub authorization_ttl: Duration,

    /// Where `charge.expired` goes when `webhook_url` is unset: the intake of the idempay that
    /// embeds this processor, which must hear of every authorization released (a payment left
    /// `requires_capture` on a released authorization could be neither captured nor canceled).
    /// Set by the embedding process, never from the command line.
    #[arg(skip)]
    pub expiries_to: Option<String>,

    #[command(flatten)]
    pub faults: Faults,
}

impl ProcessorSettings {
    /// Default settings with this API key: no faults, no events.
    pub fn new(api_key: ProcessorApiKey) -> Self {
        Self {
            api_key,
            shared: SharedArgs::default(),
            webhook_url: None,
            expiries_to: None,
            authorization_ttl: positive("IDEMPAY_PROCESSOR_AUTHORIZATION_TTL")(
                DEFAULT_AUTHORIZATION_TTL,
            )
            .expect("the default authorization lifetime parses"),
            faults: Faults::default(),
        }
    }

    /// `idempay processor`'s check at start, when it sends events: its retry schedule redelivers
    /// an event for at least as long as it remembers its idempotency keys ([`KEY_TTL`]).
    /// It cannot know how long its client takes to record a charge whose answer it lost; but a
    /// client that resumes the call with the same key, as idempay does, must stop before the
    /// processor forgets the key (idempay refuses a recovery window that would not), so an event
    /// redelivered that long reaches any such client after it recorded the charge.
    pub fn check_redelivery(&self) -> Result<(), String> {
        if self.webhook_url.is_none() {
            return Ok(());
        }
        check_redelivery(
            &self.shared.webhook_retry_schedule,
            KEY_TTL,
            &format!(
                "the time the processor remembers its idempotency keys ({}), within which its \
                 client may still record the charge or refund",
                humantime::format_duration(KEY_TTL)
            ),
        )
    }
}

/// The processor's API key: any non-empty printable ASCII, compared in constant time.
#[derive(Clone, PartialEq, Eq)]
pub struct ProcessorApiKey(String);

impl ProcessorApiKey {
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || !raw.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the processor API key must be visible ASCII characters".to_owned());
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `candidate` is this key. Both are hashed first, so the comparison takes the same
    /// time whatever their lengths and wherever they differ.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        use sha2::{Digest, Sha256};
        let ours = Sha256::digest(self.0.as_bytes());
        let theirs = Sha256::digest(candidate);
        let difference = ours
            .iter()
            .zip(theirs.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(difference) == 0
    }
}

impl fmt::Debug for ProcessorApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProcessorApiKey(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: ProcessorSettings,
    }

    #[test]
    fn the_defaults_are_those_of_new() {
        let parsed = Cli::parse_from(["processor", "--api-key", "pk_test"]).settings;
        let new = ProcessorSettings::new(ProcessorApiKey::parse("pk_test").unwrap());
        assert_eq!(parsed.shared, new.shared);
        assert_eq!(parsed.shared, SharedArgs::default());
        assert_eq!(parsed.faults, new.faults);
        assert_eq!(parsed.webhook_url, new.webhook_url);
        assert!(parsed.api_key == new.api_key);
    }

    #[test]
    fn a_schedule_that_gives_events_up_before_the_processor_forgets_its_keys_is_refused() {
        let mut settings = Cli::parse_from(["processor", "--api-key", "pk_test"]).settings;
        assert_eq!(settings.check_redelivery(), Ok(()), "the default schedule");
        settings.shared.webhook_retry_schedule = RetrySchedule::parse("1s,1h").unwrap();
        assert_eq!(
            settings.check_redelivery(),
            Ok(()),
            "no events, nothing to check"
        );
        settings.webhook_url = Some("http://127.0.0.1:8080/v1/webhooks/processor".to_owned());
        let refused = settings.check_redelivery().unwrap_err();
        assert!(
            refused.contains(
                "IDEMPAY_WEBHOOK_RETRY_SCHEDULE (1s,1h) redelivers a refused event for 54m 900ms"
            ) && refused.contains("remembers its idempotency keys (1day)"),
            "{refused}"
        );
        settings.shared.webhook_retry_schedule = RetrySchedule::parse("1day,4h").unwrap();
        assert_eq!(settings.check_redelivery(), Ok(()));
    }

    #[test]
    fn a_retry_delay_longer_than_a_year_is_refused_naming_the_variable() {
        let error = Cli::try_parse_from([
            "processor",
            "--api-key",
            "pk_test",
            "--webhook-retry-schedule",
            "550000000000years",
        ])
        .err()
        .expect("refused");
        assert!(
            error
                .to_string()
                .contains("IDEMPAY_WEBHOOK_RETRY_SCHEDULE: a retry delay must be at most 1year"),
            "{error}"
        );
    }

    #[test]
    fn the_api_key_is_required_and_compared_exactly() {
        assert!(Cli::try_parse_from(["processor"]).is_err());
        let key = ProcessorApiKey::parse("pk_test").unwrap();
        assert!(key.matches(b"pk_test"));
        assert!(!key.matches(b"pk_tes"));
        assert!(!key.matches(b"pk_test "));
        assert!(ProcessorApiKey::parse("").is_err());
        assert!(ProcessorApiKey::parse("a b").is_err());
    }
}
