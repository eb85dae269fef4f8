//! The processor's events and their effects on payments and refunds. Each effect runs in the
//! transaction that records the event as processed, and writes idempay's own event about the
//! change (`payment.failed`, `payment.disputed`, `refund.failed`) in it.
//!
//! An event about an object of the processor's (a charge `ch_…`, a refund `pyr_…`) that idempay
//! has not recorded is [`NotRecorded`], which the intake parks (`parked.rs`) to apply once the
//! object is recorded: the processor answers idempay and delivers its events independently, and
//! while a payment's charge is unknown (503 `processor-outcome-unknown`) its event may come first.
//! An id of idempay's own (`pay_…`, `re_…`) is known to nobody before it is recorded, so an
//! unknown one is acknowledged and `ignored`.
//!
//! This file reads an envelope into an [`Event`] and dispatches it; each kind's effect is in a file
//! of its own beside it: `payments.rs` (a charge succeeded or failed), `refunds.rs` (a refund
//! failed), `disputes.rs` (a dispute opened, changed or closed), `authorizations.rs` (an
//! authorization expired, captured or voided).

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use sqlx::PgConnection;
use utoipa::ToSchema;

use crate::db::Engine;
use crate::disputes::DisputeStatus;
use crate::events::{EventType, NewEvent};
use crate::payments::PaymentStatus;
use service::vocabulary::vocabulary;

mod authorizations;
mod disputes;
mod payments;
mod refunds;

/// A delivery's body: the Standard Webhooks envelope.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({
    "type": "dispute.created",
    "timestamp": "2026-11-29T19:10:00Z",
    "data": { "payment": "pay_U5PgTqA02dYsv3cLANIGkqIs", "dispute": "dp_Yq3tNw8LbV0cXk2RmA7s", "amount": 1500 }
}))]
pub struct Envelope {
    /// The processor's `charge.succeeded`, `charge.failed`, `charge.dispute.created` and
    /// `charge.refund.failed`, which name its charge (`ch_…`) or refund; or the same events
    /// naming idempay's own objects: `payment.succeeded`, `payment.failed`, `dispute.created` and
    /// `refund.failed`; and `charge.expired`, an authorization the processor released, which
    /// cancels its manual payment. The processor's `charge.declined`, `charge.refunded`,
    /// `charge.captured` and `charge.voided` change nothing (idempay records their effect from the
    /// processor's answer to its call) but, like the others, are parked while their charge or
    /// refund is not recorded. Another type is refused with 503 `webhook-event-type-unknown` and
    /// recorded nowhere, so that the processor delivers it again until a release that knows it
    /// applies it.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the processor created the event. A payment's status follows only events newer than
    /// the last one applied to it: an older one arriving later is recorded as `stale`.
    pub timestamp: DateTime<Utc>,
    /// The event's object: `{ "charge": "ch_…" }` or `{ "payment": "pay_…" }`; a dispute adds
    /// the processor's dispute id and the disputed amount, `{ "charge": "ch_…", "dispute": "dp_…",
    /// "amount": 1500 }` (or with `payment`); a refund's event is `{ "refund": "…" }`.
    #[schema(value_type = Object)]
    pub data: Value,
}

vocabulary! {
    /// The event types the intake understands (the processor's, and the same naming idempay's own
    /// objects); any other is refused with 503 and left unrecorded, for a release that knows it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum IntakeType: "event type" {
        PaymentSucceeded => "payment.succeeded",
        ChargeSucceeded => "charge.succeeded",
        PaymentFailed => "payment.failed",
        ChargeFailed => "charge.failed",
        DisputeCreated => "dispute.created",
        ChargeDisputeCreated => "charge.dispute.created",
        RefundFailed => "refund.failed",
        ChargeRefundFailed => "charge.refund.failed",
        ChargeDeclined => "charge.declined",
        ChargeRefunded => "charge.refunded",
        ChargeCaptured => "charge.captured",
        ChargeVoided => "charge.voided",
        ChargeExpired => "charge.expired",
        ChargeDisputeUpdated => "charge.dispute.updated",
        ChargeDisputeClosed => "charge.dispute.closed",
    }
}

/// The events the service understands.
#[derive(Debug)]
enum Event {
    PaymentSucceeded {
        payment: Target,
    },
    PaymentFailed {
        payment: Target,
    },
    /// `dispute` is the processor's id of the dispute, which keys its effect.
    DisputeCreated {
        payment: Target,
        dispute: String,
        amount: i64,
    },
    RefundFailed {
        refund: String,
    },
    /// `charge.declined`, `charge.refunded`, `charge.captured`, `charge.voided`: facts idempay
    /// records from the processor's answer to its own call, so the event has no effect, once that
    /// object is recorded.
    Confirms(Recorded),
    /// `charge.expired`: the processor released an authorization nobody captured in time.
    AuthorizationExpired {
        charge: String,
    },
    /// `charge.dispute.updated`, `charge.dispute.closed`: where the dispute stands now.
    DisputeChanged {
        dispute: String,
        status: DisputeStatus,
    },
}

/// An object of the processor's, as idempay records it: a payment's `charge`, a refund's
/// `processor_refund`.
#[derive(Debug)]
enum Recorded {
    Charge(String),
    Refund(String),
}

/// The event names an object of the processor's that idempay has not recorded (yet): a charge
/// (`ch_…`) no payment names, a processor refund (`pyr_…`) no refund names. Decided before the
/// event writes anything, so the caller may keep its transaction: the intake parks the event.
#[derive(Debug)]
pub struct NotRecorded {
    /// The processor's id of the object.
    pub object: String,
    /// The event's type.
    pub kind: String,
}

/// How an event names a payment: by idempay's id, or by the processor's charge it records.
#[derive(Debug)]
enum Target {
    Payment(String),
    Charge(String),
}

impl Target {
    /// The `(id, charge)` pair a query matches `payments` by: one of them is `None`.
    fn columns(&self) -> (Option<&str>, Option<&str>) {
        match self {
            Self::Payment(id) => (Some(id), None),
            Self::Charge(charge) => (None, Some(charge)),
        }
    }

    /// What an event naming this, which matched no payment, comes to: a charge may be recorded
    /// later, a payment id of ours never.
    fn unmatched(&self, kind: &str) -> Applying {
        match self {
            Self::Payment(id) => unmatched(kind, id, false),
            Self::Charge(charge) => unmatched(kind, charge, true),
        }
    }

    /// The account of the payment this names, if it names one of ours. An event of the processor
    /// is not per account; this read, which takes no lock (the account of a payment never
    /// changes), and its refund twin (`refund_account`) are the statements of intake that look in
    /// every account's rows: the others name the account, so on Citus they run on its node.
    async fn account(&self, conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
        let (id, charge) = self.columns();
        sqlx::query_scalar!(
            "SELECT account_id FROM payments WHERE id = $1 OR charge = $2 LIMIT 1",
            id,
            charge,
        )
        .fetch_optional(conn)
        .await
    }
}

#[derive(Deserialize)]
struct PaymentData {
    payment: String,
}

#[derive(Deserialize)]
struct ChargeData {
    charge: String,
}

#[derive(Deserialize)]
struct DisputeData {
    payment: String,
    dispute: String,
    amount: i64,
}

#[derive(Deserialize)]
struct ChargeDisputeData {
    charge: String,
    dispute: String,
    amount: i64,
}

#[derive(Deserialize)]
struct DisputeChangeData {
    dispute: String,
    status: String,
}

#[derive(Deserialize)]
struct RefundData {
    refund: String,
}

vocabulary! {
    // The outcomes' names, as the API, the processed events and the metrics spell them.
    /// What became of an event.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum EventOutcome: "webhook event outcome" {
        /// Its effect was applied now; for an event without one (`charge.declined`,
        /// `charge.refunded`), what it names is recorded.
        Applied => "applied",
        /// Acknowledged without effect: an object of idempay's own (`pay_…`, `re_…`) that does
        /// not exist, or data that cannot apply. (An unknown type is not acknowledged at all.)
        Ignored => "ignored",
        /// A redelivery of an event already processed, or an effect already recorded under another
        /// event id (a dispute already known by its dispute id): nothing was applied again.
        Duplicate => "duplicate",
        /// Older than the last event applied to the payment (by the envelope's `timestamp`):
        /// recorded, and the payment keeps the newer state.
        Stale => "stale",
        /// A dispute over more than remains of the payment (after its refunds and other disputes):
        /// recorded and flagged for an operator's review; the payment's `amount_disputed` took only
        /// what remained.
        NeedsReview => "needs_review",
        /// About a charge or refund of the processor's that idempay has not recorded yet: kept, and
        /// applied once when it is recorded (by the client's retry, the recovery job or an
        /// operator).
        Parked => "parked",
    }
}

/// What applying an event did: its outcome, and the event it wrote about the change, if any.
#[derive(Debug)]
pub struct Applied {
    pub outcome: EventOutcome,
    /// Written in the caller's transaction: count it with [`events::written`] once it committed.
    pub event: Option<NewEvent>,
}

impl Applied {
    fn without_event(outcome: EventOutcome) -> Self {
        Self {
            outcome,
            event: None,
        }
    }
}

/// What an event came to: applied (whatever its outcome), or waiting until its object is recorded.
pub type Applying = Result<Applied, NotRecorded>;

/// `Ok(Ignored)` for an object of ours that does not exist, which nobody can know of before it is
/// recorded (and it never will be now); [`NotRecorded`] for an object of the processor's, which
/// idempay may record later.
fn unmatched(kind: &str, object: &str, of_the_processor: bool) -> Applying {
    if of_the_processor {
        // Logged and counted by the intake, which knows the event's id.
        Err(NotRecorded {
            object: object.to_owned(),
            kind: kind.to_owned(),
        })
    } else {
        let reason = format!("{kind} names `{object}`, which does not exist");
        Ok(Applied::without_event(ignored(NoEffect::Unexpected(
            reason,
        ))))
    }
}

/// Whether this build knows the event type `kind`. The intake refuses one it does not (503, the
/// event left unrecorded) rather than acknowledge it: a later release may know it.
pub fn is_known_type(kind: &str) -> bool {
    kind.parse::<IntakeType>().is_ok()
}

/// Why an event of type `kind` carrying `data` cannot apply whatever the database holds (a type
/// this build does not know, which the intake refuses, or data without the fields its type needs,
/// an id that is none of ours, a dispute of nothing, which it acknowledges `ignored`), or `None`
/// if it can apply. `idempay webhook send` asks before it sends, so that a typo is refused on the
/// spot, with the reason, instead of being refused by the intake or `ignored` under an event id
/// then spent.
pub fn unreadable(kind: &str, data: &Value) -> Option<String> {
    parse(kind, data).err()
}

/// The event an envelope's `kind` and `data` carry; `Err` says why it has no effect.
fn parse(kind: &str, data: &Value) -> Result<Event, String> {
    let malformed = |error: serde_json::Error| format!("malformed {kind} data: {error}");
    let data = data.clone();
    if !known_id_shapes(&data) {
        return Err(format!("{kind} names no object of ours"));
    }
    let Ok(known) = kind.parse::<IntakeType>() else {
        return Err(format!("unknown event type `{kind}`"));
    };
    match known {
        IntakeType::PaymentSucceeded => serde_json::from_value::<PaymentData>(data)
            .map(|d| Event::PaymentSucceeded {
                payment: Target::Payment(d.payment),
            })
            .map_err(malformed),
        IntakeType::ChargeSucceeded => serde_json::from_value::<ChargeData>(data)
            .map(|d| Event::PaymentSucceeded {
                payment: Target::Charge(d.charge),
            })
            .map_err(malformed),
        IntakeType::PaymentFailed => serde_json::from_value::<PaymentData>(data)
            .map(|d| Event::PaymentFailed {
                payment: Target::Payment(d.payment),
            })
            .map_err(malformed),
        IntakeType::ChargeFailed => serde_json::from_value::<ChargeData>(data)
            .map(|d| Event::PaymentFailed {
                payment: Target::Charge(d.charge),
            })
            .map_err(malformed),
        IntakeType::DisputeCreated => serde_json::from_value::<DisputeData>(data)
            .map_err(malformed)
            .and_then(|d| dispute(Target::Payment(d.payment), d.dispute, d.amount)),
        IntakeType::ChargeDisputeCreated => serde_json::from_value::<ChargeDisputeData>(data)
            .map_err(malformed)
            .and_then(|d| dispute(Target::Charge(d.charge), d.dispute, d.amount)),
        IntakeType::RefundFailed | IntakeType::ChargeRefundFailed => {
            serde_json::from_value::<RefundData>(data)
                .map(|d| Event::RefundFailed { refund: d.refund })
                .map_err(malformed)
        }
        IntakeType::ChargeCaptured | IntakeType::ChargeVoided => {
            serde_json::from_value::<ChargeData>(data)
                .map(|d| Event::Confirms(Recorded::Charge(d.charge)))
                .map_err(malformed)
        }
        IntakeType::ChargeDisputeUpdated | IntakeType::ChargeDisputeClosed => {
            serde_json::from_value::<DisputeChangeData>(data)
                .map_err(malformed)
                .and_then(|d| dispute_changed(known, d))
        }
        IntakeType::ChargeExpired => serde_json::from_value::<ChargeData>(data)
            .map(|d| Event::AuthorizationExpired { charge: d.charge })
            .map_err(malformed),
        IntakeType::ChargeDeclined => serde_json::from_value::<ChargeData>(data)
            .map(|d| Event::Confirms(Recorded::Charge(d.charge)))
            .map_err(malformed),
        IntakeType::ChargeRefunded => serde_json::from_value::<RefundData>(data)
            .map(|d| Event::Confirms(Recorded::Refund(d.refund)))
            .map_err(malformed),
    }
}

impl Envelope {
    /// The event this envelope carries; `Err` says why it has no effect.
    fn event(&self) -> Result<Event, String> {
        parse(&self.kind, &self.data)
    }

    /// Applies the event's effect, recorded as processed under `event_id`; `Ignored` when it has
    /// none; [`NotRecorded`], having written nothing, when it names an object of the processor's
    /// that idempay has not recorded. A change of a payment or a refund writes its event in the
    /// same transaction.
    pub async fn apply(
        &self,
        conn: &mut PgConnection,
        engine: Engine,
        event_id: &str,
    ) -> Result<Applying, sqlx::Error> {
        let event = match self.event() {
            Ok(event) => event,
            Err(reason) => {
                let outcome = ignored(NoEffect::Unexpected(reason));
                return Ok(Ok(Applied::without_event(outcome)));
            }
        };
        match event {
            Event::PaymentSucceeded { payment } => {
                let (status, kind) = (PaymentStatus::Succeeded, EventType::PaymentSucceeded);
                self.set_status(conn, engine, &payment, status, kind).await
            }
            Event::PaymentFailed { payment } => {
                let (status, kind) = (PaymentStatus::Failed, EventType::PaymentFailed);
                self.set_status(conn, engine, &payment, status, kind).await
            }
            Event::DisputeCreated {
                payment,
                dispute,
                amount,
            } => {
                self.dispute(conn, engine, event_id, &payment, &dispute, amount)
                    .await
            }
            Event::RefundFailed { refund } => self.refund_failed(conn, engine, &refund).await,
            Event::Confirms(object) => self.confirms(conn, &object).await,
            Event::AuthorizationExpired { charge } => {
                self.authorization_expired(conn, engine, &charge).await
            }
            Event::DisputeChanged { dispute, status } => {
                self.dispute_changed(conn, engine, &dispute, status).await
            }
        }
    }

    /// An event with no effect of its own is acknowledged once its object is recorded: `Applied`,
    /// as a status event confirming the payment's status is. Whether the figures agree is
    /// `idempay reconcile`'s to say.
    async fn confirms(
        &self,
        conn: &mut PgConnection,
        object: &Recorded,
    ) -> Result<Applying, sqlx::Error> {
        match object {
            Recorded::Charge(charge) => {
                let charge = Target::Charge(charge.clone());
                if charge.account(conn).await?.is_none() {
                    return Ok(charge.unmatched(&self.kind));
                }
            }
            Recorded::Refund(refund) => {
                if refund_account(conn, refund).await?.is_none() {
                    return Ok(unmatched_refund(&self.kind, refund));
                }
            }
        }
        Ok(Ok(Applied::without_event(EventOutcome::Applied)))
    }
}

/// The account of the refund `refund` names (idempay's id or the processor's), read without a
/// lock, as for a payment (`Target::account`).
async fn refund_account(
    conn: &mut PgConnection,
    refund: &str,
) -> Result<Option<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT account_id FROM refunds WHERE id = $1 OR processor_refund = $1 LIMIT 1",
        refund,
    )
    .fetch_optional(conn)
    .await
}

/// What an event naming a refund that matched none comes to: a refund id of idempay's is `re_…`;
/// any other the shape check let through is the processor's, which may be recorded later.
fn unmatched_refund(kind: &str, refund: &str) -> Applying {
    unmatched(kind, refund, !crate::refunds::RefundId::fits(refund))
}

fn dispute(payment: Target, dispute: String, amount: i64) -> Result<Event, String> {
    if amount > 0 {
        Ok(Event::DisputeCreated {
            payment,
            dispute,
            amount,
        })
    } else {
        Err(format!("a dispute of {amount} cannot apply"))
    }
}

/// A dispute's new status, as its event names it: `under_review` updates one, `won` or `lost`
/// closes one; any other status, or a status its type does not carry, cannot apply.
fn dispute_changed(kind: IntakeType, data: DisputeChangeData) -> Result<Event, String> {
    let status = data
        .status
        .parse::<DisputeStatus>()
        .map_err(|error| format!("{kind}: {error}"))?;
    let fits = match kind {
        IntakeType::ChargeDisputeUpdated => status == DisputeStatus::UnderReview,
        _ => matches!(status, DisputeStatus::Won | DisputeStatus::Lost),
    };
    if fits {
        Ok(Event::DisputeChanged {
            dispute: data.dispute,
            status,
        })
    } else {
        Err(format!("{kind} cannot make a dispute {status}"))
    }
}

/// The ids an event names must have the shape of ours (or the processor's) before any query sees
/// them.
fn known_id_shapes(data: &Value) -> bool {
    let payment_ok = data
        .get("payment")
        .and_then(Value::as_str)
        .is_none_or(|id| crate::payments::PaymentId::parse(id).is_some());
    let refund_ok = data
        .get("refund")
        .and_then(Value::as_str)
        .is_none_or(|id| crate::refunds::RefundId::fits(id) || is_processor_id(id));
    let charge_ok = data
        .get("charge")
        .and_then(Value::as_str)
        .is_none_or(is_processor_id);
    let dispute_ok = data
        .get("dispute")
        .and_then(Value::as_str)
        .is_none_or(is_processor_id);
    payment_ok && refund_ok && charge_ok && dispute_ok
}

/// A processor's id: a short prefix, `_`, and up to 64 base62 characters.
fn is_processor_id(id: &str) -> bool {
    id.split_once('_').is_some_and(|(prefix, random)| {
        (2..=4).contains(&prefix.len())
            && prefix.bytes().all(|b| b.is_ascii_lowercase())
            && (1..=64).contains(&random.len())
            && random.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// An event whose body could not be serialized fails the transaction, as a failed write would.
fn unencodable(error: serde_json::Error) -> sqlx::Error {
    sqlx::Error::Encode(error.into())
}

/// Why an event is acknowledged without effect, which decides who hears of it.
enum NoEffect {
    /// A known event that changes nothing in the state its object is in now, as a refunded
    /// payment's `charge.succeeded`: the processor's ordinary traffic, logged at DEBUG with the
    /// reason, so that a developer who asks (`RUST_LOG=idempay=debug`) sees it and an operator's
    /// WARN lines stay for what needs them.
    Expected(String),
    /// An event idempay cannot read (an unknown type, data without the fields its type needs) or
    /// that names an object of ours that does not exist: the sender and idempay disagree, which
    /// an operator must look at. Logged at WARN.
    Unexpected(String),
}

fn ignored(why: NoEffect) -> EventOutcome {
    match why {
        NoEffect::Expected(reason) => {
            tracing::debug!(reason, "webhook event acknowledged without effect");
        }
        NoEffect::Unexpected(reason) => {
            tracing::warn!(reason, "webhook event acknowledged without effect");
        }
    }
    EventOutcome::Ignored
}

/// The transaction's `now()`, the time of the change it applies: read on its own, since Citus
/// allows no such function in a distributed statement's `RETURNING` (it evaluates `now()` on the
/// coordinator, where this reads it too).
async fn now(conn: &mut PgConnection) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
        .fetch_one(conn)
        .await
}
