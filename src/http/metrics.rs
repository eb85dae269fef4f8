//! Prometheus metrics at `GET /metrics`: the recorder, the scrape, and the series of the plumbing
//! (requests by route and status with their latency, the idempotency outcomes, the connection
//! pool). Each domain counts its own (`webhooks::metrics` with the outbox's, `accounts::metrics`,
//! the events written, the expiry job), and the assembly hands their descriptions to [`install`] and their gauges read
//! at a scrape to [`Readings`]. The names and what each says are in `src/http/README.md`; every one
//! starts with `idempay_`.

use std::time::Instant;

use axum::extract::{FromRef, MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

const REQUESTS: &str = "idempay_http_requests_total";
const REQUEST_DURATION: &str = "idempay_http_request_duration_seconds";
pub const KEY_OUTCOMES: &str = "idempay_idempotency_outcomes_total";
const POOL_CONNECTIONS: &str = "idempay_db_pool_connections";

/// Installs the process's recorder (`service::metrics`), so metrics recorded before the first
/// scrape are kept, and describes the series: the plumbing's, then the domains' with
/// `describe_domains` (once a process).
pub fn install(describe_domains: impl FnOnce()) {
    service::metrics::install(|| {
        describe();
        describe_domains();
    });
}

/// A gauge that a scrape reads before it renders, such as the age of the oldest pending webhook
/// delivery: a domain owns it, the assembly lists it in the [`Readings`].
pub type Reading = for<'a> fn(&'a PgPool) -> BoxFuture<'a, ()>;

/// The gauges every scrape reads, as the application's state provides them.
#[derive(Clone, Copy, Debug)]
pub struct Readings(pub &'static [Reading]);

fn describe() {
    describe_counter!(
        REQUESTS,
        "HTTP requests answered, by method, route and status."
    );
    describe_histogram!(
        REQUEST_DURATION,
        metrics::Unit::Seconds,
        "Time to answer an HTTP request, by method and route."
    );
    describe_counter!(
        KEY_OUTCOMES,
        "Requests with an Idempotency-Key, by what became of them."
    );
    describe_gauge!(
        POOL_CONNECTIONS,
        "Database connections of this instance, by state (in_use, idle)."
    );
}

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    Readings: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(scrape))
}

/// Metrics
///
/// The service's metrics in the Prometheus text format, for a scraper.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses((status = 200, description = "The metrics.", body = String,
        content_type = "text/plain"))
)]
async fn scrape(
    State(pool): State<PgPool>,
    State(Readings(readings)): State<Readings>,
) -> Response {
    let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX);
    gauge!(POOL_CONNECTIONS, "state" => "idle").set(f64::from(idle));
    gauge!(POOL_CONNECTIONS, "state" => "in_use").set(f64::from(pool.size().saturating_sub(idle)));
    for read in readings {
        read(&pool).await;
    }
    (
        [(header::CONTENT_TYPE, service::metrics::CONTENT_TYPE)],
        // Installed by now, with every description: the application installs it as it is built.
        service::metrics::render(),
    )
        .into_response()
}

/// Counts every routed request and times it, labelled with its route template (never the path
/// itself, which holds ids and would make a series per payment).
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    histogram!(REQUEST_DURATION, "method" => method.clone(), "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    counter!(
        REQUESTS,
        "method" => method,
        "route" => route,
        "status" => response.status().as_str().to_owned()
    )
    .increment(1);
    response
}
