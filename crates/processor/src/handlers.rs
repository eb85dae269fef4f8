//! The processor's handlers. The mutating ones run through [`Idempotency::run`] exactly as
//! idempay's payments and refunds do: the ledger rows, the outbox event and the key's completion
//! commit in one transaction, and a retry with the same key is answered from the stored response.
//!
//! [`Idempotency::run`]: idempotency::Idempotency::run

use std::future::Future;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use sqlx::PgConnection;

use crate::ProcessorState;
use crate::deadline::CallDeadline;
use crate::extract::{Authorized, KeyQuery, KeyedPageQuery, PathId};
use crate::faults::Faults;
use crate::model::{
    CaptureState, Charge, ChargeId, ChargeRow, ChargeStatus, DisputeId, DisputeRow, NewCharge,
    NewDispute, NewRefund, PaymentMethod, ProcessorEventType, ProcessorRefund, RefundId, RefundRow,
    RefundStatus, tagged,
};
use crate::problem::{Error, Problem, ProblemKind};
use idempotency::engine::Engine;
use idempotency::{
    Completion, Fence, IDEMPOTENT_REPLAYED, IdempotencyKey, Idempotent, Lease, StoredResponse,
};
use service::ids::PublicId;
use service::outbox::delivery;
use service::pagination::{List, PageRequest};
use service::server::Hangup;
use service::vocabulary::stored;

/// The decline code of `pm_card_chargeDeclined`, as Stripe's test card answers.
const DECLINE_CODE: &str = "generic_decline";

// -------------------------------------------------------------------------------------------
// Faults
// -------------------------------------------------------------------------------------------

impl ProcessorState {
    /// Answers a mutating request through the configured faults: 503 before anything happens, or
    /// the answer of a first execution lost after its commit.
    pub(crate) async fn with_faults(
        &self,
        hangup: Option<Extension<Hangup>>,
        answer: impl Future<Output = Result<Response, Error>>,
    ) -> Result<Response, Error> {
        let faults = self.faults();
        if faults.fail.happens() {
            return Err(Problem::new(
                ProblemKind::ServiceUnavailable,
                "The processor failed before doing anything (IDEMPAY_PROCESSOR_FAIL).",
            )
            .retry_after(Duration::from_secs(1))
            .into());
        }
        let lose = faults.lose_answers.happens();
        let response = answer.await?;
        // A replay is answered: the lost answer's retry learns what happened.
        let first = !response.headers().contains_key(IDEMPOTENT_REPLAYED);
        match hangup {
            Some(Extension(hangup)) if lose && first => {
                tracing::info!("losing the answer (IDEMPAY_PROCESSOR_LOSE_ANSWERS)");
                hangup.now();
                // The connection is dropped with this future; answering would race the drop.
                std::future::pending().await
            }
            _ => Ok(response),
        }
    }

    /// The injected latency, inside the key's lease and before the effect.
    pub(crate) async fn delay(&self) {
        let latency = self.faults().latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// The faults in force now.
    pub(crate) fn faults(&self) -> Faults {
        *self
            .faults
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes an event to the outbox in the caller's transaction, when events are delivered.
    pub(crate) async fn announce(
        &self,
        conn: &mut PgConnection,
        kind: ProcessorEventType,
        at: DateTime<Utc>,
        data: &impl Serialize,
    ) -> Result<(), Error> {
        let Some(url) = &self.webhook_url else {
            return Ok(());
        };
        let body = delivery::envelope(kind.as_str(), at, data).map_err(anyhow::Error::from)?;
        delivery::enqueue(
            conn,
            crate::extract::SCOPE_OWNER,
            &delivery::event_id(),
            url,
            &body,
        )
        .await?;
        Ok(())
    }

    /// The work of a keyed route that changes a charge: after the injected latency, and unless the
    /// call's deadline passed (see `deadline.rs`), `change` runs in the key's transaction (given the key and the lease's time); what it made is announced and
    /// answered, and a refusal is answered. Either answer is the key's stored response, committed
    /// with the change and its event, so a repeat of the key gets it again and changes nothing.
    pub(crate) async fn change_under_key<T: Serialize>(
        &self,
        lease: Lease,
        deadline: CallDeadline,
        change: impl AsyncFnOnce(
            &mut PgConnection,
            &IdempotencyKey,
            DateTime<Utc>,
        ) -> Result<Result<Made<T>, Problem>, sqlx::Error>,
    ) -> Result<Completion, Error> {
        self.delay().await;
        deadline.check()?;
        let at = lease.now();
        let mut tx = lease.begin().await?;
        let response = match change(&mut tx, lease.key(), at).await? {
            Ok(made) => {
                self.announce(&mut tx, made.event, at, &made.data).await?;
                StoredResponse::json(made.status, &tagged(made.object, &made.answer))
                    .map_err(anyhow::Error::from)?
            }
            Err(refusal) => refusal.stored(),
        };
        Ok(lease.complete(tx, response).await?)
    }
}

/// What a keyed route made: the object it answers with (`object` names its kind) under `status`,
/// and the event that announces it, with its data.
pub(crate) struct Made<T> {
    pub(crate) status: StatusCode,
    pub(crate) object: &'static str,
    pub(crate) answer: T,
    pub(crate) event: ProcessorEventType,
    pub(crate) data: serde_json::Value,
}

// -------------------------------------------------------------------------------------------
// Charges
// -------------------------------------------------------------------------------------------

/// `POST /v1/charges`: 201 with the charge, or 402 naming the declined charge; both are results,
/// recorded and replayed.
pub(crate) async fn create_charge(
    State(state): State<ProcessorState>,
    hangup: Option<Extension<Hangup>>,
    deadline: CallDeadline,
    Idempotent { request, body }: Idempotent<NewCharge>,
) -> Result<Response, Error> {
    let shared = state.clone();
    let answer = state
        .idempotency
        .run(request, move |lease| charge(shared, lease, deadline, body));
    state.with_faults(hangup, answer).await
}

async fn charge(
    state: ProcessorState,
    lease: Lease,
    deadline: CallDeadline,
    new: NewCharge,
) -> Result<Completion, Error> {
    state.delay().await;
    let decline_code = match new.payment_method {
        PaymentMethod::CardVisa => None,
        PaymentMethod::CardChargeDeclined => Some(DECLINE_CODE),
        PaymentMethod::CardSlow => {
            tokio::time::sleep(state.slow_charge).await;
            None
        }
    };
    // After the waits, right before the transaction that makes the charge.
    deadline.check()?;
    let amount = i64::from(new.amount);
    // A decline holds nothing; an authorization holds the amount until it is captured or voided.
    let (capture_state, amount_captured) = match (decline_code, new.capture) {
        (Some(_), _) => (CaptureState::Captured, 0),
        (None, true) => (CaptureState::Captured, amount),
        (None, false) => (CaptureState::RequiresCapture, 0),
    };
    let charge = Charge {
        id: ChargeId::generate().into(),
        amount,
        currency: new.currency.as_str().to_owned(),
        status: match decline_code {
            None => ChargeStatus::Succeeded,
            Some(_) => ChargeStatus::Declined,
        },
        payment_method: new.payment_method.as_str().to_owned(),
        decline_code: decline_code.map(str::to_owned),
        amount_refunded: 0,
        capture_state,
        amount_captured: Some(amount_captured),
        capture_idempotency_key: None,
        void_idempotency_key: None,
        idempotency_key: Some(lease.key().as_str().to_owned()),
        created_at: lease.now(),
    };
    let response = match decline_code {
        None => StoredResponse::json(StatusCode::CREATED, &tagged("charge", &charge))
            .map_err(anyhow::Error::from)?
            .with_header(header::LOCATION, format!("/v1/charges/{}", charge.id)),
        Some(code) => Problem::charge_declined(&charge.id, code).stored(),
    };
    let kind = ProcessorEventType::of_charge(charge.status).as_str();
    let data = json!({ "charge": charge.id, "amount": charge.amount, "currency": charge.currency });
    // The event, when events are delivered: written by the same statement as the charge.
    let event = match &state.webhook_url {
        Some(url) => Some((
            delivery::event_id(),
            url.clone(),
            delivery::envelope(kind, charge.created_at, &data).map_err(anyhow::Error::from)?,
        )),
        None => None,
    };
    let key = lease.key().clone();
    if lease.engine().await? == Engine::Citus {
        // The charge, its event and the completion as statements of one transaction (see
        // `Lease::engine`).
        let mut tx = lease.begin().await?;
        insert_charge(&mut tx, &charge, &key).await?;
        if let Some((id, url, body)) = &event {
            delivery::enqueue(&mut tx, crate::extract::SCOPE_OWNER, id, url, body).await?;
        }
        return Ok(lease.complete(tx, response).await?);
    }
    let completion = lease.complete_with(response, move |connection, fence| {
        Box::pin(async move { record_charge(connection, &charge, &key, event, fence).await })
    });
    Ok(completion.await?)
}

/// The charge alone, in the work's transaction: the form for a distributed database.
async fn insert_charge(
    connection: &mut PgConnection,
    charge: &Charge,
    key: &IdempotencyKey,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO processor_charges
            (id, amount, currency, status, payment_method, decline_code, idempotency_key,
             created_at, capture_state, amount_captured)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        "#,
        charge.id,
        charge.amount,
        charge.currency,
        charge.status.as_str(),
        charge.payment_method,
        charge.decline_code,
        key.as_str(),
        charge.created_at,
        charge.capture_state.as_str(),
        charge.amount_captured,
    )
    .execute(connection)
    .await?;
    Ok(())
}

/// The charge, its event (if any) and the key's completion, in one statement: one round trip,
/// all or nothing, as idempay records a payment.
async fn record_charge(
    connection: &mut PgConnection,
    charge: &Charge,
    key: &IdempotencyKey,
    event: Option<(String, String, Vec<u8>)>,
    fence: Fence,
) -> Result<(), sqlx::Error> {
    let (event_id, url, body) = match event {
        Some((id, url, body)) => (Some(id), Some(url), Some(body)),
        None => (None, None, None),
    };
    sqlx::query_scalar!(
        r#"
        WITH charge AS (
            INSERT INTO processor_charges
                (id, amount, currency, status, payment_method, decline_code, idempotency_key,
                 created_at, capture_state, amount_captured)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $19, $20)
            RETURNING id
        ), event AS (
            INSERT INTO webhook_deliveries (account_id, event_id, url, body)
            SELECT $18, $9, $10, $11 FROM charge WHERE $9::text IS NOT NULL
        )
        SELECT idempotency_complete($18, $12, $13, $14, $15, $16, $17) AS "key_id!" FROM charge
        "#,
        charge.id,
        charge.amount,
        charge.currency,
        charge.status.as_str(),
        charge.payment_method,
        charge.decline_code,
        key.as_str(),
        charge.created_at,
        event_id,
        url,
        body,
        fence.key_id,
        fence.token,
        fence.response_code,
        fence.response_headers,
        &fence.response_body[..],
        fence.ttl_ms,
        &*fence.owner,
        charge.capture_state.as_str(),
        charge.amount_captured,
    )
    .fetch_one(connection)
    .await?;
    Ok(())
}

/// `GET /v1/charges/{id}`; with `?idempotency_key=…`, 409 while a capture or a void under that
/// key is still being made (in its latency, or waiting on the charge's row lock): the charge read
/// then would say "still authorized" and be wrong a moment later. A client settling a capture or
/// void whose answer it lost asks this way (as it lists the charges or refunds made under a key).
pub(crate) async fn get_charge(
    State(state): State<ProcessorState>,
    _: Authorized,
    PathId(id): PathId<ChargeId>,
    KeyQuery(key): KeyQuery,
) -> Result<Response, Error> {
    if let Some(key) = &key {
        let releases = [
            "POST /v1/charges/{id}/capture",
            "POST /v1/charges/{id}/void",
        ];
        still_making(&state, &releases, key.as_str()).await?;
    }
    let row = sqlx::query_as!(
        ChargeRow,
        r#"
        SELECT id, amount, currency, status, payment_method, decline_code, amount_refunded,
               capture_state, amount_captured, capture_key, void_key, idempotency_key,
               created_at
        FROM processor_charges
        WHERE id = $1
        "#,
        id.as_str(),
    )
    .fetch_optional(&state.pool)
    .await?
    .ok_or_else(|| ChargeId::no_such(id.as_str()))?;
    Ok(axum::Json(tagged("charge", &row.parse()?)).into_response())
}

/// Refuses to answer what was made under `key` on any of `routes` while a request under that key
/// is still making it: the answer would say "nothing" and be wrong a moment later.
///
/// A key whose lease ran out is made by nobody now: its holder died (its transaction rolled back)
/// or stalls. It is fenced first (its token replaced, as a takeover does), so that a stalled
/// holder that wakes cannot complete it, and its effect rolls back with its completion; then the
/// ledger read after this answers for good. Without the fence, such a key would answer 409 until
/// a retry under it took it over, and the caller that reads (`idempay keys settle`, whose own key
/// is held, so that nobody retries) would ask forever.
async fn still_making(state: &ProcessorState, routes: &[&str], key: &str) -> Result<(), Error> {
    let scopes: Vec<String> = routes
        .iter()
        .map(|route| format!("{}:{route}", crate::extract::SCOPE_OWNER))
        .collect();
    // The token is made here, not by `gen_random_uuid()`: Citus refuses a volatile function in
    // an update of a distributed table.
    let fenced = sqlx::query_scalar!(
        r#"
        UPDATE idempotency_keys SET lock_token = $4
        WHERE account_id = $1 AND scope = ANY($2) AND idem_key = $3
          AND status = 'in_progress' AND locked_until <= now()
        RETURNING id
        "#,
        crate::extract::SCOPE_OWNER,
        &scopes,
        key,
        sqlx::types::Uuid::new_v4(),
    )
    .fetch_all(&state.pool)
    .await?;
    if !fenced.is_empty() {
        tracing::warn!(
            key,
            "a read under a key whose lease ran out fenced it: its holder can no longer complete it"
        );
    }
    let in_progress = sqlx::query_scalar!(
        r#"
        SELECT EXISTS (
            SELECT 1 FROM idempotency_keys
            WHERE account_id = $1 AND scope = ANY($2) AND idem_key = $3
              AND status = 'in_progress' AND locked_until > now()
        ) AS "in_progress!"
        "#,
        crate::extract::SCOPE_OWNER,
        &scopes,
        key,
    )
    .fetch_one(&state.pool)
    .await?;
    if in_progress {
        return Err(Problem::new(
            ProblemKind::IdempotencyKeyInUse,
            format!("A request under the Idempotency-Key `{key}` is still in progress: ask again."),
        )
        .retry_after(Duration::from_secs(1))
        .into());
    }
    Ok(())
}

/// A page of a list, in Stripe's shape: the list and where it is read.
#[derive(Serialize)]
struct Page<T> {
    #[serde(flatten)]
    list: List<T>,
    url: &'static str,
}

/// The answer to a list read at `url`: the rows read for `page`, each parsed and tagged as an
/// `object` (`"object": "charge"`).
pub(crate) fn answer_page<R, T: Serialize>(
    rows: Vec<R>,
    page: &PageRequest,
    parse: impl FnMut(R) -> Result<T, sqlx::Error>,
    object: &'static str,
    url: &'static str,
) -> Result<Response, Error> {
    let list = List::parse_rows(rows, page, parse)?;
    let list = List {
        object: list.object,
        data: list.data.iter().map(|item| tagged(object, item)).collect(),
        has_more: list.has_more,
    };
    Ok(axum::Json(Page { list, url }).into_response())
}

/// `GET /v1/charges`: newest first, a keyset page at a time; with `idempotency_key`, only the
/// charges made under that key (one, or none: a client that lost the answer to its charge, and
/// can no longer repeat it because the key may have expired here, learns what it made). While a
/// charge under that key is still being made, 409: the answer would not be final.
pub(crate) async fn list_charges(
    State(state): State<ProcessorState>,
    _: Authorized,
    KeyedPageQuery {
        page,
        idempotency_key,
    }: KeyedPageQuery,
) -> Result<Response, Error> {
    let key = idempotency_key.as_ref().map(IdempotencyKey::as_str);
    if let Some(key) = key {
        still_making(&state, &["POST /v1/charges"], key).await?;
    }
    let rows = service::keyset_page!(
        &state.pool,
        &page,
        ChargeRow,
        position(id) if ChargeId::fits(id) =>
            "SELECT created_at, id FROM processor_charges WHERE id = $1", id;
        select: r#"SELECT id, amount, currency, status, payment_method, decline_code,
                          amount_refunded, capture_state, amount_captured, capture_key, void_key,
                          idempotency_key, created_at
                   FROM processor_charges"#,
        created_at: "created_at",
        id: "id",
        filter: "$4::text IS NULL OR idempotency_key = $4",
        key,
    )
    .await?;
    answer_page(rows, &page, ChargeRow::parse, "charge", "/v1/charges")
}

// -------------------------------------------------------------------------------------------
// Refunds
// -------------------------------------------------------------------------------------------

/// `POST /v1/charges/{id}/refunds`: 201 with the refund; never beyond what the charge has left.
/// A refusal (unknown or declined charge, too much asked) is a stored result, like idempay's.
pub(crate) async fn create_refund(
    State(state): State<ProcessorState>,
    hangup: Option<Extension<Hangup>>,
    PathId(id): PathId<ChargeId>,
    deadline: CallDeadline,
    Idempotent { request, body }: Idempotent<NewRefund>,
) -> Result<Response, Error> {
    let shared = state.clone();
    let answer = state.idempotency.run(request, move |lease| async move {
        let made = async |tx: &mut PgConnection, key: &IdempotencyKey, at| {
            Ok(refund(tx, id.as_str(), &body, key, at).await?.map(|refund| Made {
                status: StatusCode::CREATED,
                object: "refund",
                data: json!({ "charge": refund.charge, "refund": refund.id, "amount": refund.amount }),
                event: ProcessorEventType::ChargeRefunded,
                answer: refund,
            }))
        };
        shared.change_under_key(lease, deadline, made).await
    });
    state.with_faults(hangup, answer).await
}

/// Refunds `charge` in the caller's transaction, or says why nothing was refunded.
async fn refund(
    conn: &mut PgConnection,
    charge: &str,
    new: &NewRefund,
    key: &IdempotencyKey,
    at: DateTime<Utc>,
) -> Result<Result<ProcessorRefund, Problem>, sqlx::Error> {
    // The row lock makes concurrent refunds of one charge take turns, each seeing what the
    // previous one left.
    let Some(charged) = sqlx::query!(
        r#"
        SELECT COALESCE(amount_captured, amount) AS "captured!", amount_refunded,
               amount_disputed, status, capture_state
        FROM processor_charges WHERE id = $1 FOR UPDATE
        "#,
        charge,
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(Err(charge_not_found(charge)));
    };
    if stored::<ChargeStatus>(&charged.status)? == ChargeStatus::Declined {
        return Ok(Err(Problem::new(
            ProblemKind::PaymentNotRefundable,
            format!(
                "Charge `{charge}` was declined: there is nothing to refund. Nothing was refunded."
            ),
        )));
    }
    if stored::<CaptureState>(&charged.capture_state)? != CaptureState::Captured {
        return Ok(Err(Problem::new(
            ProblemKind::PaymentNotRefundable,
            format!(
                "Charge `{charge}` is {}: nothing was captured to refund. Nothing was refunded.",
                charged.capture_state
            ),
        )));
    }
    // Only what was captured can go back; disputed money is the cardholder's bank's to take back:
    // refunding it too would pay twice.
    let remaining = (charged.captured - charged.amount_refunded - charged.amount_disputed).max(0);
    let amount = new.amount.map_or(remaining, i64::from);
    if remaining == 0 || amount > remaining {
        return Ok(Err(Problem::new(
            ProblemKind::RefundExceedsPayment,
            format!(
                "Only {remaining} of charge `{charge}` remains refundable; {amount} was asked. \
                 Nothing was refunded."
            ),
        )));
    }
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        INSERT INTO processor_refunds (id, charge_id, amount, status, idempotency_key, created_at)
        VALUES ($1, $2, $3, $6, $4, $5)
        RETURNING id, charge_id, amount, status, idempotency_key, created_at
        "#,
        String::from(RefundId::generate()),
        charge,
        amount,
        key.as_str(),
        at,
        RefundStatus::Succeeded.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query!(
        "UPDATE processor_charges SET amount_refunded = amount_refunded + $2 WHERE id = $1",
        charge,
        amount,
    )
    .execute(&mut *conn)
    .await?;
    Ok(Ok(row.parse()?))
}

/// `GET /v1/refunds`: every refund, newest first, each naming its charge, for reconciliation;
/// with `idempotency_key`, only those made under that key, as for charges.
pub(crate) async fn list_refunds(
    State(state): State<ProcessorState>,
    _: Authorized,
    KeyedPageQuery {
        page,
        idempotency_key,
    }: KeyedPageQuery,
) -> Result<Response, Error> {
    let key = idempotency_key.as_ref().map(IdempotencyKey::as_str);
    if let Some(key) = key {
        still_making(&state, &["POST /v1/charges/{id}/refunds"], key).await?;
    }
    let rows = service::keyset_page!(
        &state.pool,
        &page,
        RefundRow,
        position(id) if RefundId::fits(id) =>
            "SELECT created_at, id FROM processor_refunds WHERE id = $1", id;
        select: r#"SELECT id, charge_id, amount, status, idempotency_key, created_at
                   FROM processor_refunds"#,
        created_at: "created_at",
        id: "id",
        filter: "$4::text IS NULL OR idempotency_key = $4",
        key,
    )
    .await?;
    answer_page(rows, &page, RefundRow::parse, "refund", "/v1/refunds")
}

// -------------------------------------------------------------------------------------------
// Disputes: a test helper, standing in for the cardholder's bank.
// -------------------------------------------------------------------------------------------

/// `POST /v1/charges/{id}/disputes {amount}`: opens a dispute of up to what the charge has not
/// had disputed yet. Not keyed: a test opens each dispute once.
pub(crate) async fn create_dispute(
    State(state): State<ProcessorState>,
    _: Authorized,
    PathId(id): PathId<ChargeId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let body = body.map_err(Problem::from)?;
    let new: NewDispute = serde_json::from_slice(&body)
        .map_err(|error| Problem::invalid_body::<NewDispute>(&body, &error))?;
    let amount = i64::from(new.amount);
    let mut tx = idempotency::connections::begin(&state.pool).await?;
    let Some(charged) = sqlx::query!(
        r#"
        SELECT COALESCE(amount_captured, amount) AS "captured!", amount_disputed, status,
               capture_state
        FROM processor_charges WHERE id = $1 FOR UPDATE
        "#,
        id.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?
    else {
        return Err(ChargeId::no_such(id.as_str()).into());
    };
    // Only captured money can be disputed: an authorization never left the card.
    let open = charged.captured - charged.amount_disputed;
    if stored::<ChargeStatus>(&charged.status)? == ChargeStatus::Declined
        || stored::<CaptureState>(&charged.capture_state)? != CaptureState::Captured
        || amount > open
    {
        return Err(Problem::new(
            ProblemKind::InvalidRequest,
            format!(
                "Charge `{id}` ({}) has {open} left to dispute; {amount} was asked.",
                charged.status
            ),
        )
        .into());
    }
    let dispute = sqlx::query_as!(
        DisputeRow,
        r#"
        INSERT INTO processor_disputes (id, charge_id, amount)
        VALUES ($1, $2, $3)
        RETURNING id, charge_id AS charge, amount, status, created_at
        "#,
        String::from(DisputeId::generate()),
        id.as_str(),
        amount,
    )
    .fetch_one(&mut *tx)
    .await?
    .parse()?;
    sqlx::query!(
        "UPDATE processor_charges SET amount_disputed = amount_disputed + $2 WHERE id = $1",
        id.as_str(),
        amount,
    )
    .execute(&mut *tx)
    .await?;
    let data = json!({ "charge": dispute.charge, "dispute": dispute.id, "amount": dispute.amount });
    state
        .announce(
            &mut tx,
            ProcessorEventType::ChargeDisputeCreated,
            dispute.created_at,
            &data,
        )
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(tagged("dispute", &dispute))).into_response())
}

/// `POST /v1/refunds/{id}/failure`: the card network gave the refund back (a closed card): the
/// refund fails, its amount is the charge's again, and `charge.refund.failed` is announced. A test
/// helper, like disputes; a refund fails once.
pub(crate) async fn fail_refund(
    State(state): State<ProcessorState>,
    _: Authorized,
    PathId(id): PathId<RefundId>,
) -> Result<Response, Error> {
    let mut tx = idempotency::connections::begin(&state.pool).await?;
    let failed = sqlx::query_as!(
        RefundRow,
        r#"
        UPDATE processor_refunds SET status = $2
        WHERE id = $1 AND status = $3
        RETURNING id, charge_id, amount, status, idempotency_key, created_at
        "#,
        id.as_str(),
        RefundStatus::Failed.as_str(),
        RefundStatus::Succeeded.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| RefundId::no_such(id.as_str()))?;
    sqlx::query!(
        "UPDATE processor_charges SET amount_refunded = amount_refunded - $2 WHERE id = $1",
        failed.charge_id,
        failed.amount,
    )
    .execute(&mut *tx)
    .await?;
    let refund = failed.parse()?;
    let at = chrono::Utc::now();
    let data = json!({ "charge": refund.charge, "refund": refund.id, "amount": refund.amount });
    state
        .announce(&mut tx, ProcessorEventType::ChargeRefundFailed, at, &data)
        .await?;
    tx.commit().await?;
    Ok(axum::Json(tagged("refund", &refund)).into_response())
}

pub(crate) fn charge_not_found(id: &str) -> Problem {
    ChargeId::no_such(id).into()
}
