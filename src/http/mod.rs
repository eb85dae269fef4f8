//! The HTTP plumbing, which owns the application's state: the router with the middleware every
//! request passes through, [`Application`], which serves it on a bound listener until told to
//! stop, and what every route shares (the problem+json error type, extractors, pagination, the
//! OpenAPI root, health and metrics). The domains plug their routers into [`routes`]; nothing here
//! depends on a domain except that assembly and the state it hands to them.

pub mod error;
pub mod extract;
pub mod health;
pub mod metrics;
pub mod openapi;
pub mod pagination;
mod problems;

pub use problems::Figures;
pub mod server;

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRef, Request};
use axum::http::HeaderName;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::accounts::{self, AccountCache, RateLimit};
use crate::config::Settings;
use crate::idempotency::Resumers;
use crate::idempotency::{Idempotency, MAX_KEY_LEN, Policy, Service};
use crate::jobs::Jobs;
use crate::processor::{Processor, ProcessorApiKey, ProcessorClient, ProcessorSettings};
use crate::webhooks::WebhookSecrets;
use crate::webhooks::delivery::{Deliverer, Sender};
use crate::{disputes, events, expiry, idempotency, ids, payments, recovery, refunds, webhooks};
use error::{Problem, ProblemKind};
use openapi::ApiDoc;

/// Request bodies above this size are refused with 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What the handlers share. Every extractor of every request clones the state, so it is one
/// reference-counted pointer: a clone costs an increment, not a copy of each part.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

/// The parts of [`AppState`].
#[derive(Debug)]
pub struct Shared {
    pub pool: PgPool,
    pub accounts: AccountCache,
    /// Each account's requests per second, checked as it authenticates.
    pub rate_limit: RateLimit,
    pub idempotency: Idempotency,
    /// Charges and refunds go through it, each call with a downstream key of its own.
    pub processor: ProcessorClient,
    /// Verify the processor's webhooks, any of them; without any they are refused.
    pub webhook_secrets: Option<WebhookSecrets>,
    /// How long processed webhook event ids are remembered.
    pub event_ttl: Duration,
    /// Whether merchant endpoints may point at non-public addresses (development only).
    pub webhook_allow_private: bool,
    /// How long a request body may stall before the request is answered with 408.
    pub body_read_timeout: Duration,
    /// How long a request may take before it is answered with 503.
    pub request_timeout: Duration,
    /// The limits the problem pages explain, as this instance applies them.
    pub figures: Figures,
    /// The background jobs that died: any takes readiness down.
    pub jobs: Jobs,
}

impl FromRef<AppState> for AccountCache {
    fn from_ref(state: &AppState) -> Self {
        state.accounts.clone()
    }
}

impl FromRef<AppState> for RateLimit {
    fn from_ref(state: &AppState) -> Self {
        state.rate_limit.clone()
    }
}

/// idempay's requests are owned by the account that authenticates them: every key is scoped to it.
impl idempotency::Owners for AppState {
    async fn owner(
        &self,
        parts: &mut axum::http::request::Parts,
    ) -> Result<String, error::ApiError> {
        use axum::extract::FromRequestParts;
        let account = accounts::Account::from_request_parts(parts, self).await?;
        Ok(account.id().to_string())
    }
}

/// The gauges a scrape of `/metrics` reads.
impl FromRef<AppState> for metrics::Readings {
    fn from_ref(_: &AppState) -> Self {
        metrics::Readings(&[webhooks::metrics::read_oldest_pending])
    }
}

impl FromRef<AppState> for PgPool {
    fn from_ref(state: &AppState) -> Self {
        state.pool.clone()
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    pub fn new(pool: PgPool, settings: &Settings, processor: ProcessorClient) -> Self {
        let policy = Policy {
            key_ttl: settings.key_ttl,
            lease: settings.lease,
            recovery_window: settings.recovery_window,
        };
        Self(Arc::new(Shared {
            accounts: AccountCache::new(pool.clone()),
            rate_limit: RateLimit::per_second(settings.rate_limit),
            idempotency: Idempotency::new(Service::Api, pool.clone(), policy),
            processor,
            webhook_secrets: settings.webhook_secrets.clone(),
            event_ttl: settings.event_ttl,
            webhook_allow_private: settings.webhook_allow_private,
            body_read_timeout: settings.body_read_timeout,
            request_timeout: settings.request_timeout,
            figures: Figures::of(settings),
            jobs: Jobs::default(),
            pool,
        }))
    }
}

impl Figures {
    /// The figures of a service that runs with `settings`.
    pub fn of(settings: &Settings) -> Self {
        Self {
            key_ttl: settings.key_ttl,
            event_ttl: settings.event_ttl,
            lease: settings.lease,
            body_limit_bytes: MAX_BODY_BYTES,
            body_read_timeout: settings.body_read_timeout,
            webhook_tolerance: webhooks::TOLERANCE,
            webhook_delivery_timeout: settings.webhook_delivery_timeout,
            max_signatures: webhooks::MAX_SIGNATURES,
            max_key_len: MAX_KEY_LEN,
            rate_limit: settings.rate_limit,
        }
    }
}

/// Every documented route, with its operation in the API description.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(payments::router())
        .merge(refunds::router())
        .merge(disputes::router())
        .merge(events::router())
        .merge(idempotency::router())
        .merge(webhooks::router())
        .merge(problems::router())
        .merge(health::router())
        .merge(metrics::router())
}

/// The whole HTTP API, its description at `/openapi.json` and the browsable docs at `/docs`.
/// Everything answers errors as problem documents, including unknown routes and methods.
pub fn router(state: AppState) -> Router {
    router_beside(state, |_| Router::new())
}

/// [`router`], with more routes `beside` it, made from the API's routes: the checkout page, which
/// calls them in process. They pass through the same outer layers as the API (request id, logs,
/// body limits) but are not part of its description.
fn router_beside(state: AppState, beside: impl FnOnce(Router) -> Router) -> Router {
    let body_read_timeout = state.body_read_timeout;
    let request_timeout = state.request_timeout;
    let (api, description) = routes().split_for_parts();
    let description = openapi::finish(description);
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
                        .on_response(DefaultOnResponse::new().level(Level::INFO)),
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

/// The running service: the HTTP API on a bound listener, and beside it the expiry job, the
/// recovery job, the listener that tells the account cache of API key changes, the loop that
/// delivers events to merchant endpoints and, when no processor URL is configured, the embedded
/// processor. With `IDEMPAY_DEMO_UI` (and the `dev` feature), the checkout page is served beside
/// the API too.
///
/// Taking a bound listener lets a test bind port 0 and learn the address before serving.
pub struct Application {
    listener: TcpListener,
    state: AppState,
    settings: Settings,
    embedded: Option<Processor>,
    deliverer: Deliverer,
    /// The checkout page, when `IDEMPAY_DEMO_UI` is on: a dev tool, absent from a build without
    /// the `dev` feature.
    #[cfg(feature = "dev")]
    checkout: Option<crate::dev::checkout::Checkout>,
}

impl Application {
    /// Fails when the processor settings are incomplete (a URL without an API key) or the
    /// embedded processor cannot be set up.
    pub fn build(settings: Settings, pool: PgPool, listener: TcpListener) -> anyhow::Result<Self> {
        metrics::install(|| {
            accounts::metrics::describe();
            events::describe_metrics();
            webhooks::metrics::describe();
            expiry::describe_metrics();
        });
        crate::config::check_delivery_retention(
            settings.webhook_delivery_retention,
            &settings.webhook_retry_schedule,
            settings.webhook_delivery_timeout,
        )
        .map_err(anyhow::Error::msg)?;
        let (client, embedded) = match settings.processor.client()? {
            Some(client) => (client, None),
            None => {
                let (embedded, api_key) = embedded_processor(&settings, &pool)?;
                let url = format!("http://{}", embedded.local_addr()?);
                let client = settings.processor.configure(ProcessorClient::new(
                    &url,
                    api_key,
                    settings.processor.timeout,
                )?);
                (client, Some(embedded))
            }
        };
        #[cfg(feature = "dev")]
        let checkout = settings
            .demo_ui
            .then(|| crate::dev::checkout::Checkout::new(pool.clone()));
        #[cfg(not(feature = "dev"))]
        anyhow::ensure!(
            !settings.demo_ui,
            "IDEMPAY_DEMO_UI needs the dev tools, and this binary was built without the `dev` feature"
        );
        let deliverer = Deliverer::new(
            pool.clone(),
            Sender::Endpoints {
                allow_private: settings.webhook_allow_private,
            },
            settings.webhook_retry_schedule.clone(),
            settings.webhook_delivery_timeout,
        )?
        .with_poll_interval(settings.webhook_poll_interval);
        Ok(Self {
            state: AppState::new(pool, &settings, client),
            deliverer,
            listener,
            settings,
            embedded,
            #[cfg(feature = "dev")]
            checkout,
        })
    }

    /// Makes the checkout page, if `IDEMPAY_DEMO_UI` is on, pay as the account of `key` rather
    /// than as an account of its own (`idempay dev`: the account its banner shows).
    #[cfg(feature = "dev")]
    pub fn with_demo_account(mut self, key: crate::accounts::ApiKey) -> Self {
        if self.checkout.is_some() {
            self.checkout = Some(crate::dev::checkout::Checkout::paying_as(
                self.state.pool.clone(),
                key,
            ));
        }
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish and stops the
    /// expiry job.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = CancellationToken::new();
        // Each job watched: one that dies is logged and takes readiness down (`jobs`).
        let watch = |job, task| self.state.jobs.watch(job, task, &stop);
        let mut jobs = vec![
            watch(
                "expiry",
                expiry::spawn(
                    self.state.pool.clone(),
                    expiry::Expiry {
                        interval: self.settings.expiry_interval,
                        keys: true,
                        retention: Some(expiry::Retention::Merchants {
                            events: self.settings.event_retention,
                            deliveries: self.settings.webhook_delivery_retention,
                        }),
                    },
                    stop.clone(),
                ),
            ),
            watch(
                "recovery",
                recovery::spawn(
                    self.state.idempotency.clone(),
                    resumers(&self.state),
                    self.settings.recovery_interval,
                    stop.clone(),
                ),
            ),
            watch(
                "api-key-listener",
                accounts::listen(self.state.accounts.clone(), stop.clone()),
            ),
            watch("webhook-delivery", self.deliverer.spawn(stop.clone())),
        ];
        // The embedded processor stops last: requests finishing now may still be calling it.
        if let Some(processor) = self.embedded {
            let stopped = stop.clone();
            jobs.push(watch(
                "embedded-processor",
                tokio::spawn(async move {
                    let stopped = async move { stopped.cancelled().await };
                    if let Err(error) = processor.run_until_stopped(stopped).await {
                        tracing::error!(%error, "the embedded processor failed");
                    }
                }),
            ));
        }
        #[cfg(feature = "dev")]
        let router = match self.checkout {
            Some(checkout) => router_beside(self.state, |api| checkout.router(api)),
            None => router(self.state),
        };
        #[cfg(not(feature = "dev"))]
        let router = router(self.state);
        let served = server::serve(
            self.listener,
            router,
            self.settings.header_read_timeout,
            async move {
                shutdown.await;
                tracing::info!("shutting down: finishing in-flight requests");
            },
        )
        .await;
        stop.cancel();
        // The watchers log whatever became of their jobs; they do not fail themselves.
        for job in jobs {
            job.await.ok();
        }
        served
    }
}

/// The work the recovery job resumes, by recovery point: the same units of work the routes run.
fn resumers(state: &AppState) -> Resumers {
    let charges = state.processor.clone();
    let refunds = state.processor.clone();
    let pool = state.pool.clone();
    Resumers::default()
        .on(payments::CHARGE_REQUESTED, move |lease| {
            payments::charge_and_record(charges.clone(), lease)
        })
        .on(refunds::REFUND_REQUESTED, move |lease| {
            refunds::refund_and_record(refunds.clone(), pool.clone(), lease, None)
        })
}

/// The processor `serve` runs when no URL names one: the same service as `idempay processor`,
/// on a loopback port of its own, its ledger in idempay's database, its API key made up here. It
/// sends no events: idempay learns each charge's outcome from its answer, and an event about it,
/// delivered later, would race the events a test or an operator sends (`idempay dev` runs the
/// processor as a service of its own, with its events).
fn embedded_processor(settings: &Settings, pool: &PgPool) -> anyhow::Result<(Processor, String)> {
    let api_key = ids::generate("sk_embedded", 32);
    let mut embedded =
        ProcessorSettings::new(ProcessorApiKey::parse(&api_key).map_err(anyhow::Error::msg)?);
    embedded.slow_charge = settings.slow_charge;
    // A key the processor holds for a request of a dead instance is freed as soon as idempay's.
    embedded.lease = settings.lease;
    // It sends no events, but its job is idempay's in all else.
    embedded.expiry_interval = settings.expiry_interval;
    embedded.webhook_delivery_retention = settings.webhook_delivery_retention;
    let socket = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    socket.set_nonblocking(true)?;
    let processor =
        Processor::build(embedded, pool.clone(), TcpListener::from_std(socket)?)?.sharing_expiry();
    Ok((processor, api_key))
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
