//! The unit of work of `POST /v1/payments`: charge at the processor exactly once, then record the
//! payment with the key's completion. The same function serves a fresh request, a retry that
//! takes over a key its first request left behind, and the recovery job.
//!
//! 1. **Recovery point**, recorded by the key's reservation itself, before the processor hears of
//!    the charge: what the charge is (its parameters, the payment id it will be recorded under) and
//!    the downstream key it is sent with. Whoever picks the key up later resumes from here.
//! 2. **The charge**, sent with the downstream key as its `Idempotency-Key`, so every attempt of
//!    every holder of this key names one charge at the processor, which answers repeats with it.
//! 3. **Three outcomes**: a charge (succeeded or declined) is recorded with its event
//!    (`payment.succeeded`, `payment.declined`) and the key's completion in one statement; a
//!    definite "nothing was charged" forgets the point and releases the key; an unknown outcome
//!    (timeout, lost answer, 5xx) keeps the key for the next attempt.

use axum::http::{StatusCode, header};
use serde::{Deserialize, Serialize};

use super::model::{Payment, PaymentId, PaymentStatus};
use super::{NewPayment, insert, insert_and_complete};
use crate::accounts::AccountId;
use crate::db::Engine;
use crate::events::{self, EventType, NewEvent};
use crate::http::error::{ApiError, Problem};
use crate::processor::client;
use crate::processor::{Charge, ChargeRequest, ChargeStatus, Outcome, ProcessorClient};
use idempotency::{Completion, Lease, StoredResponse};

/// The recovery point of a payment: the charge was (about to be) requested.
pub const CHARGE_REQUESTED: &str = "payment.charge_requested";

/// What resuming a payment needs, recorded on its key with the recovery point.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChargeRequested {
    account: AccountId,
    /// The payment's id, chosen before the charge, so every attempt records the same payment.
    payment: PaymentId,
    request: NewPayment,
}

impl ChargeRequested {
    pub fn new(account: AccountId, request: NewPayment) -> Self {
        Self {
            account,
            payment: PaymentId::generate(),
            request,
        }
    }

    fn charge_request(&self) -> ChargeRequest {
        ChargeRequest {
            amount: i64::from(self.request.amount),
            currency: self.request.currency.as_str().to_owned(),
            payment_method: self.request.payment_method.as_str().to_owned(),
        }
    }
}

/// Charges and records one payment under `lease`, from the recovery point its key is at: the
/// reservation (or the takeover) recorded it from the request (see `create_payment`), or an
/// earlier holder of the key did, whose charge is then resumed with the same downstream key.
pub async fn charge_and_record(
    processor: ProcessorClient,
    mut lease: Lease,
) -> Result<Completion, ApiError> {
    let (intent, downstream_key, earlier) = match lease.recovery_point() {
        Some(point) if point.name == CHARGE_REQUESTED => (
            serde_json::from_value::<ChargeRequested>(point.state.clone())
                .map_err(|error| anyhow::anyhow!("unreadable recovery point: {error}"))?,
            point.downstream_key.clone(),
            point.earlier_calls,
        ),
        _ => return Err(anyhow::anyhow!("a payment's key without its recovery point").into()),
    };
    let request = intent.charge_request();
    let charged = client::until_known("charge", earlier, || {
        processor.charge(&downstream_key, &request)
    });
    match charged.await {
        Outcome::Done(charge) => record(lease, intent, charge).await,
        Outcome::NotDone(refusal) => {
            // Nothing was charged, and no call with the downstream key can have been made
            // (`until_known` says unknown otherwise): the retry may start afresh, as after any
            // failure of ours.
            if !lease.clear_recovery_point().await? {
                return Ok(lease.lost());
            }
            Err(client::refused_problem("charge", &refusal).into())
        }
        Outcome::Unknown(reason) => {
            tracing::warn!(%reason, downstream_key, "the charge's outcome is unknown");
            Err(client::unknown_problem("charge").into())
        }
    }
}

/// Records the processor's charge as the payment, with its event, and completes the key, in one
/// statement.
async fn record(
    lease: Lease,
    intent: ChargeRequested,
    charge: Charge,
) -> Result<Completion, ApiError> {
    let (status, kind) = match charge.status {
        ChargeStatus::Succeeded => (PaymentStatus::Succeeded, EventType::PaymentSucceeded),
        ChargeStatus::Declined => (PaymentStatus::Declined, EventType::PaymentDeclined),
    };
    let payment = Payment::new(
        intent.payment,
        &intent.request,
        status,
        charge.id.clone(),
        lease.now(),
    );
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
    let event = NewEvent::payment(kind, payment.clone(), payment.created_at)
        .map_err(anyhow::Error::from)?;
    let key = lease.key().clone();
    let account = intent.account;
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
