//! `GET /v1/idempotency_keys/{key}`: a key's life as the account sees it, one entry per route the
//! key was used on (a key's scope is the account and the endpoint, so one key may name a payment
//! and a refund). Read-only: inspecting a key never changes it.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::store::KeyStatus;
use super::{IdempotencyKey, Owner};
use crate::app::AppState;
use crate::http::error::{ApiError, AuthenticatedProblems, Problem, ProblemKind};
use crate::http::extract::Path;

/// The routes that take an `Idempotency-Key`, as their scopes name them (method and route
/// template). The inspection reads exactly these scopes of the account: each an index lookup on
/// `(account_id, scope, idem_key)`, and never the processor's own keys, which share the table under scopes of
/// their own. A unit test checks the list against the API description.
pub(crate) const IDEMPOTENT_ROUTES: [&str; 4] = [
    "POST /v1/events/{id}/retry",
    "POST /v1/payments",
    "POST /v1/payments/{id}/refunds",
    "POST /v1/webhook_endpoints",
];

/// The key in the path, described by the same schema as the `Idempotency-Key` header, so that
/// what the description allows is what the route accepts.
#[derive(serde::Deserialize)]
struct KeyInPath {
    key: String,
}

impl utoipa::IntoParams for KeyInPath {
    fn into_params(
        _parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::Required;
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};

        vec![
            ParameterBuilder::new()
                .name("key")
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .description(Some("The key, as sent in `Idempotency-Key`."))
                .schema(Some(super::request::key_schema()))
                .build(),
        ]
    }
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_idempotency_key))
}

/// An idempotency key of the account, on every route it was used on.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "key": "5f0c8b1e-2a3d-4c6f-9b21-7d0e4a9c1f88",
    "uses": [{
        "route": "POST /v1/payments",
        "state": "completed",
        "created_at": "2026-12-01T10:00:00.000000Z",
        "completed_at": "2026-12-01T10:00:00.120000Z",
        "expires_at": "2026-12-02T10:00:00.120000Z",
        "locked_until": null,
        "recovery_point": null,
        "downstream_key": "5b1e0c8f-7d0e-4a9c-9b21-2a3d4c6f1f88",
        "response_status": 201,
        "response_location": "/v1/payments/pay_U5PgTqA02dYsv3cLANIGkqIs",
        "fingerprint": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "takeovers": 0
    }]
}))]
pub struct KeyInspection {
    /// The key, as the path named it (unquoted).
    key: String,
    /// One entry per route the key was used on, by route.
    uses: Vec<KeyUse>,
}

/// Whether a request is still working on the key, or its response is stored.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyUseState {
    /// A request holds the key under a lease (`locked_until`), or its work was suspended at a
    /// recovery point for the next attempt to resume.
    InProgress,
    /// The response is stored: every repeat with the same body receives it.
    Completed,
    /// The work's call to the processor stayed unsettled past the recovery window: nothing
    /// resumes it by itself, and an operator settles it (`idempotency-key-held`).
    Held,
}

/// The key on one route.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyUse {
    /// The method and route template the key was used on, e.g. `POST /v1/payments`.
    route: String,
    state: KeyUseState,
    /// When the key was reserved.
    created_at: DateTime<Utc>,
    /// When the key completed; `null` while in progress (and for keys completed before this
    /// time was recorded).
    completed_at: Option<DateTime<Utc>>,
    /// When the key and its stored response are deleted; the key is new again after that.
    expires_at: DateTime<Utc>,
    /// While in progress: until when the request holding the key may work without renewing its
    /// lease. Past it, the next retry (or the recovery job) takes the key over.
    locked_until: Option<DateTime<Utc>>,
    /// The step the work recorded before calling the processor, from which the next attempt
    /// resumes (e.g. `payment.charge_requested`).
    recovery_point: Option<String>,
    /// The key idempay sends to the processor for this key's work, the same on every attempt.
    downstream_key: Option<String>,
    /// When the key was held for an operator; `null` unless `state` is `held`.
    held_at: Option<DateTime<Utc>>,
    /// The stored response's status code, once completed.
    response_status: Option<u16>,
    /// The stored response's `Location`, if it has one.
    response_location: Option<String>,
    /// The request's fingerprint: hex SHA-256 of its target and canonical JSON body. A retry with
    /// another fingerprint is refused (422).
    fingerprint: String,
    /// How many times another request, or the recovery job, took the key over from a holder
    /// whose lease ran out.
    takeovers: i32,
}

/// Retrieve an idempotency key
///
/// Shows what became of a key of this account: for each route it was used on, whether its request
/// is in progress or completed, its lease, its recovery point, the stored response's status and
/// `Location`, the request's fingerprint and how many times the key was taken over. Another
/// account's key is not found, like a key never used or expired. Percent-encode the key in the
/// path; it follows the rules of the `Idempotency-Key` header (bare or as an sf-string).
#[utoipa::path(
    get,
    path = "/v1/idempotency_keys/{key}",
    operation_id = "getIdempotencyKey",
    tag = "idempotency",
    params(KeyInPath),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The key on every route it was used on.", body = KeyInspection,
            content_type = "application/json"),
        (status = 400, description = "Not a valid idempotency key (`invalid-idempotency-key`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such key for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn get_idempotency_key(
    State(state): State<AppState>,
    Owner(owner): Owner,
    Path(KeyInPath { key: raw }): Path<KeyInPath>,
) -> Result<Response, ApiError> {
    let key = IdempotencyKey::parse(raw.as_bytes()).map_err(|error| {
        let reason = error.to_string().replace("the Idempotency-Key", "the key");
        Problem::new(
            ProblemKind::InvalidIdempotencyKey,
            format!("Not an idempotency key: {reason}."),
        )
    })?;
    let scopes: Vec<String> = IDEMPOTENT_ROUTES
        .iter()
        .map(|route| format!("{owner}:{route}"))
        .collect();
    let rows = sqlx::query!(
        r#"
        SELECT scope, status AS "status: KeyStatus", created_at, completed_at, expires_at,
               locked_until, recovery_point, downstream_key, held_at, response_code,
               response_headers ->> 'location' AS response_location, request_hash, takeovers
        FROM idempotency_keys
        WHERE account_id = $3 AND scope = ANY($1) AND idem_key = $2
          -- What the reservation treats as expired (new again) is not shown; a key whose call
          -- to the processor is unsettled is, past its expires_at too.
          AND NOT (expires_at <= now()
                   AND (status = 'completed'
                        OR (locked_until <= now() AND recovery_point IS NULL)))
        ORDER BY scope
        "#,
        &scopes,
        key.as_str(),
        owner,
    )
    .fetch_all(&state.pool)
    .await?;
    if rows.is_empty() {
        return Err(Problem::new(
            ProblemKind::NotFound,
            "No such idempotency key for this account: never used, or expired.",
        )
        .into());
    }
    let prefix = format!("{owner}:");
    let uses = rows
        .into_iter()
        .map(|row| KeyUse {
            route: row
                .scope
                .strip_prefix(&prefix)
                .unwrap_or(&row.scope)
                .to_owned(),
            state: match row.status {
                KeyStatus::InProgress => KeyUseState::InProgress,
                KeyStatus::Completed => KeyUseState::Completed,
                KeyStatus::Held => KeyUseState::Held,
            },
            created_at: row.created_at,
            completed_at: row.completed_at,
            expires_at: row.expires_at,
            locked_until: row.locked_until,
            recovery_point: row.recovery_point,
            downstream_key: row.downstream_key,
            held_at: row.held_at,
            response_status: row.response_code.and_then(|code| u16::try_from(code).ok()),
            response_location: row.response_location,
            fingerprint: hex::encode(row.request_hash),
            takeovers: row.takeovers,
        })
        .collect();
    Ok(axum::Json(KeyInspection {
        key: key.as_str().to_owned(),
        uses,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation that takes an `Idempotency-Key` is a route the inspection reads: a new
    /// idempotent route must join [`IDEMPOTENT_ROUTES`], or its keys would never be shown.
    #[test]
    fn the_inspected_routes_are_the_operations_that_take_a_key() {
        let description = serde_json::to_value(crate::app::spec()).unwrap();
        let mut keyed: Vec<String> = Vec::new();
        for (path, item) in description["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let takes_key = operation["parameters"].as_array().is_some_and(|params| {
                    params
                        .iter()
                        .any(|param| param["name"] == "Idempotency-Key")
                });
                if takes_key {
                    keyed.push(format!("{} {path}", method.to_uppercase()));
                }
            }
        }
        keyed.sort();
        assert_eq!(keyed, IDEMPOTENT_ROUTES);
    }
}
