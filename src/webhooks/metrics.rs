//! The webhook intake's series: the events received, by what became of them. The deliveries' series
//! are the outbox's (`service::outbox::metrics`).

use futures_util::future::BoxFuture;
use metrics::{counter, describe_counter, describe_gauge, gauge};
use sqlx::PgPool;

use super::EventOutcome;
use super::endpoints::EndpointStatus;

const WEBHOOK_EVENTS: &str = "idempay_webhook_events_total";
const MANUAL_RETRIES: &str = "idempay_webhook_manual_retries_total";
const ENDPOINTS: &str = "idempay_webhook_endpoints";

/// Describes the webhooks' series to the recorder, the outbox's with them.
pub fn describe() {
    describe_counter!(
        WEBHOOK_EVENTS,
        "Webhook events received, by outcome (applied, ignored, duplicate, stale, needs_review; \
         parked: kept until the charge or refund it names is recorded; unparked: a parked event \
         applied once that was recorded; not_recorded: refused with 409, the parked events at \
         their bound; unknown_type: refused with 503, a type this release does not know)."
    );
    describe_counter!(
        MANUAL_RETRIES,
        "Deliveries asked for at POST /v1/events/{id}/retry, by result (queued; pending: refused \
         while a delivery of the event to the endpoint is pending; limit: refused after 5 of one \
         event to one endpoint)."
    );
    describe_gauge!(
        ENDPOINTS,
        "Webhook endpoints of every account, by status (enabled, disabled: acknowledged nothing \
         for the whole retry schedule), read at the scrape."
    );
    service::outbox::metrics::describe(crate::SERVICE);
}

/// The age of the oldest pending delivery, read at a scrape (a [`crate::http::metrics::Reading`])
/// into idempay's series.
pub fn read_oldest_pending(pool: &PgPool) -> BoxFuture<'_, ()> {
    service::outbox::delivery::read_oldest_pending(crate::SERVICE, pool)
}

/// Each endpoint's oldest due delivery, read at a scrape (a [`crate::http::metrics::Reading`])
/// into idempay's series.
pub fn read_oldest_due(pool: &PgPool) -> BoxFuture<'_, ()> {
    service::outbox::lag::read_oldest_due(crate::SERVICE, pool)
}

/// What became of a retry, as `idempay_webhook_manual_retries_total` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManualRetry {
    /// A delivery was queued.
    Queued,
    /// Refused: a delivery of the event to the endpoint is pending.
    Pending,
    /// Refused: the event was delivered again to the endpoint the most times it may be by hand
    /// (`MAX_MANUAL_RETRIES`, 5).
    Limit,
}

impl ManualRetry {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Pending => "pending",
            Self::Limit => "limit",
        }
    }
}

/// Counts one retry asked for by what became of it.
pub(super) fn manual_retry(result: ManualRetry) {
    counter!(MANUAL_RETRIES, "result" => result.as_str()).increment(1);
}

/// Reads how many webhook endpoints are enabled and disabled into their gauge; a scrape calls it.
/// Both statuses are written, 0 when none has it.
pub fn read_endpoints(pool: &PgPool) -> futures_util::future::BoxFuture<'_, ()> {
    Box::pin(async move {
        let counted = sqlx::query!(
            r#"
            SELECT count(*) FILTER (WHERE status = $1) AS "enabled!",
                   count(*) FILTER (WHERE status = $2) AS "disabled!"
            FROM webhook_endpoints
            "#,
            EndpointStatus::Enabled.as_str(),
            EndpointStatus::Disabled.as_str(),
        )
        .fetch_one(pool)
        .await;
        match counted {
            #[allow(clippy::cast_precision_loss)]
            Ok(counted) => {
                gauge!(ENDPOINTS, "status" => EndpointStatus::Enabled.as_str())
                    .set(counted.enabled as f64);
                gauge!(ENDPOINTS, "status" => EndpointStatus::Disabled.as_str())
                    .set(counted.disabled as f64);
            }
            Err(error) => tracing::warn!(%error, "cannot count the webhook endpoints"),
        }
    })
}

/// Counts one webhook event by what became of it: a rising `needs_review` is disputes the ledger
/// could not take in full, a rising `stale` events arriving out of order.
pub(super) fn webhook_event(outcome: EventOutcome) {
    counter!(WEBHOOK_EVENTS, "outcome" => outcome.as_str()).increment(1);
}

/// Counts one delivery of an event refused because the object it names is not recorded yet and
/// no more events can be parked: each redelivery counts again.
pub(super) fn webhook_event_not_recorded() {
    counter!(WEBHOOK_EVENTS, "outcome" => "not_recorded").increment(1);
}

/// Counts one delivery of an event refused because this build does not know its type: each
/// redelivery counts again, until a release that knows it takes it.
pub(super) fn webhook_event_unknown_type() {
    counter!(WEBHOOK_EVENTS, "outcome" => "unknown_type").increment(1);
}

/// Counts one parked event applied once its object was recorded (its own outcome is in
/// `processed_events` and the log): `parked` less `unparked` is about how many wait.
pub(super) fn webhook_event_unparked() {
    counter!(WEBHOOK_EVENTS, "outcome" => "unparked").increment(1);
}
