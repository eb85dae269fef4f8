//! `GET /v1/disputes`: every dispute opened at the processor, for reconciliation, in the same keyset
//! pages as its charges and refunds. (Opening one, a test helper, is in `handlers.rs`.)
//!
//! Disputes are few (one per chargeback), so the pages are read without an index on
//! `created_at`: sorting the disputes of a page's range costs less than keeping one.

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::ProcessorState;
use crate::extract::Authorized;
use crate::extract::PageQuery;
use crate::handlers::Page;
use crate::model::{Dispute, IdKind, tagged};
use crate::problem::Error;
use service::pagination::{Cursor, List, Position, unknown_cursor};

/// `GET /v1/disputes`: every dispute, newest first, each naming its charge.
pub(crate) async fn list_disputes(
    State(state): State<ProcessorState>,
    _: Authorized,
    PageQuery(page): PageQuery,
) -> Result<Response, Error> {
    let position = match &page.cursor {
        Cursor::First => None,
        Cursor::After(id) | Cursor::Before(id) if !IdKind::Dispute.is(id) => {
            return Err(unknown_cursor(id).into());
        }
        Cursor::After(id) | Cursor::Before(id) => Some(
            sqlx::query_as!(
                Position,
                "SELECT created_at, id FROM processor_disputes WHERE id = $1",
                id,
            )
            .fetch_optional(&state.pool)
            .await?
            .ok_or_else(|| unknown_cursor(id))?,
        ),
    };
    let disputes = match (&page.cursor, position) {
        (Cursor::Before(_), Some(after)) => {
            sqlx::query_as!(
                Dispute,
                r#"
                SELECT id, charge_id AS charge, amount, created_at
                FROM processor_disputes
                WHERE (created_at, id) > ($1, $2)
                ORDER BY created_at, id
                LIMIT $3
                "#,
                after.created_at,
                after.id,
                page.fetch(),
            )
            .fetch_all(&state.pool)
            .await?
        }
        (_, before) => {
            sqlx::query_as!(
                Dispute,
                r#"
                SELECT id, charge_id AS charge, amount, created_at
                FROM processor_disputes
                WHERE (created_at, id) < (COALESCE($1, 'infinity'::timestamptz), COALESCE($2, ''))
                ORDER BY created_at DESC, id DESC
                LIMIT $3
                "#,
                before.as_ref().map(|position| position.created_at),
                before.as_ref().map(|position| position.id.as_str()),
                page.fetch(),
            )
            .fetch_all(&state.pool)
            .await?
        }
    };
    let list = List::from_rows(disputes, &page);
    let data = list.data.iter().map(|d| tagged("dispute", d)).collect();
    Ok(axum::Json(Page {
        list: List {
            object: list.object,
            data,
            has_more: list.has_more,
        },
        url: "/v1/disputes",
    })
    .into_response())
}
