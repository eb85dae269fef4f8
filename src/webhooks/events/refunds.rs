//! The processor's `refund.failed`: the money of a refund did not go back, so its amount is
//! refundable again.

use sqlx::PgConnection;
use sqlx::types::Json;

use super::{
    Applied, Applying, Envelope, EventOutcome, NoEffect, ignored, now, refund_account, unencodable,
    unmatched_refund,
};
use crate::db::Engine;
use crate::events::{self, EventType, NewEvent};
use crate::metadata::Metadata;
use crate::payments::PaymentStatus;
use crate::refunds::{RefundRow, RefundStatus};

impl Envelope {
    /// The money of a refund did not go back: the amount is refundable again, and the refund's
    /// `refund.failed` is written.
    pub(super) async fn refund_failed(
        &self,
        conn: &mut PgConnection,
        engine: Engine,
        refund: &str,
    ) -> Result<Applying, sqlx::Error> {
        let Some(account) = refund_account(conn, refund).await? else {
            return Ok(unmatched_refund(&self.kind, refund));
        };
        let failed = sqlx::query!(
            r#"
            WITH failed AS (
                UPDATE refunds SET status = $3
                WHERE account_id = $2 AND (id = $1 OR processor_refund = $1)
                  AND status = $4
                RETURNING id, payment_id, account_id, amount, reason, status, processor_refund,
                          created_at, metadata
            )
            UPDATE payments p
            SET amount_refunded = p.amount_refunded - failed.amount,
                status = CASE WHEN p.status = $5 THEN $6 ELSE p.status END
            FROM failed
            WHERE p.account_id = $2 AND p.account_id = failed.account_id
              AND p.id = failed.payment_id
            RETURNING failed.id AS "id!", failed.payment_id AS "payment_id!",
                      failed.account_id AS "account_id!", failed.amount AS "amount!",
                      failed.reason AS "reason?", failed.status AS "status!",
                      failed.processor_refund AS "processor_refund?",
                      failed.created_at AS "created_at!",
                      failed.metadata AS "metadata!: Json<Metadata>"
            "#,
            refund,
            account,
            RefundStatus::Failed.as_str(),
            RefundStatus::Succeeded.as_str(),
            PaymentStatus::Refunded.as_str(),
            PaymentStatus::Succeeded.as_str(),
        )
        .fetch_optional(&mut *conn)
        .await?;
        let Some(failed) = failed else {
            let reason = format!(
                "{} changes nothing: refund `{refund}` is not `succeeded` (it failed already, or \
                 is not settled)",
                self.kind
            );
            return Ok(Ok(Applied::without_event(ignored(NoEffect::Expected(
                reason,
            )))));
        };
        // The money is the payment's again: a dispute squeezed by the refund may hold it now.
        crate::payments::disputed::recount(conn, &account, &failed.payment_id).await?;
        let row = RefundRow {
            id: failed.id,
            payment_id: failed.payment_id,
            amount: failed.amount,
            reason: failed.reason,
            status: failed.status,
            processor_refund: failed.processor_refund,
            created_at: failed.created_at,
            metadata: failed.metadata,
        };
        let event = NewEvent::new(EventType::RefundFailed, &row.parse()?, now(conn).await?)
            .map_err(unencodable)?;
        events::write(
            conn,
            engine,
            &failed.account_id,
            std::slice::from_ref(&event),
        )
        .await?;
        Ok(Ok(Applied {
            outcome: EventOutcome::Applied,
            event: Some(event),
        }))
    }
}
