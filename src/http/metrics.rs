//! Prometheus metrics at `GET /metrics`: requests by route and status with their latency, the
//! idempotency outcomes, the webhook events received, the events written and delivered, the expiry
//! job, the connection pool, API key lookups and the requests refused by the rate limit. The names
//! and what each says are in `src/http/README.md`; every one starts with `idempay_`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::AppState;

const REQUESTS: &str = "idempay_http_requests_total";
const REQUEST_DURATION: &str = "idempay_http_request_duration_seconds";
pub const KEY_OUTCOMES: &str = "idempay_idempotency_outcomes_total";
pub const PROCESSOR_KEY_OUTCOMES: &str = "idempay_processor_idempotency_outcomes_total";
const EXPIRY_DELETED: &str = "idempay_expiry_deleted_rows_total";
const EXPIRY_DURATION: &str = "idempay_expiry_run_duration_seconds";
const POOL_CONNECTIONS: &str = "idempay_db_pool_connections";
const WEBHOOK_EVENTS: &str = "idempay_webhook_events_total";
const WEBHOOK_DELIVERIES: &str = "idempay_webhook_deliveries_total";
const WEBHOOK_OLDEST_PENDING: &str = "idempay_webhook_oldest_pending_seconds";
const ACCOUNT_LOOKUPS: &str = "idempay_account_lookups_total";
const API_KEY_LISTENER: &str = "idempay_api_key_listener_connected";
const THROTTLED: &str = "idempay_rate_limited_requests_total";
const EVENTS_WRITTEN: &str = "idempay_events_written_total";

/// Latency buckets in seconds: a replay takes well under a millisecond, a slow charge seconds.
const BUCKETS: [f64; 14] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How often histograms are folded into the exported state, which bounds their memory.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process-wide recorder. The metrics macros report to one global recorder, so every
/// application in the process shares it (tests start several).
fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
            .and_then(PrometheusBuilder::install_recorder)
            .expect("no other metrics recorder is installed");
        describe();
        let upkeep = handle.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        });
        handle
    })
}

/// Installs the recorder, so metrics recorded before the first scrape are kept.
pub fn install() {
    handle();
}

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
    describe_counter!(
        PROCESSOR_KEY_OUTCOMES,
        "Requests to the simulated processor (embedded or not) with an Idempotency-Key, by what \
         became of them."
    );
    describe_counter!(
        EXPIRY_DELETED,
        "Expired rows deleted by the expiry job, by table."
    );
    describe_histogram!(
        EXPIRY_DURATION,
        metrics::Unit::Seconds,
        "Time of one run of the expiry job."
    );
    describe_counter!(
        WEBHOOK_EVENTS,
        "Webhook events received, by outcome (applied, ignored, duplicate, stale, needs_review; \
         not_recorded: refused with 409 until the charge or refund it names is recorded)."
    );
    describe_counter!(
        WEBHOOK_DELIVERIES,
        "Webhook delivery attempts sent, by sender (processor, endpoints) and what became of the \
         delivery (delivered, retried, failed: given up after the whole retry schedule)."
    );
    describe_gauge!(
        WEBHOOK_OLDEST_PENDING,
        metrics::Unit::Seconds,
        "Age of the oldest event delivery neither acknowledged nor given up, read at the scrape; 0 \
         when none is pending. A steady rise means the delivery loops are stuck or behind."
    );
    describe_gauge!(
        POOL_CONNECTIONS,
        "Database connections of this instance, by state (in_use, idle)."
    );
    describe_counter!(
        ACCOUNT_LOOKUPS,
        "API keys looked up in the database, the account cache unable to answer, by result \
         (found, unknown)."
    );
    describe_gauge!(
        API_KEY_LISTENER,
        "1 while the instance listens for API key changes; at 0 its account cache is off and every \
         request looks its key up."
    );
    describe_counter!(
        EVENTS_WRITTEN,
        "Events written (their change committed), by type."
    );
    describe_counter!(
        THROTTLED,
        "Requests refused with 429 because their account was over its rate limit."
    );
}

pub fn router() -> OpenApiRouter<AppState> {
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
async fn scrape(State(pool): State<PgPool>) -> Response {
    let idle = u32::try_from(pool.num_idle()).unwrap_or(u32::MAX);
    gauge!(POOL_CONNECTIONS, "state" => "idle").set(f64::from(idle));
    gauge!(POOL_CONNECTIONS, "state" => "in_use").set(f64::from(pool.size().saturating_sub(idle)));
    // A scrape while the database is down still answers, with the last age it read.
    match crate::webhooks::delivery::oldest_pending_age(&pool).await {
        Ok(age) => gauge!(WEBHOOK_OLDEST_PENDING).set(age.as_secs_f64()),
        Err(error) => tracing::warn!(%error, "cannot read the oldest pending webhook delivery"),
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle().render(),
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

/// Counts a lookup of an API key in the database.
pub fn account_lookup(found: bool) {
    let result = if found { "found" } else { "unknown" };
    counter!(ACCOUNT_LOOKUPS, "result" => result).increment(1);
}

/// Records whether the API key listener is connected.
pub fn api_key_listener(connected: bool) {
    gauge!(API_KEY_LISTENER).set(if connected { 1.0 } else { 0.0 });
}

/// Counts a request refused by its account's rate limit.
pub fn throttled() {
    counter!(THROTTLED).increment(1);
}

/// Records one run of the expiry job.
pub fn expiry_run(keys: u64, events: u64, took: Duration) {
    counter!(EXPIRY_DELETED, "table" => "idempotency_keys").increment(keys);
    counter!(EXPIRY_DELETED, "table" => "processed_events").increment(events);
    histogram!(EXPIRY_DURATION).record(took.as_secs_f64());
}

/// Counts what one run of the expiry job deleted past its retention: the deliveries of `owner`
/// (their attempts go with them) and the merchants' events.
pub fn retention_run(
    owner: Option<crate::webhooks::retention::Owner>,
    deliveries: u64,
    events: u64,
) {
    use crate::webhooks::retention::Owner;
    let table = match owner {
        Some(Owner::Endpoints) => "webhook_deliveries",
        Some(Owner::Processor) => "processor_webhook_deliveries",
        None => return,
    };
    counter!(EXPIRY_DELETED, "table" => table).increment(deliveries);
    if owner == Some(Owner::Endpoints) {
        counter!(EXPIRY_DELETED, "table" => "events").increment(events);
    }
}

/// Counts one delivery attempt by what became of its delivery.
pub fn webhook_delivery(sender: &'static str, outcome: crate::webhooks::delivery::Outcome) {
    counter!(WEBHOOK_DELIVERIES, "sender" => sender, "outcome" => outcome.as_str()).increment(1);
}

/// Counts one webhook event by what became of it: a rising `needs_review` is disputes the ledger
/// could not take in full, a rising `stale` events arriving out of order.
pub fn webhook_event(outcome: crate::webhooks::Outcome) {
    counter!(WEBHOOK_EVENTS, "outcome" => outcome.as_str()).increment(1);
}

/// Counts one delivery of an event refused because the object it names is not recorded yet: each
/// redelivery counts again, so a count that keeps rising names an object never recorded.
pub fn webhook_event_not_recorded() {
    counter!(WEBHOOK_EVENTS, "outcome" => "not_recorded").increment(1);
}

/// Counts one event whose change committed.
pub fn event_written(kind: crate::events::EventType) {
    counter!(EVENTS_WRITTEN, "type" => kind.as_str()).increment(1);
}
