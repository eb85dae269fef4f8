//! The processor's settings, from the command line or the environment (`idempay processor`), or
//! built in code by a process that embeds it.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::faults::Faults;
use service::outbox::{RetrySchedule, WebhookSecrets};
use service::settings::{any_length, parse_lease, positive};

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

/// The settings `idempay serve` and `idempay processor` share, each declared once, with its one
/// default and parser: flattened into both (idempay's `Settings`, in `config.rs`, and
/// [`ProcessorSettings`]), so that an embedded processor (or `idempay dev`'s) takes idempay's values
/// as one. Here, beside the processor, because the processor may not import idempay's `config`.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct SharedArgs {
    /// How long an in-progress key blocks retries before a retry may take it over (idempay's keys,
    /// and the processor's).
    #[arg(long, env = "IDEMPAY_LEASE", default_value = DEFAULT_LEASE, value_parser = parse_lease)]
    pub lease: Duration,

    /// Processing time of the test payment method `pm_card_slow`, at the processor (embedded or
    /// not).
    #[arg(long, env = "IDEMPAY_SLOW_CHARGE", default_value = DEFAULT_SLOW_CHARGE, value_parser = any_length("IDEMPAY_SLOW_CHARGE"))]
    pub slow_charge: Duration,

    /// How often the expiry job deletes expired keys, and events and deliveries past their
    /// retention (the processor's job: its keys and its deliveries).
    #[arg(long, env = "IDEMPAY_EXPIRY_INTERVAL", default_value = DEFAULT_EXPIRY_INTERVAL, value_parser = positive("IDEMPAY_EXPIRY_INTERVAL"))]
    pub expiry_interval: Duration,

    /// The `whsec_…` secrets webhooks are signed with, space separated: idempay accepts a
    /// delivery signed with any of them, so one can be rotated; the processor signs its events
    /// with the first.
    #[arg(long = "webhook-secret", env = "IDEMPAY_WEBHOOK_SECRET", hide_env_values = true, value_parser = WebhookSecrets::parse)]
    pub webhook_secrets: Option<WebhookSecrets>,

    /// The delays between attempts to deliver an event (idempay's to a merchant endpoint, the
    /// processor's to idempay), comma separated, each jittered by ±10%: after the last one the
    /// delivery is given up, and a merchant endpoint that acknowledged nothing for that whole
    /// time is disabled.
    #[arg(long, env = "IDEMPAY_WEBHOOK_RETRY_SCHEDULE", default_value = RetrySchedule::DEFAULT, value_parser = parse_retry_schedule)]
    pub webhook_retry_schedule: RetrySchedule,

    /// How long a receiver has to answer a delivery 2xx; later is a failed attempt.
    #[arg(long, env = "IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT", default_value = DEFAULT_WEBHOOK_DELIVERY_TIMEOUT, value_parser = positive("IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT"))]
    pub webhook_delivery_timeout: Duration,

    /// How long a delivery, with its attempts (`GET /v1/events/{id}/attempts` for a merchant
    /// endpoint's), is kept after it was acknowledged or given up; then the expiry job deletes
    /// it. A pending delivery is never deleted. For idempay at least the retry schedule's span
    /// (`config::check_delivery_retention`): whether an endpoint is disabled depends on what it
    /// acknowledged within it.
    #[arg(long, env = "IDEMPAY_WEBHOOK_DELIVERY_RETENTION", default_value = DEFAULT_WEBHOOK_DELIVERY_RETENTION, value_parser = positive("IDEMPAY_WEBHOOK_DELIVERY_RETENTION"))]
    pub webhook_delivery_retention: Duration,
}

/// How long the processor keeps its keys: idempay's default, so its retries, hours apart, still
/// find their first charge.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The defaults of [`SharedArgs`], as the command line spells them; [`SharedArgs::default`]
/// reads them with the same parsers. The lease's and the expiry interval's are `idempay
/// fixture`'s too.
pub const DEFAULT_LEASE: &str = "30s";
pub const DEFAULT_SLOW_CHARGE: &str = "2s";
pub const DEFAULT_EXPIRY_INTERVAL: &str = "60s";
const DEFAULT_WEBHOOK_DELIVERY_TIMEOUT: &str = "10s";
const DEFAULT_WEBHOOK_DELIVERY_RETENTION: &str = "30days";

impl Default for SharedArgs {
    fn default() -> Self {
        let read = |parsed: Result<Duration, String>| parsed.expect("a default setting parses");
        Self {
            lease: read(parse_lease(DEFAULT_LEASE)),
            slow_charge: read(any_length("IDEMPAY_SLOW_CHARGE")(DEFAULT_SLOW_CHARGE)),
            expiry_interval: read(positive("IDEMPAY_EXPIRY_INTERVAL")(DEFAULT_EXPIRY_INTERVAL)),
            webhook_secrets: None,
            webhook_retry_schedule: RetrySchedule::default(),
            webhook_delivery_timeout: read(positive("IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT")(
                DEFAULT_WEBHOOK_DELIVERY_TIMEOUT,
            )),
            webhook_delivery_retention: read(positive("IDEMPAY_WEBHOOK_DELIVERY_RETENTION")(
                DEFAULT_WEBHOOK_DELIVERY_RETENTION,
            )),
        }
    }
}

/// Reads the retry schedule, its errors naming the variable as every setting's do.
fn parse_retry_schedule(raw: &str) -> Result<RetrySchedule, String> {
    RetrySchedule::parse(raw).map_err(|error| format!("IDEMPAY_WEBHOOK_RETRY_SCHEDULE: {error}"))
}

/// Refuses a retry schedule that gives an event up sooner than its receiver may need to apply it:
/// idempay refuses (409) an event about a charge or refund it has not recorded yet, so that it
/// comes again, and records it only once the call that made it is settled, which can take up to
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
    fn the_shared_defaults_are_the_documented_values() {
        let shared = SharedArgs::default();
        assert_eq!(shared.lease, Duration::from_secs(30));
        assert_eq!(shared.slow_charge, Duration::from_secs(2));
        assert_eq!(shared.expiry_interval, Duration::from_secs(60));
        assert_eq!(shared.webhook_delivery_timeout, Duration::from_secs(10));
        assert_eq!(
            shared.webhook_delivery_retention,
            Duration::from_secs(30 * 24 * 60 * 60)
        );
        assert_eq!(shared.webhook_secrets, None);
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
