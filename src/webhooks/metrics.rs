//! The webhooks' series: the events received, by what became of them, the delivery attempts sent,
//! and the age of the oldest pending delivery, read at each scrape.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};

use super::Outcome;

const WEBHOOK_EVENTS: &str = "idempay_webhook_events_total";
const WEBHOOK_DELIVERIES: &str = "idempay_webhook_deliveries_total";
const WEBHOOK_OLDEST_PENDING: &str = "idempay_webhook_oldest_pending_seconds";

/// Describes the webhooks' series to the recorder.
pub fn describe() {
    describe_counter!(
        WEBHOOK_EVENTS,
        "Webhook events received, by outcome (applied, ignored, duplicate, stale, needs_review; \
         not_recorded: refused with 409 until the charge or refund it names is recorded)."
    );
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
}

/// Sets the age of the oldest pending delivery, as a scrape read it.
pub(super) fn oldest_pending(age: Duration) {
    gauge!(WEBHOOK_OLDEST_PENDING).set(age.as_secs_f64());
}

/// Counts one delivery attempt by what became of its delivery (`delivered`, `retried`, `failed`).
pub(super) fn webhook_delivery(sender: &'static str, outcome: &'static str) {
    counter!(WEBHOOK_DELIVERIES, "sender" => sender, "outcome" => outcome).increment(1);
}

/// Counts one webhook event by what became of it: a rising `needs_review` is disputes the ledger
/// could not take in full, a rising `stale` events arriving out of order.
pub(super) fn webhook_event(outcome: Outcome) {
    counter!(WEBHOOK_EVENTS, "outcome" => outcome.as_str()).increment(1);
}

/// Counts one delivery of an event refused because the object it names is not recorded yet: each
/// redelivery counts again, so a count that keeps rising names an object never recorded.
pub(super) fn webhook_event_not_recorded() {
    counter!(WEBHOOK_EVENTS, "outcome" => "not_recorded").increment(1);
}
