//! Outgoing webhooks, for any sender: an event is written to the `webhook_deliveries` outbox in the
//! transaction of the change it announces ([`enqueue`]), and a [`Deliverer`] loop sends it
//! afterwards, signed per Standard Webhooks, at least once, until the receiver answers 2xx.
//!
//! Several loops (instances) may run on one database: each claims due rows with `FOR UPDATE SKIP
//! LOCKED` and moves their next attempt past the delivery timeout in the same statement, so an
//! attempt is sent by one loop only, and a loop that dies mid-attempt leaves the row due again.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{WebhookSecret, WebhookSecrets};
use crate::ids;

/// How many deliveries one tick claims at most: a backlog drains in bounded bites, and the claim
/// lock is held for one short statement.
pub const BATCH: i64 = 50;

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

/// Puts an event in the outbox, in the caller's transaction: it is delivered if and only if that
/// transaction commits.
pub async fn enqueue(
    conn: &mut PgConnection,
    event_id: &str,
    url: &str,
    body: &[u8],
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO webhook_deliveries (event_id, url, body) VALUES ($1, $2, $3)",
        event_id,
        url,
        body,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// How failed attempts are spaced: `base`, then doubling, never more than `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    /// The wait after the `attempts`-th failed attempt (1 for the first).
    pub fn after(self, attempts: i32) -> Duration {
        let doublings = u32::try_from(attempts.saturating_sub(1))
            .unwrap_or(0)
            .min(31);
        self.base
            .checked_mul(1 << doublings)
            .unwrap_or(self.cap)
            .min(self.cap)
    }
}

/// One claimed attempt.
struct Due {
    id: i64,
    event_id: String,
    url: String,
    body: Vec<u8>,
    attempts: i32,
}

/// What became of an attempt.
enum Attempt {
    Acknowledged(u16),
    Failed { status: Option<u16>, error: String },
}

/// Sends due deliveries. Cheap to clone; clones share the HTTP client.
#[derive(Clone)]
pub struct Deliverer {
    pool: PgPool,
    client: reqwest::Client,
    /// The first of the secrets: receivers accept it, whichever others they also accept.
    signer: WebhookSecret,
    backoff: Backoff,
    timeout: Duration,
}

impl std::fmt::Debug for Deliverer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deliverer")
            .field("backoff", &self.backoff)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Deliverer {
    /// A deliverer that signs with the first of `secrets` and gives each attempt `timeout` to be
    /// answered 2xx.
    pub fn new(
        pool: PgPool,
        secrets: &WebhookSecrets,
        backoff: Backoff,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            pool,
            client: reqwest::Client::builder().timeout(timeout).build()?,
            signer: secrets.signing().clone(),
            backoff,
            timeout,
        })
    }

    /// Claims up to [`BATCH`] due deliveries, sends them at once and records each outcome.
    /// Returns how many were attempted.
    pub async fn deliver_due(&self) -> Result<usize, sqlx::Error> {
        let due = self.claim().await?;
        let attempted = due.len();
        let sends = due.into_iter().map(|due| async move {
            let attempt = self.send(&due).await;
            self.record(&due, attempt).await
        });
        for recorded in futures_util::future::join_all(sends).await {
            recorded?;
        }
        Ok(attempted)
    }

    /// Runs [`Deliverer::deliver_due`] every `interval` (at once again while a batch came back
    /// full) until `stop` is cancelled.
    pub fn spawn(self, interval: Duration, stop: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let full = match self.deliver_due().await {
                    Ok(attempted) => attempted == usize::try_from(BATCH).unwrap_or(usize::MAX),
                    Err(error) => {
                        tracing::warn!(%error, "could not deliver webhooks");
                        false
                    }
                };
                if full {
                    continue;
                }
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(interval) => {}
                }
            }
        })
    }

    /// Takes the due rows nobody else is taking, and makes them due again only after this
    /// attempt's timeout (twice over, for the time to record it): one statement, one short lock.
    async fn claim(&self) -> Result<Vec<Due>, sqlx::Error> {
        let in_flight_ms =
            i64::try_from(self.timeout.as_millis().saturating_mul(2)).unwrap_or(i64::MAX);
        sqlx::query_as!(
            Due,
            r#"
            UPDATE webhook_deliveries
            SET attempts = attempts + 1,
                next_attempt_at = now() + $1::bigint * interval '1 millisecond'
            WHERE id IN (
                SELECT id FROM webhook_deliveries
                WHERE delivered_at IS NULL AND next_attempt_at <= now()
                ORDER BY next_attempt_at
                LIMIT $2
                FOR UPDATE SKIP LOCKED
            )
            RETURNING id, event_id, url, body, attempts
            "#,
            in_flight_ms,
            BATCH,
        )
        .fetch_all(&self.pool)
        .await
    }

    async fn send(&self, due: &Due) -> Attempt {
        let timestamp = Utc::now().timestamp();
        let signature = match self.signer.sign(&due.event_id, timestamp, &due.body) {
            Ok(signature) => signature,
            Err(error) => {
                return Attempt::Failed {
                    status: None,
                    error: format!("cannot sign: {error}"),
                };
            }
        };
        let sent = self
            .client
            .post(&due.url)
            .header("content-type", "application/json")
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
            },
            Err(error) => Attempt::Failed {
                status: None,
                // The chain: "error sending request" alone says nothing of why.
                error: format!("{:#}", anyhow::Error::from(error)),
            },
        }
    }

    /// Records the attempt, unless the row was claimed again meanwhile (this attempt outlived its
    /// claim): `attempts` fences the update, as a lock token fences a key's completion.
    async fn record(&self, due: &Due, attempt: Attempt) -> Result<(), sqlx::Error> {
        match attempt {
            Attempt::Acknowledged(status) => {
                sqlx::query!(
                    r#"
                    UPDATE webhook_deliveries
                    SET delivered_at = now(), last_status = $3, last_error = NULL
                    WHERE id = $1 AND attempts = $2
                    "#,
                    due.id,
                    due.attempts,
                    i16::try_from(status).unwrap_or(i16::MAX),
                )
                .execute(&self.pool)
                .await?;
            }
            Attempt::Failed { status, error } => {
                let wait = self.backoff.after(due.attempts);
                tracing::info!(event = %due.event_id, url = %due.url, attempts = due.attempts, ?wait, %error, "webhook delivery failed; will retry");
                sqlx::query!(
                    r#"
                    UPDATE webhook_deliveries
                    SET next_attempt_at = now() + $3::bigint * interval '1 millisecond',
                        last_status = $4, last_error = $5
                    WHERE id = $1 AND attempts = $2
                    "#,
                    due.id,
                    due.attempts,
                    i64::try_from(wait.as_millis()).unwrap_or(i64::MAX),
                    status.map(|status| i16::try_from(status).unwrap_or(i16::MAX)),
                    error,
                )
                .execute(&self.pool)
                .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_its_base_up_to_its_cap() {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60 * 60),
        };
        let waits: Vec<u64> = (1..=4).map(|n| backoff.after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8]);
        assert_eq!(backoff.after(13), Duration::from_secs(3600));
        assert_eq!(backoff.after(i32::MAX), Duration::from_secs(3600));
    }

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
