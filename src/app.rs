//! The application, assembled in one place: the state the routes share and the sub-states each
//! domain asks of it (`FromRef`), every route merged into one router with its description, and
//! [`Application`], which serves it on a bound listener beside the background jobs until told to
//! stop. It sits on top: it names every domain and the plumbing (`http`), and none of them names it.

use std::future::Future;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::FromRef;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::accounts::{self, AccountCache, RateLimit};
use crate::config::Settings;
use crate::downstream::ProcessorClient;
use crate::downstream::call::CallResumers;
use crate::http::error::ApiError;
use crate::http::openapi::{self, ApiDoc};
use crate::http::{Figures, Timeouts, health, metrics, problems};
use crate::webhooks::WebhookSettings;
use crate::{disputes, events, expiry, keys, payments, recovery, refunds, webhooks};
use idempotency::{Idempotency, MAX_KEY_LEN, Policy, Resumers};
use processor::{Processor, ProcessorApiKey, ProcessorSettings};
use service::jobs::Jobs;
use service::outbox::WebhookSecrets;
use service::outbox::delivery::{Deliverer, Sender};
use service::server::{self, MAX_BODY_BYTES};
use service::{failpoint, ids, sweeps};

/// What the handlers share. No domain names it: each asks for the parts it uses (`State<PgPool>`,
/// `State<Idempotency>`, `State<WebhookSettings>`…), which the `FromRef`s below take from it.
/// Every request clones the state, so it is one reference-counted pointer: a clone costs an
/// increment, not a copy of each part.
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
    /// What the webhook routes are configured with: the processor's secrets, how long event ids
    /// are remembered, whether endpoints may be private.
    pub webhooks: WebhookSettings,
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
    type Rejection = ApiError;

    async fn owner(&self, parts: &mut axum::http::request::Parts) -> Result<String, ApiError> {
        use axum::extract::FromRequestParts;
        let account = accounts::Account::from_request_parts(parts, self).await?;
        Ok(account.id().to_string())
    }
}

impl FromRef<AppState> for PgPool {
    fn from_ref(state: &AppState) -> Self {
        state.pool.clone()
    }
}

impl FromRef<AppState> for Idempotency {
    fn from_ref(state: &AppState) -> Self {
        state.idempotency.clone()
    }
}

impl FromRef<AppState> for ProcessorClient {
    fn from_ref(state: &AppState) -> Self {
        state.processor.clone()
    }
}

impl FromRef<AppState> for WebhookSettings {
    fn from_ref(state: &AppState) -> Self {
        state.webhooks.clone()
    }
}

impl FromRef<AppState> for Figures {
    fn from_ref(state: &AppState) -> Self {
        state.figures
    }
}

impl FromRef<AppState> for Jobs {
    fn from_ref(state: &AppState) -> Self {
        state.jobs.clone()
    }
}

/// The gauges a scrape of `/metrics` reads, the domains' own.
impl FromRef<AppState> for metrics::Readings {
    fn from_ref(_: &AppState) -> Self {
        metrics::Readings(&[
            crate::webhooks::metrics::read_oldest_pending,
            crate::recovery::read_keys,
            crate::webhooks::metrics::read_oldest_due,
            crate::webhooks::metrics::read_endpoints,
            crate::db::read_idle_in_transaction,
        ])
    }
}

impl Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// `embedded_secrets`: the secret the embedded processor signs its expiries with when no
    /// webhook secret is configured (`WebhookSettings::embedded`).
    pub fn new(
        pool: PgPool,
        settings: &Settings,
        processor: ProcessorClient,
        embedded_secrets: Option<WebhookSecrets>,
    ) -> Self {
        // The events that came before the objects they name wait in the intake's park until a
        // recording of those objects applies them: whoever records (a request, the recovery job,
        // an operator's settle) runs on this state, so the hook is installed here.
        let processor = processor.when_recorded(webhooks::parked::when_recorded(
            pool.clone(),
            settings.event_ttl,
        ));
        let policy = Policy {
            key_ttl: settings.key_ttl,
            lease: settings.shared.lease,
            recovery_window: settings.recovery_window,
        };
        Self(Arc::new(Shared {
            accounts: AccountCache::new(pool.clone()),
            rate_limit: RateLimit::per_second(settings.rate_limit),
            idempotency: Idempotency::new(pool.clone(), policy)
                .resuming(resumers(&processor))
                .counted_as(metrics::KEY_OUTCOMES)
                .crash_points(failpoint::hit),
            processor,
            webhooks: WebhookSettings {
                secrets: settings.shared.webhook_secrets.clone(),
                embedded: embedded_secrets,
                event_ttl: settings.event_ttl,
                allow_private: settings.webhook_allow_private,
            },
            body_read_timeout: settings.body_read_timeout,
            request_timeout: settings.request_timeout,
            figures: Figures::of(settings),
            jobs: Jobs::new(crate::SERVICE),
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
            lease: settings.shared.lease,
            body_limit_bytes: MAX_BODY_BYTES,
            body_read_timeout: settings.body_read_timeout,
            webhook_tolerance: service::outbox::TOLERANCE,
            webhook_delivery_timeout: settings.shared.webhook_delivery_timeout,
            max_signatures: service::outbox::MAX_SIGNATURES,
            max_key_len: MAX_KEY_LEN,
            max_webhook_endpoints: webhooks::endpoints::MAX_ENDPOINTS,
            max_parked: webhooks::parked::MAX_PARKED,
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
        .merge(keys::router())
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
    let timeouts = Timeouts {
        request: state.request_timeout,
        body_read: state.body_read_timeout,
    };
    let (api, description) = routes().split_for_parts();
    crate::http::router(api, state, described(description), timeouts, beside)
}

/// The complete description: this document with every route's operation.
pub fn spec() -> utoipa::openapi::OpenApi {
    described(routes().into_openapi())
}

/// The description as committed under `openapi/openapi.json`.
pub fn spec_json() -> String {
    let mut json = spec()
        .to_pretty_json()
        .expect("the API description always serializes");
    json.push('\n');
    json
}

/// The description as served and committed: the shapes code generators need
/// ([`openapi::finish`]), the figures its texts name (`{key_ttl}`, …) filled in from the
/// default settings and the constants, so no text retypes a figure that the code could change,
/// and the form bodies beside the JSON ones ([`openapi::with_form_bodies`]).
fn described(description: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let settings = Settings::default();
    let described = openapi::with_figures(openapi::finish(description), |text| {
        // The retry schedule is not `Copy`, as `Figures` is: filled in here, from the same settings.
        Figures::of(&settings)
            .fill(text)
            .replace(
                "{webhook_retry_schedule}",
                &settings.shared.webhook_retry_schedule.to_string(),
            )
            .replace(
                "{webhook_jitter}",
                &format!("±{}%", service::outbox::JITTER * 100.0),
            )
    });
    openapi::with_form_bodies(described)
}

/// The running service: the HTTP API on a bound listener, and beside it the expiry job, the
/// recovery job, the sweep of parked webhooks, the listener that tells the account cache of API key changes, the loop that
/// delivers events to merchant endpoints and, when no processor URL is configured, the embedded
/// processor. More routes may be served beside the API ([`Application::with_routes_beside`]: the
/// dev tools' checkout page, when `IDEMPAY_DEMO_UI` is on).
///
/// Taking a bound listener lets a test bind port 0 and learn the address before serving.
pub struct Application {
    listener: TcpListener,
    state: AppState,
    settings: Settings,
    embedded: Option<Processor>,
    deliverer: Deliverer,
    /// Routes served beside the API, made from it (see [`router_beside`]).
    beside: Option<Beside>,
}

/// Makes routes to serve beside the API from the API's own router, which they may call in process.
type Beside = Box<dyn FnOnce(Router) -> Router + Send>;

impl Application {
    /// Fails when the processor settings are incomplete (a URL without an API key) or the
    /// embedded processor cannot be set up.
    pub fn build(settings: Settings, pool: PgPool, listener: TcpListener) -> anyhow::Result<Self> {
        metrics::install(|| {
            accounts::metrics::describe();
            events::describe_metrics();
            webhooks::metrics::describe();
            service::jobs::describe_metrics(crate::SERVICE);
            sweeps::describe_metrics(crate::SERVICE);
            processor::describe_metrics();
            crate::downstream::metrics::describe();
            crate::recovery::describe_metrics();
            crate::recovery::describe_key_gauges();
            crate::db::describe();
        });
        crate::config::check_delivery_retention(
            settings.shared.webhook_delivery_retention,
            &settings.shared.webhook_retry_schedule,
            settings.shared.webhook_delivery_timeout,
        )
        .map_err(anyhow::Error::msg)?;
        // The embedded processor's expiries reach this idempay's own intake, signed with its
        // webhook secret, or, where none is configured, with one made up for the process, which
        // the intake then accepts from it alone (`WebhookSettings::embedded`).
        let (client, embedded, embedded_secrets) = match settings.processor.client()? {
            Some(client) => (client, None, None),
            None => {
                let (embedded, api_key, secrets) =
                    embedded_processor(&settings, &pool, own_intake(&listener)?)?;
                let url = format!("http://{}", embedded.local_addr()?);
                let client = settings.processor.configure(ProcessorClient::new(
                    &url,
                    api_key,
                    settings.processor.timeout,
                )?);
                (client, Some(embedded), secrets)
            }
        };
        #[cfg(not(feature = "dev"))]
        anyhow::ensure!(
            !settings.demo_ui,
            "IDEMPAY_DEMO_UI needs the dev tools, and this binary was built without the `dev` feature"
        );
        let deliverer = Deliverer::new(
            crate::SERVICE,
            pool.clone(),
            Sender::Endpoints {
                allow_private: settings.webhook_allow_private,
            },
            settings.shared.webhook_retry_schedule.clone(),
            settings.shared.webhook_delivery_timeout,
        )?
        .with_poll_interval(settings.webhook_poll_interval);
        Ok(Self {
            state: AppState::new(pool, &settings, client, embedded_secrets),
            deliverer,
            listener,
            settings,
            embedded,
            beside: None,
        })
    }

    /// Serves the routes `beside` makes from the API's router beside the API, through the same
    /// outer layers (request id, logs, body limits), outside its description: how the dev tools
    /// add their checkout page, which the service itself does not know.
    pub fn with_routes_beside(
        mut self,
        beside: impl FnOnce(Router) -> Router + Send + 'static,
    ) -> Self {
        self.beside = Some(Box::new(beside));
        self
    }

    /// The settings the service runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The service's pool, for what is served beside it.
    pub fn pool(&self) -> &PgPool {
        &self.state.pool
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Refuses to serve a database where keys wait at a recovery point that no unit of work of
    /// this build resumes (one removed or renamed since they were suspended): the recovery job
    /// would never finish them, nor would their retries. `serve` asks right after migrating.
    pub async fn refuse_unresumable(&self) -> anyhow::Result<()> {
        let unresumable = self.state.idempotency.unresumable().await?;
        match unresumable_refusal(&unresumable) {
            Some(refusal) => Err(anyhow::Error::msg(refusal)),
            None => Ok(()),
        }
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish and stops the
    /// expiry job.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let stop = CancellationToken::new();
        // Each job watched: one that dies is logged and takes readiness down (`service::jobs`).
        let watch = |job, task| self.state.jobs.watch(job, task, &stop);
        let mut jobs = vec![
            watch(
                "expiry",
                sweeps::spawn(
                    "expiry",
                    self.state.pool.clone(),
                    self.settings.shared.expiry_interval,
                    expiry::all(expiry::Retention {
                        events: self.settings.event_retention,
                        deliveries: self.settings.shared.webhook_delivery_retention,
                    }),
                    stop.clone(),
                ),
            ),
            watch(
                "recovery",
                recovery::job(&self.state.idempotency, self.settings.recovery_interval)
                    .spawn(stop.clone()),
            ),
            watch(
                "parked-webhooks",
                webhooks::parked::spawn(
                    self.state.pool.clone(),
                    self.settings.event_ttl,
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
            // Its own jobs are watched as idempay's: one that dies takes `/readyz` down too.
            let processor = processor.watched_by(&self.state.jobs);
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
        let router = match self.beside {
            Some(beside) => router_beside(self.state, beside),
            None => router(self.state),
        };
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

/// The work the recovery job resumes, by recovery point: the same units of work the routes run,
/// one line each. A unit left out here has its point refused when recorded, and keys already
/// suspended at it refuse the start ([`Application::refuse_unresumable`]).
fn resumers(processor: &ProcessorClient) -> Resumers {
    Resumers::default()
        .unit::<payments::ChargeRequested>(processor)
        .unit::<refunds::RefundRequested>(processor)
        .unit::<payments::CaptureRequested>(processor)
        .unit::<payments::CancelRequested>(processor)
}

/// Why a start is refused while keys wait at `unresumable` points (each with its number of keys),
/// and what to do; `None` when none do.
fn unresumable_refusal(unresumable: &[(String, i64)]) -> Option<String> {
    if unresumable.is_empty() {
        return None;
    }
    let points: Vec<String> = unresumable
        .iter()
        .map(|(point, keys)| {
            let plural = if *keys == 1 { "key" } else { "keys" };
            format!("`{point}` ({keys} {plural})")
        })
        .collect();
    Some(format!(
        "refusing to start: suspended keys wait at recovery points that no unit of work of this \
         build resumes: {}. Run the version that recorded them until its recovery job has resumed \
         them (a key it cannot resume within the recovery window is held for an operator, and a \
         held key blocks no start: `idempay keys settle` settles it), or register a unit of work \
         for each point (a `.unit::<…>` line in app.rs `resumers`); then start again.",
        points.join(", ")
    ))
}

/// The processor `serve` runs when no URL names one: the same service as `idempay processor`,
/// on a loopback port of its own, its ledger in idempay's database, its API key made up here. Of
/// its events it sends only `charge.expired`, to `intake` (idempay's own): an authorization it
/// releases must cancel its payment, which nothing else would tell idempay. The others it does
/// not send: idempay learns each charge's outcome from its answer, and an event about it,
/// delivered later, would race the events a test or an operator sends (`idempay dev` runs the
/// processor as a service of its own, with all its events). Its expiries are signed with
/// idempay's webhook secret; without one, with a secret made up here, returned for the intake
/// to accept from this processor alone.
fn embedded_processor(
    settings: &Settings,
    pool: &PgPool,
    intake: String,
) -> anyhow::Result<(Processor, String, Option<WebhookSecrets>)> {
    let api_key = ids::generate("sk_embedded", 32);
    let mut embedded =
        ProcessorSettings::new(ProcessorApiKey::parse(&api_key).map_err(anyhow::Error::msg)?);
    // idempay's values, as one: its slow charge, its lease (a key the processor holds for a
    // request of a dead instance is freed as soon as idempay's), its expiry job's, its delivery
    // settings for the expiries.
    embedded.shared = settings.shared.clone();
    let made_up = match &settings.shared.webhook_secrets {
        Some(_) => None,
        None => Some(WebhookSecrets::generate()),
    };
    if let Some(secrets) = &made_up {
        embedded.shared.webhook_secrets = Some(secrets.clone());
    }
    embedded.expiries_to = Some(intake);
    embedded.authorization_ttl = settings.processor.authorization_ttl;
    let socket = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))?;
    socket.set_nonblocking(true)?;
    let processor = Processor::build(embedded, pool.clone(), TcpListener::from_std(socket)?)?
        .sharing_expiry()
        .polling_every(settings.webhook_poll_interval);
    Ok((processor, api_key, made_up))
}

/// The processor's webhook intake of the idempay serving on `listener`: at its address, or over
/// loopback when it listens on every interface.
fn own_intake(listener: &TcpListener) -> std::io::Result<String> {
    let address = listener.local_addr()?;
    let ip = if address.ip().is_unspecified() {
        std::net::Ipv4Addr::LOCALHOST.into()
    } else {
        address.ip()
    };
    let address = SocketAddr::new(ip, address.port());
    Ok(format!("http://{address}/v1/webhooks/processor"))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    fn description() -> Value {
        serde_json::from_str(&super::spec_json()).unwrap()
    }

    #[test]
    fn a_start_is_refused_naming_each_unresumable_point_with_its_keys_and_what_to_do() {
        assert_eq!(super::unresumable_refusal(&[]), None);
        let refusal = super::unresumable_refusal(&[
            ("payment.capture_requested".to_owned(), 1),
            ("refund.old_point".to_owned(), 3),
        ])
        .expect("a refusal");
        assert!(
            refusal.contains("`payment.capture_requested` (1 key), `refund.old_point` (3 keys)."),
            "{refusal}"
        );
        assert!(refusal.contains("app.rs `resumers`"), "{refusal}");
    }

    #[test]
    fn an_optional_body_is_not_required_and_names_its_schema() {
        let spec = description();
        let body = &spec["paths"]["/v1/payments/{id}/refunds"]["post"]["requestBody"];
        assert_eq!(body["required"], false, "{body}");
        assert_eq!(
            body["content"]["application/json"]["schema"],
            json!({ "$ref": "#/components/schemas/NewRefund" })
        );
        let text = spec.to_string();
        assert!(
            !text.contains(r#"{"type":"null"}"#),
            "no body or member is only null"
        );
    }

    #[test]
    fn every_list_refers_to_its_items_named_schema() {
        let spec = description();
        let schemas = spec["components"]["schemas"].as_object().unwrap();
        let lists: Vec<&String> = schemas
            .keys()
            .filter(|name| name.starts_with("List_"))
            .collect();
        assert!(lists.len() >= 5, "{lists:?}");
        for list in lists {
            let item = list.trim_start_matches("List_");
            assert_eq!(
                schemas[list]["properties"]["data"]["items"],
                json!({ "$ref": format!("#/components/schemas/{item}") }),
                "{list}"
            );
        }
    }

    #[test]
    fn enum_values_that_are_not_identifiers_have_names_for_generators() {
        let spec = description();
        let schemas = &spec["components"]["schemas"];
        assert_eq!(
            schemas["EventType"]["x-enum-varnames"][0],
            "PAYMENT_SUCCEEDED"
        );
        let events = &schemas["NewWebhookEndpoint"]["properties"]["enabled_events"]["items"];
        let values = events["enum"].as_array().unwrap();
        let names = events["x-enum-varnames"].as_array().unwrap();
        assert_eq!(values.len(), names.len());
        let all = values.iter().position(|value| value == "*").unwrap();
        assert_eq!(names[all], "ALL");
        assert!(
            schemas["KeyUseState"].get("x-enum-varnames").is_none(),
            "identifiers keep their own names"
        );
    }

    /// Every operation that takes an `Idempotency-Key` is a route the inspection reads: a new
    /// idempotent route must join [`keys::IDEMPOTENT_ROUTES`], or its keys would never be shown.
    #[test]
    fn the_inspected_routes_are_the_operations_that_take_a_key() {
        let description = description();
        let mut keyed: Vec<String> = Vec::new();
        for (path, item) in description["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let takes_key = operation["parameters"].as_array().is_some_and(|params| {
                    params
                        .iter()
                        .any(|param| param["name"] == "Idempotency-Key")
                });
                if takes_key {
                    keyed.push(format!("{} {path}", method.to_uppercase()));
                }
            }
        }
        keyed.sort();
        assert_eq!(keyed, crate::keys::IDEMPOTENT_ROUTES);
    }
}
