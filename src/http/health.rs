//! Liveness and readiness probes for orchestrators and load balancers.

use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{Problem, ProblemKind};
use service::jobs::Jobs;

/// How long readiness waits for the database before calling it unreachable.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    Jobs: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// The state a probe reports.
#[derive(Serialize, ToSchema)]
struct Health {
    /// `ok` for liveness, `ready` for readiness.
    #[schema(example = "ok")]
    status: &'static str,
}

/// Liveness
///
/// The process is alive and serving HTTP.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    responses((status = 200, description = "Alive.", body = Health, content_type = "application/json"))
)]
async fn healthz() -> Response {
    axum::Json(Health { status: "ok" }).into_response()
}

/// Readiness
///
/// The database answers and every background job of the instance runs, so requests can be
/// served. A job that died (expiry, recovery, webhook delivery, the API key listener, the
/// embedded processor, or one of the embedded processor's own: its expiry job, its outbox) keeps
/// this 503 until the instance is restarted.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready.", body = Health, content_type = "application/json"),
        (status = 503, description = "The database is unreachable, or a background job died (`service-unavailable`, naming the job).",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = i64, description = "Seconds to wait before asking again."))),
    )
)]
async fn readyz(State(pool): State<PgPool>, State(jobs): State<Jobs>) -> Response {
    if let Some(death) = jobs.first_death() {
        tracing::warn!(job = death.job, cause = %death.cause, "readiness check failed");
        return Problem::new(
            ProblemKind::ServiceUnavailable,
            format!(
                "The background job `{}` died ({}); this instance must be restarted.",
                death.job, death.cause
            ),
        )
        .retry_after(Duration::from_secs(1))
        .into_response();
    }
    let ping = tokio::time::timeout(READY_TIMEOUT, sqlx::query("SELECT 1").execute(&pool)).await;
    match ping {
        Ok(Ok(_)) => axum::Json(Health { status: "ready" }).into_response(),
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
