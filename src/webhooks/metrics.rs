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
         parked: kept until the charge or refund it names is recorded; unparked: a parked event \
         applied once that was recorded; not_recorded: refused with 409, the parked events at \
         their bound)."
    );
    service::outbox::metrics::describe();
}

/// Counts one webhook event by what became of it: a rising `needs_review` is disputes the ledger
/// could not take in full, a rising `stale` events arriving out of order.
pub(super) fn webhook_event(outcome: Outcome) {
    counter!(WEBHOOK_EVENTS, "outcome" => outcome.as_str()).increment(1);
}

/// Counts one delivery of an event refused because the object it names is not recorded yet and
/// no more events can be parked: each redelivery counts again.
pub(super) fn webhook_event_not_recorded() {
    counter!(WEBHOOK_EVENTS, "outcome" => "not_recorded").increment(1);
}

/// Counts one parked event applied once its object was recorded (its own outcome is in
/// `processed_events` and the log): `parked` less `unparked` is about how many wait.
pub(super) fn webhook_event_unparked() {
    counter!(WEBHOOK_EVENTS, "outcome" => "unparked").increment(1);
}
