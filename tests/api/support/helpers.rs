//! `TestApp`: a real server on a free port, its own database, an account, and typed calls.

use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use idempay::app::Application;
use idempay::config::Settings;
use reqwest::header::HeaderMap;
use serde_json::Value;
use service::outbox::WebhookSecrets;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::support::harness::{create_database, database_url};

/// The key every test sends unless it needs another.
pub fn new_key() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct TestResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl TestResponse {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "body is not JSON ({error}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// Asserts the status; when it differs, the failure shows the body, which says why.
    #[track_caller]
    pub fn assert_status(&self, status: u16) {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
    }

    /// The `id` of what the answer created or shows.
    #[track_caller]
    pub fn id(&self) -> String {
        self.json()["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no id in {}", self.json()))
            .to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Asserts an RFC 9457 problem document of the given status and `type`.
    pub fn assert_problem(&self, status: u16, type_slug: &str) -> Value {
        assert_eq!(
            self.status,
            status,
            "body: {}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let problem = self.json();
        assert_eq!(
            problem["type"],
            format!("/problems/{type_slug}"),
            "{problem}"
        );
        assert_eq!(problem["status"], status, "{problem}");
        assert!(
            problem["title"].as_str().is_some_and(|t| !t.is_empty()),
            "{problem}"
        );
        assert!(
            problem["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{problem}"
        );
        // What a program reads: `code`, the slug of `type`; what a person reads: `detail`, whole
        // sentences, no parser positions.
        assert_eq!(problem["code"], type_slug, "{problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.starts_with(|c: char| !c.is_lowercase()) && detail.ends_with(['.', '?', '!']),
            "a detail is a sentence: {problem}"
        );
        assert!(!detail.contains(" at line "), "{problem}");
        problem
    }
}

/// A server instance on its own port. Dropping it stops the server.
pub struct TestApp {
    pub address: String,
    /// Direct access to the same database, for assertions and for setting up faults.
    pub db: PgPool,
    database: String,
    pub api_key: String,
    pub account_id: String,
    client: reqwest::Client,
    stop: CancellationToken,
}

impl TestApp {
    /// A server with default settings on a fresh database, with one account.
    pub async fn spawn() -> Self {
        Self::spawn_with(Settings::default()).await
    }

    pub async fn spawn_with(settings: Settings) -> Self {
        let database = fresh_database().await;
        let mut app = Self::serve(&database, settings, bind_any().await).await;
        let (account_id, api_key) = app.create_account("test merchant").await;
        app.account_id = account_id;
        app.api_key = api_key;
        app
    }

    /// Another server instance on the same database, as a second replica would be.
    pub async fn another_instance(&self, settings: Settings) -> Self {
        self.another_instance_on(bind_any().await, settings).await
    }

    /// Another instance on the same database, serving on `listener`: a port the test chose, e.g.
    /// one a processor was told to deliver its webhooks to before anything listened there.
    pub async fn another_instance_on(&self, listener: TcpListener, settings: Settings) -> Self {
        let mut app = Self::serve(&self.database, settings, listener).await;
        app.account_id.clone_from(&self.account_id);
        app.api_key.clone_from(&self.api_key);
        app
    }

    /// A server on a fresh database, with one account, whose pool reaches the database at the URL
    /// `reach` makes of the database's (a proxy's), with `limits`; the test's own pool (`db`)
    /// connects directly.
    pub async fn spawn_reaching(
        settings: Settings,
        limits: idempay::db::PoolLimits,
        reach: impl FnOnce(&str) -> String,
    ) -> Self {
        let database = fresh_database().await;
        let pool = idempay::db::pool_with(&reach(&database_url(&database)), limits).expect("pool");
        let mut app = Self::serve_on(&database, settings, bind_any().await, pool).await;
        let (account_id, api_key) = app.create_account("test merchant").await;
        app.account_id = account_id;
        app.api_key = api_key;
        app
    }

    async fn serve(database: &str, settings: Settings, listener: TcpListener) -> Self {
        let pool = idempay::db::pool(&database_url(database)).expect("pool");
        Self::serve_on(database, settings, listener, pool).await
    }

    async fn serve_on(
        database: &str,
        settings: Settings,
        listener: TcpListener,
        pool: PgPool,
    ) -> Self {
        let url = database_url(database);
        let app = Application::build(settings, pool, listener).expect("build");
        let app = idempay::dev::checkout::mount(app, None);
        let address = format!("http://{}", app.local_addr().expect("address"));
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            app.run_until_stopped(async move { stopped.cancelled().await })
                .await
                .expect("server runs");
        });
        Self {
            address,
            db: PgPool::connect(&url).await.expect("assertion pool"),
            database: database.to_owned(),
            api_key: String::new(),
            account_id: String::new(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                // The server closes a connection left idle for its header read timeout (10 s):
                // a pooled connection reused just then fails (an incomplete message), so the
                // client lets its idle connections go first.
                .pool_idle_timeout(Duration::from_secs(5))
                .build()
                .expect("client"),
            stop,
        }
    }

    /// Creates another account in the same database; returns its id and API key.
    pub async fn create_account(&self, name: &str) -> (String, String) {
        let (account, key) = idempay::accounts::create(&self.db, name)
            .await
            .expect("create account");
        (account.id().to_string(), key.expose().to_owned())
    }

    /// The connection string of this app's database.
    pub fn database_url(&self) -> String {
        database_url(&self.database)
    }

    /// The name of this app's database, for another service to keep its tables in.
    pub fn database_name(&self) -> &str {
        &self.database
    }

    /// Stops this instance; in-flight requests finish first.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    /// `POST /v1/payments` with this app's account, the given key and a JSON body.
    pub async fn post_payment(&self, key: &str, body: &Value) -> TestResponse {
        self.post_payment_as(&self.api_key, key, body).await
    }

    pub async fn post_payment_as(&self, api_key: &str, key: &str, body: &Value) -> TestResponse {
        self.send(self.keyed_post_as(api_key, "/v1/payments", key, body))
            .await
    }

    /// `POST path` with `body` under `key` as the account of `api_key`, not yet sent.
    pub fn keyed_post_as(
        &self,
        api_key: &str,
        path: &str,
        key: &str,
        body: &Value,
    ) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .bearer_auth(api_key)
            .header("idempotency-key", key)
            .json(body)
    }

    /// `POST /v1/payments` with a raw body, content type and headers as given.
    pub fn raw_post(&self) -> reqwest::RequestBuilder {
        self.client
            .post(self.url("/v1/payments"))
            .bearer_auth(&self.api_key)
    }

    /// `POST /v1/payments/{payment}/refunds` with the given key and body.
    pub async fn post_refund(&self, payment: &str, key: &str, body: &Value) -> TestResponse {
        self.post_keyed(&format!("/v1/payments/{payment}/refunds"), key, body)
            .await
    }

    /// `POST /v1/payments/{payment}/capture` under `key`.
    pub async fn post_capture(&self, payment: &str, key: &str, body: &Value) -> TestResponse {
        self.post_keyed(&format!("/v1/payments/{payment}/capture"), key, body)
            .await
    }

    /// `POST /v1/payments/{payment}/cancel` under `key`.
    pub async fn post_cancel(&self, payment: &str, key: &str, body: &Value) -> TestResponse {
        self.post_keyed(&format!("/v1/payments/{payment}/cancel"), key, body)
            .await
    }

    /// `POST path` with `body` under `key`, as this app's account.
    pub async fn post_keyed(&self, path: &str, key: &str, body: &Value) -> TestResponse {
        self.send(self.keyed_post_as(&self.api_key, path, key, body))
            .await
    }

    /// A manual payment of `amount`, authorized (`requires_capture`): its id.
    pub async fn authorized(&self, amount: i64) -> String {
        let (key, mut body) = (new_key(), payment(amount));
        body["capture_method"] = Value::from("manual");
        let response = retry_while_in_flight(|| self.post_payment(&key, &body)).await;
        response.assert_status(201);
        assert_eq!(response.json()["status"], "requires_capture");
        response.json()["id"].as_str().unwrap().to_owned()
    }

    /// `GET path` with this app's account.
    pub async fn get(&self, path: &str) -> TestResponse {
        self.send(self.client.get(self.url(path)).bearer_auth(&self.api_key))
            .await
    }

    /// Creates a succeeded payment of `amount` and returns its id. Retried with its key while the
    /// answer is 409 or 503, as a client does: on a loaded machine the processor may answer past
    /// idempay's timeout (503, an unknown outcome) or a connection wait past the acquire timeout.
    pub async fn paid(&self, amount: i64) -> String {
        let (key, body) = (new_key(), payment(amount));
        let response = retry_while_in_flight(|| self.post_payment(&key, &body)).await;
        response.assert_status(201);
        response.json()["id"].as_str().unwrap().to_owned()
    }

    pub async fn get_payment(&self, id: &str) -> TestResponse {
        self.send(
            self.client
                .get(self.url(&format!("/v1/payments/{id}")))
                .bearer_auth(&self.api_key),
        )
        .await
    }

    /// Sends a request and checks its response against the API description.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> TestResponse {
        send(request).await
    }

    pub async fn payment_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(&self.db)
            .await
            .expect("count payments")
    }

    /// Charges in the processor's ledger (the embedded processor's, in the test database).
    pub async fn charge_count(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM processor_charges")
            .fetch_one(&self.db)
            .await
            .expect("count charges")
    }

    /// idempay's keys; the embedded processor keeps its own in the same table, under its scope.
    pub async fn key_count(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM idempotency_keys WHERE scope NOT LIKE 'processor:%'",
        )
        .fetch_one(&self.db)
        .await
        .expect("count keys")
    }

    /// From now on the database refuses every payment insert (a trigger raises): the unit of work
    /// fails after its key was reserved.
    pub async fn refuse_payments(&self) {
        // On Citus the trigger is created on every shard of the table, which it allows when told
        // (this one touches no other table), one statement at a time.
        let mut tx = idempotency::connections::begin(&self.db)
            .await
            .expect("a transaction");
        if crate::support::citus::enabled() {
            sqlx::query("SET LOCAL citus.enable_unsafe_triggers = on")
                .execute(&mut *tx)
                .await
                .expect("allow the trigger");
        }
        sqlx::query(
            "CREATE FUNCTION refuse_payment() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'the ledger is unavailable'; END $$",
        )
        .execute(&mut *tx)
        .await
        .expect("install the refusing function");
        sqlx::query(
            "CREATE TRIGGER refuse_payment BEFORE INSERT ON payments
             FOR EACH ROW EXECUTE FUNCTION refuse_payment()",
        )
        .execute(&mut *tx)
        .await
        .expect("install the refusing trigger");
        tx.commit().await.expect("commit the trigger");
    }

    /// Another request takes the key in progress over, as a retry would once its lease ran out:
    /// a new token is installed, so the request holding the old one loses its lease.
    pub async fn take_over_the_key_in_progress(&self) {
        // The token is made here: Citus refuses a volatile function in an update of a
        // distributed table.
        let taken = sqlx::query(
            "UPDATE idempotency_keys SET lock_token = $1, \
             locked_until = now() + interval '20 seconds' \
             WHERE status = 'in_progress' AND scope NOT LIKE 'processor:%'",
        )
        .bind(uuid::Uuid::new_v4())
        .execute(&self.db)
        .await
        .expect("take the key over");
        assert_eq!(taken.rows_affected(), 1, "taken over while in progress");
    }

    /// Sends a payment from a task of its own and returns once its key is reserved; the task gives
    /// the response.
    pub async fn start_payment(
        &self,
        key: &str,
        body: &Value,
    ) -> tokio::task::JoinHandle<TestResponse> {
        let request = self.keyed_post_as(&self.api_key, "/v1/payments", key, body);
        let response = tokio::spawn(send(request));
        self.wait_for_keys(1).await;
        response
    }

    /// Waits until `keys` keys are stored: the requests sent in the background have reserved
    /// theirs.
    pub async fn wait_for_keys(&self, keys: i64) {
        wait_until("the requests reserve their keys", || async {
            self.key_count().await >= keys
        })
        .await;
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A listener on a free port of 127.0.0.1.
async fn bind_any() -> TcpListener {
    TcpListener::bind("127.0.0.1:0").await.expect("bind")
}

/// Sends a request, reads the whole response and checks it against the API description.
pub async fn send(request: reqwest::RequestBuilder) -> TestResponse {
    let (client, request) = request.build_split();
    let request = request.expect("a valid request");
    let (method, path) = (request.method().clone(), request.url().path().to_owned());
    let response = client.execute(request).await.expect("the server answers");
    let response = TestResponse {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("a body").to_vec(),
    };
    crate::support::contract::check(&method, &path, &response);
    response
}

/// Asserts `sent` failed, the process having crashed before it answered, and waits for `crashed`
/// to exit (within `ANSWER_WITHIN`); its exit status, for the test to check how it died.
#[cfg(feature = "failpoints")]
pub async fn died_before_answering(
    sent: reqwest::Result<reqwest::Response>,
    crashed: &mut crate::support::instance::Instance,
) -> std::process::ExitStatus {
    use crate::support::instance::ANSWER_WITHIN;

    assert!(sent.is_err(), "the process died before it answered");
    tokio::time::timeout(ANSWER_WITHIN, crashed.child.wait())
        .await
        .expect("the process exits")
        .unwrap()
}

/// Sends a request as a client told to retry would: again, a moment later, while the answer is 409
/// (the key is still in progress) or 503 (try again soon), for at most 10 seconds. Returns the
/// first other answer.
pub async fn retry_while_in_flight<F, Fut>(send: F) -> TestResponse
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = TestResponse>,
{
    let mut answer = send().await;
    for _ in 0..50 {
        if !matches!(answer.status, 409 | 503) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer = send().await;
    }
    answer
}

/// Waits until `condition` holds, checking every 10 ms; panics after [`WAIT_LIMIT`], saying `what`
/// never happened. The property is the event, not how soon it comes: a passing test returns as
/// soon as it holds, and the limit only ends a test whose event never comes.
pub async fn wait_until<F, Fut>(what: &str, condition: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(
        holds_within(WAIT_LIMIT, condition).await,
        "{what}: not within {WAIT_LIMIT:?}"
    );
}

/// How long [`wait_until`] waits for its event: generous, because the suites run beside other
/// work on two cores (a Citus cluster's recovery job, with a 30,000-key test beside it, took more
/// than 10 s for two tries that take a second alone).
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Whether `condition` comes to hold within `limit`, checking every 10 ms: for a wait whose
/// failure says more than [`wait_until`]'s.
pub async fn holds_within<F, Fut>(limit: Duration, condition: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !condition().await {
        if started.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    true
}

impl TestApp {
    /// Waits until a statement of this test's database whose text is `LIKE` `query` waits for a
    /// lock (a row's, a table's or an advisory one): how a test knows a request reached the window
    /// it aims at, and is held there.
    /// On Citus the lock is waited for on a worker: there the coordinator's session still running
    /// the statement is what shows it (as in `until_statements_wait_together`).
    pub async fn until_a_statement_waits(&self, what: &str, query: &str) {
        wait_until(what, || self.a_statement_waits(query)).await;
    }

    /// Whether a statement of this test's database whose text is `LIKE` `query` waits for a lock
    /// now (see [`Self::until_a_statement_waits`]).
    pub async fn a_statement_waits(&self, query: &str) -> bool {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT FROM pg_stat_activity
                            WHERE datname = current_database() AND state = 'active'
                              AND (wait_event_type = 'Lock' OR $2) AND query LIKE $1)",
        )
        .bind(query)
        .bind(crate::support::citus::enabled())
        .fetch_one(&self.db)
        .await
        .unwrap()
    }

    /// Waits until at least `least` statements of this test's database whose text is `LIKE`
    /// `query` wait for a lock at the same moment, and returns the most that did over the next
    /// 200 ms (the others have that long to arrive too): how a test proves
    /// that requests it sent together were in flight together (sent one after another, at most
    /// one would be held at a lock the test holds). Panics after 10 s with the most it saw. On
    /// Citus the lock is waited for on a worker, under the shard's name: the coordinator's
    /// sessions still running the statement are counted instead (held by the test, they wait).
    pub async fn until_statements_wait_together(&self, what: &str, query: &str, least: i64) -> i64 {
        let started = std::time::Instant::now();
        let (mut most, mut reached) = (0, None);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state = 'active'
                   AND (wait_event_type = 'Lock' OR $2) AND query LIKE $1",
            )
            .bind(query)
            .bind(crate::support::citus::enabled())
            .fetch_one(&self.db)
            .await
            .unwrap();
            most = most.max(waiting);
            if most >= least
                && reached
                    .get_or_insert_with(std::time::Instant::now)
                    .elapsed()
                    >= Duration::from_millis(200)
            {
                return most;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{what}: at most {most} waited at once within 10 s, not {least}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A server that accepts webhooks signed with a new secret, and the secret.
    pub async fn spawn_with_webhooks() -> (Self, WebhookSecrets) {
        let secret = WebhookSecrets::generate();
        let app = Self::spawn_with(Settings {
            shared: SharedArgs {
                webhook_secrets: Some(secret.clone()),
                ..SharedArgs::default()
            },
            ..Settings::default()
        })
        .await;
        (app, secret)
    }
}

/// A valid payment body.
pub fn payment(amount: i64) -> Value {
    serde_json::json!({ "amount": amount, "currency": "eur", "order": "cmd_9182" })
}

/// A payment of `amount` with the test card that takes `IDEMPAY_SLOW_CHARGE` to charge.
pub fn slow_payment(amount: i64) -> Value {
    serde_json::json!({ "amount": amount, "currency": "eur", "payment_method": "pm_card_slow" })
}

/// Held for the whole run of a test that loads three `idempay serve` processes at once (a retry
/// storm, a backlog drained by three jobs): two such tests at once, with the cluster's three nodes
/// on this machine's two cores, answered requests past the 10 s request timeout, which they rightly
/// count as failures. Other tests run beside them as before.
pub async fn one_storm_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static STORMS: std::sync::OnceLock<tokio::sync::Mutex<()>> = std::sync::OnceLock::new();
    STORMS
        .get_or_init(|| tokio::sync::Mutex::new(()))
        .lock()
        .await
}

/// Settings for the test's own server when the test starts `idempay serve` processes that must be
/// the only ones taking over or deleting keys: its expiry and recovery jobs run at start (with
/// nothing to do yet), then not for a day. With the defaults, on a slow run its recovery job
/// (every 10 s) took over a crashed key before the test's retry could, and its expiry job (every
/// 60 s) deleted keys no instance's metrics counted.
pub fn jobs_off() -> Settings {
    Settings {
        shared: SharedArgs {
            expiry_interval: Duration::from_secs(86_400),
            ..SharedArgs::default()
        },
        recovery_interval: Duration::from_secs(86_400),
        ..Settings::default()
    }
}

/// A database of the test's own, cloned from the migrated template; its name.
pub async fn fresh_database() -> String {
    let database = format!("test_{}", uuid::Uuid::new_v4().simple());
    create_database(&database)
        .await
        .expect("create the test database");
    database
}

/// A [`fresh_database`] with no server on it, and its URL: no background job runs there but what
/// the test calls. (A server's jobs run once at its start, and on a loaded run that first run came
/// after the test had made its rows, and took them.)
pub async fn bare_database() -> String {
    database_url(&fresh_database().await)
}

/// A pool of one connection to `database_url`, where `tables` were analyzed while empty and keep
/// those statistics (autovacuum off for them): every statement of a batch job run on it is
/// planned as if nothing were to be done, and that connection keeps its prepared statements, so
/// a test can make a backlog appear under a plan made for an empty table.
pub async fn one_connection_planning_for_empty(database_url: &str, tables: &[&str]) -> PgPool {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(database_url)
        .await
        .unwrap();
    for table in tables {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false); ANALYZE {table}"
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
    pool
}

/// Settings with a short slow charge, so in-flight tests are quick.
pub fn with_slow_charge(slow_charge: Duration) -> Settings {
    Settings {
        shared: SharedArgs {
            slow_charge,
            ..SharedArgs::default()
        },
        ..Settings::default()
    }
}

impl TestApp {
    /// A server like [`TestApp::spawn_with`]'s, and the task that serves it: it ends once the
    /// server stopped accepting and finished its requests in flight.
    pub async fn spawn_watched(
        settings: Settings,
    ) -> (Self, tokio::task::JoinHandle<std::io::Result<()>>) {
        // A fresh database with its account; its server is replaced by the watched one.
        let unwatched = Self::spawn().await;
        let url = unwatched.database_url();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let app = Application::build(settings, idempay::db::pool(&url).expect("pool"), listener)
            .expect("build");
        let address = format!("http://{}", app.local_addr().expect("address"));
        let stop = CancellationToken::new();
        let task = tokio::spawn(app.run_until_stopped(stop.clone().cancelled_owned()));
        let watched = Self {
            address,
            db: unwatched.db.clone(),
            database: unwatched.database.clone(),
            api_key: unwatched.api_key.clone(),
            account_id: unwatched.account_id.clone(),
            client: unwatched.client.clone(),
            stop,
        };
        (watched, task)
    }
}

/// Inserts the reservation a crashed instance would leave, with the fingerprint the service
/// computes for `body` (SHA-256 of the path and the canonical JSON).
pub async fn reserve_as_a_dead_process(
    app: &TestApp,
    key: &str,
    body: &serde_json::Value,
    locked_until: &str,
) {
    let fingerprint = idempotency::Fingerprint::of_request("/v1/payments", body);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO idempotency_keys
             (account_id, scope, idem_key, request_hash, status, lock_token, locked_until,
              expires_at)
         VALUES (split_part($1, ':', 1), $1, $2, $3, 'in_progress', gen_random_uuid(),
                 {locked_until}, now() + interval '1 day')"
    )))
    .bind(format!("{}:POST /v1/payments", app.account_id))
    .bind(key)
    .bind(fingerprint.as_bytes().as_slice())
    .execute(&app.db)
    .await
    .unwrap();
}
