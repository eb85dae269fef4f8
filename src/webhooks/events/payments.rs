//! The processor's `charge.succeeded` and `charge.failed`: a payment's status moves between
//! `succeeded` and `failed` as the processor last said, an event older than the last one applied
//! changing nothing (`Stale`).

use sqlx::PgConnection;
use sqlx::types::Json;

use super::{
    Applied, Applying, Envelope, EventOutcome, NoEffect, Target, ignored, now, unencodable,
};
use crate::db::Engine;
use crate::events::{self, EventType, NewEvent};
use crate::metadata::Metadata;
use crate::payments::{PaymentRow, PaymentStatus};
use service::vocabulary::stored;

impl Envelope {
    /// Moves the payment to `status` (`succeeded` or `failed`), announced as `kind`. `declined` is
    /// the processor's final answer and `refunded` a fact of ours: neither moves. The comparison
    /// with the last applied event is in the UPDATE itself, so two events of one payment cannot
    /// both pass it: the second waits on the row lock, then sees the first one's time. A move
    /// writes its event (`payment.failed`, or `payment.succeeded` back from failed); an event that
    /// confirms the status the payment has changes nothing a client sees, and writes none.
    pub(super) async fn set_status(
        &self,
        conn: &mut PgConnection,
        engine: Engine,
        payment: &Target,
        status: PaymentStatus,
        kind: EventType,
    ) -> Result<Applying, sqlx::Error> {
        let Some(account) = payment.account(conn).await? else {
            return Ok(payment.unmatched(&self.kind));
        };
        let (id, charge) = payment.columns();
        // `prior` reads the row under its lock, so it is the status this UPDATE moves from.
        let updated = sqlx::query!(
            r#"
            UPDATE payments p SET status = $4, last_event_at = $3
            FROM (
                SELECT account_id, id, status FROM payments
                WHERE account_id = $5 AND (id = $1 OR charge = $2)
                FOR NO KEY UPDATE
            ) prior
            WHERE p.account_id = $5 AND p.account_id = prior.account_id AND p.id = prior.id
              AND p.status IN ($6, $7)
              AND (p.last_event_at IS NULL OR p.last_event_at < $3)
            RETURNING prior.status AS prior_status, p.account_id, p.id, p.amount, p.currency,
                      p.status, p.payment_method, p.order_ref, p.description, p.amount_refunded,
                      p.amount_disputed, p.charge, p.created_at,
                      p.metadata AS "metadata: Json<Metadata>", p.capture_method,
                      p.amount_captured, p.amount_capturable, p.canceled_at, p.cancellation_reason
            "#,
            id,
            charge,
            self.timestamp,
            status.as_str(),
            account,
            PaymentStatus::Succeeded.as_str(),
            PaymentStatus::Failed.as_str(),
        )
        .fetch_optional(&mut *conn)
        .await?;
        let Some(updated) = updated else {
            let outcome = self.status_outcome(conn, &account, payment).await?;
            return Ok(Ok(Applied::without_event(outcome)));
        };
        let event = if stored::<PaymentStatus>(&updated.prior_status)? == status {
            None
        } else {
            let row = PaymentRow {
                id: updated.id,
                amount: updated.amount,
                currency: updated.currency,
                status: updated.status,
                payment_method: updated.payment_method,
                order_ref: updated.order_ref,
                description: updated.description,
                amount_refunded: updated.amount_refunded,
                amount_disputed: updated.amount_disputed,
                charge: updated.charge,
                created_at: updated.created_at,
                metadata: updated.metadata,
                capture_method: updated.capture_method,
                amount_captured: updated.amount_captured,
                amount_capturable: updated.amount_capturable,
                canceled_at: updated.canceled_at,
                cancellation_reason: updated.cancellation_reason,
            };
            let event =
                NewEvent::new(kind, &row.parse()?, now(conn).await?).map_err(unencodable)?;
            events::write(
                conn,
                engine,
                &updated.account_id,
                std::slice::from_ref(&event),
            )
            .await?;
            Some(event)
        };
        Ok(Ok(Applied {
            outcome: EventOutcome::Applied,
            event,
        }))
    }

    /// What became of a status event that changed nothing: `Stale` if the payment has applied an
    /// event at least as new, `Ignored` otherwise. The decision was the UPDATE's; this read only
    /// names it for the answer.
    async fn status_outcome(
        &self,
        conn: &mut PgConnection,
        account: &str,
        payment: &Target,
    ) -> Result<EventOutcome, sqlx::Error> {
        let (id, charge) = payment.columns();
        let newer = sqlx::query_scalar!(
            r#"
            SELECT EXISTS (
                SELECT 1 FROM payments
                WHERE account_id = $4 AND (id = $1 OR charge = $2) AND last_event_at >= $3
            ) AS "newer!"
            "#,
            id,
            charge,
            self.timestamp,
            account,
        )
        .fetch_one(&mut *conn)
        .await?;
        Ok(if newer {
            tracing::info!(kind = %self.kind, timestamp = %self.timestamp, "stale event: a newer one was applied");
            EventOutcome::Stale
        } else {
            // A payment refunded, pending or declined: its status moves only between succeeded
            // and failed, and the processor announces every charge, including those since refunded.
            ignored(NoEffect::Expected(format!(
                "{} changes nothing: the payment's status is neither succeeded nor failed",
                self.kind
            )))
        })
    }
}
