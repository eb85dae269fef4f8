//! Clients streaming new payments at an instance while something happens to what is under it (the
//! database stopped or paused, a shard moved): each payment as its client saw it, for the test to
//! judge afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::support::helpers::{TestResponse, new_key, payment};
use crate::support::instance::Instance;

/// Payments per stream, at most: far more than any scenario's seconds take at its pace.
const MAX_SENDS: usize = 2_000;

/// One payment as its client saw it.
pub struct Sent {
    pub key: String,
    pub amount: i64,
    pub answer: TestResponse,
    /// When the client sent it, and when it had the whole answer.
    pub sent_at: Instant,
    pub answered_at: Instant,
}

impl Sent {
    /// How long its client waited for the answer.
    pub fn elapsed(&self) -> Duration {
        self.answered_at - self.sent_at
    }

    /// Whether it was in flight at some moment between `from` and `to`.
    pub fn overlaps(&self, from: Instant, to: Instant) -> bool {
        self.sent_at < to && self.answered_at > from
    }
}

/// `clients` clients, each sending a new payment at most once per `pace`, one at a time.
pub struct PaymentStream {
    stop: CancellationToken,
    sent: Arc<Mutex<Vec<Sent>>>,
    clients: Vec<JoinHandle<()>>,
}

impl PaymentStream {
    /// Starts the clients against `instance`, as the account of `api_key`.
    pub fn start(instance: &Arc<Instance>, api_key: &str, clients: usize, pace: Duration) -> Self {
        let stop = CancellationToken::new();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..clients)
            .map(|_| {
                tokio::spawn(send_payments(
                    Arc::clone(instance),
                    api_key.to_owned(),
                    Arc::clone(&sent),
                    stop.clone(),
                    pace,
                ))
            })
            .collect();
        Self {
            stop,
            sent,
            clients,
        }
    }

    /// How many payments have been answered so far.
    pub async fn answered(&self) -> usize {
        self.sent.lock().await.len()
    }

    /// Stops the clients once their payments in flight are answered; returns every payment sent.
    pub async fn stop(self) -> Vec<Sent> {
        self.stop.cancel();
        futures::future::join_all(self.clients).await;
        std::mem::take(&mut *self.sent.lock().await)
    }
}

async fn send_payments(
    instance: Arc<Instance>,
    api_key: String,
    sent: Arc<Mutex<Vec<Sent>>>,
    stop: CancellationToken,
    pace: Duration,
) {
    let mut pace = tokio::time::interval(pace);
    while !stop.is_cancelled() && sent.lock().await.len() < MAX_SENDS {
        pace.tick().await;
        let key = new_key();
        let amount = 100 + i64::try_from(sent.lock().await.len()).unwrap_or_default();
        let sent_at = Instant::now();
        let answer = instance
            .post_payment(&api_key, &key, &payment(amount))
            .await;
        sent.lock().await.push(Sent {
            key,
            amount,
            answer,
            sent_at,
            answered_at: Instant::now(),
        });
    }
}
