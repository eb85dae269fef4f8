//! `GET /v1/events/{id}/attempts`: every attempt to deliver one of the account's events to its
//! endpoints, as it went, so a merchant can see why an event did not arrive.

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts::{Account, AccountCache, RateLimit};
use crate::events::EventId;
use crate::http::error::{ApiError, AuthenticatedProblems, Problem};
use crate::http::extract::PathId;
use service::ids::PublicId;
use service::pagination::List;

/// The most attempts one answer lists: an event sent to many endpoints, each tried the whole
/// schedule, stays a bounded answer (`has_more` says when more were made).
const MAX_ATTEMPTS: i64 = 100;

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(list_event_attempts))
}

/// One attempt to deliver an event to an endpoint.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "object": "webhook_attempt",
    "endpoint": "we_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
    "attempt": 1,
    "status_code": 500,
    "latency_ms": 12,
    "error": "answered 500 Internal Server Error",
    "attempted_at": "2026-12-01T02:05:12.118230Z"
}))]
pub struct WebhookAttempt {
    /// Always `webhook_attempt`.
    #[schema(value_type = String, pattern = "^webhook_attempt$")]
    pub object: &'static str,
    /// The endpoint it was sent to, `we_…`.
    pub endpoint: String,
    /// 1 for the first attempt to this endpoint, then one more per retry.
    #[schema(minimum = 1)]
    pub attempt: i32,
    /// The endpoint's status code; absent when none came back (refused, timed out, not sent).
    pub status_code: Option<i16>,
    /// From sending to the answer (or the failure), in milliseconds.
    #[schema(minimum = 0)]
    pub latency_ms: i32,
    /// Why it failed; absent when the endpoint answered 2xx.
    pub error: Option<String>,
    pub attempted_at: DateTime<Utc>,
}

/// List an event's delivery attempts
///
/// Every attempt to deliver one of the account's events to its webhook endpoints, oldest first,
/// at most 100. An event queued for no endpoint, or not yet attempted, has none.
#[utoipa::path(
    get,
    path = "/v1/events/{id}/attempts",
    operation_id = "listEventAttempts",
    tag = "webhook endpoints",
    params(("id" = String, Path, description = "The event's id, `evt_…`.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The attempts, oldest first.", body = List<WebhookAttempt>, content_type = "application/json"),
        (status = 404, description = "No such event for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_event_attempts(
    State(pool): State<PgPool>,
    account: Account,
    PathId(id): PathId<EventId>,
) -> Result<Response, ApiError> {
    let account = account.id().as_str();
    let id = sqlx::query_scalar!(
        "SELECT id FROM events WHERE id = $1 AND account_id = $2",
        id.as_str(),
        account,
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| EventId::no_such(id.as_str()))?;
    let mut data = sqlx::query!(
        r#"
        SELECT delivery.endpoint_id AS "endpoint!", attempt.attempt, attempt.status_code,
               attempt.latency_ms, attempt.error, attempt.attempted_at
        FROM webhook_deliveries delivery
        JOIN webhook_attempts attempt
            ON attempt.account_id = delivery.account_id AND attempt.delivery_id = delivery.id
        WHERE delivery.account_id = $3 AND delivery.event_id = $1
          AND delivery.endpoint_id IS NOT NULL
        ORDER BY attempt.attempted_at, delivery.endpoint_id, attempt.attempt
        LIMIT $2
        "#,
        id,
        MAX_ATTEMPTS + 1,
        account,
    )
    .fetch_all(&pool)
    .await?
    .into_iter()
    .map(|row| WebhookAttempt {
        object: "webhook_attempt",
        endpoint: row.endpoint,
        attempt: row.attempt,
        status_code: row.status_code,
        latency_ms: row.latency_ms,
        error: row.error,
        attempted_at: row.attempted_at,
    })
    .collect::<Vec<_>>();
    let has_more = data.len() > usize::try_from(MAX_ATTEMPTS).unwrap_or(usize::MAX);
    data.truncate(usize::try_from(MAX_ATTEMPTS).unwrap_or(usize::MAX));
    Ok(axum::Json(List {
        object: "list",
        data,
        has_more,
    })
    .into_response())
}
