//! The background job that deletes expired idempotency keys and processed webhook event ids, so
//! neither table grows without end.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::db::KnownEngine;
use crate::http::metrics;
use crate::idempotency::Idempotency;
use crate::webhooks;

/// Rows per delete: small enough to keep each statement's locks short. The delete statements
/// carry it as a literal `LIMIT 1000`.
pub const BATCH: u64 = 1_000;

/// Every `interval` until `shutdown` is cancelled, drains what has expired in bounded batches.
/// Safe to run on every instance at once: batches skip rows another instance has locked.
pub fn spawn(pool: PgPool, interval: Duration, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let engine = KnownEngine::default();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let started = Instant::now();
            let keys = match engine.get(&pool).await {
                Ok(engine) => drain(&shutdown, || Idempotency::expire_batch(&pool, engine)).await,
                Err(error) => {
                    tracing::warn!(%error, "expiry failed; it runs again next interval");
                    0
                }
            };
            let events = drain(&shutdown, || webhooks::expire_batch(&pool)).await;
            metrics::expiry_run(keys, events, started.elapsed());
            if keys + events > 0 {
                tracing::info!(keys, events, "expired rows deleted");
            }
            // For the test of a job that dies: after a run that did something, so the instance
            // was ready first.
            if keys > 0 {
                crate::failpoint::panic("expiry-job-panic");
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
