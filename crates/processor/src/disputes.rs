//! `GET /v1/disputes`: every dispute opened at the processor, for reconciliation, in the same keyset
//! pages as its charges and refunds; and a dispute's lifecycle, test helpers standing in for the
//! cardholder's bank: evidence submitted, then closed as won or lost. (Opening one is in
//! `handlers.rs`.)
//!
//! Disputes are few (one per chargeback), so the pages are read without an index on
//! `created_at`: sorting the disputes of a page's range costs less than keeping one.

use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use crate::ProcessorState;
use crate::extract::{Authorized, PageQuery, PathId};
use crate::handlers::answer_page;
use crate::model::{DisputeClosing, DisputeId, DisputeOutcome, DisputeRow, tagged};
use crate::model::{DisputeStatus, ProcessorEventType};
use crate::problem::{Error, Problem, ProblemKind};
use service::ids::PublicId;
use service::vocabulary::stored;

/// `GET /v1/disputes`: every dispute, newest first, each naming its charge.
pub(crate) async fn list_disputes(
    State(state): State<ProcessorState>,
    _: Authorized,
    PageQuery(page): PageQuery,
) -> Result<Response, Error> {
    let rows = service::keyset_page!(
        &state.pool,
        &page,
        DisputeRow,
        position(id) if DisputeId::fits(id) =>
            "SELECT created_at, id FROM processor_disputes WHERE id = $1", id;
        select: "SELECT id, charge_id AS charge, amount, status, created_at FROM processor_disputes",
        created_at: "created_at",
        id: "id",
        filter: "TRUE",
    )
    .await?;
    answer_page(rows, &page, DisputeRow::parse, "dispute", "/v1/disputes")
}

/// `POST /v1/disputes/{id}/evidence`: the merchant answered the dispute; it is `under_review`
/// until the bank decides, announced as `charge.dispute.updated`. A test helper, like opening one;
/// refused unless the dispute `needs_response`.
pub(crate) async fn submit_evidence(
    State(state): State<ProcessorState>,
    _: Authorized,
    PathId(id): PathId<DisputeId>,
) -> Result<Response, Error> {
    change(&state, &id, DisputeStatus::UnderReview).await
}

/// `POST /v1/disputes/{id}/close {"outcome": "won" | "lost"}`: the bank decides. A won dispute
/// gives its amount back to the charge (`amount_disputed` falls); a lost one keeps it with the
/// cardholder. Announced as `charge.dispute.closed`. A test helper; a dispute closes once.
pub(crate) async fn close_dispute(
    State(state): State<ProcessorState>,
    _: Authorized,
    PathId(id): PathId<DisputeId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, Error> {
    let body = body.map_err(Problem::from)?;
    let closing: DisputeClosing = serde_json::from_slice(&body)
        .map_err(|error| Problem::invalid_body::<DisputeClosing>(&body, &error))?;
    let status = match closing.outcome {
        DisputeOutcome::Won => DisputeStatus::Won,
        DisputeOutcome::Lost => DisputeStatus::Lost,
    };
    change(&state, &id, status).await
}

/// Moves dispute `id` to `status` under its row lock, with its event and, when won, the charge's
/// disputed amount given back, in one transaction.
async fn change(
    state: &ProcessorState,
    id: &DisputeId,
    status: DisputeStatus,
) -> Result<Response, Error> {
    let mut tx = idempotency::connections::begin(&state.pool).await?;
    let now: DisputeStatus = stored(
        &sqlx::query_scalar!(
            "SELECT status FROM processor_disputes WHERE id = $1 FOR UPDATE",
            id.as_str()
        )
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| DisputeId::no_such(id.as_str()))?,
    )?;
    let allowed = match status {
        DisputeStatus::UnderReview => now == DisputeStatus::NeedsResponse,
        _ => !now.is_closed(),
    };
    if !allowed {
        return Err(Problem::new(
            ProblemKind::InvalidRequest,
            format!("Dispute `{id}` is {now}: it cannot become {status}."),
        )
        .into());
    }
    // The event's time is the database's, read under the row lock: a dispute's changes are then
    // stamped in the order they were made, whichever instance made them, and idempay, which
    // takes an older event after a newer one for stale, applies each.
    let at = sqlx::query_scalar!(r#"SELECT clock_timestamp() AS "at!""#)
        .fetch_one(&mut *tx)
        .await?;
    let dispute = sqlx::query_as!(
        DisputeRow,
        r#"
        UPDATE processor_disputes SET status = $2 WHERE id = $1
        RETURNING id, charge_id AS charge, amount, status, created_at
        "#,
        id.as_str(),
        status.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?
    .parse()?;
    if status == DisputeStatus::Won {
        sqlx::query!(
            "UPDATE processor_charges SET amount_disputed = amount_disputed - $2 WHERE id = $1",
            dispute.charge,
            dispute.amount,
        )
        .execute(&mut *tx)
        .await?;
    }
    let kind = if status.is_closed() {
        ProcessorEventType::ChargeDisputeClosed
    } else {
        ProcessorEventType::ChargeDisputeUpdated
    };
    let data = json!({
        "charge": dispute.charge,
        "dispute": dispute.id,
        "amount": dispute.amount,
        "status": dispute.status,
    });
    state.announce(&mut tx, kind, at, &data).await?;
    tx.commit().await?;
    Ok(axum::Json(tagged("dispute", &dispute)).into_response())
}
