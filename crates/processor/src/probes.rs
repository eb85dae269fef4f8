//! What an operator's tools ask the processor, without its API key, as they ask idempay: is it
//! alive (`/healthz`), can it serve (`/readyz`: its database answers), and its metrics
//! (`/metrics`, the process's recorder: its key outcomes, its jobs, its outbox's deliveries and
//! their lag).

use std::time::Duration;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use service::name::ServiceName;

use crate::ProcessorState;
use crate::problem::{Problem, ProblemKind};

/// The processor, as what it runs on (`crates/service`) names it: the prefix of every series it
/// records (`processor_…`), embedded or not, which its `/metrics` shows, and its webhook
/// deliveries' `User-Agent` (`processor/<version> (+webhooks)`).
pub const SERVICE: ServiceName = ServiceName::new("processor", env!("CARGO_PKG_VERSION"));

/// How long readiness waits for the database before calling it unreachable.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub(crate) async fn healthz() -> Response {
    axum::Json(serde_json::json!({ "status": "ok" })).into_response()
}

pub(crate) async fn readyz(State(state): State<ProcessorState>) -> Response {
    let ping = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(&state.pool);
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(_)) => axum::Json(serde_json::json!({ "status": "ready" })).into_response(),
        Ok(Err(error)) => unready(&error.to_string()),
        Err(_) => unready("no answer within the readiness timeout"),
    }
}

/// 503, the cause logged and not told.
fn unready(cause: &str) -> Response {
    tracing::warn!(
        cause,
        "the processor's readiness check failed: its database does not answer"
    );
    Problem::new(
        ProblemKind::ServiceUnavailable,
        "The processor's database does not answer; ask again shortly.",
    )
    .retry_after(Duration::from_secs(1))
    .into_response()
}

pub(crate) async fn metrics(State(state): State<ProcessorState>) -> Response {
    // The outbox's lag is read from the processor's own database, where its deliveries are.
    service::outbox::lag::read_oldest_due(SERVICE, &state.pool).await;
    (
        [(header::CONTENT_TYPE, service::metrics::CONTENT_TYPE)],
        service::metrics::render(),
    )
        .into_response()
}
