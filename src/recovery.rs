//! The background job that resumes keys their request left at a recovery point: a charge or a
//! refund was requested at the processor, and then the request's instance died, or its answer was
//! lost and the client never came back. Each such key is taken over (as a retry would), its work
//! resumed with the same downstream key, and the result recorded and stored for the client's
//! retry to replay. A key whose recovery state is in a version this build does not read is left
//! alone for a release that reads it, and reported.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use idempotency::Idempotency;

/// Every `interval` until `shutdown` is cancelled, resumes what is waiting, a batch at a time.
/// Safe to run on every instance at once: each key is claimed by one of them (`SKIP LOCKED` and a
/// conditional takeover), and a key whose holder is alive (renewing its lease) is left alone.
pub fn spawn(
    idempotency: Idempotency,
    interval: Duration,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        // The first run one interval after the start, like every later one: a key suspended
        // moments ago is usually resumed by its client's retry first.
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            // Keys past the recovery window go to an operator first, so no batch resumes them.
            loop {
                match idempotency.hold_overdue().await {
                    Ok(100..) => continue,
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "holding overdue keys failed; tried again next interval");
                        break;
                    }
                }
            }
            // Keys whose state no unit of work of this build reads (a later release wrote them,
            // during a rolling deploy or after a rollback) are left alone, and reported.
            if let Err(error) = idempotency.report_unknown_states().await {
                tracing::warn!(%error, "looking for keys left alone failed; tried again next interval");
            }
            // A full batch may mean more are waiting; a short one, or a failure, waits a tick.
            while !shutdown.is_cancelled() {
                match idempotency.recover_batch(interval).await {
                    Ok(claimed) if claimed > 0 => {
                        tracing::info!(claimed, "recovery job resumed keys");
                        if claimed < 20 {
                            break;
                        }
                    }
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "recovery failed; it runs again next interval");
                        break;
                    }
                }
            }
        }
        tracing::debug!("recovery job stopped");
    })
}
