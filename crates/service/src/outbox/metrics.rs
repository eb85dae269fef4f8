//! The outbox's series: the delivery attempts sent, by sender and what became of the delivery, and
//! the age of the oldest pending delivery, read at each scrape. Each is named after the service
//! that records it (`idempay_webhook_…`, `processor_webhook_…`): the one whose loop sends, or
//! whose scrape reads.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};

use crate::name::ServiceName;

/// The series' names after the service's prefix.
const WEBHOOK_DELIVERIES: &str = "webhook_deliveries_total";
const WEBHOOK_OLDEST_PENDING: &str = "webhook_oldest_pending_seconds";
const WEBHOOK_OLDEST_DUE: &str = "webhook_oldest_due_seconds";
const WEBHOOK_IN_FLIGHT: &str = "webhook_deliveries_in_flight";

/// Describes `service`'s outbox series to the recorder.
pub fn describe(service: ServiceName) {
    describe_counter!(
        service.metric(WEBHOOK_DELIVERIES),
        "Webhook delivery attempts sent, by sender (processor, endpoints) and what became of the \
         delivery (delivered, retried, failed: given up after the whole retry schedule)."
    );
    describe_gauge!(
        service.metric(WEBHOOK_OLDEST_PENDING),
        metrics::Unit::Seconds,
        "Age of the oldest event delivery neither acknowledged nor given up, read at the scrape; 0 \
         when none is pending. A steady rise means the delivery loops are stuck or behind."
    );
    describe_gauge!(
        service.metric(WEBHOOK_OLDEST_DUE),
        metrics::Unit::Seconds,
        "How long the oldest due delivery (pending, its next attempt due) of each endpoint has \
         waited, by sender (endpoints, processor) and endpoint (the endpoint id; idempay for the \
         processor's), read at the scrape for the 50 endpoints furthest behind; 0 once caught up."
    );
    describe_gauge!(
        service.metric(WEBHOOK_IN_FLIGHT),
        "Webhook sends in flight now, by sender: at most 50 per instance and 5 per endpoint."
    );
}

/// Sets the age of an endpoint's oldest due delivery, as a scrape read it.
pub(super) fn oldest_due(service: ServiceName, sender: &str, endpoint: &str, seconds: f64) {
    gauge!(service.metric(WEBHOOK_OLDEST_DUE), "sender" => sender.to_owned(), "endpoint" => endpoint.to_owned())
        .set(seconds);
}

/// Sets how many sends a loop has in flight.
pub(super) fn in_flight(service: ServiceName, sender: &'static str, sends: usize) {
    #[allow(clippy::cast_precision_loss)]
    gauge!(service.metric(WEBHOOK_IN_FLIGHT), "sender" => sender).set(sends as f64);
}

/// Sets the age of the oldest pending delivery, as a scrape read it.
pub(super) fn oldest_pending(service: ServiceName, age: Duration) {
    gauge!(service.metric(WEBHOOK_OLDEST_PENDING)).set(age.as_secs_f64());
}

/// Counts one delivery attempt by what became of its delivery (`delivered`, `retried`, `failed`).
/// Writes the sender's delivery counters at 0 when its loop starts, so that each series exists (and
/// a `rate()` over it reads 0, not nothing) before its first delivery.
pub(super) fn started(service: ServiceName, sender: &'static str) {
    for outcome in ["delivered", "retried", "failed"] {
        counter!(service.metric(WEBHOOK_DELIVERIES), "sender" => sender, "outcome" => outcome)
            .increment(0);
    }
}

pub(super) fn webhook_delivery(service: ServiceName, sender: &'static str, outcome: &'static str) {
    counter!(service.metric(WEBHOOK_DELIVERIES), "sender" => sender, "outcome" => outcome)
        .increment(1);
}
