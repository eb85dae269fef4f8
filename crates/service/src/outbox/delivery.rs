//! Outgoing webhooks, for any sender: an event is written to the `webhook_deliveries` outbox in the
//! transaction of the change it announces ([`enqueue`]), and a [`Deliverer`] loop sends it
//! afterwards, signed per Standard Webhooks, at least once, until the receiver answers 2xx.
//!
//! One implementation serves both senders ([`Sender`]): the processor's events and the events
//! delivered to merchant endpoints. Failed attempts are retried on a [`RetrySchedule`]; after its
//! last delay the delivery is given up (`failed_at`), and an endpoint that acknowledged nothing
//! for that whole time is disabled. Every attempt is recorded in `webhook_attempts`.
//!
//! A loop keeps up to [`BATCH`] sends in flight, at most [`PER_ENDPOINT`] to one endpoint, and claims
//! due rows fairly across endpoints as sends end ([`super::fair`]): an endpoint that never answers
//! holds its own sends until their timeout, not every merchant's.
//!
//! Several loops (instances) may run on one database: each claims due rows with `FOR UPDATE SKIP
//! LOCKED` and moves their next attempt past the delivery timeout in the same statement, so an
//! attempt is sent by one loop only, and a loop that dies mid-attempt leaves the row due again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

pub use super::fair::PER_ENDPOINT;
use super::fair::{self, Due, Endpoint, InFlight};
use super::schedule::{self, Retry, RetrySchedule};
use super::{WebhookSecret, WebhookSecrets, address};
use crate::ids;
use crate::name::ServiceName;
use idempotency::engine::{Engine, KnownEngine};

/// How many sends a deliverer keeps in flight at most, and claims at once: a backlog drains in
/// bounded bites, and the claim lock is held for one short statement.
pub const BATCH: i64 = 50;

/// The longest a loop sleeps between two looks for due rows.
const MAX_POLL: Duration = Duration::from_secs(1);

/// A new event id, `evt_…`: the `webhook-id` of every attempt to deliver it.
pub fn event_id() -> String {
    ids::generate("evt", 24)
}

/// The Standard Webhooks envelope, `{"type", "timestamp", "data"}`, serialized once: these bytes
/// are stored, signed and sent on every attempt.
pub fn envelope(
    kind: &str,
    timestamp: DateTime<Utc>,
    data: &impl Serialize,
) -> Result<Vec<u8>, serde_json::Error> {
    #[derive(Serialize)]
    struct Envelope<'a, T> {
        #[serde(rename = "type")]
        kind: &'a str,
        timestamp: String,
        data: &'a T,
    }
    serde_json::to_vec(&Envelope {
        kind,
        timestamp: timestamp.to_rfc3339_opts(SecondsFormat::Micros, true),
        data,
    })
}

/// Puts an event of `owner` (whose rows it sits with: an account, or the processor) in the outbox,
/// in the caller's transaction: it is delivered if and only if that transaction commits.
pub async fn enqueue(
    conn: &mut PgConnection,
    owner: &str,
    event_id: &str,
    url: &str,
    body: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO webhook_deliveries (account_id, event_id, url, body) VALUES ($1, $2, $3, $4)",
        owner,
        event_id,
        url,
        body,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Whose deliveries a [`Deliverer`] sends: the two senders share the outbox and this code, and
/// differ in their rows and their secret.
#[derive(Clone)]
pub enum Sender {
    /// The processor's own events (`endpoint_id` NULL), signed with its secret, to the URL its
    /// operator configured.
    Processor(WebhookSecret),
    /// Merchant endpoints' deliveries, each signed with its endpoint's secret, to a URL a merchant
    /// chose: only to public addresses unless `allow_private` (see [`super::address`]).
    Endpoints { allow_private: bool },
}

impl Sender {
    fn is_endpoints(&self) -> bool {
        matches!(self, Self::Endpoints { .. })
    }

    fn label(&self) -> &'static str {
        match self {
            Self::Processor(_) => "processor",
            Self::Endpoints { .. } => "endpoints",
        }
    }

    /// The name its loop runs under as a watched job (`crate::jobs`), the same in
    /// `{service}_job_up` and `{service}_job_last_success_timestamp_seconds`.
    fn job(&self) -> &'static str {
        match self {
            Self::Processor(_) => "processor-outbox",
            Self::Endpoints { .. } => "webhook-delivery",
        }
    }
}

/// What became of an attempt.
enum Attempt {
    Acknowledged(u16),
    Failed {
        status: Option<u16>,
        error: String,
        /// How long the receiver asked to be left alone (`Retry-After`), if it said.
        retry_after: Option<Duration>,
    },
}

/// What a delivery became after an attempt, as counted in `{service}_webhook_deliveries_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Answered 2xx: done.
    Delivered,
    /// Failed; tried again after the schedule's next delay, or sooner if the receiver asked.
    Retried,
    /// Failed after the schedule's last delay: given up.
    Failed,
}

impl DeliveryOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::Retried => "retried",
            Self::Failed => "failed",
        }
    }
}

/// Sends due deliveries. Cheap to clone; clones share the HTTP client.
#[derive(Clone)]
pub struct Deliverer {
    /// The service whose series it writes, and whose `User-Agent` its attempts carry.
    service: ServiceName,
    /// `service`'s `User-Agent`, made once.
    user_agent: String,
    pool: PgPool,
    /// The kind of database, asked at the first claim.
    engine: KnownEngine,
    client: reqwest::Client,
    sender: Sender,
    schedule: RetrySchedule,
    timeout: Duration,
    poll: Duration,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer")
            .field("service", &self.service.as_str())
            .field("sender", &self.sender.label())
            .field("schedule", &self.schedule)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Deliverer {
    /// A deliverer of `sender`'s rows, for `service` (its series and `User-Agent`), that gives
    /// each attempt `timeout` to be answered 2xx and retries on `schedule`. It follows no redirect: a 3xx is a failed attempt, as Stripe and
    /// Standard Webhooks treat it, and a redirect could lead to an address the URL check refused.
    /// It ignores proxy variables (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, which reqwest reads by
    /// default): through a proxy, the proxy resolves the endpoint's name and [`address::PublicOnly`]
    /// is never asked, so a name re-pointed at 127.0.0.1 or 169.254.169.254 after registration
    /// would be fetched, its answer readable at `/attempts`.
    pub fn new(
        service: ServiceName,
        pool: PgPool,
        sender: Sender,
        schedule: RetrySchedule,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let mut client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Sender::Endpoints {
            allow_private: false,
        } = sender
        {
            client = client.dns_resolver(std::sync::Arc::new(address::PublicOnly));
        }
        Ok(Self {
            service,
            user_agent: service.user_agent(),
            pool,
            engine: KnownEngine::default(),
            client: client.build()?,
            sender,
            poll: schedule.shortest().min(MAX_POLL),
            schedule,
            timeout,
        })
    }

    /// Looks for due rows every `poll` instead of as often as the shortest retry delay.
    #[must_use]
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The processor's deliverer, for `service`: its rows, signed with the first of `secrets`.
    pub fn processor(
        service: ServiceName,
        pool: PgPool,
        secrets: &WebhookSecrets,
        schedule: RetrySchedule,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        Self::new(
            service,
            pool,
            Sender::Processor(secrets.signing().clone()),
            schedule,
            timeout,
        )
    }

    /// How often the loop looks for due rows: unless told otherwise, as often as the shortest
    /// retry delay, and at least every second, so a new event waits at most that long.
    pub fn poll_interval(&self) -> Duration {
        self.poll
    }

    /// Claims up to [`BATCH`] due deliveries (at most [`PER_ENDPOINT`] of each endpoint), sends
    /// them at once and records each outcome. Returns how many were attempted. The loop
    /// ([`Deliverer::spawn`]) does not wait for a whole batch: it claims more as sends end.
    pub async fn deliver_due(&self) -> Result<usize, sqlx::Error> {
        let due = self.claim(BATCH, &InFlight::default()).await?;
        let attempted = due.len();
        let sends = due.into_iter().map(|due| self.deliver(due));
        for recorded in futures_util::future::join_all(sends).await {
            recorded?;
        }
        Ok(attempted)
    }

    /// Sends one claimed attempt and records its outcome.
    async fn deliver(&self, due: Due) -> Result<(), sqlx::Error> {
        let started = Instant::now();
        let attempt = self.send(&due).await;
        self.record(&due, attempt, started.elapsed()).await
    }

    /// Keeps up to [`BATCH`] sends in flight, at most [`PER_ENDPOINT`] to one endpoint, until
    /// `stop` is cancelled: it claims due rows as sends end, and every
    /// [`Deliverer::poll_interval`] while nothing ends, so a receiver that holds its requests
    /// until the timeout holds its own sends only. On `stop`, the sends in flight are let end.
    pub fn spawn(self, stop: CancellationToken) -> JoinHandle<()> {
        let this = Arc::new(self);
        tokio::spawn(async move { this.run(stop).await })
    }

    async fn run(self: Arc<Self>, stop: CancellationToken) {
        let sender = self.sender.label();
        super::metrics::started(self.service, sender);
        let mut sends: JoinSet<()> = JoinSet::new();
        let mut endpoints: HashMap<tokio::task::Id, Endpoint> = HashMap::new();
        let mut in_flight = InFlight::default();
        loop {
            let room = BATCH - i64::try_from(sends.len()).unwrap_or(BATCH);
            if room > 0 {
                match self.claim(room, &in_flight).await {
                    Ok(due) => {
                        // A pass succeeds when the claim does: sends that fail are the
                        // endpoints' trouble, counted per delivery, not the loop's.
                        crate::jobs::succeeded(self.service, self.sender.job());
                        for due in due {
                            let endpoint = due.endpoint();
                            in_flight.start(endpoint.clone());
                            let this = Arc::clone(&self);
                            let send = sends.spawn(async move {
                                if let Err(error) = this.deliver(due).await {
                                    tracing::warn!(%error, sender = this.sender.label(), "could not record a webhook delivery");
                                }
                            });
                            endpoints.insert(send.id(), endpoint);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, sender, "could not claim webhook deliveries");
                    }
                }
            }
            super::metrics::in_flight(self.service, sender, sends.len());
            tokio::select! {
                () = stop.cancelled() => break,
                Some(ended) = sends.join_next_with_id(), if !sends.is_empty() => {
                    ended_send(ended, &mut endpoints, &mut in_flight);
                    // Those that ended meanwhile too: one claim refills for all of them.
                    while let Some(ended) = sends.try_join_next_with_id() {
                        ended_send(ended, &mut endpoints, &mut in_flight);
                    }
                }
                () = tokio::time::sleep(self.poll) => {}
            }
        }
        while let Some(ended) = sends.join_next_with_id().await {
            ended_send(ended, &mut endpoints, &mut in_flight);
        }
        super::metrics::in_flight(self.service, sender, 0);
    }

    /// Takes up to `room` due rows of this sender that nobody else is taking, fairly across
    /// endpoints and none of an endpoint with [`PER_ENDPOINT`] sends `in_flight` (see
    /// [`super::fair`]), and makes them due again only after this attempt's timeout (twice over,
    /// for the time to record it).
    async fn claim(&self, room: i64, in_flight: &InFlight) -> Result<Vec<Due>, sqlx::Error> {
        let in_flight_ms =
            i64::try_from(self.timeout.as_millis().saturating_mul(2)).unwrap_or(i64::MAX);
        let of_endpoints = self.sender.is_endpoints();
        if self.engine.get(&self.pool).await? == Engine::Citus {
            return fair::claim_unlocked(&self.pool, of_endpoints, room, in_flight, in_flight_ms)
                .await;
        }
        fair::claim(&self.pool, of_endpoints, room, in_flight, in_flight_ms).await
    }

    async fn send(&self, due: &Due) -> Attempt {
        let failed = |error: String| Attempt::Failed {
            status: None,
            error,
            retry_after: None,
        };
        // The secrets to sign with, the current one first: two while a rolled endpoint's old
        // secret still signs, so a receiver holding either verifies the delivery.
        let signers = match (&self.sender, &due.secret) {
            (Sender::Processor(secret), _) => vec![secret.clone()],
            (Sender::Endpoints { allow_private }, Some(secret)) => {
                // The address of a URL that names one is checked here; a name is checked by the
                // client's resolver as it connects.
                if let Err(refused) = address::parse(&due.url, *allow_private) {
                    return failed(format!("not sent: {refused}"));
                }
                let secrets = std::iter::once(secret).chain(&due.previous_secret);
                match secrets
                    .map(|secret| WebhookSecret::parse(secret))
                    .collect::<Result<Vec<_>, _>>()
                {
                    Ok(secrets) => secrets,
                    Err(error) => return failed(format!("cannot sign: {error}")),
                }
            }
            (Sender::Endpoints { .. }, None) => {
                return failed("cannot sign: the endpoint has no secret".to_owned());
            }
        };
        let timestamp = Utc::now().timestamp();
        // Standard Webhooks: several `v1,` signatures in one header, separated by spaces.
        let signature = match signers
            .iter()
            .map(|signer| signer.sign(&due.event_id, timestamp, &due.body))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(signatures) => signatures.join(" "),
            Err(error) => return failed(format!("cannot sign: {error}")),
        };
        let sent = self
            .client
            .post(&due.url)
            .header("content-type", "application/json")
            .header("user-agent", &self.user_agent)
            .header("webhook-id", &due.event_id)
            .header("webhook-timestamp", timestamp)
            .header("webhook-signature", signature)
            .body(due.body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {
                Attempt::Acknowledged(response.status().as_u16())
            }
            Ok(response) => Attempt::Failed {
                status: Some(response.status().as_u16()),
                error: format!("answered {}", response.status()),
                retry_after: response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .and_then(|value| schedule::retry_after(value, SystemTime::now())),
            },
            // The chain: "error sending request" alone says nothing of why.
            Err(error) => failed(format!("{:#}", anyhow::Error::from(error))),
        }
    }

    /// Records the attempt in `webhook_attempts` (its primary key, the delivery and the attempt
    /// number, lets it be recorded once), and its outcome on the delivery unless the row was
    /// claimed again meanwhile (this attempt outlived its claim): `attempts` fences that update,
    /// as a lock token fences a key's completion.
    async fn record(
        &self,
        due: &Due,
        attempt: Attempt,
        latency: Duration,
    ) -> Result<(), sqlx::Error> {
        let latency_ms = i32::try_from(latency.as_millis()).unwrap_or(i32::MAX);
        let (status, error) = match &attempt {
            Attempt::Acknowledged(status) => (Some(*status), None),
            Attempt::Failed { status, error, .. } => (*status, Some(error.as_str())),
        };
        let status = status.map(|status| i16::try_from(status).unwrap_or(i16::MAX));
        // The schedule's step is counted in the attempts it made itself, not the early ones.
        let retry = match attempt {
            Attempt::Acknowledged(_) => None,
            Attempt::Failed { retry_after, .. } => Some(self.schedule.retry(
                due.attempts - due.early_attempts,
                due.step_due_at.is_some(),
                retry_after,
            )),
        };
        let outcome = match retry {
            None => DeliveryOutcome::Delivered,
            Some(Retry::GiveUp) => DeliveryOutcome::Failed,
            Some(_) => DeliveryOutcome::Retried,
        };
        let mut tx = idempotency::connections::begin(&self.pool).await?;
        sqlx::query!(
            r#"
            INSERT INTO webhook_attempts
                (account_id, delivery_id, attempt, status_code, latency_ms, error)
            SELECT account_id, id, $2, $3, $4, $5 FROM webhook_deliveries
            WHERE account_id = $6 AND id = $1
            ON CONFLICT (account_id, delivery_id, attempt) DO NOTHING
            "#,
            due.id,
            due.attempts,
            status,
            latency_ms,
            error,
            due.account_id,
        )
        .execute(&mut *tx)
        .await?;
        // One statement per outcome rather than a CASE on it: Citus evaluates `now()` on the
        // coordinator, and refuses it inside a CASE.
        let updated = match outcome {
            DeliveryOutcome::Delivered => {
                if let Some(endpoint) = &due.endpoint_id {
                    acknowledged_by(&mut tx, &due.account_id, endpoint).await?;
                }
                sqlx::query!(
                    r#"
                UPDATE webhook_deliveries
                SET delivered_at = now(), last_status = $3, last_error = $4
                WHERE account_id = $5 AND id = $1 AND attempts = $2
                "#,
                    due.id,
                    due.attempts,
                    status,
                    error,
                    due.account_id,
                )
                .execute(&mut *tx)
                .await?
            }
            DeliveryOutcome::Failed => {
                sqlx::query!(
                    r#"
                UPDATE webhook_deliveries
                SET failed_at = now(), last_status = $3, last_error = $4
                WHERE account_id = $5 AND id = $1 AND attempts = $2
                "#,
                    due.id,
                    due.attempts,
                    status,
                    error,
                    due.account_id,
                )
                .execute(&mut *tx)
                .await?
            }
            DeliveryOutcome::Retried => {
                // The wait from now; the step's (an early attempt's); whether the next attempt is
                // early. Back to a step: due when the step was set for (or now, if past).
                let (wait, step, early) = match retry {
                    Some(Retry::Step(wait)) => (wait, None, 0),
                    Some(Retry::Early { wait, step }) => (wait, Some(step), 1),
                    _ => (Duration::ZERO, None, 0),
                };
                let millis = |wait: Duration| i64::try_from(wait.as_millis()).unwrap_or(i64::MAX);
                sqlx::query!(
                    r#"
                UPDATE webhook_deliveries
                SET next_attempt_at = GREATEST(now() + $3::bigint * interval '1 millisecond',
                                               COALESCE(step_due_at, '-infinity')),
                    step_due_at = now() + $4::bigint * interval '1 millisecond',
                    early_attempts = early_attempts + $5,
                    last_status = $6, last_error = $7
                WHERE account_id = $8 AND id = $1 AND attempts = $2
                "#,
                    due.id,
                    due.attempts,
                    millis(wait),
                    step.map(millis),
                    early,
                    status,
                    error,
                    due.account_id,
                )
                .execute(&mut *tx)
                .await?
            }
        }
        .rows_affected();
        if updated == 0 {
            // Claimed again meanwhile: the later claim records the delivery's state.
            tx.commit().await?;
            return Ok(());
        }
        if let (DeliveryOutcome::Failed, Some(endpoint)) = (outcome, &due.endpoint_id) {
            disable_if_dead(&mut tx, &due.account_id, endpoint, due.created_at).await?;
        }
        tx.commit().await?;
        super::metrics::webhook_delivery(self.service, self.sender.label(), outcome.as_str());
        match outcome {
            DeliveryOutcome::Delivered => {}
            DeliveryOutcome::Retried => {
                tracing::info!(event = %due.event_id, url = %due.url, attempts = due.attempts, ?retry, ?error, "webhook delivery failed; will retry");
            }
            DeliveryOutcome::Failed => {
                tracing::warn!(event = %due.event_id, url = %due.url, attempts = due.attempts, ?error, "webhook delivery failed for the whole schedule; given up");
            }
        }
        Ok(())
    }
}

/// Counts a send as ended, whether it recorded its outcome or panicked.
fn ended_send(
    ended: Result<(tokio::task::Id, ()), tokio::task::JoinError>,
    endpoints: &mut HashMap<tokio::task::Id, Endpoint>,
    in_flight: &mut InFlight,
) {
    let id = match ended {
        Ok((id, ())) => id,
        Err(error) => {
            tracing::error!(%error, "a webhook send panicked");
            error.id()
        }
    };
    if let Some(endpoint) = endpoints.remove(&id) {
        in_flight.end(&endpoint);
    }
}

/// How stale an endpoint's `last_acknowledged_at` may be: it is written at most once per this
/// long, so an endpoint acknowledging a stream of deliveries writes its row once a minute, not at
/// each. The disable rule allows for it.
const ACKNOWLEDGED_WITHIN_SECONDS: f64 = 60.0;

/// Keeps the endpoint's last acknowledgment on its row, where retention does not prune it. Runs
/// before the delivery's own update: an acknowledgment then never holds a delivery while it waits
/// for the endpoint's row, which [`disable_if_dead`] holds while it gives up the endpoint's pending
/// deliveries, so the two never wait for each other in a circle. A row written within the last
/// minute is not written again (nor locked: the `WHERE` leaves it).
async fn acknowledged_by(
    conn: &mut PgConnection,
    account: &str,
    endpoint: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        UPDATE webhook_endpoints SET last_acknowledged_at = now()
        WHERE account_id = $2 AND id = $1
          AND (last_acknowledged_at IS NULL
               OR last_acknowledged_at < now() - $3::float8 * interval '1 second')
        "#,
        endpoint,
        account,
        ACKNOWLEDGED_WITHIN_SECONDS,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Disables an endpoint that acknowledged nothing since `since`, when its delivery created then
/// was given up: it failed for the whole retry schedule. A delivery created before the merchant
/// last enabled the endpoint again (`enabled_at`) does not count: its failure streak starts there. Its other pending deliveries are given
/// up with it (they would fail the same way), and it receives no new ones. What it acknowledged
/// is read from its row's `last_acknowledged_at` (kept within a minute, so an acknowledgment up to
/// a minute before `since` counts too, keeping the endpoint: the safe side) and from its
/// deliveries, for acknowledgments a release before that column recorded.
async fn disable_if_dead(
    conn: &mut PgConnection,
    account: &str,
    endpoint: &str,
    since: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let disabled = sqlx::query_scalar!(
        r#"
        UPDATE webhook_endpoints SET status = 'disabled'
        WHERE account_id = $3 AND id = $1 AND status = 'enabled'
          AND (enabled_at IS NULL OR enabled_at <= $2::timestamptz)
          AND (last_acknowledged_at IS NULL
               OR last_acknowledged_at < $2::timestamptz - $4::float8 * interval '1 second')
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries
              WHERE account_id = $3 AND endpoint_id = $1 AND delivered_at >= $2
          )
        RETURNING id
        "#,
        endpoint,
        since,
        account,
        ACKNOWLEDGED_WITHIN_SECONDS,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if disabled.is_some() {
        let given_up = sqlx::query!(
            r#"
            UPDATE webhook_deliveries SET failed_at = now()
            WHERE account_id = $2 AND endpoint_id = $1 AND delivered_at IS NULL
              AND failed_at IS NULL
            "#,
            endpoint,
            account,
        )
        .execute(&mut *conn)
        .await?
        .rows_affected();
        tracing::warn!(
            endpoint,
            given_up,
            "webhook endpoint disabled: it acknowledged nothing for the whole retry schedule"
        );
    }
    Ok(())
}

/// Reads the age of the oldest pending delivery into `service`'s gauge; its scrape calls it. A
/// scrape while the database is down still answers, with the last age it read.
pub fn read_oldest_pending(
    service: ServiceName,
    pool: &PgPool,
) -> futures_util::future::BoxFuture<'_, ()> {
    Box::pin(async move {
        match oldest_pending_age(pool).await {
            Ok(age) => super::metrics::oldest_pending(service, age),
            Err(error) => tracing::warn!(%error, "cannot read the oldest pending webhook delivery"),
        }
    })
}

/// The age of the oldest delivery not yet acknowledged nor given up, of either sender; zero when
/// there is none. Read at every scrape of `/metrics`.
pub async fn oldest_pending_age(pool: &PgPool) -> Result<Duration, sqlx::Error> {
    let seconds = sqlx::query_scalar!(
        r#"
        SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0) AS "seconds!"
        FROM webhook_deliveries
        WHERE delivered_at IS NULL AND failed_at IS NULL
        "#,
    )
    .fetch_one(pool)
    .await?;
    Ok(Duration::from_secs_f64(seconds.max(0.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_has_the_type_an_rfc3339_timestamp_and_the_data() {
        let at = DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let body = envelope(
            "charge.succeeded",
            at,
            &serde_json::json!({"charge": "ch_1"}),
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"{"type":"charge.succeeded","timestamp":"2026-11-30T10:00:00.000000Z","data":{"charge":"ch_1"}}"#
        );
    }

    #[test]
    fn a_signature_of_the_crate_verifies_with_the_intake() {
        let secret = WebhookSecret::generate();
        let signer = standardwebhooks::Webhook::new(&secret.expose()).unwrap();
        let now = Utc::now().timestamp();
        let body = br#"{"type":"charge.succeeded"}"#;
        let signature = signer.sign("evt_1", now, body).unwrap();
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("webhook-id", "evt_1".parse().unwrap());
        headers.insert("webhook-timestamp", now.into());
        headers.insert("webhook-signature", signature.parse().unwrap());
        let intake = WebhookSecrets::from(secret);
        assert_eq!(intake.verify(&headers, body), Ok("evt_1".to_owned()));
    }
}
