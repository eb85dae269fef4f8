//! The processor's events and their effects on payments and refunds. Each effect runs in the
//! transaction that records the event as processed.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgConnection;
use utoipa::ToSchema;

/// A delivery's body: the Standard Webhooks envelope.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({
    "type": "dispute.created",
    "timestamp": "2026-11-29T19:10:00Z",
    "data": { "payment": "pay_U5PgTqA02dYsv3cLANIGkqIs", "amount": 1500 }
}))]
pub struct Envelope {
    /// The processor's `charge.succeeded`, `charge.failed`, `charge.dispute.created` and
    /// `charge.refund.failed`, which name its charge (`ch_…`) or refund; or the same events
    /// naming idempay's own objects: `payment.succeeded`, `payment.failed`, `dispute.created` and
    /// `refund.failed`. Other types (`charge.declined`, `charge.refunded`: recorded when the
    /// processor answered the call) are acknowledged and recorded without effect.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the processor created the event.
    pub timestamp: DateTime<Utc>,
    /// The event's object: `{ "charge": "ch_…" }` or `{ "payment": "pay_…" }`, with `amount` for
    /// a dispute, or `{ "refund": "…" }`.
    #[schema(value_type = Object)]
    pub data: Value,
}

/// The events the service understands.
#[derive(Debug)]
enum Event {
    PaymentSucceeded { payment: Target },
    PaymentFailed { payment: Target },
    DisputeCreated { payment: Target, amount: i64 },
    RefundFailed { refund: String },
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
    amount: i64,
}

#[derive(Deserialize)]
struct ChargeDisputeData {
    charge: String,
    amount: i64,
}

#[derive(Deserialize)]
struct RefundData {
    refund: String,
}

/// What became of an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Its effect was applied now.
    Applied,
    /// Acknowledged without effect: an unknown type, an unknown object, or data that cannot apply.
    Ignored,
    /// A redelivery of an event already processed: nothing was applied again.
    Duplicate,
}

impl Envelope {
    /// The event this envelope carries; `Err` says why it has no effect.
    fn event(&self) -> Result<Event, String> {
        let data = self.data.clone();
        let malformed = |error: serde_json::Error| format!("malformed {} data: {error}", self.kind);
        match self.kind.as_str() {
            kind if !known_id_shapes(&self.data) => Err(format!("{kind} names no object of ours")),
            "payment.succeeded" => serde_json::from_value::<PaymentData>(data)
                .map(|d| Event::PaymentSucceeded {
                    payment: Target::Payment(d.payment),
                })
                .map_err(malformed),
            "charge.succeeded" => serde_json::from_value::<ChargeData>(data)
                .map(|d| Event::PaymentSucceeded {
                    payment: Target::Charge(d.charge),
                })
                .map_err(malformed),
            "payment.failed" => serde_json::from_value::<PaymentData>(data)
                .map(|d| Event::PaymentFailed {
                    payment: Target::Payment(d.payment),
                })
                .map_err(malformed),
            "charge.failed" => serde_json::from_value::<ChargeData>(data)
                .map(|d| Event::PaymentFailed {
                    payment: Target::Charge(d.charge),
                })
                .map_err(malformed),
            "dispute.created" => serde_json::from_value::<DisputeData>(data)
                .map_err(malformed)
                .and_then(|d| dispute(Target::Payment(d.payment), d.amount)),
            "charge.dispute.created" => serde_json::from_value::<ChargeDisputeData>(data)
                .map_err(malformed)
                .and_then(|d| dispute(Target::Charge(d.charge), d.amount)),
            "refund.failed" | "charge.refund.failed" => serde_json::from_value::<RefundData>(data)
                .map(|d| Event::RefundFailed { refund: d.refund })
                .map_err(malformed),
            other => Err(format!("unknown event type `{other}`")),
        }
    }

    /// Applies the event's effect; `Ignored` when it has none.
    pub async fn apply(&self, conn: &mut PgConnection) -> Result<Outcome, sqlx::Error> {
        let event = match self.event() {
            Ok(event) => event,
            Err(reason) => return Ok(ignored(&reason)),
        };
        let applied = match event {
            Event::PaymentSucceeded { payment } => {
                let (id, charge) = payment.columns();
                sqlx::query!(
                    r#"
                    UPDATE payments SET status = 'succeeded'
                    WHERE (id = $1 OR charge = $2) AND status IN ('succeeded', 'failed', 'declined')
                    "#,
                    id,
                    charge,
                )
                .execute(&mut *conn)
                .await?
            }
            Event::PaymentFailed { payment } => {
                let (id, charge) = payment.columns();
                sqlx::query!(
                    r#"
                    UPDATE payments SET status = 'failed'
                    WHERE (id = $1 OR charge = $2) AND status IN ('succeeded', 'failed')
                    "#,
                    id,
                    charge,
                )
                .execute(&mut *conn)
                .await?
            }
            Event::DisputeCreated { payment, amount } => {
                // Never more disputed than was paid; the check and the addition are one statement.
                // The check subtracts, so an absurd amount cannot overflow the sum first.
                let (id, charge) = payment.columns();
                sqlx::query!(
                    r#"
                    UPDATE payments SET amount_disputed = amount_disputed + $2
                    WHERE (id = $1 OR charge = $3) AND $2 <= amount - amount_disputed
                    "#,
                    id,
                    amount,
                    charge,
                )
                .execute(&mut *conn)
                .await?
            }
            Event::RefundFailed { refund } => {
                // The money did not go back: the amount is refundable again.
                sqlx::query!(
                    r#"
                    WITH failed AS (
                        UPDATE refunds SET status = 'failed'
                        WHERE (id = $1 OR processor_refund = $1) AND status = 'succeeded'
                        RETURNING payment_id, amount
                    )
                    UPDATE payments p
                    SET amount_refunded = p.amount_refunded - failed.amount,
                        status = CASE WHEN p.status = 'refunded' THEN 'succeeded' ELSE p.status END
                    FROM failed
                    WHERE p.id = failed.payment_id
                    "#,
                    refund,
                )
                .execute(&mut *conn)
                .await?
            }
        };
        Ok(if applied.rows_affected() > 0 {
            Outcome::Applied
        } else {
            ignored(&format!("{} matched no object it can apply to", self.kind))
        })
    }
}

fn dispute(payment: Target, amount: i64) -> Result<Event, String> {
    if amount > 0 {
        Ok(Event::DisputeCreated { payment, amount })
    } else {
        Err(format!("a dispute of {amount} cannot apply"))
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
        .is_none_or(|id| crate::refunds::is_refund_id(id) || is_processor_id(id));
    let charge_ok = data
        .get("charge")
        .and_then(Value::as_str)
        .is_none_or(is_processor_id);
    payment_ok && refund_ok && charge_ok
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

fn ignored(reason: &str) -> Outcome {
    tracing::warn!(reason, "webhook event acknowledged without effect");
    Outcome::Ignored
}
