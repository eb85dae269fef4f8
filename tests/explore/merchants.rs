//! Merchant webhook endpoints, as a merchant runs them: idempay sends each account's events to the
//! endpoints the account registered, at least once, signed with the endpoint's secret, through the
//! outbox every instance's loop drains. The faults that test the ledgers test that too: an
//! instance killed or paused mid-send, the database crashed or slow under the outbox's claims.
//!
//! Each schedule has two accounts: the one whose intents the clients send, and a silent one that
//! sends nothing. Before the faults begin, each registers an endpoint for every event type, each on
//! its own path of one receiver the explorer serves on loopback ([`Merchants`]); the receiver keeps
//! every delivery, verifies its signature with its endpoint's secret, and answers 200. Once every
//! intent has its final answer, [`Merchants::check`] waits (at most [`DRAIN`]) for the outbox to
//! deliver everything, then holds the deliveries to the events: every event of the sending account
//! received by its endpoint (redeliveries allowed), none about an object of another account,
//! nothing at all at the silent account's endpoint, every signature verified.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};
use service::outbox::WebhookSecrets;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::check::Violation;
use crate::coverage::Seen;
use crate::run::Schedule;
use crate::world::create_account;

/// How long the outbox may take, once every intent has its final answer, to deliver every event:
/// a send cut by a kill is due again after the delivery timeout (10 s), then retried every second.
const DRAIN: Duration = Duration::from_secs(30);

/// The instances' retry schedule for merchant deliveries: every second, for longer than any
/// schedule and its drain. The default's second delay (5 min) would outlast the schedule, and a
/// delivery that failed twice would be judged undelivered when it is only late.
pub fn retry_schedule() -> String {
    vec!["1s"; 120].join(",")
}

/// Which account's endpoint a delivery reached: its path on the receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Endpoint {
    /// The account the clients send intents for.
    Sender,
    /// The account that sends nothing: nothing should reach it.
    Silent,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Self::Sender => "sender",
            Self::Silent => "silent",
        }
    }
}

/// One delivery as the receiver got it.
#[derive(Clone)]
struct Delivery {
    endpoint: Endpoint,
    headers: HeaderMap,
    /// The body, parsed: `{"id", "type", "data": {"object": {"id", "object", …}}}`.
    event: Value,
    /// The signature checked with the endpoint's secret on arrival (its timestamp is judged
    /// against the clock then): why it failed, if it did.
    unsigned: Option<String>,
}

impl Delivery {
    /// The `webhook-id`: the event's id, which a merchant deduplicates on.
    fn id(&self) -> &str {
        self.headers
            .get("webhook-id")
            .and_then(|id| id.to_str().ok())
            .unwrap_or("")
    }

    fn kind(&self) -> &str {
        self.event["type"].as_str().unwrap_or("?")
    }

    /// What the event is about: the object's kind (`payment`, `refund`, `dispute`) and id.
    fn object(&self) -> (&str, &str) {
        let object = &self.event["data"]["object"];
        (
            object["object"].as_str().unwrap_or("?"),
            object["id"].as_str().unwrap_or("?"),
        )
    }
}

/// What the receiver keeps, shared with its handler.
#[derive(Default)]
struct Inbox {
    deliveries: Mutex<Vec<Delivery>>,
    /// Each endpoint's secret, from the answer to its registration.
    secrets: Mutex<HashMap<Endpoint, WebhookSecrets>>,
}

/// The receiver of one schedule, and the silent account.
pub struct Merchants {
    inbox: Arc<Inbox>,
    port: u16,
    server: JoinHandle<()>,
    silent_account: String,
    silent_key: String,
}

impl Drop for Merchants {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Merchants {
    /// Creates the silent account in the schedule's database and starts the receiver on a free
    /// loopback port.
    pub async fn start(database_url: &str) -> Self {
        let (silent_key, silent_account) = create_account(database_url, "explorer (silent)").await;
        let inbox = Arc::new(Inbox::default());
        let app = Router::new()
            .route("/merchants/{endpoint}", post(receive))
            .with_state(Arc::clone(&inbox));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the receiver's port");
        let port = listener.local_addr().expect("a bound port").port();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Self {
            inbox,
            port,
            server,
            silent_account,
            silent_key,
        }
    }

    /// Registers each account's endpoint through instance 0, before the faults begin (an event is
    /// queued only for the endpoints registered when it is written). One not registered fails the
    /// schedule: it would check nothing.
    pub async fn register(&self, s: &Schedule) {
        for (endpoint, api_key) in [
            (Endpoint::Sender, &s.api_key),
            (Endpoint::Silent, &self.silent_key),
        ] {
            match self.register_one(s, endpoint, api_key).await {
                Ok(secret) => {
                    self.inbox.secrets.lock().unwrap().insert(endpoint, secret);
                    s.timeline.log(format!(
                        "  merchant endpoint of the {} account registered",
                        endpoint.path()
                    ));
                }
                Err(error) => s.trouble(
                    "endpoint not registered",
                    format!("the {} account's endpoint: {error}", endpoint.path()),
                ),
            }
        }
    }

    /// `POST /v1/webhook_endpoints` for every event type, retried with its key until 201: the
    /// endpoint's secret.
    async fn register_one(
        &self,
        s: &Schedule,
        endpoint: Endpoint,
        api_key: &str,
    ) -> Result<WebhookSecrets, String> {
        let url = format!(
            "http://127.0.0.1:{}/merchants/{}",
            self.port,
            endpoint.path()
        );
        let key = format!("explore-{}-endpoint-{}", s.plan.seed, endpoint.path());
        let mut error = String::new();
        for _ in 0..10 {
            let sent = reqwest::Client::new()
                .post(format!("{}/v1/webhook_endpoints", s.instance_address(0)))
                .bearer_auth(api_key)
                .header("Idempotency-Key", &key)
                .timeout(Duration::from_secs(5))
                .json(&json!({ "url": url, "enabled_events": ["*"] }))
                .send()
                .await;
            match sent {
                Ok(answer) if answer.status() == StatusCode::CREATED => {
                    let answer: Value = answer.json().await.map_err(|e| e.to_string())?;
                    let secret = answer["secret"].as_str().ok_or("no secret in the 201")?;
                    return WebhookSecrets::parse(secret);
                }
                Ok(answer) => {
                    error = format!(
                        "{} {}",
                        answer.status(),
                        answer.text().await.unwrap_or_default()
                    )
                }
                Err(failed) => error = failed.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(error)
    }

    /// Waits (at most [`DRAIN`]) until the outbox has nothing pending for an endpoint and every
    /// event of the sending account reached its endpoint, then holds the deliveries to the events.
    pub async fn check(&self, s: &Schedule) -> Vec<Violation> {
        let mut broken = Vec::new();
        let mut violation = |kind: &'static str, detail: String| {
            broken.push(Violation { kind, detail });
        };
        let sender: String = match sqlx::query_scalar("SELECT id FROM accounts WHERE id <> $1")
            .bind(&self.silent_account)
            .fetch_one(&s.db)
            .await
        {
            Ok(sender) => sender,
            Err(error) => {
                violation(
                    "merchant check",
                    format!("the sending account not read: {error}"),
                );
                return broken;
            }
        };
        let waiting = Instant::now();
        let mut events: Vec<(String, String, String)>;
        loop {
            // The events before what was received: an event received in between is found, and
            // one written in between is looked for on the next round.
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM webhook_deliveries
                 WHERE endpoint_id IS NOT NULL AND delivered_at IS NULL AND failed_at IS NULL",
            )
            .fetch_one(&s.db)
            .await
            .unwrap_or(-1);
            events = sqlx::query_as("SELECT id, account_id, type FROM events ORDER BY seq")
                .fetch_all(&s.db)
                .await
                .unwrap_or_default();
            let received = received(&self.inbox.deliveries.lock().unwrap(), Endpoint::Sender);
            let missing = events
                .iter()
                .filter(|(id, account, _)| *account == sender && !received.contains(id))
                .count();
            if pending == 0 && missing == 0 {
                break;
            }
            if waiting.elapsed() > DRAIN {
                s.timeline.log(format!(
                    "  merchant deliveries: {pending} pending, {missing} event(s) not received \
                     after {DRAIN:?}"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // A copy: the receiver keeps taking deliveries (late redeliveries) while this looks.
        let deliveries = self.inbox.deliveries.lock().unwrap().clone();
        let event_account: HashMap<&str, &str> = events
            .iter()
            .map(|(id, account, _)| (id.as_str(), account.as_str()))
            .collect();
        let object_account = objects_accounts(s).await;

        let received = received(&deliveries, Endpoint::Sender);
        for (id, account, kind) in &events {
            if *account == sender && !received.contains(id) {
                violation(
                    "event not delivered",
                    format!(
                        "{kind} {id} of the sending account never reached its endpoint ({})",
                        delivery_state(s, id).await
                    ),
                );
            }
        }
        for delivery in deliveries.iter() {
            let (object_kind, object) = delivery.object();
            let about = format!(
                "{} {} about {object_kind} {object}",
                delivery.kind(),
                delivery.id()
            );
            if let Some(why) = &delivery.unsigned {
                violation(
                    "bad signature",
                    format!(
                        "{about} at the {} account's endpoint: {why}",
                        delivery.endpoint.path()
                    ),
                );
            }
            if delivery.event["id"].as_str() != Some(delivery.id()) {
                violation(
                    "event mislabeled",
                    format!("{about}: the body's id is {}", delivery.event["id"]),
                );
            }
            let owner = event_account.get(delivery.id()).copied();
            let object_owner = object_account.get(object).map(String::as_str);
            match delivery.endpoint {
                Endpoint::Silent => violation(
                    "event leaked to another account",
                    format!(
                        "{about}, an event of {}, reached the silent account's endpoint",
                        owner.unwrap_or("no account (no such event)")
                    ),
                ),
                Endpoint::Sender if owner != Some(sender.as_str()) => violation(
                    "event leaked to another account",
                    format!(
                        "{about}, an event of {}, reached the sending account's endpoint",
                        owner.unwrap_or("no account (no such event)")
                    ),
                ),
                Endpoint::Sender if object_owner != Some(sender.as_str()) => violation(
                    "event leaked to another account",
                    format!(
                        "{about} reached the sending account's endpoint: the {object_kind} is \
                         {}",
                        object_owner
                            .map_or("no account's".to_owned(), |owner| format!("{owner}'s"))
                    ),
                ),
                Endpoint::Sender => {}
            }
        }
        let delivered = events
            .iter()
            .filter(|(id, account, _)| *account == sender && received.contains(id))
            .count();
        s.coverage.add(
            Seen::MerchantEvents,
            u32::try_from(delivered).unwrap_or(u32::MAX),
        );
        s.timeline.log(format!(
            "merchant endpoints: {delivered} of {} event(s) of the sending account received in {} \
             deliveries, {} delivery(ies) at the silent account's, after {:.1?} of waiting",
            events
                .iter()
                .filter(|(_, account, _)| *account == sender)
                .count(),
            deliveries
                .iter()
                .filter(|delivery| delivery.endpoint == Endpoint::Sender)
                .count(),
            deliveries
                .iter()
                .filter(|delivery| delivery.endpoint == Endpoint::Silent)
                .count(),
            waiting.elapsed()
        ));
        broken
    }
}

/// The event ids received at `endpoint`, each once however often it came.
fn received(deliveries: &[Delivery], endpoint: Endpoint) -> HashSet<String> {
    deliveries
        .iter()
        .filter(|delivery| delivery.endpoint == endpoint)
        .map(|delivery| delivery.id().to_owned())
        .collect()
}

/// Every payment, refund and dispute's account, by the object's id: whose object an event names.
async fn objects_accounts(s: &Schedule) -> HashMap<String, String> {
    let mut owners = HashMap::new();
    for query in [
        "SELECT id, account_id FROM payments",
        "SELECT id, account_id FROM refunds",
        "SELECT id, account_id FROM disputes",
    ] {
        let rows: Vec<(String, String)> = sqlx::query_as(query)
            .fetch_all(&s.db)
            .await
            .unwrap_or_default();
        owners.extend(rows);
    }
    owners
}

/// One delivery row of the outbox, as [`delivery_state`] reads it.
#[derive(sqlx::FromRow)]
struct DeliveryRow {
    endpoint_id: Option<String>,
    delivered: bool,
    failed: bool,
    attempts: i32,
    last_error: Option<String>,
}

/// What the outbox holds of an event's deliveries, for the violation that says it never arrived.
async fn delivery_state(s: &Schedule, event: &str) -> String {
    let rows: Vec<DeliveryRow> = sqlx::query_as(
        "SELECT endpoint_id, delivered_at IS NOT NULL AS delivered,
                failed_at IS NOT NULL AS failed, attempts, last_error
         FROM webhook_deliveries WHERE event_id = $1 AND endpoint_id IS NOT NULL",
    )
    .bind(event)
    .fetch_all(&s.db)
    .await
    .unwrap_or_default();
    if rows.is_empty() {
        return "no delivery queued for it".to_owned();
    }
    rows.iter()
        .map(|row| {
            let state = match (row.delivered, row.failed) {
                (true, _) => "marked delivered",
                (_, true) => "given up",
                _ => "pending",
            };
            let error = row
                .last_error
                .as_deref()
                .map_or(String::new(), |error| format!(", last error: {error}"));
            format!(
                "{}: {state} after {} attempt(s){error}",
                row.endpoint_id.as_deref().unwrap_or("?"),
                row.attempts
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A delivery to `/merchants/{endpoint}`: kept with its signature's verdict, and acknowledged
/// whatever it holds (a refusal would only have it sent again).
async fn receive(
    State(inbox): State<Arc<Inbox>>,
    Path(endpoint): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let endpoint = match endpoint.as_str() {
        "sender" => Endpoint::Sender,
        "silent" => Endpoint::Silent,
        _ => return StatusCode::NOT_FOUND,
    };
    let unsigned = match inbox.secrets.lock().unwrap().get(&endpoint) {
        Some(secrets) => secrets
            .verify(&headers, &body)
            .err()
            .map(|rejection| rejection.to_string()),
        None => Some("no secret registered for this endpoint".to_owned()),
    };
    let event = serde_json::from_slice(&body).unwrap_or(Value::Null);
    inbox.deliveries.lock().unwrap().push(Delivery {
        endpoint,
        headers,
        event,
        unsigned,
    });
    StatusCode::OK
}
