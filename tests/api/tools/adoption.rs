//! The mechanism adopted as a team outside idempay adopts it: its own migration makes the keys'
//! table in an empty database, the same schema idempay's migrations built step by step, beside a
//! service's own sqlx migrations without either ignoring the other's; its layer on a router of
//! the service's own refuses and replays; and the crate's example service
//! (crates/idempotency/examples/shop.rs, built with the workspace's other targets) places one
//! order for a key sent twice, and answers the second with the first's answer.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Request, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use idempay_test_macros::api_test;
use idempotency::{Idempotency, IdempotencyLayer, Owners, Policy};
use serde_json::json;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::process::Command;
use tower::ServiceExt;

use crate::support::harness::database_url;
use crate::support::helpers::{TestApp, new_key, wait_until};
use crate::support::instance::free_port;

/// A database of its own, empty: no migration of idempay's has run in it.
async fn empty_database() -> String {
    let name = format!("adopt_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&database_url("postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    database_url(&name)
}

/// What the mechanism's statements rely on, as the catalog describes it: the keys' table's
/// columns, constraints and indexes, and `idempotency_complete`.
async fn the_keys_schema(db: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT 'column ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
                || coalesce(' default ' || pg_get_expr(d.adbin, d.adrelid), '')
                || coalesce(nullif(' identity ' || a.attidentity::text, ' identity '), '')
         FROM pg_attribute a
         LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE a.attrelid = 'idempotency_keys'::regclass AND a.attnum > 0 AND NOT a.attisdropped
         UNION ALL
         SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
         FROM pg_constraint WHERE conrelid = 'idempotency_keys'::regclass
         UNION ALL
         SELECT 'index ' || pg_get_indexdef(indexrelid)
         FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass
         UNION ALL
         SELECT 'function ' || pg_get_functiondef('idempotency_complete'::regproc)
         ORDER BY 1",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

/// The crate's example `name`, as `cargo build --examples` links it (`make test` builds the
/// examples first; `cargo test --all-targets` builds them only as test harnesses, which serve
/// nothing).
fn the_example(name: &str) -> PathBuf {
    let example = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        example.is_file(),
        "{} is missing: `make test` builds it, or `cargo build --workspace --examples --features \
         failpoints`",
        example.display()
    );
    example
}

#[api_test]
async fn the_mechanism_s_migration_makes_the_schema_idempay_s_migrations_made() {
    let app = TestApp::spawn().await;
    let adopter = PgPool::connect(&empty_database().await).await.unwrap();

    idempotency::migrate(&adopter).await.unwrap();
    // Run again, as every start of the service runs it: nothing left to do.
    idempotency::migrate(&adopter).await.unwrap();

    let idempays = the_keys_schema(&app.db).await;
    let mechanisms = the_keys_schema(&adopter).await;
    assert!(idempays.len() > 30, "{idempays:#?}");
    assert_eq!(mechanisms, idempays);
}

#[api_test]
async fn the_example_shop_places_one_order_for_a_key_sent_twice() {
    let database = empty_database().await;
    let shop = Shop::start(&database, &[]).await;

    let key = new_key();
    let first = shop.order(&key).await.unwrap();
    let (status, replayed) = (
        first.status(),
        first.headers().get("idempotent-replayed").cloned(),
    );
    let placed = first.text().await.unwrap();
    let again = shop.order(&key).await.unwrap();
    let replayed_again = again.headers().get("idempotent-replayed").cloned();
    let again_status = again.status();
    let answer = again.text().await.unwrap();
    let other = shop.order(&new_key()).await.unwrap().text().await.unwrap();

    assert_eq!(status, 201);
    assert_eq!(placed, "order 1\n");
    assert!(replayed.is_none(), "the first answer is no replay");
    assert_eq!((again_status.as_u16(), answer.as_str()), (201, "order 1\n"));
    assert_eq!(
        replayed_again
            .as_ref()
            .and_then(|value| value.to_str().ok()),
        Some("true"),
        "the second is the first's answer, replayed"
    );
    assert_eq!(other, "order 2\n", "another key is another order");
    let adopter = PgPool::connect(&database).await.unwrap();
    let keys: Vec<(String, String)> =
        sqlx::query_as("SELECT scope, status FROM idempotency_keys ORDER BY id")
            .fetch_all(&adopter)
            .await
            .unwrap();
    assert_eq!(
        keys,
        [
            ("shop:POST /orders".to_owned(), "completed".to_owned()),
            ("shop:POST /orders".to_owned(), "completed".to_owned()),
        ]
    );
    shop.stop().await;
}

/// The mechanism's own expiry job, as the example runs it: a key past its lifetime is deleted, and
/// then it is a new key, which places a new order. The key is in the table after its first answer,
/// so it is the job that deletes it.
#[api_test]
async fn the_example_shop_s_expiry_job_deletes_an_expired_key_which_then_orders_anew() {
    let database = empty_database().await;
    let shop = Shop::start(&database, &[("SHOP_KEY_TTL_SECS", "2")]).await;
    let adopter = PgPool::connect(&database).await.unwrap();
    let stored = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM idempotency_keys")
            .fetch_one(&adopter)
            .await
            .unwrap()
    };

    let key = new_key();
    let first = shop.order(&key).await.unwrap().text().await.unwrap();
    assert_eq!(first, "order 1\n");
    assert_eq!(stored().await, 1, "the key is stored with its answer");
    wait_until("the expiry job deletes the expired key", || async {
        stored().await == 0
    })
    .await;
    let again = shop.order(&key).await.unwrap();
    assert!(
        again.headers().get("idempotent-replayed").is_none(),
        "an expired key's request is no replay"
    );
    assert_eq!(again.text().await.unwrap(), "order 2\n");
    shop.stop().await;
}

/// The example shop, built as a program (`make test` builds the examples first), on a free port.
struct Shop {
    child: tokio::process::Child,
    listen: String,
    client: reqwest::Client,
}

impl Shop {
    /// Starts it on `database` with `env` besides, once it answers.
    async fn start(database: &str, env: &[(&str, &str)]) -> Self {
        let listen = format!("127.0.0.1:{}", free_port());
        let child = Command::new(the_example("shop"))
            .env("DATABASE_URL", database)
            .env("SHOP_LISTEN", &listen)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let client = reqwest::Client::new();
        wait_until("the shop answers", || async {
            client
                .get(format!("http://{listen}/"))
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok()
        })
        .await;
        Self {
            child,
            listen,
            client,
        }
    }

    /// Places an order with `key`.
    fn order(&self, key: &str) -> impl Future<Output = reqwest::Result<reqwest::Response>> {
        self.client
            .post(format!("http://{}/orders", self.listen))
            .header("idempotency-key", key)
            .send()
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// A service's own sqlx migrations, in a folder of their own (removed when dropped): one table.
struct OwnMigrations(PathBuf);

impl OwnMigrations {
    fn new() -> Self {
        let folder =
            std::env::temp_dir().join(format!("adopter_{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(
            folder.join("20250101000000_orders.sql"),
            "CREATE TABLE orders (id bigint PRIMARY KEY);\n",
        )
        .unwrap();
        Self(folder)
    }

    /// The service's migrator, as sqlx makes it: refusing versions it does not know.
    async fn migrator(&self) -> sqlx::migrate::Migrator {
        sqlx::migrate::Migrator::new(self.0.as_path())
            .await
            .unwrap()
    }
}

impl Drop for OwnMigrations {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The versions recorded in `table`.
async fn versions(db: &PgPool, table: &str) -> Vec<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM {table} ORDER BY version"
    )))
    .fetch_all(db)
    .await
    .unwrap()
}

/// The crate's migrations, as they are under `crates/idempotency/migrations`.
fn the_mechanism_s_versions() -> Vec<i64> {
    let folder = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/idempotency/migrations");
    let mut versions: Vec<i64> = std::fs::read_dir(folder)
        .unwrap()
        .map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.split('_').next().unwrap().parse().unwrap()
        })
        .collect();
    versions.sort_unstable();
    versions
}

/// A service with sqlx migrations of its own runs them as sqlx makes them, without
/// `set_ignore_missing`, before and after the mechanism's: each records its own in a table of its
/// own, so neither finds a version it does not know.
#[api_test]
async fn an_adopter_s_own_migrations_and_the_mechanism_s_run_in_any_order_and_again() {
    let adopter = PgPool::connect(&empty_database().await).await.unwrap();
    let own = OwnMigrations::new();

    own.migrator().await.run(&adopter).await.unwrap();
    idempotency::migrate(&adopter).await.unwrap();
    // Every start runs both again.
    own.migrator().await.run(&adopter).await.unwrap();
    idempotency::migrate(&adopter).await.unwrap();

    assert_records_apart(&adopter).await;
}

/// Each migrator's versions in its own table: the adopter's one in `_sqlx_migrations`, the
/// mechanism's in its own.
async fn assert_records_apart(adopter: &PgPool) {
    assert_eq!(
        versions(adopter, "_sqlx_migrations").await,
        [20250101000000]
    );
    assert_eq!(
        versions(adopter, idempotency::MIGRATIONS_TABLE).await,
        the_mechanism_s_versions()
    );
}

/// A database migrated when the crate recorded its migrations in `_sqlx_migrations` (the service's
/// migrator then ignoring them): the mechanism's rows move to its own table, the service's stay,
/// and from then on neither migrator needs to ignore anything.
#[api_test]
async fn a_database_whose_shared_record_holds_the_mechanism_s_migrations_moves_them_to_its_own() {
    let adopter = PgPool::connect(&empty_database().await).await.unwrap();
    let own = OwnMigrations::new();
    let mut shared = sqlx::migrate!("./crates/idempotency/migrations");
    shared.set_ignore_missing(true);
    shared.run(&adopter).await.unwrap();
    let mut ignoring = own.migrator().await;
    ignoring.set_ignore_missing(true);
    ignoring.run(&adopter).await.unwrap();
    let mut before = the_mechanism_s_versions();
    before.push(20250101000000);
    before.sort_unstable();
    assert_eq!(versions(&adopter, "_sqlx_migrations").await, before);

    idempotency::migrate(&adopter).await.unwrap();
    own.migrator().await.run(&adopter).await.unwrap();

    assert_records_apart(&adopter).await;
}

/// Owners whose refusal is the adopter's own answer, not one of the mechanism's: a tenant named by
/// a header, or 401.
#[derive(Clone)]
struct Tenants;

impl Owners for Tenants {
    type Rejection = (StatusCode, &'static str);

    async fn owner(&self, parts: &mut Parts) -> Result<String, Self::Rejection> {
        match parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()) {
            Some(tenant) => Ok(format!("tenant_{tenant}")),
            None => Err((StatusCode::UNAUTHORIZED, "name your tenant")),
        }
    }
}

/// The adopter's routes behind `layer`: each order placed counts once in `placed`.
fn orders(layer: IdempotencyLayer<Tenants>, placed: Arc<AtomicU64>) -> Router {
    async fn place(State(placed): State<Arc<AtomicU64>>) -> (StatusCode, String) {
        let number = placed.fetch_add(1, Ordering::SeqCst) + 1;
        (StatusCode::CREATED, format!("order {number}"))
    }
    Router::new()
        .route("/orders", post(place))
        .route_layer(layer)
        .with_state(placed)
}

/// Sends a POST to `/orders` with `headers`; the answer's status, `Content-Type`,
/// `Idempotent-Replayed` and body.
async fn post_order(router: &Router, headers: &[(&str, &str)]) -> (u16, String, String, String) {
    let mut request = Request::post("/orders");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = router
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|value: &HeaderValue| value.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (status, content_type, replayed) = (
        parts.status.as_u16(),
        header(header::CONTENT_TYPE.as_str()),
        header("idempotent-replayed"),
    );
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    (status, content_type, replayed, body)
}

/// An adopter's router with the layer, on its own database, no `FromRef` or state of the
/// mechanism's: a POST without a key is 400 `application/problem+json`, or, with `on_error`, the
/// adopter's own body; a refusal of its `Owners` is its own rejection (which needs no
/// `From<idempotency::Error>`); a key sent twice runs the handler once and replays its answer.
#[api_test]
async fn the_layer_refuses_as_problem_json_or_through_on_error_and_replays_a_key_sent_twice() {
    let adopter = PgPool::connect(&empty_database().await).await.unwrap();
    idempotency::migrate(&adopter).await.unwrap();
    let idempotency = Idempotency::new(adopter, Policy::default());
    let placed = Arc::new(AtomicU64::new(0));
    let plain = orders(
        IdempotencyLayer::new(idempotency.clone(), Tenants),
        Arc::clone(&placed),
    );
    let reshaped = orders(
        IdempotencyLayer::new(idempotency, Tenants).on_error(|error| {
            let status = match &error {
                idempotency::Error::Refused(refusal) => refusal.status(),
                _ => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, Json(json!({ "shop_error": error.to_string() }))).into_response()
        }),
        Arc::clone(&placed),
    );
    let tenant = ("x-tenant", "a");

    let (status, content_type, _, body) = post_order(&plain, &[tenant]).await;
    assert_eq!(
        (status, content_type.as_str()),
        (400, "application/problem+json")
    );
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["status"], 400, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{problem}"
    );
    let (status, content_type, _, body) = post_order(&reshaped, &[tenant]).await;
    assert_eq!((status, content_type.as_str()), (400, "application/json"));
    let own: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(
        own["shop_error"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{own}"
    );
    let key = new_key();
    let untenanted = post_order(&plain, &[("idempotency-key", &key)]).await;
    assert_eq!(
        (untenanted.0, untenanted.3.as_str()),
        (401, "name your tenant")
    );
    assert_eq!(placed.load(Ordering::SeqCst), 0, "no refused request ran");

    let keyed = [tenant, ("idempotency-key", key.as_str())];
    let first = post_order(&plain, &keyed).await;
    let again = post_order(&reshaped, &keyed).await;

    assert_eq!(
        (first.0, first.2.as_str(), first.3.as_str()),
        (201, "", "order 1")
    );
    assert_eq!(
        (again.0, again.2.as_str(), again.3.as_str()),
        (201, "true", "order 1")
    );
    assert_eq!(placed.load(Ordering::SeqCst), 1, "the handler ran once");
}
