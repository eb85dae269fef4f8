//! What the webhook routes are configured with: the intake in `mod.rs` and the endpoints' routes
//! both read it, so it lives below both.

use std::time::Duration;

use service::outbox::WebhookSecrets;

/// What the webhook routes are configured with, beside the pool and the mechanism.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    /// Verify the processor's webhooks, any of them; without any they are refused.
    pub secrets: Option<WebhookSecrets>,
    /// With no secret configured, the one the embedded processor signs its `charge.expired`
    /// with (made up at start, known to this process alone): its deliveries are accepted, and
    /// any other is refused as before, for want of a configured secret.
    pub embedded: Option<WebhookSecrets>,
    /// How long processed webhook event ids are remembered.
    pub event_ttl: Duration,
    /// Whether merchant endpoints may point at non-public addresses (development only).
    pub allow_private: bool,
}
