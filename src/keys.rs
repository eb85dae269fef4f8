//! `GET /v1/idempotency_keys/{key}`: a key's life as the account sees it, one entry per route the
//! key was used on, read by the mechanism ([`Idempotency::inspect`]) on the routes named here.

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use idempotency::{Idempotency, IdempotencyKey, KeyInspection, Owner, Owners};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{ApiError, AuthenticatedProblems, Problem, ProblemKind};
use crate::http::extract::Path;

/// The routes that take an `Idempotency-Key`, as their scopes name them (method and route
/// template). The inspection reads exactly these scopes of the account: each an index lookup on
/// `(account_id, scope, idem_key)`, and never the processor's own keys, which share the table under scopes of
/// their own. A unit test checks the list against the API description.
pub const IDEMPOTENT_ROUTES: [&str; 8] = [
    "POST /v1/events/{id}/retry",
    "POST /v1/payments",
    "POST /v1/payments/{id}/cancel",
    "POST /v1/payments/{id}/capture",
    "POST /v1/payments/{id}/refunds",
    "POST /v1/webhook_endpoints",
    "POST /v1/webhook_endpoints/{id}",
    "POST /v1/webhook_endpoints/{id}/roll_secret",
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
                .schema(Some(idempotency::key_schema()))
                .build(),
        ]
    }
}

/// The route, on any state that names the owner of a request and holds the mechanism.
pub fn router<S>() -> OpenApiRouter<S>
where
    S: Owners<Rejection = ApiError> + Clone + Send + Sync + 'static,
    Idempotency: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(get_idempotency_key))
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
    State(mechanism): State<Idempotency>,
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
    match mechanism.inspect(&owner, &key, &IDEMPOTENT_ROUTES).await? {
        Some(inspection) => Ok(axum::Json::<KeyInspection>(inspection).into_response()),
        None => Err(Problem::new(
            ProblemKind::NotFound,
            "No such idempotency key for this account: never used, or expired.",
        )
        .into()),
    }
}
