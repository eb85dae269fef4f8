//! idempay's calls to the processor, counted by operation and outcome and timed: whether the
//! processor is reachable, refusing, or leaving outcomes unknown (the keys suspend) is read here
//! before a customer says it. Each call that did not succeed is also logged with its downstream
//! key, its outcome and its cause, which the client's problem never carries.

use std::time::Instant;

use metrics::{counter, describe_counter, describe_histogram, histogram};

const CALLS: &str = "idempay_processor_calls_total";
const CALL_DURATION: &str = "idempay_processor_call_duration_seconds";

/// What idempay asks of the processor: the label `operation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Charge,
    Refund,
    Capture,
    Void,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Charge => "charge",
            Self::Refund => "refund",
            Self::Capture => "capture",
            Self::Void => "void",
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
}

/// Counts and times one call that started at `started` and ended as `outcome`, and logs it when
/// it did not succeed (`cause` is then the refusal or why its outcome is unknown), naming the
/// downstream key, the outcome and the cause.
pub fn record(
    operation: Operation,
    downstream_key: &str,
    started: Instant,
    outcome: CallOutcome,
    cause: Option<&dyn std::fmt::Display>,
) {
    let operation = operation.as_str();
    histogram!(CALL_DURATION, "operation" => operation).record(started.elapsed().as_secs_f64());
    counter!(CALLS, "operation" => operation, "outcome" => outcome.as_str()).increment(1);
    let Some(cause) = cause else { return };
    if outcome == CallOutcome::Unknown {
        tracing::warn!(
            operation,
            downstream_key,
            outcome = outcome.as_str(),
            %cause,
            "the outcome of a call to the processor is unknown"
        );
    } else {
        tracing::warn!(
            operation,
            downstream_key,
            outcome = outcome.as_str(),
            %cause,
            "the processor did not make the {operation}"
        );
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
