//! The background job that deletes expired idempotency keys and processed webhook event ids, and
//! events and webhook deliveries (with their attempts) past their retention, so that no table
//! grows without end.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::db::KnownEngine;
use crate::webhooks;
use idempotency::Idempotency;
use service::outbox::retention::{self, Owner};

/// Rows per delete: small enough to keep each statement's locks short. The delete statements
/// carry it as a literal `LIMIT 1000`, the mechanism's batch of keys.
pub const BATCH: u64 = idempotency::EXPIRY_BATCH;

/// What one expiry job deletes, and how often.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expiry {
    pub interval: Duration,
    /// Expired idempotency keys and processed webhook ids: off for a processor whose process
    /// runs idempay's job on the same tables (one job per table, not two).
    pub keys: bool,
    /// Whose outbox, and for how long; `None` for a service that writes none.
    pub retention: Option<Retention>,
}

impl Expiry {
    /// Keys and processed webhook ids only, every `interval`.
    pub fn keys(interval: Duration) -> Self {
        Self {
            interval,
            keys: true,
            retention: None,
        }
    }
}

/// How long an outbox keeps what it no longer needs, counted from each row's creation (an event)
/// or its end (a delivery acknowledged or given up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retention {
    /// idempay's: the merchants' events and their deliveries to endpoints.
    Merchants {
        events: Duration,
        deliveries: Duration,
    },
    /// The processor's own deliveries.
    Processor { deliveries: Duration },
}

/// Every `interval` until `shutdown` is cancelled, drains what has expired in bounded batches.
/// Safe to run on every instance at once: batches skip rows another instance has locked.
pub fn spawn(pool: PgPool, expiry: Expiry, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let engine = KnownEngine::default();
        let mut ticks = tokio::time::interval(expiry.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let started = Instant::now();
            let engine = match engine.get(&pool).await {
                Ok(engine) => engine,
                Err(error) => {
                    tracing::warn!(%error, "expiry failed; it runs again next interval");
                    continue;
                }
            };
            let (mut keys, mut processed) = (0, 0);
            if expiry.keys {
                keys = drain(&shutdown, || Idempotency::expire_batch(&pool, engine)).await;
                processed = drain(&shutdown, || webhooks::expire_batch(&pool)).await;
            }
            // Deliveries first: an event whose last delivery goes now can go in the same run.
            let (owner, deliveries, events) = match expiry.retention {
                None => (None, None, None),
                Some(Retention::Merchants { events, deliveries }) => {
                    (Some(Owner::Endpoints), Some(deliveries), Some(events))
                }
                Some(Retention::Processor { deliveries }) => {
                    (Some(Owner::Processor), Some(deliveries), None)
                }
            };
            let pruned_deliveries = match (owner, deliveries) {
                (Some(owner), Some(kept)) => {
                    drain(&shutdown, || {
                        retention::prune_deliveries(&pool, engine, owner, kept)
                    })
                    .await
                }
                _ => 0,
            };
            let pruned_events = match events {
                Some(kept) => {
                    drain(&shutdown, || {
                        webhooks::retention::prune_events(&pool, engine, kept)
                    })
                    .await
                }
                None => 0,
            };
            count_run(keys, processed, started.elapsed());
            count_retention(owner, pruned_deliveries, pruned_events);
            if keys + processed + pruned_deliveries + pruned_events > 0 {
                tracing::info!(
                    keys,
                    processed,
                    deliveries = pruned_deliveries,
                    events = pruned_events,
                    "expired rows deleted"
                );
            }
            // For the test of a job that dies: after a run that did something, so the instance
            // was ready first.
            if keys > 0 {
                service::failpoint::panic("expiry-job-panic");
            }
        }
        tracing::debug!("expiry job stopped");
    })
}

/// Runs `expire` batch after batch until one comes back short, a batch fails, or shutdown.
async fn drain<F, Fut>(shutdown: &CancellationToken, expire: F) -> u64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<u64, sqlx::Error>>,
{
    let mut deleted = 0;
    // Checked between batches too, so a long drain does not delay shutdown.
    while !shutdown.is_cancelled() {
        match expire().await {
            Ok(count) => {
                deleted += count;
                if count < BATCH {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "expiry failed; it runs again next interval");
                break;
            }
        }
    }
    deleted
}

const EXPIRY_DELETED: &str = "idempay_expiry_deleted_rows_total";
const EXPIRY_DURATION: &str = "idempay_expiry_run_duration_seconds";

/// Describes the expiry job's series to the recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        EXPIRY_DELETED,
        "Expired rows deleted by the expiry job, by table."
    );
    metrics::describe_histogram!(
        EXPIRY_DURATION,
        metrics::Unit::Seconds,
        "Time of one run of the expiry job."
    );
}

/// Records one run of the expiry job.
fn count_run(keys: u64, events: u64, took: Duration) {
    metrics::counter!(EXPIRY_DELETED, "table" => "idempotency_keys").increment(keys);
    metrics::counter!(EXPIRY_DELETED, "table" => "processed_events").increment(events);
    metrics::histogram!(EXPIRY_DURATION).record(took.as_secs_f64());
}

/// Counts what one run of the expiry job deleted past its retention: the deliveries of `owner`
/// (their attempts go with them) and the merchants' events.
fn count_retention(owner: Option<Owner>, deliveries: u64, events: u64) {
    let table = match owner {
        Some(Owner::Endpoints) => "webhook_deliveries",
        Some(Owner::Processor) => "processor_webhook_deliveries",
        None => return,
    };
    metrics::counter!(EXPIRY_DELETED, "table" => table).increment(deliveries);
    if owner == Some(Owner::Endpoints) {
        metrics::counter!(EXPIRY_DELETED, "table" => "events").increment(events);
    }
}
