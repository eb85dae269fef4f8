//! The background job that deletes expired keys, so the table does not grow without end.

use std::time::Duration;

use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::Idempotency;

/// Rows per delete: small enough to keep each statement's locks short.
const BATCH: i64 = 1_000;

/// Runs [`Idempotency::expire_batch`] every `interval` until `shutdown` is cancelled, draining all
/// expired keys in bounded batches on each run. Safe to run on every instance at once.
pub fn spawn_expiry_job(
    pool: PgPool,
    interval: Duration,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let mut deleted = 0;
            loop {
                // Checked between batches too, so a long drain does not delay shutdown.
                if shutdown.is_cancelled() {
                    break;
                }
                match Idempotency::expire_batch(&pool, BATCH).await {
                    Ok(count) => {
                        deleted += count;
                        if count < BATCH.unsigned_abs() {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "expiry job failed; it runs again next interval");
                        break;
                    }
                }
            }
            if deleted > 0 {
                tracing::info!(deleted, "expired idempotency keys deleted");
            }
        }
        tracing::debug!("expiry job stopped");
    })
}
