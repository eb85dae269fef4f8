//! idempay's calls to the processor, counted by operation and outcome and timed: whether the
//! processor is reachable, refusing, or leaving outcomes unknown (the keys suspend) is read here
//! before a customer says it. Each call that did not succeed is also logged with its downstream
//! key, its outcome and its cause, which the client's problem never carries.

use std::time::Instant;

use metrics::{counter, describe_counter, describe_histogram, histogram};

use super::client::Outcome;

const CALLS: &str = "idempay_processor_calls_total";
const CALL_DURATION: &str = "idempay_processor_call_duration_seconds";

/// What idempay asks of the processor: the label `operation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Charge,
    Refund,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
        }
    }
}

/// How one call ended, as counted: the label `outcome`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// Answered with the effect (a charge, declined or not, or a refund).
    Succeeded,
    /// A definite refusal (4xx, a declined charge): nothing happened.
    Declined,
    /// Sent, with no definite answer (timeout, 5xx, connection lost): the key suspends.
    Unknown,
    /// The connection was refused before anything was sent: known not executed.
    NotSent,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Declined => "declined",
            Self::Unknown => "unknown",
            Self::NotSent => "not_sent",
        }
    }

    /// The outcome of a call that ended with `outcome`; `declined` when the processor's answer is
    /// a decline (a charge read back after a 402).
    pub fn of<T>(outcome: &Outcome<T>, declined: bool) -> Self {
        match outcome {
            Outcome::Done(_) if declined => Self::Declined,
            Outcome::Done(_) => Self::Succeeded,
            Outcome::NotDone(refusal) if refusal.status.is_none() => Self::NotSent,
            Outcome::NotDone(_) => Self::Declined,
            Outcome::Unknown(_) => Self::Unknown,
        }
    }
}

/// Counts and times one call that started at `started`, and logs it when it did not succeed,
/// naming the downstream key, the outcome and the cause.
pub fn record<T>(
    operation: Operation,
    downstream_key: &str,
    started: Instant,
    outcome: &Outcome<T>,
    declined: bool,
) {
    let counted = CallOutcome::of(outcome, declined);
    let operation = operation.as_str();
    histogram!(CALL_DURATION, "operation" => operation).record(started.elapsed().as_secs_f64());
    counter!(CALLS, "operation" => operation, "outcome" => counted.as_str()).increment(1);
    match outcome {
        Outcome::Done(_) => {}
        Outcome::NotDone(refusal) => tracing::warn!(
            operation,
            downstream_key,
            outcome = counted.as_str(),
            cause = %refusal,
            "the processor did not make the {operation}"
        ),
        Outcome::Unknown(cause) => tracing::warn!(
            operation,
            downstream_key,
            outcome = counted.as_str(),
            cause,
            "the outcome of a call to the processor is unknown"
        ),
    }
}

pub fn describe() {
    describe_counter!(
        CALLS,
        "Calls idempay made to the processor, by operation (charge, refund) and outcome \
         (succeeded, declined, unknown, not_sent)."
    );
    describe_histogram!(
        CALL_DURATION,
        metrics::Unit::Seconds,
        "Time of one call to the processor, by operation."
    );
}
