//! Authorizations: a charge made with `capture: false` holds its amount on the card until
//! `POST /v1/charges/{id}/capture` takes it (all or part; the rest is released) or
//! `POST /v1/charges/{id}/void` releases it. Both are keyed like a charge, through the same
//! mechanism: the charge's row, its event and the key's completion commit together, and a repeat
//! of the key is answered from the stored response. One that was not captured within
//! `IDEMPAY_PROCESSOR_AUTHORIZATION_TTL` is released by the expiry job ([`expire_batch`]), which
//! announces `charge.expired`.
//!
//! The charge's row lock orders a capture, a void and the expiry of one authorization: whichever
//! comes first wins, and the others find it no longer `requires_capture` and are refused (a
//! refusal is their stored result, as a refund's is).

use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{PgConnection, PgPool};

use crate::ProcessorState;
use crate::deadline::CallDeadline;
use crate::extract::PathId;
use crate::handlers::{Made, charge_not_found};
use crate::model::{
    CaptureState, Charge, ChargeId, ChargeRow, NewCapture, NewVoid, ProcessorEventType,
};
use crate::problem::{Error, Problem, ProblemKind};
use idempotency::engine::Engine;
use idempotency::{IdempotencyKey, Idempotent};
use service::outbox::delivery;
use service::server::Hangup;
use service::vocabulary::stored;

/// `POST /v1/charges/{id}/capture {amount?}`: 200 with the captured charge. Refused (a stored
/// result) unless the charge is an authorization still held, or for more than it holds.
pub(crate) async fn capture_charge(
    State(state): State<ProcessorState>,
    hangup: Option<Extension<Hangup>>,
    PathId(id): PathId<ChargeId>,
    deadline: CallDeadline,
    Idempotent { request, body }: Idempotent<NewCapture>,
) -> Result<Response, Error> {
    let shared = state.clone();
    let answer = state.idempotency.run(request, move |lease| async move {
        let made = async |tx: &mut PgConnection, key: &IdempotencyKey, _| {
            let amount = body.amount.map(i64::from);
            Ok(capture(tx, id.as_str(), amount, key)
                .await?
                .map(|charge| Made {
                    status: StatusCode::OK,
                    object: "charge",
                    data: json!({ "charge": charge.id, "amount": charge.amount_captured }),
                    event: ProcessorEventType::ChargeCaptured,
                    answer: charge,
                }))
        };
        shared.change_under_key(lease, deadline, made).await
    });
    state.with_faults(hangup, answer).await
}

/// `POST /v1/charges/{id}/void`: 200 with the voided charge, its money released. Refused (a stored
/// result) unless the charge is an authorization still held.
pub(crate) async fn void_charge(
    State(state): State<ProcessorState>,
    hangup: Option<Extension<Hangup>>,
    PathId(id): PathId<ChargeId>,
    deadline: CallDeadline,
    Idempotent {
        request,
        body: NewVoid {},
    }: Idempotent<NewVoid>,
) -> Result<Response, Error> {
    let shared = state.clone();
    let answer = state.idempotency.run(request, move |lease| async move {
        let made = async |tx: &mut PgConnection, key: &IdempotencyKey, _| {
            Ok(void(tx, id.as_str(), key).await?.map(|charge| Made {
                status: StatusCode::OK,
                object: "charge",
                data: json!({ "charge": charge.id, "amount": charge.amount }),
                event: ProcessorEventType::ChargeVoided,
                answer: charge,
            }))
        };
        shared.change_under_key(lease, deadline, made).await
    });
    state.with_faults(hangup, answer).await
}

/// The charge under its row lock, or why it is not an authorization still held.
async fn held(
    conn: &mut PgConnection,
    id: &str,
    refused: ProblemKind,
    what: &str,
) -> Result<Result<ChargeRow, Problem>, sqlx::Error> {
    let Some(row) = sqlx::query_as!(
        ChargeRow,
        r#"
        SELECT id, amount, currency, status, payment_method, decline_code, amount_refunded,
               capture_state, amount_captured, capture_key, void_key, idempotency_key, created_at
        FROM processor_charges WHERE id = $1 FOR UPDATE
        "#,
        id,
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(Err(charge_not_found(id)));
    };
    let state: CaptureState = stored(&row.capture_state)?;
    if row.status != "succeeded" || state != CaptureState::RequiresCapture {
        let now = if row.status == "succeeded" {
            state.as_str()
        } else {
            &row.status
        };
        return Ok(Err(Problem::new(
            refused,
            format!(
                "Charge `{id}` is {now}, not an authorization awaiting capture: nothing was {what}."
            ),
        )));
    }
    Ok(Ok(row))
}

/// Captures `amount` (all of it when `None`) of the authorization `id`, in the caller's
/// transaction, or says why nothing was captured.
async fn capture(
    conn: &mut PgConnection,
    id: &str,
    amount: Option<i64>,
    key: &IdempotencyKey,
) -> Result<Result<Charge, Problem>, sqlx::Error> {
    let authorized = match held(conn, id, ProblemKind::ChargeNotCapturable, "captured").await? {
        Ok(row) => row,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let amount = amount.unwrap_or(authorized.amount);
    if amount > authorized.amount {
        return Ok(Err(Problem::new(
            ProblemKind::ChargeNotCapturable,
            format!(
                "Charge `{id}` authorized {}; {amount} cannot be captured of it. Nothing was \
                 captured.",
                authorized.amount
            ),
        )));
    }
    let row = sqlx::query_as!(
        ChargeRow,
        r#"
        UPDATE processor_charges
        SET capture_state = $4, amount_captured = $2, capture_key = $3
        WHERE id = $1
        RETURNING id, amount, currency, status, payment_method, decline_code, amount_refunded,
                  capture_state, amount_captured, capture_key, void_key, idempotency_key,
                  created_at
        "#,
        id,
        amount,
        key.as_str(),
        CaptureState::Captured.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Ok(row.parse()?))
}

/// Voids the authorization `id` in the caller's transaction, or says why nothing was voided.
async fn void(
    conn: &mut PgConnection,
    id: &str,
    key: &IdempotencyKey,
) -> Result<Result<Charge, Problem>, sqlx::Error> {
    if let Err(refusal) = held(conn, id, ProblemKind::ChargeNotVoidable, "voided").await? {
        return Ok(Err(refusal));
    }
    let row = sqlx::query_as!(
        ChargeRow,
        r#"
        UPDATE processor_charges
        SET capture_state = $3, amount_captured = 0, void_key = $2
        WHERE id = $1
        RETURNING id, amount, currency, status, payment_method, decline_code, amount_refunded,
                  capture_state, amount_captured, capture_key, void_key, idempotency_key,
                  created_at
        "#,
        id,
        key.as_str(),
        CaptureState::Voided.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Ok(row.parse()?))
}

/// One batch of the expiry job: releases up to `LIMIT 1000` authorizations held longer than
/// `ttl`, each with its `charge.expired` to `announce_to`, in one transaction; says how many. Rows another instance's batch holds are skipped.
pub(crate) async fn expire_batch(
    pool: &PgPool,
    _engine: Engine,
    ttl: Duration,
    announce_to: &str,
) -> Result<u64, sqlx::Error> {
    let mut tx = idempotency::connections::begin(pool).await?;
    let expired = sqlx::query!(
        r#"
        UPDATE processor_charges c SET capture_state = $2, amount_captured = 0
        FROM (
            -- The literal, not a parameter: the partial index of the authorizations held
            -- (`processor_charges_requires_capture`) serves only a statement that names it.
            SELECT id FROM processor_charges
            WHERE capture_state = 'requires_capture'
              AND created_at < now() - $1::float8 * interval '1 second'
            ORDER BY created_at
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        ) due
        WHERE c.id = due.id
        RETURNING c.id, c.amount, now() AS "at!: DateTime<Utc>"
        "#,
        ttl.as_secs_f64(),
        CaptureState::Expired.as_str(),
    )
    .fetch_all(&mut *tx)
    .await?;
    for charge in &expired {
        let data = json!({ "charge": charge.id, "amount": charge.amount });
        let body = delivery::envelope(ProcessorEventType::ChargeExpired.as_str(), charge.at, &data)
            .map_err(|error| sqlx::Error::Encode(Box::new(error)))?;
        delivery::enqueue(
            &mut tx,
            crate::extract::SCOPE_OWNER,
            &delivery::event_id(),
            announce_to,
            &body,
        )
        .await?;
    }
    tx.commit().await?;
    if !expired.is_empty() {
        tracing::info!(count = expired.len(), "authorizations expired uncaptured");
    }
    Ok(expired.len() as u64)
}
