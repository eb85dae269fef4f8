//! `idempay fixture`: the fixture contract of the anyonce conformance suite
//! (`conformance/` of the `sns45/anyonce` repository) served behind the idempotency mechanism,
//! so that suite, or our own (`tests/api/exactly_once/conformance.rs`), can check the mechanism
//! against the IETF draft "The Idempotency-Key HTTP Header Field" with handlers that know nothing
//! of it. The mechanism is the service's, unchanged: the same store, lease and expiry job; only
//! its adoption differs, through [`IdempotencyLayer`] instead of the `Idempotent` extractor.
//!
//! | route | behaviour |
//! |---|---|
//! | `POST /echo` | 201, the request's body bytes with its `Content-Type` (`application/octet-stream` without one) |
//! | `POST /status/{code}` | `{code}` with the body `status:{code}`, as `text/plain` |
//! | `POST /slow?ms=N` | waits N ms, then 200 with the body `slept:N` |
//! | `POST /large?bytes=N` | 200 with N bytes of `x`, as `application/octet-stream` |
//! | `GET /counter` | 200 `{"count": n}`: how many times the POST handlers ran |
//! | `POST /reset` | 204, the counter back to 0; the only route outside the layer |
//!
//! Every POST needs an `Idempotency-Key`. Every POST handler adds one to the counter when it runs,
//! so the counter says how many times the handlers really ran, whatever the client saw.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use serde::Deserialize;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{DEFAULT_KEY_TTL, DatabaseArgs};
use crate::db::check_lease;
use crate::http::error::{ApiError, Problem, ProblemKind};
use crate::{db, expiry};
use idempotency::{Idempotency, IdempotencyLayer, NotStored, Owners, Policy};
use service::server::shutdown_signal;
use service::settings::{parse_lease, positive};
use service::shared_settings::{DEFAULT_EXPIRY_INTERVAL, DEFAULT_LEASE};
use service::sweeps;

/// The one account every fixture request belongs to: the fixture asks for no API key, and its
/// keys' scopes are still account + method + route (`acct_fixture:POST /echo`). No account of the
/// service has this id (theirs are `acct_` and 24 random characters), so the two never share a key.
pub const ACCOUNT: &str = "acct_fixture";

/// The longest `/slow` wait, in milliseconds.
pub const MAX_SLOW_MS: u64 = 60_000;

/// The largest `/large` body, in bytes, and the largest request body `/echo` takes.
pub const MAX_BYTES: usize = 16 * 1024 * 1024;

/// `idempay fixture`'s settings.
#[derive(Args, Clone, Debug)]
pub struct FixtureArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    /// Where the fixture listens.
    #[arg(long, env = "IDEMPAY_FIXTURE_LISTEN", default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,

    /// How long a key and its stored response live (the conformance suite's short-ttl vectors
    /// need at most 2s).
    #[arg(long, env = "IDEMPAY_KEY_TTL", default_value = DEFAULT_KEY_TTL, value_parser = positive("IDEMPAY_KEY_TTL"))]
    pub key_ttl: Duration,

    /// How long an in-progress key blocks retries before a retry may take it over.
    #[arg(long, env = "IDEMPAY_LEASE", default_value = DEFAULT_LEASE, value_parser = parse_lease)]
    pub lease: Duration,

    /// How often the expiry job deletes expired keys.
    #[arg(long, env = "IDEMPAY_EXPIRY_INTERVAL", default_value = DEFAULT_EXPIRY_INTERVAL, value_parser = positive("IDEMPAY_EXPIRY_INTERVAL"))]
    pub expiry_interval: Duration,
}

/// Serves the fixture until Ctrl-C (or SIGTERM), with the expiry job beside it.
pub async fn run(args: FixtureArgs) -> anyhow::Result<()> {
    check_lease(args.lease, &args.database.pool).map_err(anyhow::Error::msg)?;
    let pool = db::pool_with(&args.database.database_url, args.database.pool)?;
    db::migrate(&pool).await?;
    let listener = TcpListener::bind(args.listen).await?;
    let policy = Policy {
        key_ttl: args.key_ttl,
        lease: args.lease,
        // The fixture calls no other system: its keys never reach a recovery point.
        recovery_window: args.key_ttl,
    };
    let stop = CancellationToken::new();
    let expiry = sweeps::spawn(
        "expiry",
        pool.clone(),
        args.expiry_interval,
        expiry::keys(),
        stop.clone(),
    );
    tracing::info!(address = %listener.local_addr()?, "fixture serving");
    axum::serve(listener, router(pool, policy))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    stop.cancel();
    expiry.await?;
    Ok(())
}

/// The fixture's routes on `pool`, behind the mechanism with `policy`.
pub fn router(pool: PgPool, policy: Policy) -> Router {
    let fixture = Fixture {
        count: Arc::default(),
    };
    // The mechanism's refusals are idempay's problem documents, as on the service's own routes;
    // keys expire by the fixture's own job (`run`), the service's, which the layer need not start.
    let layer = IdempotencyLayer::new(Idempotency::new(pool, policy), Owner)
        .on_error(|error| ApiError::from(error).into_response())
        .without_expiry();
    Router::new()
        .route("/echo", post(echo))
        .route("/status/{code}", post(status))
        .route("/slow", post(slow))
        .route("/large", post(large))
        .route("/counter", get(counter))
        .route_layer(layer)
        // The control route, outside the layer: it takes no key.
        .route("/reset", post(reset))
        .layer(DefaultBodyLimit::max(MAX_BYTES))
        .with_state(fixture)
}

#[derive(Clone)]
struct Fixture {
    /// How many times the POST handlers ran, process-wide.
    count: Arc<AtomicU64>,
}

impl Fixture {
    fn ran(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

/// Every fixture request's owner: its one account.
#[derive(Clone)]
struct Owner;

impl Owners for Owner {
    type Rejection = ApiError;

    async fn owner(&self, _parts: &mut Parts) -> Result<String, ApiError> {
        Ok(ACCOUNT.to_owned())
    }
}

async fn echo(State(fixture): State<Fixture>, headers: HeaderMap, body: Bytes) -> Response {
    fixture.ran();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response()
}

async fn status(
    State(fixture): State<Fixture>,
    axum::extract::Path(code): axum::extract::Path<String>,
) -> Response {
    // 1xx are no final answer, and an HTTP server cannot send one as such: nothing to store.
    let Some(status) = code
        .parse::<u16>()
        .ok()
        .filter(|code| (200..=599).contains(code))
        .and_then(|code| StatusCode::from_u16(code).ok())
    else {
        return refused(format!(
            "`{code}` is not a status code this fixture answers with: give one from 200 to 599."
        ));
    };
    fixture.ran();
    text(status, format!("status:{}", status.as_u16()))
}

#[derive(Deserialize)]
struct SlowQuery {
    ms: Option<String>,
}

async fn slow(
    State(fixture): State<Fixture>,
    query: Result<Query<SlowQuery>, QueryRejection>,
) -> Response {
    let raw = query.ok().and_then(|Query(query)| query.ms);
    let Some(ms) = bounded(raw.as_deref(), MAX_SLOW_MS) else {
        return refused(format!(
            "`ms` is a whole number of milliseconds from 0 to {MAX_SLOW_MS}."
        ));
    };
    fixture.ran();
    tokio::time::sleep(Duration::from_millis(ms)).await;
    text(StatusCode::OK, format!("slept:{ms}"))
}

#[derive(Deserialize)]
struct LargeQuery {
    bytes: Option<String>,
}

async fn large(
    State(fixture): State<Fixture>,
    query: Result<Query<LargeQuery>, QueryRejection>,
) -> Response {
    let raw = query.ok().and_then(|Query(query)| query.bytes);
    let Some(bytes) = bounded(raw.as_deref(), MAX_BYTES as u64) else {
        return refused(format!(
            "`bytes` is a whole number of bytes from 0 to {MAX_BYTES}."
        ));
    };
    fixture.ran();
    let body = vec![b'x'; usize::try_from(bytes).unwrap_or(MAX_BYTES)];
    ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
}

async fn counter(State(fixture): State<Fixture>) -> Response {
    Json(serde_json::json!({ "count": fixture.count.load(Ordering::SeqCst) })).into_response()
}

async fn reset(State(fixture): State<Fixture>) -> StatusCode {
    fixture.count.store(0, Ordering::SeqCst);
    StatusCode::NO_CONTENT
}

/// A query parameter from 0 to `max`; absent is 0, as the contract's reference fixtures read it.
fn bounded(raw: Option<&str>, max: u64) -> Option<u64> {
    match raw {
        None => Some(0),
        Some(raw) => raw.parse::<u64>().ok().filter(|value| *value <= max),
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

/// A 400 for input the handler refuses before running: not a result, so the key stays free for
/// the corrected request.
fn refused(detail: String) -> Response {
    let mut response =
        ApiError::from(Problem::new(ProblemKind::InvalidRequest, detail)).into_response();
    response.extensions_mut().insert(NotStored);
    response
}
