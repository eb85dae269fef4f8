//! `POST /v1/events/{id}/retry`: one more delivery of one of the account's events to one of its
//! endpoints, once per idempotency key, for a receiver that lost or mishandled the event after it
//! acknowledged it, or whose delivery was given up. The delivery is a row of the outbox like the
//! fan-out's, sent by the same loop on the same schedule, with the same body and the event's id as
//! `webhook-id`: a receiver that already applied the event recognises it.

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::{EndpointId, EndpointStatus};
use crate::accounts::{Account, AccountCache, AccountId, RateLimit};
use crate::events::EventId;
use crate::http::error::{
    ApiError, AuthenticatedProblems, IdempotencyProblems, Problem, ProblemKind,
};
use crate::http::extract::PathId;
use idempotency::{
    Completion, Idempotency, IdempotencyKey, Idempotent, Lease, Owners, StoredResponse,
};
use service::ids::PublicId;
use service::vocabulary::stored;

/// How many deliveries of one event to one endpoint may be asked for (`POST
/// /v1/events/{id}/retry`), besides its own: each sends to a URL the account chose, so an account
/// cannot have one event sent without end.
pub const MAX_MANUAL_RETRIES: i64 = 5;

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Owners<Rejection = ApiError> + Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(retry_event))
}

/// Where to deliver the event again. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "endpoint": "we_Jx8bq2LkR5Vn0Ww3Zt7YcA1d" }))]
pub struct EventRetry {
    /// One of the account's webhook endpoints, `we_…`.
    #[schema(value_type = String, pattern = "^we_[0-9A-Za-z]{24}$", example = "we_Jx8bq2LkR5Vn0Ww3Zt7YcA1d")]
    pub endpoint: EndpointId,
}

/// A delivery queued by a retry.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "object": "webhook_delivery",
    "event": "evt_Hq2Lm8Rt0VbX4nWc6Zp1KsYd",
    "endpoint": "we_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
    "url": "https://example.com/idempay/events",
    "created_at": "2026-12-01T02:05:12.118230Z"
}))]
pub struct WebhookDelivery {
    /// Always `webhook_delivery`.
    #[schema(value_type = String, pattern = "^webhook_delivery$")]
    pub object: &'static str,
    /// The event delivered, `evt_…`: the delivery's `webhook-id`.
    pub event: String,
    /// The endpoint it is delivered to, `we_…`.
    pub endpoint: String,
    /// The endpoint's URL, where it is sent.
    pub url: String,
    /// When it was queued: its first attempt is due then.
    pub created_at: DateTime<Utc>,
}

/// Deliver an event again
///
/// Queues one more delivery of one of the account's events to one of its enabled endpoints, once
/// per `Idempotency-Key`: a retry with the same key and body answers the same delivery and queues
/// nothing more. The delivery loop sends it as it sends every event, the same body signed with the
/// endpoint's secret and the event's id as `webhook-id`, so a receiver that deduplicates on it
/// applies the event once however often it arrives; it is retried on the schedule
/// ({webhook_retry_schedule}) until acknowledged, like any delivery, and its attempts are listed
/// at `GET /v1/events/{id}/attempts`, numbered from 1 again. The endpoint need not subscribe to
/// the event's type: asking for it is subscribing to this one delivery.
///
/// An unknown event or endpoint (or another account's) is 404, a disabled endpoint 409
/// `webhook-endpoint-disabled`; while a delivery of the event to the endpoint is pending (queued,
/// or being retried on the schedule), 409 `webhook-retry-pending`; after 5 retries of one event to
/// one endpoint, 409 `webhook-retry-limit`: in each case nothing was queued and the key was
/// released.
#[utoipa::path(
    post,
    path = "/v1/events/{id}/retry",
    operation_id = "retryEvent",
    tag = "webhook endpoints",
    params(("id" = String, Path, description = "The event's id, `evt_…`.", example = "evt_Hq2Lm8Rt0VbX4nWc6Zp1KsYd"),
        IdempotencyKey),
    request_body(content = EventRetry, content_type = "application/json"),
    security(("api_key" = [])),
    responses(
        (status = 202, description = "The delivery was queued, or this is the replay of the request that queued it.",
            body = WebhookDelivery, content_type = "application/json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 400, description = "The body or the key is invalid (`invalid-request`, `invalid-idempotency-key`). Nothing was reserved: the key can still be used.",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such event, or no such endpoint, for this account (`not-found`); nothing was queued and the key was released.",
            body = Problem, content_type = "application/problem+json"),
        IdempotencyProblems,
        // After the mechanism's own 409, which it replaces for this operation: one status, one
        // entry, naming every kind.
        (status = 409, description = "The endpoint is disabled (`webhook-endpoint-disabled`); a delivery of the event to the endpoint is still pending, neither acknowledged nor given up (`webhook-retry-pending`); or the event was already delivered again to the endpoint 5 times on request (`webhook-retry-limit`): nothing was queued and the key was released. Or a request with this key is still being processed (`idempotency-key-in-use`): retry after `Retry-After` seconds with the same key and body to receive its result.",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = i64, description = "Seconds to wait before retrying with the same key (`idempotency-key-in-use` only)."))),
        AuthenticatedProblems,
    )
)]
async fn retry_event(
    State(idempotency): State<Idempotency>,
    account: Account,
    PathId(id): PathId<EventId>,
    Idempotent { request, body }: Idempotent<EventRetry>,
) -> Result<Response, ApiError> {
    let account = account.id().clone();
    idempotency
        .run(request, move |lease| {
            queue(lease, account, id, body.endpoint)
        })
        .await
}

/// Queues the delivery and completes the key in one transaction: the delivery exists if and only
/// if the stored answer that names it does.
async fn queue(
    lease: Lease,
    account: AccountId,
    event: EventId,
    endpoint: EndpointId,
) -> Result<Completion, ApiError> {
    let mut tx = lease.begin().await?;
    // Locked until this commits, against the retention's delete (`retention::prune_events`, which
    // skips a locked event and looks for pending deliveries again after it locked its batch) and
    // against another retry of the event: the bounds below read what every earlier retry wrote.
    let body = sqlx::query_scalar!(
        "SELECT body FROM events WHERE account_id = $1 AND id = $2 FOR NO KEY UPDATE",
        account.as_str(),
        event.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| EventId::no_such(event.as_str()))?;
    // Locked against the update that disables the endpoint until this commits: that update then
    // gives up this delivery with the endpoint's other pending ones. Without the lock, a delivery
    // queued while the endpoint is being disabled would stay pending for a disabled endpoint (the
    // foreign key's own lock does not hold back an update of its status).
    let target = sqlx::query!(
        r#"
        SELECT url, status FROM webhook_endpoints
        WHERE account_id = $1 AND id = $2
        FOR SHARE
        "#,
        account.as_str(),
        endpoint.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| {
        Problem::new(
            ProblemKind::NotFound,
            format!("No webhook endpoint `{}`.", endpoint.as_str()),
        )
    })?;
    if stored::<EndpointStatus>(&target.status)? == EndpointStatus::Disabled {
        return Err(Problem::new(
            ProblemKind::WebhookEndpointDisabled,
            format!(
                "The webhook endpoint `{0}` is disabled: nothing was queued. Enable it again \
                 (`POST /v1/webhook_endpoints/{0}` with `{{\"status\": \"enabled\"}}`), then \
                 ask for the delivery.",
                endpoint.as_str()
            ),
        )
        .into());
    }
    let earlier = sqlx::query!(
        r#"
        SELECT count(*) FILTER (WHERE retry) AS "retries!",
               count(*) FILTER (WHERE delivered_at IS NULL AND failed_at IS NULL) AS "pending!"
        FROM webhook_deliveries
        WHERE account_id = $1 AND event_id = $2 AND endpoint_id = $3
        "#,
        account.as_str(),
        event.as_str(),
        endpoint.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    if earlier.pending > 0 {
        super::metrics::manual_retry(super::metrics::ManualRetry::Pending);
        return Err(Problem::new(
            ProblemKind::WebhookRetryPending,
            format!(
                "A delivery of `{event}` to `{}` is still pending: nothing was queued. Follow it \
                 at `GET /v1/events/{event}/attempts`, and ask again once it is acknowledged or \
                 given up.",
                endpoint.as_str()
            ),
        )
        .into());
    }
    if earlier.retries >= MAX_MANUAL_RETRIES {
        super::metrics::manual_retry(super::metrics::ManualRetry::Limit);
        return Err(Problem::new(
            ProblemKind::WebhookRetryLimit,
            format!(
                "`{event}` was delivered again to `{}` {MAX_MANUAL_RETRIES} times on request, the \
                 most it may be: nothing was queued. Read it at `GET /v1/events/{event}`.",
                endpoint.as_str()
            ),
        )
        .into());
    }
    let created_at = sqlx::query_scalar!(
        r#"
        INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id, retry)
        VALUES ($1, $2, $3, $4, $5, true)
        RETURNING created_at
        "#,
        account.as_str(),
        event.as_str(),
        target.url,
        body,
        endpoint.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    let delivery = WebhookDelivery {
        object: "webhook_delivery",
        event: event.into(),
        endpoint: endpoint.into(),
        url: target.url,
        created_at,
    };
    let response =
        StoredResponse::json(StatusCode::ACCEPTED, &delivery).map_err(anyhow::Error::from)?;
    let completion = lease.complete(tx, response).await?;
    super::metrics::manual_retry(super::metrics::ManualRetry::Queued);
    Ok(completion)
}
