//! The units of work of `POST /v1/payments/{id}/capture` and `POST /v1/payments/{id}/cancel`, on
//! the steps every call to the processor shares (downstream/call.rs), like a refund's: check the
//! payment `requires_capture`, record a recovery point, capture or void the authorization at the
//! processor with the key's downstream key, then record the payment's new state, its event and the
//! key's completion in one transaction. A refusal (another state, more than authorized) is a
//! result, stored and replayed; so a capture under a new key after a capture is refused, never
//! made twice, and the processor, whose charge's row lock orders a capture, a void and the
//! authorization's expiry, refuses the loser of a race the check let through.

use std::future::Future;

use axum::http::StatusCode;
use sqlx::PgPool;

use super::authorization_state::{self, CancelState, CaptureState};
use super::disputed;
use super::model::{CancellationReason, PaymentId, PaymentStatus, payment_not_found};
use crate::accounts::AccountId;
use crate::downstream::call::{self, ProcessorCall};
use crate::downstream::{CaptureState as ProcessorCaptureState, Charge};
use crate::downstream::{ProcessorClient, ProcessorOutcome, ProcessorRefusal};
use crate::events::{self, EventType, NewEvent};
use crate::http::error::{ApiError, Problem, ProblemKind};
use idempotency::{Completion, Lease, StateVersion, StoredResponse};
use service::vocabulary::stored;

/// The recovery point of a capture: the capture was (about to be) requested at the processor.
pub const CAPTURE_REQUESTED: &str = "payment.capture_requested";
/// The recovery point of a cancel: the void was (about to be) requested at the processor.
pub const CANCEL_REQUESTED: &str = "payment.cancel_requested";

/// What a client asked of a manual payment.
#[derive(Clone, Debug)]
pub enum Asked {
    /// Take `amount` (all that is authorized when `None`); the rest is released.
    Capture { amount: Option<i64> },
    /// Release the authorization, for `reason`.
    Cancel { reason: Option<CancellationReason> },
}

/// A capture, as its recovery state records it.
#[derive(Clone, Debug)]
pub struct CaptureRequested(CaptureState);

/// A cancel, as its recovery state records it.
#[derive(Clone, Debug)]
pub struct CancelRequested(CancelState);

/// Captures or cancels `payment` of `account` under `lease`, or resumes the call an earlier holder
/// of the key made: the check first (its refusal is the key's result), then the unit of work every
/// call to the processor shares.
pub async fn capture_or_cancel(
    processor: ProcessorClient,
    pool: PgPool,
    lease: Lease,
    account: AccountId,
    payment: PaymentId,
    asked: Asked,
) -> Result<Completion, ApiError> {
    if lease.recovery_point().is_some() {
        return match asked {
            Asked::Capture { .. } => call::resume::<CaptureRequested>(processor, lease).await,
            Asked::Cancel { .. } => call::resume::<CancelRequested>(processor, lease).await,
        };
    }
    let authorized = match held(&pool, &account, &payment, &asked).await? {
        Ok(authorized) => authorized,
        Err(refusal) => return call::refuse(lease, &refusal).await,
    };
    let (account, payment) = (account.as_str().to_owned(), payment.as_str().to_owned());
    match asked {
        Asked::Capture { amount } => {
            let amount = amount.unwrap_or(authorized.capturable);
            if amount > authorized.capturable {
                let refusal = Problem::new(
                    ProblemKind::CaptureExceedsAuthorization,
                    format!(
                        "Payment `{payment}` authorized {}; {amount} cannot be captured of it.",
                        authorized.capturable
                    ),
                )
                .param("/amount_to_capture");
                return call::refuse(lease, &refusal).await;
            }
            let state = CaptureState::new(account, payment, authorized.charge, amount);
            call::start(processor, lease, CaptureRequested(state)).await
        }
        Asked::Cancel { reason } => {
            let reason = reason.map(|reason| reason.as_str().to_owned());
            let state = CancelState::new(account, payment, authorized.charge, reason);
            call::start(processor, lease, CancelRequested(state)).await
        }
    }
}

/// A payment that `requires_capture`: its charge and what it holds.
struct Authorized {
    charge: String,
    capturable: i64,
}

/// The payment, if it `requires_capture`; otherwise the refusal that is the key's result. The
/// processor decides again under its charge's lock, as the last word.
async fn held(
    pool: &PgPool,
    account: &AccountId,
    payment: &PaymentId,
    asked: &Asked,
) -> Result<Result<Authorized, Problem>, sqlx::Error> {
    let Some(row) = sqlx::query!(
        r#"
        SELECT status, charge, amount_capturable FROM payments
        WHERE id = $1 AND account_id = $2
        "#,
        payment.as_str(),
        account.as_str(),
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(Err(payment_not_found(payment.as_str())));
    };
    match (stored::<PaymentStatus>(&row.status)?, row.charge) {
        (PaymentStatus::RequiresCapture, Some(charge)) => Ok(Ok(Authorized {
            charge,
            capturable: row.amount_capturable,
        })),
        _ => Ok(Err(Problem::payment_unexpected_state(
            payment.as_str(),
            &row.status,
            asked.done(),
        ))),
    }
}

impl Asked {
    /// What is done, as a refusal says it was not.
    fn done(&self) -> &'static str {
        match self {
            Self::Capture { .. } => "captured",
            Self::Cancel { .. } => "canceled",
        }
    }
}

/// The processor's refusal of a capture or void is its answer about the charge (it was captured,
/// voided or expired meanwhile, by whatever came first under its lock): a result, stored.
fn refused_by_processor(payment: &str, doing: &str, refusal: &ProcessorRefusal) -> Option<Problem> {
    refusal.is_authorization_refused().then(|| {
        Problem::new(
            ProblemKind::PaymentUnexpectedState,
            format!("The processor refused: {refusal}. Payment `{payment}` was not {doing}."),
        )
    })
}

/// What the processor made under `downstream_key` on `charge`, read from the charge itself:
/// `made` when the capture or void under this key is the charge's; `None` when nothing was made
/// under it and nothing can be any more: the authorization still held (a call under the key that
/// never reached the processor), or released by something else (another key's capture or void,
/// the expiry), after which the processor refuses every release. The settle then completes the
/// key as nothing made, final; before, a release by another key was left to an operator "by
/// hand", and the key stayed held for ever (the model's liveness check found it: switch
/// `settle-gives-up-on-released`).
async fn made_on_charge(
    processor: &ProcessorClient,
    charge: &str,
    downstream_key: &str,
    made: impl Fn(&Charge) -> bool,
) -> anyhow::Result<Option<Charge>> {
    // Asked under the key: while the capture or void under it is still being made there, the
    // processor answers 409, and the settle fails, handing the key back held, rather than read an
    // authorization still held and record that nothing was made.
    let now = processor.charge_after(charge, downstream_key).await?;
    if made(&now) {
        return Ok(Some(now));
    }
    if now.capture_state != ProcessorCaptureState::RequiresCapture {
        tracing::info!(
            charge,
            downstream_key,
            state = %now.capture_state,
            "the authorization was released by another request or its expiry: nothing was made \
             under this key"
        );
    }
    Ok(None)
}

impl ProcessorCall for CaptureRequested {
    const POINT: &'static str = CAPTURE_REQUESTED;
    const WHAT: &'static str = "capture";
    const VERSIONS: &'static [StateVersion] = authorization_state::VERSIONS;
    type Answer = Charge;

    fn state(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(&self.0)
    }

    fn from_state(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        CaptureState::read(version, state).map(Self)
    }

    fn send(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = ProcessorOutcome<Charge>> + Send {
        processor.capture(downstream_key, &self.0.charge, Some(self.0.amount))
    }

    fn record(
        self,
        lease: Lease,
        charge: Charge,
    ) -> impl Future<Output = Result<Completion, ApiError>> + Send {
        let captured = charge.amount_captured.unwrap_or(self.0.amount);
        let (account, payment) = (self.0.account, self.0.payment);
        record(lease, account, payment, Change::Captured(captured))
    }

    async fn made_under(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> anyhow::Result<Option<Charge>> {
        made_on_charge(processor, &self.0.charge, downstream_key, |charge| {
            charge.capture_idempotency_key.as_deref() == Some(downstream_key)
        })
        .await
    }

    fn object(charge: &Charge) -> &str {
        &charge.id
    }

    fn refusal_as_result(&self, refusal: &ProcessorRefusal) -> Option<Problem> {
        refused_by_processor(&self.0.payment, "captured", refusal)
    }
}

impl ProcessorCall for CancelRequested {
    const POINT: &'static str = CANCEL_REQUESTED;
    const WHAT: &'static str = "void";
    const VERSIONS: &'static [StateVersion] = authorization_state::VERSIONS;
    type Answer = Charge;

    fn state(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(&self.0)
    }

    fn from_state(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        CancelState::read(version, state).map(Self)
    }

    fn send(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = ProcessorOutcome<Charge>> + Send {
        processor.void(downstream_key, &self.0.charge)
    }

    fn record(
        self,
        lease: Lease,
        _voided: Charge,
    ) -> impl Future<Output = Result<Completion, ApiError>> + Send {
        let (account, payment) = (self.0.account, self.0.payment);
        record(lease, account, payment, Change::Canceled(self.0.reason))
    }

    async fn made_under(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> anyhow::Result<Option<Charge>> {
        made_on_charge(processor, &self.0.charge, downstream_key, |charge| {
            charge.void_idempotency_key.as_deref() == Some(downstream_key)
        })
        .await
    }

    fn object(charge: &Charge) -> &str {
        &charge.id
    }

    fn refusal_as_result(&self, refusal: &ProcessorRefusal) -> Option<Problem> {
        refused_by_processor(&self.0.payment, "canceled", refusal)
    }
}

/// What the processor's answer does to the payment.
enum Change {
    /// Captured this much: `succeeded`.
    Captured(i64),
    /// Voided, for this reason: `canceled`.
    Canceled(Option<String>),
}

/// Records the payment's new state with its event (`payment.captured`, `payment.canceled`) and
/// completes the key with the payment, 200, in one transaction. The processor made the change, so
/// it is recorded whatever idempay's row says meanwhile.
async fn record(
    lease: Lease,
    account: String,
    payment: String,
    change: Change,
) -> Result<Completion, ApiError> {
    let (status, captured, reason, kind) = match change {
        Change::Captured(amount) => (
            PaymentStatus::Succeeded,
            amount,
            None,
            EventType::PaymentCaptured,
        ),
        Change::Canceled(reason) => (
            PaymentStatus::Canceled,
            0,
            reason,
            EventType::PaymentCanceled,
        ),
    };
    // A parameter, not `now()` in the statement: Citus refuses a function that is not immutable
    // inside a CASE of a distributed UPDATE.
    let at = lease.now();
    let canceled_at = (status == PaymentStatus::Canceled).then_some(at);
    let mut tx = lease.begin().await?;
    let held = sqlx::query_scalar!(
        "UPDATE payments
         SET status = $3, amount_captured = $4, amount_capturable = 0, canceled_at = $6,
             cancellation_reason = $5
         WHERE account_id = $2 AND id = $1
         RETURNING amount_disputed",
        payment,
        account,
        status.as_str(),
        captured,
        reason,
        canceled_at,
    )
    .fetch_one(&mut *tx)
    .await?;
    // A dispute that arrived before this capture was recorded holds what the capture took; a
    // cancel leaves nothing for one to hold (`payments::disputed`). The UPDATE holds the row lock.
    let payment = disputed::locked_by_caller(&account, &payment, held)
        .recount(&mut tx)
        .await?
        .payment
        .parse()?;
    let event = NewEvent::new(kind, &payment, at).map_err(anyhow::Error::from)?;
    let engine = lease.engine().await?;
    events::write(&mut tx, engine, &account, std::slice::from_ref(&event)).await?;
    let response = StoredResponse::json(StatusCode::OK, &payment).map_err(anyhow::Error::from)?;
    let completion = lease.complete(tx, response).await?;
    if completion.committed() {
        events::written([&event]);
    }
    Ok(completion)
}
