//! The webhook intake's series: the events received, by what became of them. The deliveries' series
//! are the outbox's (`service::outbox::metrics`).

use metrics::{counter, describe_counter};

use super::Outcome;

const WEBHOOK_EVENTS: &str = "idempay_webhook_events_total";

/// Describes the webhooks' series to the recorder, the outbox's with them.
pub fn describe() {
    describe_counter!(
        WEBHOOK_EVENTS,
        "Webhook events received, by outcome (applied, ignored, duplicate, stale, needs_review; \
         not_recorded: refused with 409 until the charge or refund it names is recorded)."
    );
    service::outbox::metrics::describe();
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
