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
    /// `payment.succeeded`, `payment.failed`, `dispute.created` or `refund.failed`; other types
    /// are acknowledged and recorded without effect.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the processor created the event.
    pub timestamp: DateTime<Utc>,
    /// The event's object: `{ "payment": "pay_…" }`, with `amount` for a dispute, or
    /// `{ "refund": "re_…" }`.
    #[schema(value_type = Object)]
    pub data: Value,
}

/// The events the service understands.
#[derive(Debug)]
enum Event {
    PaymentSucceeded { payment: String },
    PaymentFailed { payment: String },
    DisputeCreated { payment: String, amount: i64 },
    RefundFailed { refund: String },
}

#[derive(Deserialize)]
struct PaymentData {
    payment: String,
}

#[derive(Deserialize)]
struct DisputeData {
    payment: String,
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
                .map(|d| Event::PaymentSucceeded { payment: d.payment })
                .map_err(malformed),
            "payment.failed" => serde_json::from_value::<PaymentData>(data)
                .map(|d| Event::PaymentFailed { payment: d.payment })
                .map_err(malformed),
            "dispute.created" => serde_json::from_value::<DisputeData>(data)
                .map_err(malformed)
                .and_then(|d| {
                    if d.amount > 0 {
                        Ok(Event::DisputeCreated {
                            payment: d.payment,
                            amount: d.amount,
                        })
                    } else {
                        Err(format!("a dispute of {} cannot apply", d.amount))
                    }
                }),
            "refund.failed" => serde_json::from_value::<RefundData>(data)
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
                sqlx::query!(
                    r#"
                    UPDATE payments SET status = 'succeeded'
                    WHERE id = $1 AND status IN ('succeeded', 'failed', 'declined')
                    "#,
                    payment,
                )
                .execute(&mut *conn)
                .await?
            }
            Event::PaymentFailed { payment } => {
                sqlx::query!(
                    r#"
                    UPDATE payments SET status = 'failed'
                    WHERE id = $1 AND status IN ('succeeded', 'failed')
                    "#,
                    payment,
                )
                .execute(&mut *conn)
                .await?
            }
            Event::DisputeCreated { payment, amount } => {
                // Never more disputed than was paid; the check and the addition are one statement.
                // The check subtracts, so an absurd amount cannot overflow the sum first.
                sqlx::query!(
                    r#"
                    UPDATE payments SET amount_disputed = amount_disputed + $2
                    WHERE id = $1 AND $2 <= amount - amount_disputed
                    "#,
                    payment,
                    amount,
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
                        WHERE id = $1 AND status = 'succeeded'
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

/// The ids an event names must have the shape of ours before any query sees them.
fn known_id_shapes(data: &Value) -> bool {
    let payment_ok = data
        .get("payment")
        .and_then(Value::as_str)
        .is_none_or(|id| crate::payments::PaymentId::parse(id).is_some());
    let refund_ok = data
        .get("refund")
        .and_then(Value::as_str)
        .is_none_or(crate::refunds::is_refund_id);
    payment_ok && refund_ok
}

fn ignored(reason: &str) -> Outcome {
    tracing::warn!(reason, "webhook event acknowledged without effect");
    Outcome::Ignored
}
