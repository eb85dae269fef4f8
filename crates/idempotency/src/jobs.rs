//! The mechanism's background work, which a service runs beside its routes: the expiry job, which
//! deletes expired keys, and the recovery job, which resumes the keys a request left at a recovery
//! point (a call downstream was sent, and then the request's instance died, or its answer was lost
//! and its client never came back). Both are safe to run on every instance at once: a batch skips
//! the rows another instance holds, and a key is taken over only from a holder whose lease ran
//! out. Each stops at `shutdown`, between batches.

use std::collections::BTreeSet;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::metrics::KeyOutcome;
use crate::{EXPIRY_BATCH, HOLD_BATCH, Idempotency, RECOVERY_BATCH};

impl Idempotency {
    /// Every `interval` until `shutdown`, deletes the expired keys, a batch
    /// ([`EXPIRY_BATCH`]) at a time until a batch comes back short. A failed batch is logged and
    /// tried again at the next interval. A service with other tables to expire runs
    /// [`Idempotency::expire_batch`] in its own job instead.
    pub fn spawn_expiry(&self, interval: Duration, shutdown: CancellationToken) -> JoinHandle<()> {
        let idempotency = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                while !shutdown.is_cancelled() {
                    let engine = match idempotency.engine().await {
                        Ok(engine) => engine,
                        Err(error) => {
                            tracing::warn!(%error, "expiring keys failed; tried again next interval");
                            break;
                        }
                    };
                    match Self::expire_batch(&idempotency.pool, engine).await {
                        Ok(deleted) if deleted < EXPIRY_BATCH => break,
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, "expiring keys failed; tried again next interval");
                            break;
                        }
                    }
                }
            }
        })
    }

    /// The recovery job of this instance of the mechanism, run every `interval`; start it with
    /// [`RecoveryJob::spawn`].
    pub fn recovery_job(&self, interval: Duration) -> RecoveryJob {
        RecoveryJob {
            idempotency: self.clone(),
            interval,
            names: Names::with_prefix(RecoveryJob::DEFAULT_PREFIX),
            succeeded: || {},
        }
    }
}

/// The recovery job: each run holds the keys past the recovery window for an operator, reports
/// those whose state this build does not read (left alone for a release that reads them), then
/// resumes the rest a batch ([`RECOVERY_BATCH`]) at a time, as a client's retry would.
///
/// It counts into four series, named `{prefix}_runs_total`, `{prefix}_keys_total` (by
/// `result`: completed, released, suspended, held, unknown_format),
/// `{prefix}_unresolved_keys` and `{prefix}_last_success_timestamp_seconds`; the prefix is
/// [`RecoveryJob::DEFAULT_PREFIX`] unless [`RecoveryJob::counted_as`] names another.
#[derive(Clone)]
pub struct RecoveryJob {
    idempotency: Idempotency,
    interval: Duration,
    names: Names,
    succeeded: fn(),
}

/// The recovery job's series.
#[derive(Clone)]
struct Names {
    runs: String,
    last_success: String,
    unresolved: String,
    keys: String,
}

impl Names {
    fn with_prefix(prefix: &str) -> Self {
        Self {
            runs: format!("{prefix}_runs_total"),
            last_success: format!("{prefix}_last_success_timestamp_seconds"),
            unresolved: format!("{prefix}_unresolved_keys"),
            keys: format!("{prefix}_keys_total"),
        }
    }
}

impl RecoveryJob {
    /// The prefix of the recovery job's series unless [`RecoveryJob::counted_as`] names another.
    pub const DEFAULT_PREFIX: &str = "idempotency_recovery";

    /// Names its series `{prefix}_…`, so that a service's dashboards and alerts keep its own.
    pub fn counted_as(mut self, prefix: &str) -> Self {
        self.names = Names::with_prefix(prefix);
        self
    }

    /// Calls `hook` at the end of each run in which nothing failed (a watch over the service's
    /// jobs, say).
    pub fn on_success(mut self, hook: fn()) -> Self {
        self.succeeded = hook;
        self
    }

    /// Describes the series of a recovery job counted as `prefix` (see
    /// [`RecoveryJob::counted_as`]) to the metrics recorder.
    pub fn describe_metrics(prefix: &str) {
        let names = &Names::with_prefix(prefix);
        describe_counter!(names.runs.clone(), "Runs of the recovery job.");
        describe_gauge!(
            names.last_success.clone(),
            metrics::Unit::Seconds,
            "Unix time of the end of the recovery job's last run in which nothing failed."
        );
        describe_gauge!(
            names.unresolved.clone(),
            "Keys the recovery job's last successful run left unresolved (still suspended, or in a \
             format this build does not read)."
        );
        describe_counter!(
            names.keys.clone(),
            "Keys the recovery job handled, by result (completed, released, suspended, held, \
             unknown_format)."
        );
    }

    /// Runs every interval until `shutdown`. The first run comes one interval after the start,
    /// like every later one: a key suspended moments ago is usually resumed by its client's retry
    /// first.
    pub fn spawn(self, shutdown: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let interval = self.interval;
            let mut ticks =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut left_alone = BTreeSet::new();
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                self.run(&shutdown, &mut left_alone).await;
            }
            tracing::debug!("recovery job stopped");
        })
    }

    /// One run. `left_alone` is what the run before reported as unreadable, so that a key is
    /// counted once, not at every run.
    async fn run(&self, shutdown: &CancellationToken, left_alone: &mut BTreeSet<i64>) {
        let idempotency = &self.idempotency;
        counter!(self.names.runs.clone()).increment(1);
        let mut failed = false;
        // Keys past the recovery window go to an operator first, so no batch resumes them.
        loop {
            match idempotency.hold_overdue().await {
                Ok(held) => {
                    self.count(KeyResult::Held, held);
                    if held < HOLD_BATCH {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "holding overdue keys failed; tried again next interval");
                    failed = true;
                    break;
                }
            }
        }
        // Keys whose state no unit of work of this build reads (a later release wrote them,
        // during a rolling deploy or after a rollback) are left alone, and reported.
        let mut unresolved = 0;
        match idempotency.report_unknown_states().await {
            Ok(waiting) => {
                let waiting: BTreeSet<i64> = waiting.into_iter().collect();
                self.count(
                    KeyResult::UnknownFormat,
                    waiting.difference(left_alone).count(),
                );
                unresolved += waiting.len();
                *left_alone = waiting;
            }
            Err(error) => {
                tracing::warn!(%error, "looking for keys left alone failed; tried again next interval");
                failed = true;
            }
        }
        // A full batch may mean more are waiting; a short one, or a failure, waits a tick.
        while !shutdown.is_cancelled() {
            match idempotency.recover(self.interval).await {
                Ok(results) => {
                    for result in &results {
                        if let Some(result) = KeyResult::of(result.outcome) {
                            self.count(result, 1);
                            if result == KeyResult::Suspended {
                                unresolved += 1;
                            }
                        }
                    }
                    if results.len() < RECOVERY_BATCH {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "recovery failed; it runs again next interval");
                    failed = true;
                    break;
                }
            }
        }
        if !failed && !shutdown.is_cancelled() {
            gauge!(self.names.unresolved.clone()).set(unresolved as f64);
            gauge!(self.names.last_success.clone()).set(unix_now());
            (self.succeeded)();
        }
    }

    fn count(&self, result: KeyResult, keys: usize) {
        if keys > 0 {
            counter!(self.names.keys.clone(), "result" => result.as_str()).increment(keys as u64);
        }
    }
}

/// What one run did with a key: the label `result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyResult {
    /// Its work completed: the result is stored for the client's retry.
    Completed,
    /// Its work failed before anything was asked downstream: the key was deleted.
    Released,
    /// Still unknown: tried again at a later run.
    Suspended,
    /// Past the recovery window: held for an operator.
    Held,
    /// Its state is in a format this build does not read: left alone.
    UnknownFormat,
}

impl KeyResult {
    fn of(outcome: KeyOutcome) -> Option<Self> {
        match outcome {
            KeyOutcome::Recovered => Some(Self::Completed),
            KeyOutcome::Released => Some(Self::Released),
            KeyOutcome::Suspended => Some(Self::Suspended),
            // Another holder took the key meanwhile: what becomes of it is counted there.
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Released => "released",
            Self::Suspended => "suspended",
            Self::Held => "held",
            Self::UnknownFormat => "unknown_format",
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    fn series(job: &RecoveryJob) -> [&str; 4] {
        let names = &job.names;
        [
            &names.runs,
            &names.keys,
            &names.unresolved,
            &names.last_success,
        ]
    }

    #[tokio::test]
    async fn the_recovery_job_counts_under_its_default_prefix_until_a_service_names_its_own() {
        // A pool that never connects: naming the series asks nothing of the database.
        let pool = sqlx::PgPool::connect_lazy("postgres://nobody@localhost/none").unwrap();
        let idempotency = Idempotency::new(pool, Policy::default());
        let job = idempotency.recovery_job(Duration::from_secs(1));
        assert_eq!(
            series(&job),
            [
                "idempotency_recovery_runs_total",
                "idempotency_recovery_keys_total",
                "idempotency_recovery_unresolved_keys",
                "idempotency_recovery_last_success_timestamp_seconds",
            ]
        );
        let job = job.counted_as("shop_recovery");
        assert_eq!(
            series(&job),
            [
                "shop_recovery_runs_total",
                "shop_recovery_keys_total",
                "shop_recovery_unresolved_keys",
                "shop_recovery_last_success_timestamp_seconds",
            ]
        );
    }
}
