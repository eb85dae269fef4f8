//! The outbox's series: the delivery attempts sent, by sender and what became of the delivery, and
//! the age of the oldest pending delivery, read at each scrape. Their names are idempay's
//! (`idempay_webhook_…`), as dashboards and the docs know them, whichever service sends.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};

const WEBHOOK_DELIVERIES: &str = "idempay_webhook_deliveries_total";
const WEBHOOK_OLDEST_PENDING: &str = "idempay_webhook_oldest_pending_seconds";
const WEBHOOK_OLDEST_DUE: &str = "idempay_webhook_oldest_due_seconds";
const WEBHOOK_IN_FLIGHT: &str = "idempay_webhook_deliveries_in_flight";

/// Describes the outbox's series to the recorder.
pub fn describe() {
    describe_counter!(
        WEBHOOK_DELIVERIES,
        "Webhook delivery attempts sent, by sender (processor, endpoints) and what became of the \
         delivery (delivered, retried, failed: given up after the whole retry schedule)."
    );
    describe_gauge!(
        WEBHOOK_OLDEST_PENDING,
        metrics::Unit::Seconds,
        "Age of the oldest event delivery neither acknowledged nor given up, read at the scrape; 0 \
         when none is pending. A steady rise means the delivery loops are stuck or behind."
    );
    describe_gauge!(
        WEBHOOK_OLDEST_DUE,
        metrics::Unit::Seconds,
        "How long the oldest due delivery (pending, its next attempt due) of each endpoint has \
         waited, by sender (endpoints, processor) and endpoint (the endpoint id; idempay for the \
         processor's), read at the scrape for the 50 endpoints furthest behind; 0 once caught up."
    );
    describe_gauge!(
        WEBHOOK_IN_FLIGHT,
        "Webhook sends in flight now, by sender: at most 50 per instance and 5 per endpoint."
    );
}

/// Sets the age of an endpoint's oldest due delivery, as a scrape read it.
pub(super) fn oldest_due(sender: &str, endpoint: &str, seconds: f64) {
    gauge!(WEBHOOK_OLDEST_DUE, "sender" => sender.to_owned(), "endpoint" => endpoint.to_owned())
        .set(seconds);
}

/// Sets how many sends a loop has in flight.
pub(super) fn in_flight(sender: &'static str, sends: usize) {
    #[allow(clippy::cast_precision_loss)]
    gauge!(WEBHOOK_IN_FLIGHT, "sender" => sender).set(sends as f64);
}

/// Sets the age of the oldest pending delivery, as a scrape read it.
pub(super) fn oldest_pending(age: Duration) {
    gauge!(WEBHOOK_OLDEST_PENDING).set(age.as_secs_f64());
}

/// Counts one delivery attempt by what became of its delivery (`delivered`, `retried`, `failed`).
/// Writes the sender's delivery counters at 0 when its loop starts, so that each series exists (and
/// a `rate()` over it reads 0, not nothing) before its first delivery.
pub(super) fn started(sender: &'static str) {
    for outcome in ["delivered", "retried", "failed"] {
        counter!(WEBHOOK_DELIVERIES, "sender" => sender, "outcome" => outcome).increment(0);
    }
}

pub(super) fn webhook_delivery(sender: &'static str, outcome: &'static str) {
    counter!(WEBHOOK_DELIVERIES, "sender" => sender, "outcome" => outcome).increment(1);
}
