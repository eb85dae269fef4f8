//! The simulated card processor, black-box: its routes answered through the same idempotency
//! mechanism as idempay's ([`charges`]), its client's three outcomes against each injected fault
//! ([`processor_client`]), and its webhooks, delivered from the outbox signed, retried and sent once per
//! attempt however many loops run ([`outbox`]).
//!
//! Its responses are not checked against idempay's API description: it is another service.

mod charges;
mod disputes;
mod outbox;
mod processor_client;

use std::time::Duration;

use ::processor::{Processor, ProcessorApiKey, ProcessorSettings};
use idempay::downstream::ProcessorClient;
use serde_json::Value;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::support::harness::database_url;
use crate::support::helpers::{TestApp, TestResponse, fresh_database};

/// The key every test processor takes.
pub const API_KEY: &str = "pk_test_processor";

/// A processor on a free port of 127.0.0.1, on a database of its own; stopped when dropped.
pub struct TestProcessor {
    pub address: String,
    pub db: PgPool,
    database: String,
    http: reqwest::Client,
    stop: CancellationToken,
}

/// Settings with the test key and no faults.
pub fn settings() -> ProcessorSettings {
    ProcessorSettings::new(ProcessorApiKey::parse(API_KEY).expect("a valid key"))
}

impl TestProcessor {
    pub async fn spawn() -> Self {
        Self::spawn_with(settings()).await
    }

    pub async fn spawn_with(settings: ProcessorSettings) -> Self {
        Self::serve(&fresh_database().await, settings, bind_any().await).await
    }

    /// A processor with its ledger in `app`'s database, as the embedded one keeps it (so that the
    /// invariants can join its charges with idempay's payments), serving on `listener`: a port
    /// idempay was pointed at before anything listened there, or where another processor ran.
    pub async fn beside_on(
        app: &TestApp,
        settings: ProcessorSettings,
        listener: TcpListener,
    ) -> Self {
        Self::serve(app.database_name(), settings, listener).await
    }

    /// A processor on a fresh database whose pool reaches it at the URL `reach` makes of the
    /// database's (a proxy's), with `limits`; the test's own pool (`db`) connects directly.
    pub async fn spawn_reaching(
        settings: ProcessorSettings,
        limits: idempay::db::PoolLimits,
        reach: impl FnOnce(&str) -> String,
    ) -> Self {
        let database = fresh_database().await;
        let pool = idempay::db::pool_with(&reach(&database_url(&database)), limits).expect("pool");
        Self::serve_on(&database, settings, bind_any().await, pool).await
    }

    async fn serve(database: &str, settings: ProcessorSettings, listener: TcpListener) -> Self {
        let pool = idempay::db::pool(&database_url(database)).expect("pool");
        Self::serve_on(database, settings, listener, pool).await
    }

    async fn serve_on(
        database: &str,
        settings: ProcessorSettings,
        listener: TcpListener,
        pool: PgPool,
    ) -> Self {
        let url = database_url(database);
        let processor = Processor::build(settings, pool, listener).expect("the processor builds");
        let address = format!("http://{}", processor.local_addr().expect("address"));
        let stop = CancellationToken::new();
        tokio::spawn(processor.run_until_stopped(stop.clone().cancelled_owned()));
        Self {
            address,
            db: PgPool::connect(&url).await.expect("assertion pool"),
            database: database.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            stop,
        }
    }

    /// The client idempay uses, with this timeout.
    pub fn client(&self, timeout: Duration) -> ProcessorClient {
        ProcessorClient::new(&self.address, API_KEY.to_owned(), timeout).expect("a client")
    }

    pub fn database_url(&self) -> String {
        database_url(&self.database)
    }

    /// Stops serving: the listener closes and new connections are refused.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// `POST path` with the API key, the idempotency key (if any) and a JSON body.
    pub async fn post(&self, path: &str, key: Option<&str>, body: &Value) -> TestResponse {
        let mut request = self
            .http
            .post(format!("{}{path}", self.address))
            .bearer_auth(API_KEY)
            .json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        read(request).await
    }

    /// `POST /v1/charges` with this key and body.
    pub async fn charge(&self, key: &str, body: &Value) -> TestResponse {
        self.post("/v1/charges", Some(key), body).await
    }

    /// `GET path` with the API key.
    pub async fn get(&self, path: &str) -> TestResponse {
        read(
            self.http
                .get(format!("{}{path}", self.address))
                .bearer_auth(API_KEY),
        )
        .await
    }

    /// A request as the test builds it, sent as is.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> TestResponse {
        read(request).await
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    pub async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&self.db)
            .await
            .expect("count rows")
    }
}

impl Drop for TestProcessor {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A charge body.
pub fn charge(amount: i64, payment_method: &str) -> Value {
    serde_json::json!({ "amount": amount, "currency": "eur", "payment_method": payment_method })
}

async fn bind_any() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

async fn read(request: reqwest::RequestBuilder) -> TestResponse {
    let response = request.send().await.expect("the processor answers");
    TestResponse {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("a body").to_vec(),
    }
}
