//! Changing a webhook endpoint instead of deleting it, which lost its delivery history:
//! `POST /v1/webhook_endpoints/{id}` updates its URL, events, description or status, and
//! `POST /v1/webhook_endpoints/{id}/roll_secret` gives it a new secret while the old one keeps
//! signing for a while. Each runs once per idempotency key, and writes the change, the account's
//! `webhook_endpoint.updated` event and the key's completion in one transaction.

use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use sqlx::PgConnection;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::endpoints::{
    EnabledEvents, EndpointId, EndpointRow, EndpointStatus, EndpointUrl, WebhookEndpoint,
};
use super::settings::WebhookSettings;
use crate::accounts::{Account, AccountCache, AccountId, RateLimit};
use crate::events::{self, EventType, NewEvent};
use crate::http::error::{ApiError, AuthenticatedProblems, IdempotencyProblems, Problem};
use crate::http::extract::PathId;
use crate::payments::Description;
use idempotency::decimal::Decimal;
use idempotency::{
    Completion, Idempotency, IdempotencyKey, Idempotent, Lease, Owners, StoredResponse,
};
use service::ids::PublicId;
use service::outbox::WebhookSecret;
use service::vocabulary::stored;

/// How long the secret a roll replaces keeps signing when the roll does not say: a day, time for a
/// receiver to take the new one.
pub const DEFAULT_OLD_SECRET_LIFETIME: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest the replaced secret may keep signing: a week. A secret is rolled because it may
/// have leaked, so the old one must not sign for long.
pub const MAX_OLD_SECRET_LIFETIME: Duration = Duration::from_secs(7 * 24 * 60 * 60);

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Owners<Rejection = ApiError> + Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
    WebhookSettings: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(update_webhook_endpoint))
        .routes(routes!(roll_webhook_endpoint_secret))
}

/// The fields to change: any of them; a field left out (or `null`) is unchanged. Unknown fields
/// are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "url": "https://example.com/idempay/v2/events",
    "status": "enabled"
}))]
pub struct WebhookEndpointUpdate {
    /// Where to send the events from now on, checked as at registration: `http` or `https`, its
    /// host a public address or a name that resolves only to public ones. Deliveries still being
    /// retried go there too.
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 2048, example = "https://example.com/idempay/v2/events")]
    pub url: Option<EndpointUrl>,
    // The event types to send from now on, each once, or `["*"]` alone for all of them: described
    // by its own schema, as a description here would wrap it in an `allOf` generators misread.
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub enabled_events: Option<EnabledEvents>,
    /// What the endpoint is for, at most 1000 characters; `""` removes it.
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 1000)]
    pub description: Option<Description>,
    // `disabled` stops its deliveries (the pending ones are given up); `enabled` sends it the
    // events committed from then on, and starts its failure streak afresh. Described by its own
    // schema (the endpoint's status), as `enabled_events` is.
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub status: Option<EndpointStatus>,
}

/// A roll of an endpoint's secret. Unknown fields are refused; the body may be left out.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "expires_in": 3600 }))]
pub struct SecretRoll {
    /// How many seconds the secret being replaced keeps signing beside the new one, from 0 (it
    /// stops now) to 604800 (7 days); 86400 (a day) when left out.
    #[serde(default)]
    #[schema(value_type = Option<u64>, minimum = 0, maximum = 604_800, example = 3600)]
    pub expires_in: Option<OldSecretLifetime>,
}

/// How long a replaced secret keeps signing: at most [`MAX_OLD_SECRET_LIFETIME`], in seconds.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(try_from = "Box<RawValue>")]
pub struct OldSecretLifetime(Duration);

/// Read from the number's text, as an amount is (`payments::Amount`): `3600.0` and `36e2` are the
/// integer 3600 to JSON Schema, which the description promises, and a fraction is refused.
impl TryFrom<Box<RawValue>> for OldSecretLifetime {
    type Error = String;

    fn try_from(raw: Box<RawValue>) -> Result<Self, Self::Error> {
        let text = raw.get().trim();
        let max = MAX_OLD_SECRET_LIFETIME.as_secs();
        let seconds = Decimal::parse(text)
            .filter(Decimal::is_integer)
            .and_then(|number| number.to_i64())
            .and_then(|seconds| u64::try_from(seconds).ok())
            .filter(|&seconds| seconds <= max)
            .ok_or_else(|| {
                format!(
                    "expires_in is a whole number of seconds from 0 to {max} (7 days), got {text}"
                )
            })?;
        Ok(Self(Duration::from_secs(seconds)))
    }
}

/// Update a webhook endpoint
///
/// Changes any of an endpoint's `url`, `enabled_events`, `description` and `status`, once per
/// `Idempotency-Key`; a field left out is unchanged. Each field is checked as at registration (a
/// URL whose host is or resolves to a non-public address is refused). Answers the endpoint,
/// without its secret.
///
/// A new URL receives the deliveries still being retried as well as the new ones. `disabled`
/// stops the endpoint's deliveries and gives up those pending; `enabled` (of a disabled endpoint,
/// whether the merchant or the retry schedule disabled it) sends it the events committed from then
/// on, and its failure streak starts afresh: no delivery created before is counted against it.
///
/// A change is recorded as a `webhook_endpoint.updated` event of the account, the endpoint as
/// changed in `data.object` and the fields it replaced, with their former values, in
/// `data.previous_attributes`; a request that changes nothing writes none.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints/{id}",
    operation_id = "updateWebhookEndpoint",
    tag = "webhook endpoints",
    params(("id" = String, Path, description = "The endpoint's id, `we_…`."), IdempotencyKey),
    request_body(content = Option<WebhookEndpointUpdate>, content_type = "application/json",
        description = "What to change; without a body (or with `{}`), nothing: the endpoint as it is."),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The endpoint as changed, or the replay of the request that changed it.",
            body = WebhookEndpoint, content_type = "application/json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 400, description = "The body or the key is invalid: a URL that is not `http(s)` with a host, whose host is or resolves to a non-public address, or does not resolve; an unknown event type or status; a description too long (`invalid-request`, with `param`; `invalid-idempotency-key`). Nothing was changed.",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint for this account (`not-found`); nothing was changed and the key was released.",
            body = Problem, content_type = "application/problem+json"),
        IdempotencyProblems,
        AuthenticatedProblems,
    )
)]
async fn update_webhook_endpoint(
    State(idempotency): State<Idempotency>,
    State(settings): State<WebhookSettings>,
    account: Account,
    PathId(id): PathId<EndpointId>,
    Idempotent { request, body }: Idempotent<WebhookEndpointUpdate>,
) -> Result<Response, ApiError> {
    let account = account.id().clone();
    idempotency
        .run(request, move |lease| {
            update(lease, account, id, body, settings.allow_private)
        })
        .await
}

/// Roll a webhook endpoint's secret
///
/// Gives the endpoint a new `whsec_…` secret, once per `Idempotency-Key`, and answers the
/// endpoint with it: this answer (and its replays) is the only one that shows it.
///
/// The secret it replaces keeps signing for `expires_in` seconds (a day unless said, at most 7
/// days; 0 stops it now): meanwhile every delivery's `webhook-signature` carries two signatures,
/// `v1,<with the new secret> v1,<with the old one>`, so a receiver holding either verifies it
/// (Standard Webhooks allows several, space-separated). After it, only the new secret signs. A
/// roll during another's overlap replaces the current secret again: the one that roll replaced
/// stops signing at once, and only the secret being replaced now keeps signing for `expires_in`.
///
/// The roll is recorded as a `webhook_endpoint.updated` event of the account, without either
/// secret: `data.previous_attributes` holds the former `secret_rolled_at` and
/// `previous_secret_expires_at`.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints/{id}/roll_secret",
    operation_id = "rollWebhookEndpointSecret",
    tag = "webhook endpoints",
    params(("id" = String, Path, description = "The endpoint's id, `we_…`."), IdempotencyKey),
    request_body(content = Option<SecretRoll>, content_type = "application/json",
        description = "How long the replaced secret keeps signing; without a body (or with `{}`), a day."),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The secret was rolled, or this is the replay of the request that rolled it. The endpoint with its new secret, shown in this answer only.",
            body = WebhookEndpoint, content_type = "application/json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 400, description = "The body or the key is invalid: `expires_in` over 604800 or not a whole number of seconds (`invalid-request`, with `param`; `invalid-idempotency-key`). Nothing was changed.",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such endpoint for this account (`not-found`); nothing was changed and the key was released.",
            body = Problem, content_type = "application/problem+json"),
        IdempotencyProblems,
        AuthenticatedProblems,
    )
)]
async fn roll_webhook_endpoint_secret(
    State(idempotency): State<Idempotency>,
    account: Account,
    PathId(id): PathId<EndpointId>,
    Idempotent { request, body }: Idempotent<SecretRoll>,
) -> Result<Response, ApiError> {
    let account = account.id().clone();
    let lifetime = body
        .expires_in
        .map_or(DEFAULT_OLD_SECRET_LIFETIME, |lifetime| lifetime.0);
    idempotency
        .run(request, move |lease| roll(lease, account, id, lifetime))
        .await
}

/// The endpoint's row, locked until the change commits: two changes of one endpoint take turns,
/// and each one's `previous_attributes` are what the one before it left.
struct Current {
    url: String,
    enabled_events: Vec<String>,
    description: Option<String>,
    status: String,
    secret: String,
    secret_rolled_at: Option<DateTime<Utc>>,
    previous_secret_expires_at: Option<DateTime<Utc>>,
    enabled_at: Option<DateTime<Utc>>,
}

async fn lock(
    conn: &mut PgConnection,
    account: &AccountId,
    id: &EndpointId,
) -> Result<Current, ApiError> {
    Ok(sqlx::query_as!(
        Current,
        r#"
        SELECT url, enabled_events, description, status, secret, secret_rolled_at,
               previous_secret_expires_at, enabled_at
        FROM webhook_endpoints
        WHERE account_id = $1 AND id = $2
        FOR UPDATE
        "#,
        account.as_str(),
        id.as_str(),
    )
    .fetch_optional(conn)
    .await?
    .ok_or_else(|| EndpointId::no_such(id.as_str()))?)
}

/// Checks a new URL's address once the key is decided (as registration does: a replay is its
/// stored answer whatever the check says now), then writes the fields that change, what follows
/// from them for the endpoint's pending deliveries, the event and the key's completion in one
/// transaction.
async fn update(
    lease: Lease,
    account: AccountId,
    id: EndpointId,
    change: WebhookEndpointUpdate,
    allow_private: bool,
) -> Result<Completion, ApiError> {
    if let Some(url) = &change.url {
        url.check(allow_private).await?;
    }
    let at = lease.now();
    let mut tx = lease.begin().await?;
    let current = lock(&mut tx, &account, &id).await?;
    let before = stored::<EndpointStatus>(&current.status)?;
    let mut previous = Map::new();
    let mut replaced = |field: &str, old: Value, new: Value| {
        if old != new {
            previous.insert(field.to_owned(), old);
        }
    };
    let url = change.url.map_or(current.url.clone(), |url| url.0);
    replaced("url", json!(current.url), json!(url));
    let enabled_events = change
        .enabled_events
        .map_or(current.enabled_events.clone(), |events| events.0);
    replaced(
        "enabled_events",
        json!(current.enabled_events),
        json!(enabled_events),
    );
    let description = match change.description.map(String::from) {
        None => current.description.clone(),
        Some(cleared) if cleared.is_empty() => None,
        Some(description) => Some(description),
    };
    replaced(
        "description",
        json!(current.description),
        json!(description),
    );
    let status = change.status.unwrap_or(before);
    replaced("status", json!(before), json!(status));
    let reenabled = before == EndpointStatus::Disabled && status == EndpointStatus::Enabled;
    let row = sqlx::query_as!(
        EndpointRow,
        r#"
        UPDATE webhook_endpoints
        SET url = $3, enabled_events = $4, description = $5, status = $6, enabled_at = $7
        WHERE account_id = $1 AND id = $2
        RETURNING id, url, enabled_events, description, status, secret_rolled_at,
                  previous_secret_expires_at, created_at
        "#,
        account.as_str(),
        id.as_str(),
        url,
        &enabled_events,
        description,
        status.as_str(),
        if reenabled {
            Some(at)
        } else {
            current.enabled_at
        },
    )
    .fetch_one(&mut *tx)
    .await?;
    if url != current.url {
        // The deliveries still being retried go where the merchant now wants them; an attempt in
        // flight finishes at the old URL.
        sqlx::query!(
            r#"
            UPDATE webhook_deliveries SET url = $3
            WHERE account_id = $1 AND endpoint_id = $2
              AND delivered_at IS NULL AND failed_at IS NULL
            "#,
            account.as_str(),
            id.as_str(),
            url,
        )
        .execute(&mut *tx)
        .await?;
    }
    if before == EndpointStatus::Enabled && status == EndpointStatus::Disabled {
        // Given up, as when the schedule disables it: the loop sends pending rows whatever the
        // endpoint's status, and a disabled endpoint is sent nothing more.
        sqlx::query!(
            r#"
            UPDATE webhook_deliveries SET failed_at = $3
            WHERE account_id = $1 AND endpoint_id = $2
              AND delivered_at IS NULL AND failed_at IS NULL
            "#,
            account.as_str(),
            id.as_str(),
            at,
        )
        .execute(&mut *tx)
        .await?;
    }
    let endpoint = row.parse()?;
    // A request that changes nothing writes no event.
    let event = (!previous.is_empty())
        .then(|| NewEvent::updated(EventType::WebhookEndpointUpdated, &endpoint, previous, at))
        .transpose()
        .map_err(anyhow::Error::from)?;
    complete(lease, tx, &account, &endpoint, event).await
}

/// Replaces the secret; the one it replaces signs beside it until `lifetime` from now (not at all
/// if zero), and the one an earlier roll replaced, if it still signed, stops.
async fn roll(
    lease: Lease,
    account: AccountId,
    id: EndpointId,
    lifetime: Duration,
) -> Result<Completion, ApiError> {
    let at = lease.now();
    let mut tx = lease.begin().await?;
    let current = lock(&mut tx, &account, &id).await?;
    let secret = WebhookSecret::generate().expose();
    let (previous_secret, expires_at) = if lifetime.is_zero() {
        (None, None)
    } else {
        let lifetime = chrono::Duration::from_std(lifetime).map_err(anyhow::Error::from)?;
        (Some(current.secret), Some(at + lifetime))
    };
    let row = sqlx::query_as!(
        EndpointRow,
        r#"
        UPDATE webhook_endpoints
        SET secret = $3, previous_secret = $4, previous_secret_expires_at = $5,
            secret_rolled_at = $6
        WHERE account_id = $1 AND id = $2
        RETURNING id, url, enabled_events, description, status, secret_rolled_at,
                  previous_secret_expires_at, created_at
        "#,
        account.as_str(),
        id.as_str(),
        secret,
        previous_secret,
        expires_at,
        at,
    )
    .fetch_one(&mut *tx)
    .await?;
    let previous = Map::from_iter([
        (
            "secret_rolled_at".to_owned(),
            json!(current.secret_rolled_at),
        ),
        (
            "previous_secret_expires_at".to_owned(),
            json!(current.previous_secret_expires_at),
        ),
    ]);
    let mut endpoint = row.parse()?;
    let event = NewEvent::updated(EventType::WebhookEndpointUpdated, &endpoint, previous, at)
        .map_err(anyhow::Error::from)?;
    endpoint.secret = Some(secret);
    complete(lease, tx, &account, &endpoint, Some(event)).await
}

/// Writes the `webhook_endpoint.updated` event, if the change wrote one, then stores the endpoint
/// (with a rolled secret, without any other) as the key's 200 and commits, all in `tx`.
async fn complete(
    lease: Lease,
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    account: &AccountId,
    endpoint: &WebhookEndpoint,
    event: Option<NewEvent>,
) -> Result<Completion, ApiError> {
    if let Some(event) = &event {
        let engine = lease.engine().await?;
        events::write(
            &mut tx,
            engine,
            account.as_str(),
            std::slice::from_ref(event),
        )
        .await?;
    }
    let response = StoredResponse::json(StatusCode::OK, endpoint).map_err(anyhow::Error::from)?;
    let completion = lease.complete(tx, response).await?;
    if completion.committed() {
        events::written(event.iter());
    }
    Ok(completion)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_secret_signs_for_at_most_a_week_in_whole_seconds_however_written() {
        let lifetime = |text: &str| serde_json::from_str::<OldSecretLifetime>(text);
        for (text, seconds) in [("0", 0), ("0.0", 0), ("604800", 604_800), ("36e2", 3600)] {
            assert_eq!(lifetime(text).unwrap().0.as_secs(), seconds, "{text}");
        }
        for text in ["604801", "-1", "1.5", "1e400", "\"60\"", "true"] {
            let refused = lifetime(text).unwrap_err().to_string();
            assert!(
                refused.contains("whole number of seconds from 0 to 604800"),
                "{text}: {refused}"
            );
        }
        assert!(DEFAULT_OLD_SECRET_LIFETIME <= MAX_OLD_SECRET_LIFETIME);
    }
}
