//! The HTTP plumbing, below the domains and naming none of them: the middleware every request
//! passes through ([`router`]), and what every route shares (the problem+json error type,
//! extractors, the OpenAPI root, health, the problem pages and metrics). The accept loop and
//! keyset pagination are the crate `service`'s (`service::server`, `service::pagination`), shared
//! with the processor; `extract.rs` answers pagination's refusals as problem documents. The domains'
//! routers are merged in `src/app.rs`, which hands each the sub-state it asks for.

pub mod error;
pub mod extract;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod problems;
mod refusals;

pub use problems::Figures;

use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::HeaderName;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa_swagger_ui::SwaggerUi;

use error::{Problem, ProblemKind};
use service::server::MAX_BODY_BYTES;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How long a request may take, and its body may stall.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// How long a request may take before it is answered with 503.
    pub request: Duration,
    /// How long a request body may stall before the request is answered with 408.
    pub body_read: Duration,
}

/// The routes `api`, given their `state`, with the middleware every request passes through, the
/// `description` at `/openapi.json` and the browsable docs at `/docs`; and more routes `beside`
/// them, made from the routes (the checkout page, which calls them in process), which pass through
/// the same outer layers (request id, logs, body limits) but are not part of the description.
/// Everything answers errors as problem documents, including unknown routes and methods.
pub fn router<S>(
    api: Router<S>,
    state: S,
    description: utoipa::openapi::OpenApi,
    timeouts: Timeouts,
    beside: impl FnOnce(Router) -> Router,
) -> Router
where
    S: Clone + Send + Sync + 'static,
{
    let Timeouts {
        request: request_timeout,
        body_read: body_read_timeout,
    } = timeouts;
    // Around every route: counted and timed by its template, then bounded in time, so a request
    // that times out is counted with the 503 it was answered with.
    let api = api.route_layer(
        ServiceBuilder::new()
            .layer(middleware::from_fn(metrics::track))
            .layer(middleware::from_fn(move |request, next| {
                answer_within(request_timeout, request, next)
            })),
    );
    let api = api.with_state(state);
    let beside = beside(api.clone().layer(DefaultBodyLimit::max(MAX_BODY_BYTES)));
    api.merge(SwaggerUi::new("/docs").url("/openapi.json", description))
        .merge(beside)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(
            // Outermost first: the request id exists before the span that logs it, and a panic
            // anywhere inside becomes a problem document.
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(request_span)
                        .on_response(DefaultOnResponse::new().level(Level::INFO))
                        .on_failure(service::server::log_failure),
                )
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                .layer(CatchPanicLayer::custom(|_| {
                    Problem::new(ProblemKind::Internal, "The request failed on our side.")
                        .into_response()
                }))
                .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
                .layer(RequestBodyTimeoutLayer::new(body_read_timeout)),
        )
}

/// Every request's span carries its id; the account, the key's scope and what became of the key are
/// recorded as they are known. Headers are not logged: they carry the API key.
fn request_span(request: &Request) -> tracing::Span {
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|id| id.to_str().ok())
        .unwrap_or_default();
    tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path(),
        request_id,
        account = tracing::field::Empty,
        scope = tracing::field::Empty,
        key_outcome = tracing::field::Empty,
    )
}

/// Bounds every request's time, so a database that stops answering (a paused server holds its
/// connections open without a word) never leaves a client hanging. The work a request started is
/// not cut short: a payment runs in a task of its own, and if it completes, a retry with the same
/// key receives its result.
async fn answer_within(limit: Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(?limit, "request timed out");
            Problem::new(
                ProblemKind::ServiceUnavailable,
                "The request did not finish in time. Retry with the same Idempotency-Key: if it went \
                 through meanwhile, the retry receives its result.",
            )
            .retry_after(Duration::from_secs(1))
            .into_response()
        }
    }
}

async fn not_found(request: Request) -> Response {
    Problem::new(
        ProblemKind::NotFound,
        format!(
            "No route for {} {}.",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response()
}

async fn method_not_allowed(request: Request) -> Response {
    Problem::new(
        ProblemKind::MethodNotAllowed,
        format!(
            "{} is not allowed on {}.",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response()
}
