//! Liveness and readiness probes for orchestrators and load balancers.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use sqlx::PgPool;

use crate::app::AppState;
use crate::error::{Problem, ProblemKind};

/// How long readiness waits for the database before calling it unreachable.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// The process is alive and serving.
async fn healthz() -> Response {
    axum::Json(json!({ "status": "ok" })).into_response()
}

/// The database answers, so requests can be served.
async fn readyz(State(pool): State<PgPool>) -> Response {
    let ping = tokio::time::timeout(READY_TIMEOUT, sqlx::query("SELECT 1").execute(&pool)).await;
    match ping {
        Ok(Ok(_)) => axum::Json(json!({ "status": "ready" })).into_response(),
        Ok(Err(error)) => unavailable(&error.to_string()),
        Err(_) => unavailable("no answer in time"),
    }
}

fn unavailable(cause: &str) -> Response {
    tracing::warn!(cause, "readiness check failed");
    Problem::new(
        ProblemKind::ServiceUnavailable,
        "The database is unreachable.",
    )
    .retry_after(Duration::from_secs(1))
    .into_response()
}
