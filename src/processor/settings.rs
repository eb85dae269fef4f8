//! The processor's settings, from the command line or the environment (`idempay processor`), or
//! built in code by a process that embeds it.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::faults::Faults;
use crate::webhooks::RetrySchedule;
use crate::webhooks::WebhookSecrets;

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

/// How the simulated processor behaves.
#[derive(Args, Clone, Debug)]
pub struct ProcessorSettings {
    /// The key its clients send as `Authorization: Bearer <key>`.
    #[arg(long, env = "IDEMPAY_PROCESSOR_API_KEY", hide_env_values = true, value_parser = ProcessorApiKey::parse)]
    pub api_key: ProcessorApiKey,

    /// Processing time of the test payment method `pm_card_slow`.
    #[arg(long, env = "IDEMPAY_SLOW_CHARGE", default_value = "2s", value_parser = crate::settings::any_length("IDEMPAY_SLOW_CHARGE"))]
    pub slow_charge: Duration,

    /// The `whsec_…` secrets, space separated: the events are signed with the first (the
    /// others are the receiver's business, listed here so both sides can share one setting).
    #[arg(long = "webhook-secret", env = "IDEMPAY_WEBHOOK_SECRET", hide_env_values = true, value_parser = WebhookSecrets::parse)]
    pub webhook_secrets: Option<WebhookSecrets>,

    /// Where the events are delivered; none are recorded or sent without it (or without a secret).
    #[arg(long, env = "IDEMPAY_PROCESSOR_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// The delays between delivery attempts, comma separated, each jittered by ±10%; after the
    /// last one a delivery is given up. The same setting as idempay's, for its merchant endpoints.
    #[arg(long, env = "IDEMPAY_WEBHOOK_RETRY_SCHEDULE", default_value = RetrySchedule::DEFAULT, value_parser = RetrySchedule::parse)]
    pub webhook_retry_schedule: RetrySchedule,

    /// How long a receiver has to answer a delivery 2xx; later is a failed attempt.
    #[arg(long, env = "IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT", default_value = "10s", value_parser = crate::settings::positive("IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT"))]
    pub webhook_delivery_timeout: Duration,

    /// How long one of its deliveries, with its attempts, is kept after it was acknowledged or
    /// given up; then its expiry job deletes it. A pending delivery is never deleted. The same
    /// setting as idempay's, for its merchant endpoints.
    #[arg(long, env = "IDEMPAY_WEBHOOK_DELIVERY_RETENTION", default_value = "30days", value_parser = crate::settings::positive("IDEMPAY_WEBHOOK_DELIVERY_RETENTION"))]
    pub webhook_delivery_retention: Duration,

    /// How often its expiry job deletes its expired keys and its deliveries past their retention.
    #[arg(long, env = "IDEMPAY_EXPIRY_INTERVAL", default_value = "60s", value_parser = crate::settings::positive("IDEMPAY_EXPIRY_INTERVAL"))]
    pub expiry_interval: Duration,

    /// How long an in-progress key of the processor blocks retries before one may take it over;
    /// embedded, the processor takes idempay's.
    #[arg(long, env = "IDEMPAY_LEASE", default_value = "30s", value_parser = crate::settings::parse_lease)]
    pub lease: Duration,

    #[command(flatten)]
    pub faults: Faults,
}

impl ProcessorSettings {
    /// Default settings with this API key: no faults, no events.
    pub fn new(api_key: ProcessorApiKey) -> Self {
        Self {
            api_key,
            slow_charge: Duration::from_secs(2),
            webhook_secrets: None,
            webhook_url: None,
            webhook_retry_schedule: RetrySchedule::default(),
            webhook_delivery_timeout: Duration::from_secs(10),
            webhook_delivery_retention: Duration::from_secs(30 * 24 * 60 * 60),
            expiry_interval: Duration::from_secs(60),
            lease: Duration::from_secs(30),
            faults: Faults::default(),
        }
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
        assert_eq!(parsed.slow_charge, new.slow_charge);
        assert_eq!(parsed.webhook_retry_schedule, new.webhook_retry_schedule);
        assert_eq!(
            parsed.webhook_delivery_timeout,
            new.webhook_delivery_timeout
        );
        assert_eq!(parsed.faults, new.faults);
        assert_eq!(
            parsed.webhook_delivery_retention,
            new.webhook_delivery_retention
        );
        assert_eq!(parsed.expiry_interval, new.expiry_interval);
        assert!(parsed.api_key == new.api_key);
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
