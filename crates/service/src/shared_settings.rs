//! The settings `idempay serve` and `idempay processor` share ([`SharedArgs`]), declared once
//! below both services. Apart from `settings`, which the outbox reads its bounds from, because
//! these name the outbox's schedule and secrets.

use std::time::Duration;

use clap::Args;

use crate::outbox::{RetrySchedule, WebhookSecrets};
use crate::settings::{any_length, declared_defaults, parse_lease, positive};

/// The settings `idempay serve` and `idempay processor` share, each declared once, with its one
/// default and parser: flattened into both (idempay's `Settings`, in `config.rs`, and the
/// processor's `ProcessorSettings`), so that an embedded processor (or `idempay dev`'s) takes
/// idempay's values as one. Here, below both, because neither may import the other's settings.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct SharedArgs {
    /// How long an in-progress key blocks retries before a retry may take it over (idempay's keys,
    /// and the processor's).
    #[arg(long, env = "IDEMPAY_LEASE", default_value = DEFAULT_LEASE, value_parser = parse_lease)]
    pub lease: Duration,

    /// Processing time of the test payment method `pm_card_slow`, at the processor (embedded or
    /// not).
    #[arg(long, env = "IDEMPAY_SLOW_CHARGE", default_value = "2s", value_parser = any_length("IDEMPAY_SLOW_CHARGE"))]
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
    #[arg(long, env = "IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT", default_value = "10s", value_parser = positive("IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT"))]
    pub webhook_delivery_timeout: Duration,

    /// How long a delivery, with its attempts (`GET /v1/events/{id}/attempts` for a merchant
    /// endpoint's), is kept after it was acknowledged or given up; then the expiry job deletes
    /// it. A pending delivery is never deleted. For idempay at least the retry schedule's span
    /// (`config::check_delivery_retention`): whether an endpoint is disabled depends on what it
    /// acknowledged within it.
    #[arg(long, env = "IDEMPAY_WEBHOOK_DELIVERY_RETENTION", default_value = "30days", value_parser = positive("IDEMPAY_WEBHOOK_DELIVERY_RETENTION"))]
    pub webhook_delivery_retention: Duration,
}

/// Defaults of [`SharedArgs`] that `idempay fixture` declares too, as the command line spells
/// them.
pub const DEFAULT_LEASE: &str = "30s";
pub const DEFAULT_EXPIRY_INTERVAL: &str = "60s";

impl Default for SharedArgs {
    fn default() -> Self {
        declared_defaults()
    }
}

/// Reads the retry schedule, its errors naming the variable as every setting's do.
fn parse_retry_schedule(raw: &str) -> Result<RetrySchedule, String> {
    RetrySchedule::parse(raw).map_err(|error| format!("IDEMPAY_WEBHOOK_RETRY_SCHEDULE: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
