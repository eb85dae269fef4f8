//! idempay as a provider: merchants register webhook endpoints, and every event of theirs is
//! delivered, signed with the endpoint's secret, at least once, retried on the schedule, given up
//! and the endpoint disabled when the schedule runs out; never to a private address; once per
//! attempt however many instances deliver. And the local receiver a developer runs.
//!
//! Events are written here as the payment and refund routes write them: a row in `events`, whose
//! trigger queues a delivery for every subscribed endpoint.

mod end_to_end;
mod endpoint_changes;
mod event_retries;
mod fairness;
mod fan_out;
mod listen;
mod proxies;
mod retention;
mod retries;
mod retry_bounds;
mod throughput;
mod webhook_endpoints;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use idempay::config::Settings;
use serde_json::{Value, json};
use service::outbox::RetrySchedule;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::support::helpers::{TestApp, TestResponse, new_key};

/// A receiver on a free port of 127.0.0.1 that answers 500 to its first `failures` deliveries,
/// then 200, and keeps every delivery it received.
pub struct Receiver {
    pub url: String,
    inbox: Inbox,
}

#[derive(Clone)]
struct Inbox {
    received: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
    failures: Arc<AtomicUsize>,
}

impl Receiver {
    pub async fn start(failures: usize) -> Self {
        let inbox = Inbox {
            received: Arc::default(),
            failures: Arc::new(AtomicUsize::new(failures)),
        };
        let app = Router::new()
            .route("/hooks", post(receive))
            .with_state(inbox.clone());
        let url = serve_hooks(app).await;
        Self { url, inbox }
    }

    pub fn deliveries(&self) -> Vec<(HeaderMap, Bytes)> {
        self.inbox.received.lock().unwrap().clone()
    }

    /// How many deliveries arrived.
    pub fn count(&self) -> usize {
        self.inbox.received.lock().unwrap().len()
    }

    /// The `webhook-id` of every delivery received, in the order they came.
    pub fn webhook_ids(&self) -> Vec<String> {
        self.deliveries()
            .iter()
            .map(|(headers, _)| headers["webhook-id"].to_str().unwrap().to_owned())
            .collect()
    }

    /// How many deliveries arrived for each `webhook-id`.
    pub fn arrivals(&self) -> HashMap<String, usize> {
        let mut arrivals = HashMap::new();
        for id in self.webhook_ids() {
            *arrivals.entry(id).or_default() += 1;
        }
        arrivals
    }
}

/// Serves `app` on a free port of 127.0.0.1 for as long as the test runs; the URL of its `/hooks`,
/// where an endpoint registered for it is delivered to.
pub async fn serve_hooks(app: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

async fn receive(State(inbox): State<Inbox>, headers: HeaderMap, body: Bytes) -> StatusCode {
    inbox.received.lock().unwrap().push((headers, body));
    let failing = inbox
        .failures
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok();
    if failing {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

/// Settings for endpoints on this machine, retried on `schedule`.
pub fn local(schedule: &str) -> Settings {
    Settings {
        webhook_allow_private: true,
        shared: SharedArgs {
            webhook_retry_schedule: RetrySchedule::parse(schedule).unwrap(),
            ..SharedArgs::default()
        },
        ..Settings::default()
    }
}

/// `POST /v1/webhook_endpoints` as `api_key`.
pub async fn post_endpoint(app: &TestApp, api_key: &str, key: &str, body: &Value) -> TestResponse {
    app.send(app.keyed_post_as(api_key, "/v1/webhook_endpoints", key, body))
        .await
}

/// Registers an endpoint for every event at `url`; returns its id and secret.
pub async fn endpoint_for_all(app: &TestApp, url: &str) -> (String, String) {
    endpoint_for(app, url, &["*"]).await
}

/// Registers an endpoint for `events` at `url`; returns its id and secret.
pub async fn endpoint_for(app: &TestApp, url: &str, events: &[&str]) -> (String, String) {
    endpoint_as(app, &app.api_key, url, events).await
}

/// Registers an endpoint for `events` at `url` as the account of `api_key`; its id and secret.
pub async fn endpoint_as(
    app: &TestApp,
    api_key: &str,
    url: &str,
    events: &[&str],
) -> (String, String) {
    let body = json!({ "url": url, "enabled_events": events });
    let created = post_endpoint(app, api_key, &new_key(), &body).await;
    created.assert_status(201);
    let created = created.json();
    (
        created["id"].as_str().unwrap().to_owned(),
        created["secret"].as_str().unwrap().to_owned(),
    )
}

/// The rest of a statement that writes events in a CTE `event` (`id, account_id, type, body`) and
/// queues each for the enabled endpoints of its account that subscribe to its type.
pub const FAN_OUT: &str = "
     INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id)
     SELECT endpoint.account_id, event.id, endpoint.url, event.body, endpoint.id
     FROM event JOIN webhook_endpoints endpoint ON endpoint.account_id = event.account_id
     WHERE endpoint.status = 'enabled'
       AND (event.type = ANY (endpoint.enabled_events) OR '*' = ANY (endpoint.enabled_events))";

/// Writes an event of the account, shaped as the real ones, as a change's transaction does;
/// returns its id.
pub async fn write_event(db: &PgPool, account: &str, kind: &str) -> String {
    let id = format!("evt_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
    let body = json!({
        "id": id,
        "object": "event",
        "type": kind,
        "created_at": chrono::Utc::now(),
        "data": { "object": { "id": "pay_U5PgTqA02dYsv3cLANIGkqIs", "object": "payment" } },
    });
    // Queued for the account's endpoints as idempay queues its own events (src/events/mod.rs).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH event AS (
             INSERT INTO events (id, account_id, type, body) VALUES ($1, $2, $3, $4)
             RETURNING id, account_id, type, body
         ) {FAN_OUT}"
    )))
    .bind(&id)
    .bind(account)
    .bind(kind)
    .bind(serde_json::to_vec(&body).unwrap())
    .execute(db)
    .await
    .unwrap();
    id
}

/// Waits until `condition` holds, checking every 20 ms; panics after `within`, saying `what`
/// never happened.
pub async fn wait_for<F, Fut>(what: &str, within: Duration, condition: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !condition().await {
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `attempts` delivery attempts are recorded (at most 20 s), saying `what` if not.
pub async fn attempts_recorded(db: &PgPool, attempts: i64, what: &str) {
    wait_for(what, Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM webhook_attempts")
            .fetch_one(db)
            .await
            .unwrap()
            == attempts
    })
    .await;
}

/// Waits until no delivery of `event` is pending (to `endpoint` only, when given): acknowledged or
/// given up.
pub async fn settled(app: &TestApp, event: &str, endpoint: Option<&str>) {
    wait_for(
        "the event's deliveries are acknowledged",
        Duration::from_secs(20),
        || async {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM webhook_deliveries
                 WHERE event_id = $1 AND ($2::text IS NULL OR endpoint_id = $2)
                   AND delivered_at IS NULL AND failed_at IS NULL",
            )
            .bind(event)
            .bind(endpoint)
            .fetch_one(&app.db)
            .await
            .unwrap();
            pending == 0
        },
    )
    .await;
}
