//! The unit of work of `POST /v1/payments`: charge at the processor exactly once, then record the
//! payment with the key's completion. What is the charge's own is here ([`ChargeRequested`]); the
//! steps every call to the processor shares are downstream/call.rs, the same for a fresh request, a
//! retry that takes over a key its first request left behind, and the recovery job.
//!
//! 1. **Recovery point**, recorded by the key's reservation itself, before the processor hears of
//!    the charge: what the charge is (its parameters, the payment id it will be recorded under,
//!    in a versioned format of its own, charge_state.rs) and the downstream key it is sent with.
//!    Whoever picks the key up later, this release or another, resumes from here.
//! 2. **The charge**, sent with the downstream key as its `Idempotency-Key`, so every attempt of
//!    every holder of this key names one charge at the processor, which answers repeats with it.
//! 3. **Three outcomes**: a charge (succeeded or declined) is recorded with its event
//!    (`payment.succeeded`, `payment.declined`) and the key's completion in one statement; a
//!    definite "nothing was charged" forgets the point and releases the key; an unknown outcome
//!    (timeout, lost answer, 5xx) keeps the key for the next attempt.

use std::future::Future;

use axum::http::{StatusCode, header};
use sqlx::PgConnection;
use sqlx::types::Json;

use super::charge_state::{self, ChargeState};
use super::model::NewPayment;
use super::model::{CaptureMethod, Payment, PaymentId, PaymentStatus};
use crate::accounts::AccountId;
use crate::db::Engine;
use crate::downstream::call::{self, ProcessorCall};
use crate::downstream::{Charge, ChargeStatus};
use crate::downstream::{ChargeRequest, ProcessorClient, ProcessorOutcome};
use crate::events::{self, EventType, NewEvent};
use crate::http::error::{ApiError, Problem};
use crate::metadata::Metadata;
use idempotency::{Completion, Fence, IdempotencyKey, Lease, StateVersion, StoredResponse};
use service::vocabulary::stored;

/// The recovery point of a payment: the charge was (about to be) requested.
pub const CHARGE_REQUESTED: &str = "payment.charge_requested";

/// A payment's charge, as its recovery state records it (charge_state.rs): what resuming it needs.
#[derive(Clone, Debug)]
pub struct ChargeRequested(ChargeState);

impl ChargeRequested {
    /// A new payment of `account`: its id chosen now, so every attempt records the same payment.
    pub fn new(account: AccountId, request: NewPayment) -> Self {
        Self(ChargeState::new(&account, &PaymentId::generate(), request))
    }

    fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            amount: self.0.amount,
            currency: self.0.currency.clone(),
            payment_method: self.0.payment_method.clone(),
            capture: self.0.capture_method != CaptureMethod::Manual.as_str(),
        }
    }
}

/// The charge, made and recorded by the unit of work every call to the processor shares
/// (downstream/call.rs): the reservation records its point (see `create_payment`), and a retry, a
/// takeover or the recovery job resumes it with the same downstream key.
impl ProcessorCall for ChargeRequested {
    const POINT: &'static str = CHARGE_REQUESTED;
    const WHAT: &'static str = "charge";
    const VERSIONS: &'static [StateVersion] = charge_state::VERSIONS;
    type Answer = Charge;

    fn state(&self) -> Result<serde_json::Value, serde_json::Error> {
        self.0.to_value()
    }

    fn from_state(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        ChargeState::read(version, state).map(Self)
    }

    fn send(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = ProcessorOutcome<Charge>> + Send {
        let request = self.charge_request();
        async move { processor.charge(downstream_key, &request).await }
    }

    /// The processor's charge made under the key, for this charge's amount and currency.
    async fn made_under(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> anyhow::Result<Option<Charge>> {
        let made = call::the_one_made(processor.charges_made_under(downstream_key).await?)?;
        let asked = self.charge_request();
        if let Some(charge) = &made
            && (charge.amount != asked.amount || charge.currency != asked.currency)
        {
            anyhow::bail!(
                "the processor's charge {} under this key is {} {}, where the key asked {} {}: \
                 settle it by hand",
                charge.id,
                charge.amount,
                charge.currency,
                asked.amount,
                asked.currency
            );
        }
        Ok(made)
    }

    fn record(
        self,
        lease: Lease,
        charge: Charge,
    ) -> impl Future<Output = Result<Completion, ApiError>> + Send {
        record(lease, self, charge)
    }

    fn object(charge: &Charge) -> &str {
        &charge.id
    }
}

/// Records the processor's charge as the payment, with its event, and completes the key, in one
/// statement.
async fn record(
    lease: Lease,
    ChargeRequested(intent): ChargeRequested,
    charge: Charge,
) -> Result<Completion, ApiError> {
    let capture_method: CaptureMethod = stored(&intent.capture_method)?;
    // A manual payment's charge only authorized: the amount is held until it is captured.
    let (status, kind, captured, capturable) = match (charge.status, capture_method) {
        (ChargeStatus::Declined, _) => (PaymentStatus::Declined, EventType::PaymentDeclined, 0, 0),
        (ChargeStatus::Succeeded, CaptureMethod::Automatic) => (
            PaymentStatus::Succeeded,
            EventType::PaymentSucceeded,
            intent.amount,
            0,
        ),
        (ChargeStatus::Succeeded, CaptureMethod::Manual) => (
            PaymentStatus::RequiresCapture,
            EventType::PaymentAuthorized,
            0,
            intent.amount,
        ),
    };
    let id = PaymentId::parse(&intent.payment)
        .ok_or_else(|| anyhow::anyhow!("the recovery state's payment id `{}`", intent.payment))?;
    // A new payment, as it is recorded of the processor's charge: nothing refunded or disputed.
    let payment = Payment {
        id,
        object: "payment",
        amount: intent.amount,
        currency: intent.currency,
        status,
        payment_method: stored(&intent.payment_method)?,
        capture_method,
        order: intent.order,
        description: intent.description,
        amount_captured: captured,
        amount_capturable: capturable,
        amount_refunded: 0,
        amount_disputed: 0,
        charge: Some(charge.id.clone()),
        created_at: lease.now(),
        canceled_at: None,
        cancellation_reason: None,
        metadata: Metadata::kept(intent.metadata),
    };
    let response = match charge.status {
        ChargeStatus::Succeeded => StoredResponse::json(StatusCode::CREATED, &payment)
            .map_err(anyhow::Error::from)?
            .with_header(header::LOCATION, payment.location()),
        ChargeStatus::Declined => Problem::card_declined(
            payment.id.as_str(),
            charge.decline_code.as_deref().unwrap_or("generic_decline"),
        )
        .stored(),
    };
    let event = NewEvent::new(kind, &payment, payment.created_at).map_err(anyhow::Error::from)?;
    let key = lease.key().clone();
    let account = AccountId::kept(intent.account);
    if lease.engine().await? == Engine::Citus {
        // The same three writes as separate statements of one transaction, all routed to the
        // account's node, the completion last (see `Lease::engine`).
        let mut tx = lease.begin().await?;
        insert(&mut tx, &account, &payment, &key).await?;
        events::write(
            &mut tx,
            Engine::Citus,
            account.as_str(),
            std::slice::from_ref(&event),
        )
        .await?;
        let completion = lease.complete(tx, response).await?;
        if completion.committed() {
            events::written([&event]);
        }
        return Ok(completion);
    }
    let completion = lease.complete_with(response, move |connection, fence| {
        Box::pin(async move {
            insert_and_complete(connection, &account, &payment, &event, &key, fence).await?;
            events::written([&event]);
            Ok(())
        })
    });
    Ok(completion.await?)
}

/// Records the payment alone, in the work's transaction: the form for a distributed database.
async fn insert(
    connection: &mut PgConnection,
    account: &AccountId,
    payment: &Payment,
    key: &IdempotencyKey,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO payments
            (id, account_id, amount, currency, status, payment_method, order_ref, description,
             idempotency_key, charge, created_at, metadata, capture_method, amount_captured,
             amount_capturable)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
        "#,
        payment.id.as_str(),
        account.as_str(),
        payment.amount,
        payment.currency,
        payment.status.as_str(),
        payment.payment_method.as_str(),
        payment.order.as_deref(),
        payment.description.as_deref(),
        key.as_str(),
        payment.charge.as_deref(),
        payment.created_at,
        Json(&payment.metadata) as _,
        payment.capture_method.as_str(),
        payment.amount_captured,
        payment.amount_capturable,
    )
    .execute(connection)
    .await?;
    Ok(())
}

/// Records the payment and its event and completes its key with `fence` in one statement: all
/// three commit, or, when another request took the key over, none. The event costs no round trip:
/// it is one more row (and its webhook deliveries, one per subscribed endpoint) in the same
/// statement. The endpoints' status is named as text (`enabled`), as `events::write` names it:
/// `webhooks`, which owns the type, builds on payments.
async fn insert_and_complete(
    connection: &mut PgConnection,
    account: &AccountId,
    payment: &Payment,
    event: &NewEvent,
    key: &IdempotencyKey,
    fence: Fence,
) -> Result<(), sqlx::Error> {
    sqlx::query_scalar!(
        r#"
        WITH payment AS (
            INSERT INTO payments
                (id, account_id, amount, currency, status, payment_method, order_ref, description,
                 idempotency_key, charge, created_at, metadata, capture_method, amount_captured,
                 amount_capturable)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $22, $23, $24, $25)
            RETURNING id
        ), event AS (
            INSERT INTO events (id, account_id, type, body, created_at)
            VALUES ($18, $2, $19, $20, $11)
        ), deliveries AS (
            INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id)
            SELECT endpoint.account_id, $18, endpoint.url, $20, endpoint.id
            FROM webhook_endpoints AS endpoint
            WHERE endpoint.account_id = $2 AND endpoint.status = 'enabled'
              AND ($19 = ANY (endpoint.enabled_events) OR '*' = ANY (endpoint.enabled_events))
        )
        SELECT idempotency_complete($21, $12, $13, $14, $15, $16, $17) AS "key_id!" FROM payment
        "#,
        payment.id.as_str(),
        account.as_str(),
        payment.amount,
        payment.currency,
        payment.status.as_str(),
        payment.payment_method.as_str(),
        payment.order.as_deref(),
        payment.description.as_deref(),
        key.as_str(),
        payment.charge.as_deref(),
        payment.created_at,
        fence.key_id,
        fence.token,
        fence.response_code,
        fence.response_headers,
        &fence.response_body[..],
        fence.ttl_ms,
        event.id,
        event.kind.as_str(),
        &event.body,
        &*fence.owner,
        Json(&payment.metadata) as _,
        payment.capture_method.as_str(),
        payment.amount_captured,
        payment.amount_capturable,
    )
    .fetch_one(connection)
    .await?;
    Ok(())
}
