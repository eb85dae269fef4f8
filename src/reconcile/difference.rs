//! How the two ledgers can disagree: what every section of the comparison adds to the report.

use std::fmt;

/// One way the two ledgers disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    /// The processor charged, and no payment records it.
    ChargeWithoutPayment { charge: String, amount: i64 },
    /// A payment names a charge the processor does not have.
    PaymentWithoutCharge { payment: String, charge: String },
    /// The payment and its charge disagree on a figure or the outcome.
    Mismatch {
        payment: String,
        charge: String,
        field: &'static str,
        ours: String,
        processor: String,
    },
    /// The processor refunded, and no refund records it.
    RefundWithoutRecord {
        processor_refund: String,
        amount: i64,
    },
    /// A refund names a processor refund that does not exist, or differs from it.
    RefundMismatch { refund: String, detail: String },
    /// A dispute was opened at the processor, and no dispute records it.
    DisputeWithoutRecord {
        dispute: String,
        charge: String,
        amount: i64,
    },
    /// A dispute of a charged payment is not the processor's, or differs from it.
    DisputeMismatch { dispute: String, detail: String },
    /// A key whose call to the processor stayed unresolved past the recovery window: nothing
    /// resumes it by itself, and an operator settles it with the processor's ledger (which may
    /// hold a charge or refund under its downstream key, also named above if so).
    KeyHeld {
        scope: String,
        key: String,
        downstream_key: Option<String>,
        since: chrono::DateTime<chrono::Utc>,
    },
    /// A processor's event about a charge or refund, parked since `since` because idempay had not
    /// recorded its object when it arrived: applied once it is, so one whose object is never
    /// recorded waits for good.
    EventParked {
        event: String,
        kind: String,
        object: String,
        since: chrono::DateTime<chrono::Utc>,
        /// Whether idempay has recorded the object by now: then the event waits only for a
        /// recording's look or the sweep of parked events (`IDEMPAY_RECOVERY_INTERVAL`), which
        /// tells an operator to look at the sweep, not at the missing object.
        object_recorded: bool,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ChargeWithoutPayment { charge, amount } => {
                write!(f, "charge {charge} ({amount}) has no payment")
            }
            Self::PaymentWithoutCharge { payment, charge } => {
                write!(
                    f,
                    "payment {payment} names charge {charge}, which the processor does not have"
                )
            }
            Self::Mismatch {
                payment,
                charge,
                field,
                ours,
                processor,
            } => write!(
                f,
                "payment {payment} / charge {charge}: {field} is {ours} here, {processor} at the processor"
            ),
            Self::RefundWithoutRecord {
                processor_refund,
                amount,
            } => write!(
                f,
                "processor refund {processor_refund} ({amount}) has no refund"
            ),
            Self::RefundMismatch { refund, detail } => write!(f, "refund {refund}: {detail}"),
            Self::DisputeWithoutRecord {
                dispute,
                charge,
                amount,
            } => write!(
                f,
                "processor dispute {dispute} ({amount}) of charge {charge} has no dispute"
            ),
            Self::DisputeMismatch { dispute, detail } => write!(f, "dispute {dispute}: {detail}"),
            Self::KeyHeld {
                scope,
                key,
                downstream_key,
                since,
            } => write!(
                f,
                "key {key:?} ({scope}) held for an operator since {}: its call to the processor \
                 with downstream key {} has no known outcome; settle it with \
                 `idempay keys settle {key:?} --account {}` (ops/runbooks.md)",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                downstream_key.as_deref().unwrap_or("(none)"),
                scope
                    .split_once(':')
                    .map_or(scope.as_str(), |(account, _)| account),
            ),
            Self::EventParked {
                event,
                kind,
                object,
                since,
                object_recorded,
            } => {
                let since = since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                if *object_recorded {
                    write!(
                        f,
                        "event {event} ({kind}) parked since {since}: {object} is recorded, and \
                         the event waits for the sweep of parked events"
                    )
                } else {
                    write!(
                        f,
                        "event {event} ({kind}) parked since {since}: waits for {object}, which \
                         idempay has not recorded"
                    )
                }
            }
        }
    }
}
