//! Webhook endpoints: where a merchant wants its events sent. `POST /v1/webhook_endpoints`
//! registers one, once per idempotency key, and answers with the `whsec_…` secret its deliveries
//! are signed with; the secret is shown in that answer (and its replays) only. Every event of a
//! subscribed type is then queued for it by the `events` trigger and sent by the delivery loop
//! (`service::outbox::delivery`). Changing one and rolling its secret is `super::changes`.

use axum::extract::{FromRef, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::settings::WebhookSettings;
use crate::accounts::{Account, AccountCache, AccountId, RateLimit};
use crate::events::EventType;
use crate::http::error::{
    ApiError, AuthenticatedProblems, IdempotencyProblems, Problem, ProblemKind,
};
use crate::http::extract::{FilteredQuery, PathId};
use crate::payments::Description;
use idempotency::{
    Completion, Idempotency, IdempotencyKey, Idempotent, Lease, Owners, StoredResponse,
};
use service::ids::PublicId;
use service::outbox::{WebhookSecret, address};
use service::pagination::{CreatedParams, List, ListParams};
use service::vocabulary::{stored, vocabulary};

/// The longest URL an endpoint may have, as the table's CHECK bounds it.
const MAX_URL_LEN: usize = 2048;

/// The most endpoints an account may have, enabled or disabled, as Stripe allows. Each event is
/// copied to every endpoint that subscribes to it in the statement that writes it (the payment's
/// own), and each copy is then sent on the whole retry schedule: without a bound, one account
/// could make every one of its payments write and send without end (`README.md` measures the cost
/// of this many).
pub const MAX_ENDPOINTS: i64 = 16;

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Owners<Rejection = ApiError> + Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    Idempotency: FromRef<S>,
    WebhookSettings: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_webhook_endpoint, list_webhook_endpoints))
        .routes(routes!(get_webhook_endpoint, delete_webhook_endpoint))
}

/// An endpoint to register. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "url": "https://example.com/idempay/events",
    "enabled_events": ["payment.succeeded", "refund.created"]
}))]
pub struct NewWebhookEndpoint {
    /// Where to send the events: an `http` or `https` URL whose host is a public address, or a
    /// name that resolves only to public addresses.
    #[schema(value_type = String, max_length = 2048, example = "https://example.com/idempay/events")]
    pub url: EndpointUrl,
    // Described by its own schema: a description here would wrap it in an `allOf`.
    #[schema(inline)]
    pub enabled_events: EnabledEvents,
    /// What the endpoint is for, in the merchant's words, at most 1000 characters (`""` is none).
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 1000, example = "Order fulfilment")]
    pub description: Option<Description>,
}

/// An endpoint's URL, of the right shape: absolute, `http` or `https`, with a host, without
/// credentials, at most 2048 characters. Whether its host is public is checked apart, since that
/// depends on a setting and a lookup.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct EndpointUrl(pub(super) String);

impl EndpointUrl {
    /// Refuses a URL whose host is, or resolves to, a non-public address (unless `allow_private`):
    /// 400 `invalid-request` naming `url`.
    pub(super) async fn check(&self, allow_private: bool) -> Result<(), ApiError> {
        address::check(&self.0, allow_private)
            .await
            .map_err(|refused| {
                Problem::new(ProblemKind::InvalidRequest, format!("{refused}.")).param("/url")
            })?;
        Ok(())
    }
}

impl TryFrom<String> for EndpointUrl {
    type Error = String;

    fn try_from(url: String) -> Result<Self, Self::Error> {
        crate::payments::reject_nul("url", &url)?;
        if url.len() > MAX_URL_LEN {
            return Err(format!("url must be at most {MAX_URL_LEN} characters"));
        }
        address::parse(&url, true).map_err(|refused| refused.to_string())?;
        Ok(Self(url))
    }
}

/// The event types an endpoint subscribes to: at least one, each known, without repeats; or `*`
/// alone, for all.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct EnabledEvents(pub(super) Vec<String>);

impl TryFrom<Vec<String>> for EnabledEvents {
    type Error = String;

    fn try_from(types: Vec<String>) -> Result<Self, Self::Error> {
        if types.is_empty() {
            return Err("enabled_events lists at least one event type, or `*`".to_owned());
        }
        if types.iter().any(|kind| kind == "*") && types.len() > 1 {
            return Err("`*` in enabled_events stands alone: it means every type".to_owned());
        }
        for (index, kind) in types.iter().enumerate() {
            if kind != "*" && kind.parse::<EventType>().is_err() {
                let types: Vec<&str> = EventType::ALL.iter().map(|kind| kind.as_str()).collect();
                return Err(format!(
                    "`{kind}` is no event type; the types are {}, or `*` for all",
                    types.join(", ")
                ));
            }
            if types[..index].contains(kind) {
                return Err(format!("`{kind}` is listed twice in enabled_events"));
            }
        }
        Ok(Self(types))
    }
}

/// Described as what it admits: at least one of the event types or `*`, without repeats. That `*`
/// stands alone is the one rule a schema cannot say.
impl utoipa::PartialSchema for EnabledEvents {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
        let names = EventType::ALL.iter().map(|kind| kind.as_str()).chain(["*"]);
        ArrayBuilder::new()
            .description(Some(
                "The event types to send, each once, or `[\"*\"]` alone for all of them.",
            ))
            .examples([serde_json::json!(["payment.succeeded"])])
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some(names)),
            )
            .min_items(Some(1))
            .unique_items(true)
            .into()
    }
}

impl utoipa::ToSchema for EnabledEvents {}

vocabulary! {
    /// Whether an endpoint is sent events.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum EndpointStatus: "webhook endpoint status" {
        /// Its events are delivered.
        Enabled => "enabled",
        /// It acknowledged no delivery for the whole retry schedule: it is sent nothing more.
        Disabled => "disabled",
    }
}

/// A webhook endpoint, as the API returns it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "id": "we_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
    "object": "webhook_endpoint",
    "url": "https://example.com/idempay/events",
    "enabled_events": ["payment.succeeded"],
    "description": "Order fulfilment",
    "status": "enabled",
    "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwdGVzdA==",
    "secret_rolled_at": null,
    "previous_secret_expires_at": null,
    "created_at": "2026-12-01T02:05:12.118230Z"
}))]
pub struct WebhookEndpoint {
    /// The endpoint's id, `we_` followed by 24 characters.
    #[schema(pattern = "^we_[0-9A-Za-z]{24}$")]
    pub id: String,
    /// Always `webhook_endpoint`.
    #[schema(value_type = String, pattern = "^webhook_endpoint$")]
    pub object: &'static str,
    pub url: String,
    /// The event types sent to it, or `["*"]` for all.
    pub enabled_events: Vec<String>,
    /// What the endpoint is for, in the merchant's words; `null` if it said nothing.
    pub description: Option<String>,
    #[schema(inline)]
    pub status: EndpointStatus,
    /// The `whsec_…` secret its deliveries are signed with (Standard Webhooks). In the answer to
    /// its creation, or to a roll of its secret, only (and that answer's replays): keep it then.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^whsec_")]
    pub secret: Option<String>,
    /// When its secret was last rolled (`POST /v1/webhook_endpoints/{id}/roll_secret`); `null` if
    /// never.
    pub secret_rolled_at: Option<DateTime<Utc>>,
    /// Until when its deliveries also carry a signature with the secret the last roll replaced;
    /// `null` if none does. Past it, only the current secret signs.
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// The answer to a deletion, as Stripe gives it.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedWebhookEndpoint {
    #[schema(pattern = "^we_[0-9A-Za-z]{24}$")]
    pub id: String,
    /// Always `webhook_endpoint`.
    #[schema(value_type = String, pattern = "^webhook_endpoint$")]
    pub object: &'static str,
    /// Always `true`.
    pub deleted: bool,
}

/// An endpoint's row as the API shows it: every statement that returns an endpoint selects these
/// columns.
pub(super) struct EndpointRow {
    pub(super) id: String,
    pub(super) url: String,
    pub(super) enabled_events: Vec<String>,
    pub(super) description: Option<String>,
    pub(super) status: String,
    pub(super) secret_rolled_at: Option<DateTime<Utc>>,
    pub(super) previous_secret_expires_at: Option<DateTime<Utc>>,
    pub(super) created_at: DateTime<Utc>,
}

impl EndpointRow {
    /// The endpoint this row holds; a decoding error if its status, or one of its event types
    /// (other than `*`), is unknown.
    pub(super) fn parse(self) -> Result<WebhookEndpoint, sqlx::Error> {
        for kind in self.enabled_events.iter().filter(|kind| *kind != "*") {
            stored::<EventType>(kind)?;
        }
        Ok(WebhookEndpoint {
            id: self.id,
            object: "webhook_endpoint",
            url: self.url,
            enabled_events: self.enabled_events,
            description: self.description,
            status: stored(&self.status)?,
            secret: None,
            secret_rolled_at: self.secret_rolled_at,
            previous_secret_expires_at: self.previous_secret_expires_at,
            created_at: self.created_at,
        })
    }
}

/// Register a webhook endpoint
///
/// Registers a URL to receive the account's events of the given types, once per
/// `Idempotency-Key`, and answers with the endpoint and its `whsec_…` secret. The secret is in
/// this answer only (a replay of it returns the same secret): `GET` never shows it.
///
/// Every event of a subscribed type committed from then on is delivered to it, signed per
/// Standard Webhooks with that secret, at least once. What the receiver must do:
///
/// - **verify** the signature (`webhook-signature`, over `"{webhook-id}.{webhook-timestamp}.{body}"`)
///   with the secret, on the raw body, and refuse a timestamp too far from your clock (idempay's
///   own intake allows {webhook_tolerance});
/// - **deduplicate** on `webhook-id`, the event's id, the same on every delivery of it: a
///   delivery may come more than once, and events may arrive out of order;
/// - **answer 2xx fast**, within {webhook_delivery_timeout}, and do slow work afterwards.
///
/// Anything else (another status, a timeout, a refused connection, a redirect) is a failed
/// attempt, tried again after each delay of the retry schedule ({webhook_retry_schedule}, each
/// moved by up to {webhook_jitter}); then the delivery is given up, and an endpoint that
/// acknowledged nothing for that whole time is disabled. Each attempt is listed at `GET /v1/events/{id}/attempts`.
///
/// The URL must be `http` or `https`, and its host a public address or a name that resolves only
/// to public ones: loopback, private, link-local (the cloud metadata service), shared (CGNAT) and
/// other non-public addresses are refused, at registration and again at every delivery.
///
/// An account has at most {max_webhook_endpoints} endpoints, enabled or disabled: one more is
/// refused with 409 `webhook-endpoint-limit` and the key is released (delete one, then retry with
/// the same key).
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints",
    operation_id = "createWebhookEndpoint",
    tag = "webhook endpoints",
    params(IdempotencyKey),
    request_body(content = NewWebhookEndpoint, content_type = "application/json"),
    security(("api_key" = [])),
    responses(
        (status = 201, description = "The endpoint was registered, or this is the replay of the request that registered it. The only answer that shows its secret.",
            body = WebhookEndpoint, content_type = "application/json",
            headers(
                ("Location" = String, description = "Where the endpoint can be read: `/v1/webhook_endpoints/{id}`."),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."),
            )),
        (status = 400, description = "The body or the key is invalid: a URL that is not `http(s)` with a host, whose host is or resolves to a non-public address, or does not resolve; an unknown event type (`invalid-request`, `invalid-idempotency-key`).",
            body = Problem, content_type = "application/problem+json"),
        IdempotencyProblems,
        // After the mechanism's own 409, which it replaces for this operation: one status, one
        // entry, naming every kind.
        (status = 409, description = "The account has {max_webhook_endpoints} endpoints already (`webhook-endpoint-limit`): nothing was registered and the key was released; delete one, then retry with the same key. Or a request with this key is still being processed (`idempotency-key-in-use`): retry after `Retry-After` seconds with the same key and body to receive its result.",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = i64, description = "Seconds to wait before retrying with the same key (`idempotency-key-in-use` only)."))),
        AuthenticatedProblems,
    )
)]
async fn create_webhook_endpoint(
    State(idempotency): State<Idempotency>,
    State(settings): State<WebhookSettings>,
    account: Account,
    Idempotent { request, body }: Idempotent<NewWebhookEndpoint>,
) -> Result<Response, ApiError> {
    let account = account.id().clone();
    idempotency
        .run(request, move |lease| {
            register(lease, account, body, settings.allow_private)
        })
        .await
}

/// Checks where the URL points, then writes the endpoint with its new secret and completes the key
/// in one transaction: the stored response, replayed to a retry, carries the same secret.
///
/// The address is checked here, once the key is decided, not before: a replay of a completed
/// key is its stored 201 (the secret, shown once, with it), whatever the address check would say
/// now (a name that resolves elsewhere today, an instance that refuses private addresses). A
/// refusal fails the work before anything was written, which releases the key: nothing was done,
/// and a retry may find the name resolving.
async fn register(
    lease: Lease,
    account: AccountId,
    endpoint: NewWebhookEndpoint,
    allow_private: bool,
) -> Result<Completion, ApiError> {
    endpoint.url.check(allow_private).await?;
    let secret = WebhookSecret::generate().expose();
    let mut tx = lease.begin().await?;
    // Counted under a lock of the account's own, held to the commit: two registrations at once
    // would otherwise both count 15 and make 17. An advisory lock, since there is no row to lock
    // yet (and a lock on the account's row would be a write to every node on Citus, where
    // `accounts` is a reference table); its key is the account id's 64-bit hash, and a collision
    // only makes two accounts' registrations wait on each other.
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('idempay endpoint limit ' || $1, 0))",
        account.as_str(),
    )
    .execute(&mut *tx)
    .await?;
    let registered = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM webhook_endpoints WHERE account_id = $1"#,
        account.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    if registered >= MAX_ENDPOINTS {
        return Err(Problem::new(
            ProblemKind::WebhookEndpointLimit,
            format!(
                "The account has {registered} webhook endpoints, the most it may have \
                 ({MAX_ENDPOINTS}); nothing was registered. Delete one, then retry with the \
                 same key."
            ),
        )
        .into());
    }
    let id = EndpointId::generate();
    let row = sqlx::query_as!(
        EndpointRow,
        r#"
        INSERT INTO webhook_endpoints (id, account_id, url, enabled_events, secret, description)
        VALUES ($1, $2, $3, $4, $5, $6)
        RETURNING id, url, enabled_events, description, status, secret_rolled_at,
                  previous_secret_expires_at, created_at
        "#,
        id.as_str(),
        account.as_str(),
        endpoint.url.0,
        &endpoint.enabled_events.0,
        secret,
        // `""` says nothing, as it removes a description in an update.
        endpoint
            .description
            .map(String::from)
            .filter(|description| !description.is_empty()),
    )
    .fetch_one(&mut *tx)
    .await?;
    let mut created = row.parse()?;
    created.secret = Some(secret);
    let response = StoredResponse::json(StatusCode::CREATED, &created)
        .map_err(anyhow::Error::from)?
        .with_header(
            header::LOCATION,
            format!("/v1/webhook_endpoints/{}", created.id),
        );
    Ok(lease.complete(tx, response).await?)
}

/// List webhook endpoints
///
/// The account's endpoints, newest first, paginated and narrowed by `created` like the payments
/// list. Secrets are not shown.
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints",
    operation_id = "listWebhookEndpoints",
    tag = "webhook endpoints",
    params(ListParams, CreatedParams),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of endpoints.", body = List<WebhookEndpoint>, content_type = "application/json"),
        (status = 400, description = "A bad `limit` or `created` bound, an unknown parameter, or both cursors at once (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The cursor names none of the account's endpoints (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_webhook_endpoints(
    State(pool): State<PgPool>,
    account: Account,
    FilteredQuery(query): FilteredQuery,
) -> Result<Response, ApiError> {
    let (page, created) = query.finish()?;
    let account = account.id().as_str();
    let rows = service::keyset_page!(
        &pool,
        &page,
        EndpointRow,
        position(cursor) if EndpointId::fits(cursor) =>
            "SELECT created_at, id FROM webhook_endpoints WHERE id = $1 AND account_id = $2",
            cursor, account;
        select: "SELECT id, url, enabled_events, description, status, secret_rolled_at,
                        previous_secret_expires_at, created_at
                 FROM webhook_endpoints",
        created_at: "created_at",
        id: "id",
        // Served by `webhook_endpoints_account_id`: the `created` range bounds its scan.
        filter: "account_id = $4
                 AND created_at >= COALESCE($5, '-infinity'::timestamptz)
                 AND created_at < COALESCE($6, 'infinity'::timestamptz)",
        account,
        created.from,
        created.until,
    )
    .await?;
    Ok(axum::Json(List::parse_rows(rows, &page, EndpointRow::parse)?).into_response())
}

/// Retrieve a webhook endpoint
///
/// One of the account's endpoints, without its secret.
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints/{id}",
    operation_id = "getWebhookEndpoint",
    tag = "webhook endpoints",
    params(("id" = String, Path, description = "The endpoint's id, `we_…`.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The endpoint.", body = WebhookEndpoint, content_type = "application/json"),
        (status = 404, description = "No such endpoint for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn get_webhook_endpoint(
    State(pool): State<PgPool>,
    account: Account,
    PathId(id): PathId<EndpointId>,
) -> Result<Response, ApiError> {
    let row = sqlx::query_as!(
        EndpointRow,
        r#"
        SELECT id, url, enabled_events, description, status, secret_rolled_at,
               previous_secret_expires_at, created_at
        FROM webhook_endpoints
        WHERE id = $1 AND account_id = $2
        "#,
        id.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| EndpointId::no_such(id.as_str()))?;
    Ok(axum::Json(row.parse()?).into_response())
}

/// Delete a webhook endpoint
///
/// Deletes one of the account's endpoints: it is sent nothing more, and its pending deliveries
/// and their attempts are deleted with it.
#[utoipa::path(
    delete,
    path = "/v1/webhook_endpoints/{id}",
    operation_id = "deleteWebhookEndpoint",
    tag = "webhook endpoints",
    params(("id" = String, Path, description = "The endpoint's id, `we_…`.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The endpoint was deleted.", body = DeletedWebhookEndpoint, content_type = "application/json"),
        (status = 404, description = "No such endpoint for this account, or it was already deleted (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn delete_webhook_endpoint(
    State(pool): State<PgPool>,
    account: Account,
    PathId(id): PathId<EndpointId>,
) -> Result<Response, ApiError> {
    let deleted = sqlx::query_scalar!(
        "DELETE FROM webhook_endpoints WHERE id = $1 AND account_id = $2 RETURNING id",
        id.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| EndpointId::no_such(id.as_str()))?;
    Ok(axum::Json(DeletedWebhookEndpoint {
        id: deleted,
        object: "webhook_endpoint",
        deleted: true,
    })
    .into_response())
}

service::public_id!(
    /// A webhook endpoint's id: `we_` and 24 base62 characters.
    pub EndpointId, "we", 24, "a webhook endpoint id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_endpoint_status_or_event_type_that_is_none_of_ours_is_an_error() {
        let row = |status: &str, events: &[&str]| EndpointRow {
            id: "we_Jx8bq2LkR5Vn0Ww3Zt7YcA1d".to_owned(),
            url: "https://example.com/".to_owned(),
            enabled_events: events.iter().map(|kind| (*kind).to_owned()).collect(),
            description: None,
            status: status.to_owned(),
            secret_rolled_at: None,
            previous_secret_expires_at: None,
            created_at: Utc::now(),
        };
        for status in EndpointStatus::ALL {
            let endpoint = row(status.as_str(), &["*"]).parse().unwrap();
            assert_eq!(endpoint.status, *status);
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
        assert!(row("enabled", &["payment.succeeded"]).parse().is_ok());
        // An unknown status is refused, never read as `enabled`.
        let unknown = row("paused", &["*"]).parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown webhook endpoint status `paused`"),
            "{unknown}"
        );
        let unknown = row("enabled", &["payment.created"]).parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown event type `payment.created`"),
            "{unknown}"
        );
    }

    fn events(types: &[&str]) -> Result<EnabledEvents, String> {
        EnabledEvents::try_from(
            types
                .iter()
                .map(|kind| (*kind).to_owned())
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn enabled_events_are_known_types_once_each_or_a_lone_star() {
        assert!(events(&["*"]).is_ok());
        assert!(events(&["payment.succeeded", "refund.created"]).is_ok());
        let all: Vec<&str> = EventType::ALL.iter().map(|kind| kind.as_str()).collect();
        assert!(events(&all).is_ok());
        assert!(events(&[]).is_err());
        assert!(events(&["*", "payment.succeeded"]).is_err());
        assert!(events(&["payment.succeeded", "payment.succeeded"]).is_err());
        let unknown = events(&["charge.succeeded"]).unwrap_err();
        assert!(
            unknown.contains("`charge.succeeded` is no event type"),
            "{unknown}"
        );
    }
}
