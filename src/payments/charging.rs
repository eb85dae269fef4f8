//! The unit of work of `POST /v1/payments`: charge at the processor exactly once, then record the
//! payment with the key's completion. What is the charge's own is here ([`ChargeRequested`]); the
//! steps every call to the processor shares are downstream/call.rs, the same for a fresh request, a
//! retry that takes over a key its first request left behind, and the recovery job.
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

use std::future::Future;

use axum::http::{StatusCode, header};
use serde::{Deserialize, Serialize};

use super::model::{Payment, PaymentId, PaymentStatus};
use super::{NewPayment, insert, insert_and_complete};
use crate::accounts::AccountId;
use crate::db::Engine;
use crate::downstream::call::{self, ProcessorCall};
use crate::downstream::{ChargeRequest, Outcome, ProcessorClient};
use crate::events::{self, EventType, NewEvent};
use crate::http::error::{ApiError, Problem};
use idempotency::{Completion, Lease, StoredResponse};
use processor::{Charge, ChargeStatus};

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

/// The charge, made and recorded by the unit of work every call to the processor shares
/// (downstream/call.rs): the reservation records its point (see `create_payment`), and a retry, a
/// takeover or the recovery job resumes it with the same downstream key.
impl ProcessorCall for ChargeRequested {
    const POINT: &'static str = CHARGE_REQUESTED;
    const WHAT: &'static str = "charge";
    type Answer = Charge;

    fn send(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = Outcome<Charge>> + Send {
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
    let event = NewEvent::new(kind, &payment, payment.created_at).map_err(anyhow::Error::from)?;
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
