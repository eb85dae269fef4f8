//! The unit of work of `POST /v1/payments/{id}/refunds`, on the steps every call to the processor
//! shares (downstream/call.rs), like a payment's: check what is refundable, record a recovery point,
//! refund at the processor with the key's downstream key, then record the refund with the key's
//! completion. A refusal (not refundable, more than remains) is a result, stored and replayed.

use std::future::Future;

use axum::http::{StatusCode, header};
use sqlx::PgPool;
use sqlx::types::Json;

use super::model::{RefundId, RefundRow, RefundStatus};
use super::refund_state::{self, Refund, RefundState};
use crate::accounts::AccountId;
use crate::downstream::ProcessorRefund;
use crate::downstream::call::{self, ProcessorCall};
use crate::downstream::{ProcessorClient, ProcessorOutcome, ProcessorRefusal};
use crate::events::{self, EventType, NewEvent};
use crate::http::error::{ApiError, Problem, ProblemKind};
use crate::metadata::Metadata;
use crate::payments::{PaymentId, PaymentStatus, disputed, payment_not_found};
use idempotency::{Completion, Lease, StateVersion, StoredResponse};
use service::vocabulary::stored;

/// The recovery point of a refund: the refund was (about to be) requested at the processor.
pub const REFUND_REQUESTED: &str = "refund.refund_requested";

/// What the client asked for.
#[derive(Clone, Debug)]
pub struct RefundAsked {
    pub account: AccountId,
    pub payment: PaymentId,
    /// All that remains when `None`.
    pub amount: Option<i64>,
    pub reason: Option<String>,
    pub metadata: Metadata,
}

/// A refund, as its recovery state records it (refund_state.rs): what resuming it needs.
#[derive(Clone, Debug)]
pub struct RefundRequested(RefundState);

/// Refunds and records one refund under `lease`, or resumes the one an earlier holder of the key
/// requested: the check first (its refusal is the key's result), then the unit of work every call
/// to the processor shares (downstream/call.rs).
pub async fn refund_and_record(
    processor: ProcessorClient,
    pool: PgPool,
    lease: Lease,
    asked: RefundAsked,
) -> Result<Completion, ApiError> {
    if lease.recovery_point().is_some() {
        return call::resume::<RefundRequested>(processor, lease).await;
    }
    match check(&pool, asked).await? {
        Ok(intent) => call::start(processor, lease, intent).await,
        Err(refusal) => call::refuse(lease, &refusal).await,
    }
}

/// The refund, made and recorded by the unit of work every call to the processor shares.
impl ProcessorCall for RefundRequested {
    const POINT: &'static str = REFUND_REQUESTED;
    const WHAT: &'static str = "refund";
    const VERSIONS: &'static [StateVersion] = refund_state::VERSIONS;
    type Answer = ProcessorRefund;

    fn state(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.0.to_value()
    }

    fn from_state(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        RefundState::read(version, state).map(Self)
    }

    fn send(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = ProcessorOutcome<ProcessorRefund>> + Send {
        processor.refund(downstream_key, &self.0.charge, Some(self.0.amount))
    }

    fn record(
        self,
        lease: Lease,
        refunded: ProcessorRefund,
    ) -> impl Future<Output = Result<Completion, ApiError>> + Send {
        record(lease, self, refunded)
    }

    /// The processor's refund made under the key, of this refund's charge and amount.
    async fn made_under(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> anyhow::Result<Option<ProcessorRefund>> {
        let made = call::the_one_made(processor.refunds_made_under(downstream_key).await?)?;
        if let Some(refund) = &made
            && (refund.charge != self.0.charge || refund.amount != self.0.amount)
        {
            anyhow::bail!(
                "the processor's refund {} under this key is {} of charge {}, where the key asked \
                 {} of charge {}: settle it by hand",
                refund.id,
                refund.amount,
                refund.charge,
                self.0.amount,
                self.0.charge
            );
        }
        Ok(made)
    }

    fn object(refunded: &ProcessorRefund) -> &str {
        &refunded.id
    }

    /// The processor keeps its own books: a refusal of the amount is a result, like ours.
    fn refusal_as_result(&self, refusal: &ProcessorRefusal) -> Option<Problem> {
        refusal.is_refund_refused().then(|| {
            Problem::new(
                ProblemKind::RefundExceedsPayment,
                format!(
                    "The processor refused to refund {} of payment `{}`: {refusal}",
                    self.0.amount, self.0.payment
                ),
            )
        })
    }
}

/// Whether the payment can be refunded by as much as asked. The processor checks it again, as
/// the last word: two refunds with different keys can both pass this check, and it refuses the
/// one that would go beyond the charge.
async fn check(
    pool: &PgPool,
    asked: RefundAsked,
) -> Result<Result<RefundRequested, Problem>, sqlx::Error> {
    let Some(paid) = sqlx::query!(
        r#"
        SELECT COALESCE(amount_captured, amount) AS "captured!", amount_refunded,
               amount_disputed, status, charge
        FROM payments
        WHERE id = $1 AND account_id = $2
        "#,
        asked.payment.as_str(),
        asked.account.as_str(),
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(Err(payment_not_found(asked.payment.as_str())));
    };
    let payment = &asked.payment;
    let status: PaymentStatus = stored(&paid.status)?;
    let (Some(charge), PaymentStatus::Succeeded) = (paid.charge, status) else {
        return Ok(Err(Problem::new(
            ProblemKind::PaymentNotRefundable,
            format!(
                "Payment `{payment}` is {}; only succeeded payments can be refunded.",
                paid.status
            ),
        )));
    };
    let remaining = refundable(paid.captured, paid.amount_refunded, paid.amount_disputed);
    let amount = asked.amount.unwrap_or(remaining);
    if remaining == 0 || amount > remaining {
        return Ok(Err(Problem::new(
            ProblemKind::RefundExceedsPayment,
            format!(
                "Only {remaining} of payment `{payment}` remains refundable (its amount \
                 captured {}, less {} refunded and {} disputed); {amount} was asked.",
                paid.captured, paid.amount_refunded, paid.amount_disputed
            ),
        )));
    }
    Ok(Ok(RefundRequested(RefundState::new(Refund {
        account: asked.account.as_str().to_owned(),
        payment: asked.payment.as_str().to_owned(),
        charge,
        amount,
        reason: asked.reason,
        metadata: asked.metadata.into_pairs(),
        refund: RefundId::generate().into(),
    }))))
}

/// What remains refundable of a payment: what was captured, less what was refunded and what the
/// cardholder disputes (that money is the bank's to take back; Stripe refuses to refund it too).
/// The same rule as the `payments_money_held` CHECK.
fn refundable(captured: i64, refunded: i64, disputed: i64) -> i64 {
    (captured - refunded - disputed).max(0)
}

/// Records the processor's refund and the payment's new totals, with their events
/// (`refund.created`, then `payment.refunded` with the payment after the refund), and completes the
/// key, in one transaction. The events cost one statement more in it (both rows in one INSERT):
/// their bodies hold the payment as the UPDATE left it, which only its answer tells. The
/// payment's row lock makes concurrent refunds of one payment take turns.
///
/// The refund is a fact by now (the processor made it), so it is recorded in full even when a
/// dispute arrived since the check (or the key is resumed long after it): the disputed amount,
/// recounted, then holds what still fits beside the refunds, and the payment's disputes are
/// flagged `needs_review`, since the money may leave twice. This path and the check agree on one rule,
/// [`refundable`], which the CHECK on `payments` enforces.
async fn record(
    lease: Lease,
    RefundRequested(intent): RefundRequested,
    refunded: ProcessorRefund,
) -> Result<Completion, ApiError> {
    let mut tx = lease.begin().await?;
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        INSERT INTO refunds
            (id, payment_id, account_id, amount, reason, status, idempotency_key, processor_refund,
             metadata)
        VALUES ($1, $2, $3, $4, $5, $9, $6, $7, $8)
        RETURNING id, payment_id, amount, reason, status, processor_refund, created_at,
                  metadata AS "metadata: Json<Metadata>"
        "#,
        intent.refund,
        intent.payment,
        intent.account,
        refunded.amount,
        intent.reason.as_deref(),
        lease.key().as_str(),
        refunded.id,
        Json(&intent.metadata) as _,
        RefundStatus::Succeeded.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    // The payment's row lock (NO KEY UPDATE, the lock the UPDATE takes anyway: a full FOR UPDATE
    // would wait on the key share lock each concurrent refund's insert, its foreign key, holds,
    // and they deadlock), with what the disputes held before the refund.
    let locked = disputed::lock(&mut tx, &intent.account, &intent.payment).await?;
    // The disputed amount capped at what still fits beside the refunds, so that the row keeps its
    // CHECK until the recount sets it exactly (`payments::disputed`).
    sqlx::query!(
        r#"
        UPDATE payments
        SET amount_refunded = amount_refunded + $2,
            amount_disputed = LEAST(amount_disputed,
                COALESCE(amount_captured, amount) - amount_refunded - $2),
            status = CASE WHEN amount_refunded + $2 = COALESCE(amount_captured, amount)
                          THEN 'refunded' ELSE status END
        WHERE account_id = $3 AND id = $1
        "#,
        intent.payment,
        refunded.amount,
        intent.account,
    )
    .execute(&mut *tx)
    .await?;
    let payment = locked
        .recount_flagging(&mut tx, "a refund")
        .await?
        .payment
        .parse()?;
    let refund = row.parse()?;
    // The refund's `created_at` is its transaction's `now()`: the time of both events.
    let at = refund.created_at;
    let written = [
        NewEvent::new(EventType::RefundCreated, &refund, at).map_err(anyhow::Error::from)?,
        NewEvent::new(EventType::PaymentRefunded, &payment, at).map_err(anyhow::Error::from)?,
    ];
    let engine = lease.engine().await?;
    events::write(&mut tx, engine, &intent.account, &written).await?;
    let response = StoredResponse::json(StatusCode::CREATED, &refund)
        .map_err(anyhow::Error::from)?
        .with_header(header::LOCATION, refund.location());
    let completion = lease.complete(tx, response).await?;
    if completion.committed() {
        events::written(&written);
    }
    Ok(completion)
}
