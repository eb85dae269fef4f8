//! The simulated card processor: another company's HTTP service, which names no idempay crate and
//! which idempay calls over the network, as it would call a real one (idempay runs it as `idempay
//! processor`, or embeds it with [`Processor::build`]). It keeps a ledger of charges, refunds and disputes, answers each keyed request once
//! with **the same idempotency mechanism** as idempay's own routes (proof that it is reusable),
//! announces its changes as signed webhooks from an outbox, and injects the faults of a real
//! network on demand ([`faults`]). How idempay calls it is idempay's own (`src/downstream/`).
//!
//! Routes: `POST /v1/charges`, `GET /v1/charges`, `GET /v1/charges/{id}`,
//! `POST /v1/charges/{id}/refunds`, `POST /v1/charges/{id}/disputes` (a test helper),
//! `GET /v1/refunds` and `GET /v1/disputes`; all need `Authorization: Bearer <IDEMPAY_PROCESSOR_API_KEY>`.
//! For operators, without a key: `GET /healthz`, `GET /readyz` (its database answers) and
//! `GET /metrics` (Prometheus text).

mod captures;
pub mod deadline;
mod disputes;
mod extract;
mod fault_routes;
pub mod faults;
mod handlers;
mod model;
mod probes;
pub mod problem;
mod settings;
mod state;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use idempotency::{Idempotency, Policy};
use problem::{Problem, ProblemKind};
use service::failpoint;
use service::jobs::Jobs;
use service::outbox::delivery::Deliverer;
use service::outbox::retention::{self, Owner};
use service::server::{self, MAX_BODY_BYTES};
use service::sweeps::{self, Sweep, Sweeps};

pub use faults::{Faults, Fraction};
pub use model::{
    Amount, CaptureState, Charge, ChargeStatus, Currency, Dispute, DisputeStatus, PaymentMethod,
    ProcessorEventType, ProcessorRefund, RefundStatus,
};
pub use probes::SERVICE;
pub use settings::{
    KEY_TTL, ProcessorApiKey, ProcessorListen, ProcessorSettings, check_redelivery,
};
pub use state::{ProcessorState, Shared};

/// The counter of the processor's key outcomes: its own instance of the mechanism, apart from
/// the embedding service's.
pub const KEY_OUTCOMES: &str = "processor_idempotency_outcomes_total";

/// Describes the processor's series to the recorder of the process that runs it: its key
/// outcomes, its jobs', its expiry job's and its outbox's.
pub fn describe_metrics() {
    metrics::describe_counter!(
        KEY_OUTCOMES,
        "Requests to the simulated processor (embedded or not) with an Idempotency-Key, by what \
         became of them."
    );
    service::jobs::describe_metrics(SERVICE);
    sweeps::describe_metrics(SERVICE);
    service::outbox::metrics::describe(SERVICE);
}

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The processor's routes, answering every error as a problem document.
pub fn router(state: ProcessorState) -> Router {
    Router::new()
        .route(
            "/v1/charges",
            post(handlers::create_charge).get(handlers::list_charges),
        )
        .route("/v1/charges/{id}", get(handlers::get_charge))
        .route("/v1/charges/{id}/refunds", post(handlers::create_refund))
        .route("/v1/charges/{id}/capture", post(captures::capture_charge))
        .route("/v1/charges/{id}/void", post(captures::void_charge))
        .route("/v1/charges/{id}/disputes", post(handlers::create_dispute))
        .route("/v1/refunds", get(handlers::list_refunds))
        .route("/v1/disputes", get(disputes::list_disputes))
        .route(
            "/v1/disputes/{id}/evidence",
            post(disputes::submit_evidence),
        )
        .route("/v1/disputes/{id}/close", post(disputes::close_dispute))
        .route("/v1/refunds/{id}/failure", post(handlers::fail_refund))
        .route(
            "/v1/test/faults",
            get(fault_routes::get_faults).put(fault_routes::set_faults),
        )
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .route("/metrics", get(probes::metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(CatchPanicLayer::custom(|_| {
            Problem::new(
                ProblemKind::Internal,
                "The request failed on the processor.",
            )
            .into_response()
        }))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_failure(server::log_failure),
        )
        .with_state(state)
}

/// Every request's span, with the fields the mechanism records (the key's scope and outcome), so
/// that a failure's log line names them.
fn request_span(request: &Request) -> tracing::Span {
    tracing::info_span!(
        "processor_request",
        method = %request.method(),
        path = %request.uri().path(),
        scope = tracing::field::Empty,
        key_outcome = tracing::field::Empty,
    )
}

async fn not_found(request: Request) -> Response {
    Problem::new(
        ProblemKind::NotFound,
        format!(
            "No route for {} {} at the processor.",
            request.method(),
            request.uri().path()
        ),
    )
    .into_response()
}

/// The running processor: its API on a bound listener, the webhook delivery loop (when a URL and
/// a secret are set) and the expiry job: its keys (unless the process already runs idempay's,
/// which drains the same table: see [`Processor::sharing_expiry`]) and its deliveries past their
/// retention.
///
/// Taking a bound listener lets a test, or a process that embeds it, bind port 0 and learn the
/// address before serving.
pub struct Processor {
    listener: TcpListener,
    state: ProcessorState,
    deliveries: Option<Deliverer>,
    runs_expiry: bool,
    expiry_interval: Duration,
    delivery_retention: Duration,
    authorization_ttl: Duration,
    /// Where each `charge.expired` is announced: the webhook URL, or the embedding idempay's
    /// intake. `None`: authorizations are never released, since nobody could be told.
    expiries_to: Option<String>,
    /// Where its background jobs' deaths are told: its own, or the embedding process's
    /// ([`Processor::watched_by`]).
    jobs: Jobs,
}

impl Processor {
    /// Fails if a webhook URL is set without a secret to sign with, or the HTTP client for
    /// deliveries cannot be built.
    pub fn build(
        settings: ProcessorSettings,
        pool: PgPool,
        listener: TcpListener,
    ) -> anyhow::Result<Self> {
        // Every event to the webhook URL; without one, only the expiries, to the embedding
        // idempay's intake.
        let expiries_to = settings
            .webhook_url
            .clone()
            .or(settings.expiries_to.clone());
        let deliveries = match (&expiries_to, &settings.shared.webhook_secrets) {
            (None, _) => None,
            (Some(_), None) => anyhow::bail!(
                "IDEMPAY_PROCESSOR_WEBHOOK_URL is set but IDEMPAY_WEBHOOK_SECRET is not: events \
                 could not be signed"
            ),
            (Some(_), Some(secrets)) => Some(Deliverer::processor(
                SERVICE,
                pool.clone(),
                secrets,
                settings.shared.webhook_retry_schedule.clone(),
                settings.shared.webhook_delivery_timeout,
            )?),
        };
        // Standalone, the processor's own recorder; embedded, the process's (already installed).
        service::metrics::install(describe_metrics);
        let state = ProcessorState(Arc::new(Shared {
            idempotency: Idempotency::new(
                pool.clone(),
                Policy {
                    key_ttl: KEY_TTL,
                    lease: settings.shared.lease,
                    // The processor calls no one: its keys never reach a recovery point.
                    recovery_window: KEY_TTL,
                },
            )
            .counted_as(KEY_OUTCOMES)
            // Named apart, so that a fault test of idempay's never fires in the embedded one.
            .crash_points(|point| failpoint::hit(&format!("processor:{point}"))),
            api_key: settings.api_key,
            slow_charge: settings.shared.slow_charge,
            faults: std::sync::RwLock::new(settings.faults),
            webhook_url: settings.webhook_url,
            pool,
        }));
        Ok(Self {
            listener,
            state,
            deliveries,
            runs_expiry: true,
            expiry_interval: settings.shared.expiry_interval,
            delivery_retention: settings.shared.webhook_delivery_retention,
            authorization_ttl: settings.authorization_ttl,
            expiries_to,
            jobs: Jobs::new(SERVICE),
        })
    }

    /// For a processor embedded in a process with a readiness probe: its background jobs (the
    /// expiry job, the outbox) are watched as that process's own, so one that dies takes the
    /// process's readiness down with it, as a job of the process's would. Their series stay the
    /// processor's (`processor_job_up`).
    #[must_use]
    pub fn watched_by(mut self, jobs: &Jobs) -> Self {
        self.jobs = jobs.reporting_as(SERVICE);
        self
    }

    /// For a processor in a process whose idempay already expires keys in the same database (the
    /// embedded one, `idempay dev`'s, `reconcile`'s): one expiry job for the table, not two. Its
    /// job still deletes its own deliveries past their retention, which idempay's leaves alone.
    #[must_use]
    pub fn sharing_expiry(mut self) -> Self {
        self.runs_expiry = false;
        self
    }

    /// How often its outbox looks for due deliveries while none ends: embedded, as often as the
    /// embedding idempay's own (`IDEMPAY_WEBHOOK_POLL_INTERVAL`), so that the one setting quiets
    /// both loops.
    #[must_use]
    pub fn polling_every(mut self, poll: Duration) -> Self {
        self.deliveries = self
            .deliveries
            .map(|deliverer| deliverer.with_poll_interval(poll));
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish and stops the
    /// delivery loop and the expiry job.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = CancellationToken::new();
        // Watched, so that a job that dies is logged as an error when it dies, not at shutdown.
        // The processor has no readiness probe of its own; embedded, its jobs are watched as the
        // embedding process's ([`Processor::watched_by`]), whose probe then reports their deaths.
        let jobs = self.jobs;
        let expiry = {
            let mut sweeps = Vec::new();
            if self.runs_expiry {
                sweeps.push(Sweep::new("idempotency_keys", |pool, engine| async move {
                    Idempotency::expire_batch(&pool, engine).await
                }));
            }
            // Its own table, whether or not it shares the keys' expiry: authorizations held past
            // their time are released, each announced as `charge.expired`. Only where it can be
            // announced: released silently, an authorization would strand the payment that holds
            // it, which could then be neither captured nor canceled.
            if let Some(url) = self.expiries_to.clone() {
                let ttl = self.authorization_ttl;
                sweeps.push(Sweep::new("processor_charges", move |pool, engine| {
                    let url = url.clone();
                    async move { captures::expire_batch(&pool, engine, ttl, &url).await }
                }));
            }
            let retention = self.delivery_retention;
            sweeps.push(Sweep::new(
                "processor_webhook_deliveries",
                move |pool, engine| async move {
                    // A bug in this job, for the test of a processor job that dies.
                    failpoint::panic("processor:expiry-job-panic");
                    retention::prune_deliveries(&pool, engine, Owner::Processor, retention).await
                },
            ));
            let task = sweeps::spawn(
                "processor-expiry",
                self.state.pool.clone(),
                self.expiry_interval,
                Sweeps::of(SERVICE, sweeps),
                stop.clone(),
            );
            jobs.watch("processor-expiry", task, &stop)
        };
        let deliveries = self
            .deliveries
            .map(|deliverer| jobs.watch("processor-outbox", deliverer.spawn(stop.clone()), &stop));
        let served = server::serve(
            self.listener,
            router(self.state),
            HEADER_READ_TIMEOUT,
            shutdown,
        )
        .await;
        stop.cancel();
        for watcher in std::iter::once(expiry).chain(deliveries) {
            watcher.await.ok();
        }
        served
    }
}
