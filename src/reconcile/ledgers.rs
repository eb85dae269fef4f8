//! The two ledgers as the reconciliation reads them, idempay's in one snapshot and the
//! processor's through its list API: what every section of the comparison reads.

use std::fmt;

use sqlx::PgPool;

use crate::disputes::DisputeStatus;
use crate::downstream::ProcessorClient;
use crate::downstream::{Charge, Dispute, ProcessorRefund};
use crate::payments::{CancellationReason, PaymentStatus};
use crate::refunds::RefundStatus as OurRefundStatus;
use service::vocabulary::stored;

/// A key suspended at its recovery point (in progress, no request holding it).
#[derive(Debug)]
pub struct SuspendedKey {
    pub(super) scope: String,
    pub(super) idem_key: String,
    pub(super) recovery_point: String,
    pub(super) downstream_key: Option<String>,
    pub(super) created_at: chrono::DateTime<chrono::Utc>,
    pub(super) recoveries: i32,
}

impl fmt::Display for SuspendedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "warning: key {:?} ({}) suspended at {} since {} ({} recovery attempts): its call to \
             the processor with downstream key {} has no known outcome yet; a retry or the \
             recovery job resolves it, or it is held at the end of the recovery window",
            self.idem_key,
            self.scope,
            self.recovery_point,
            self.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.recoveries,
            self.downstream_key.as_deref().unwrap_or("(none)"),
        )
    }
}

/// The processor's ledger, as its list API gives it.
pub(super) struct Theirs {
    pub(super) charges: Vec<Charge>,
    pub(super) refunds: Vec<ProcessorRefund>,
    pub(super) disputes: Vec<Dispute>,
}

impl Theirs {
    pub(super) async fn read(processor: &ProcessorClient) -> anyhow::Result<Self> {
        Ok(Self {
            charges: processor.charges().await?,
            refunds: processor.refunds().await?,
            disputes: processor.disputes().await?,
        })
    }
}

/// idempay's ledger: the rows that name an object of the processor's, and the keys whose call to
/// it is held for an operator.
pub(super) struct Ours {
    pub(super) payments: Vec<OurPayment>,
    pub(super) refunds: Vec<OurRefund>,
    pub(super) disputes: Vec<OurDispute>,
    pub(super) held: Vec<HeldKey>,
    pub(super) suspended: Vec<SuspendedKey>,
}

/// A key held for an operator (`status = 'held'`).
pub(super) struct HeldKey {
    pub(super) scope: String,
    pub(super) idem_key: String,
    pub(super) downstream_key: Option<String>,
    pub(super) held_at: chrono::DateTime<chrono::Utc>,
}

/// A payment with the charge that recorded it.
pub(super) struct OurPayment {
    pub(super) id: String,
    pub(super) charge: String,
    pub(super) amount: i64,
    pub(super) currency: String,
    pub(super) status: PaymentStatus,
    pub(super) amount_refunded: i64,
    pub(super) amount_disputed: i64,
    /// What the processor took, as idempay recorded it (the whole amount on payments recorded
    /// before manual capture, unless declined).
    pub(super) amount_captured: i64,
    pub(super) amount_capturable: i64,
    /// Canceled because the processor released the authorization (`cancellation_reason`
    /// `expired`), not by a void of the merchant's.
    pub(super) expired: bool,
}

/// A refund with the processor's refund that made it, and its payment's charge. (A refund carries
/// no currency, here or at the processor: it is in its charge's, whose currency is its payment's.)
pub(super) struct OurRefund {
    pub(super) id: String,
    pub(super) processor_refund: String,
    pub(super) charge: Option<String>,
    pub(super) amount: i64,
    pub(super) status: OurRefundStatus,
}

/// A dispute of a charged payment, by the processor's dispute id, with that payment's charge.
pub(super) struct OurDispute {
    pub(super) id: String,
    pub(super) charge: String,
    pub(super) amount: i64,
    pub(super) status: DisputeStatus,
}

impl Ours {
    /// The whole ledger in one snapshot (on Citus, one per node, each holding whole accounts: a
    /// payment is read with its refunds and disputes), so that a payment's figures and the rows
    /// they sum are of one moment.
    pub(super) async fn read(pool: &PgPool) -> anyhow::Result<Self> {
        let mut tx = idempotency::connections::begin(pool).await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        // A status none of ours is an error, not a difference to report.
        let payments = sqlx::query!(
            r#"
            SELECT id, charge AS "charge!", amount, currency, status, amount_refunded,
                   amount_disputed, amount_capturable, cancellation_reason,
                   COALESCE(amount_captured, CASE WHEN status = $1 THEN 0 ELSE amount END)
                       AS "amount_captured!"
            FROM payments WHERE charge IS NOT NULL
            "#,
            PaymentStatus::Declined.as_str(),
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurPayment {
                status: stored(&row.status)?,
                id: row.id,
                charge: row.charge,
                amount: row.amount,
                currency: row.currency,
                amount_refunded: row.amount_refunded,
                amount_disputed: row.amount_disputed,
                amount_captured: row.amount_captured,
                amount_capturable: row.amount_capturable,
                expired: row.cancellation_reason.as_deref()
                    == Some(CancellationReason::Expired.as_str()),
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        let refunds = sqlx::query!(
            r#"
            SELECT r.id, r.processor_refund AS "processor_refund!", r.amount, r.status, p.charge
            FROM refunds r
            JOIN payments p ON p.account_id = r.account_id AND p.id = r.payment_id
            WHERE r.processor_refund IS NOT NULL
            "#
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurRefund {
                status: stored(&row.status)?,
                id: row.id,
                processor_refund: row.processor_refund,
                charge: row.charge,
                amount: row.amount,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        // A dispute is recorded under the processor's id for it (`data.dispute` of its event); one
        // of a payment with no charge has nothing at the processor to be compared with.
        let disputes = sqlx::query!(
            r#"
            SELECT d.id, p.charge AS "charge!", d.amount, d.lifecycle
            FROM disputes d
            JOIN payments p ON p.account_id = d.account_id AND p.id = d.payment_id
            WHERE p.charge IS NOT NULL
            "#
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurDispute {
                status: stored(&row.lifecycle)?,
                id: row.id,
                charge: row.charge,
                amount: row.amount,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        let held = sqlx::query_as!(
            HeldKey,
            r#"
            SELECT scope, idem_key, downstream_key, held_at AS "held_at!"
            FROM idempotency_keys WHERE status = 'held'
            ORDER BY held_at
            "#
        )
        .fetch_all(&mut *tx)
        .await?;
        let suspended = sqlx::query_as!(
            SuspendedKey,
            r#"
            SELECT scope, idem_key, recovery_point AS "recovery_point!", downstream_key,
                   created_at, recoveries
            FROM idempotency_keys
            WHERE status = 'in_progress' AND recovery_point IS NOT NULL AND locked_until <= now()
            ORDER BY created_at
            "#
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Self {
            payments,
            refunds,
            disputes,
            held,
            suspended,
        })
    }
}
