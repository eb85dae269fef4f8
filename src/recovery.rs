//! The background job that resumes keys their request left at a recovery point: a charge or a
//! refund was requested at the processor, and then the request's instance died, or its answer was
//! lost and the client never came back. Each such key is taken over (as a retry would), its work
//! resumed with the same downstream key, and the result recorded and stored for the client's
//! retry to replay. A key whose recovery state is in a version this build does not read is left
//! alone for a release that reads it, and reported.

use std::collections::BTreeSet;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use idempotency::Idempotency;
use idempotency::metrics::KeyOutcome;

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
        let mut left_alone = BTreeSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            counter!(RUNS).increment(1);
            let mut failed = false;
            // Keys past the recovery window go to an operator first, so no batch resumes them.
            loop {
                match idempotency.hold_overdue().await {
                    Ok(held) => {
                        count(KeyResult::Held, held);
                        if held < idempotency::HOLD_BATCH {
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
                    count(
                        KeyResult::UnknownFormat,
                        waiting.difference(&left_alone).count(),
                    );
                    unresolved += waiting.len();
                    left_alone = waiting;
                }
                Err(error) => {
                    tracing::warn!(%error, "looking for keys left alone failed; tried again next interval");
                    failed = true;
                }
            }
            // A full batch may mean more are waiting; a short one, or a failure, waits a tick.
            while !shutdown.is_cancelled() {
                match idempotency.recover(interval).await {
                    Ok(results) => {
                        for result in &results {
                            if let Some(result) = KeyResult::of(result.outcome) {
                                count(result, 1);
                                if result == KeyResult::Suspended {
                                    unresolved += 1;
                                }
                            }
                        }
                        if results.len() < idempotency::RECOVERY_BATCH {
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
                gauge!(UNRESOLVED).set(unresolved as f64);
                gauge!(LAST_SUCCESS).set(unix_now());
                service::jobs::succeeded("recovery");
            }
        }
        tracing::debug!("recovery job stopped");
    })
}

const RUNS: &str = "idempay_recovery_runs_total";
const LAST_SUCCESS: &str = "idempay_recovery_last_success_timestamp_seconds";
const UNRESOLVED: &str = "idempay_recovery_unresolved_keys";
const KEYS: &str = "idempay_recovery_keys_total";

/// What one run did with a key: the label `result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyResult {
    /// Its work completed: the result is stored for the client's retry.
    Completed,
    /// Its work failed before anything was asked of the processor: the key was deleted.
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

fn count(result: KeyResult, keys: usize) {
    if keys > 0 {
        counter!(KEYS, "result" => result.as_str()).increment(keys as u64);
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// Describes the recovery job's series to the recorder.
pub fn describe_metrics() {
    describe_counter!(RUNS, "Runs of the recovery job.");
    describe_gauge!(
        LAST_SUCCESS,
        metrics::Unit::Seconds,
        "Unix time of the end of the recovery job's last run in which nothing failed."
    );
    describe_gauge!(
        UNRESOLVED,
        "Keys the recovery job's last successful run left unsettled (still suspended, or in a \
         format this build does not read)."
    );
    describe_counter!(
        KEYS,
        "Keys the recovery job handled, by result (completed, released, suspended, held, \
         unknown_format)."
    );
}

const KEYS_NOW: &str = "idempay_idempotency_keys";
const OLDEST_SUSPENDED: &str = "idempay_idempotency_oldest_suspended_seconds";

/// Reads the keys past their recovery point at a scrape (a [`crate::http::metrics::Reading`]):
/// by state, route and recovery point, and the oldest suspended one by route. A combination read
/// before that is gone now is written 0, so a resolved key drops to 0 instead of leaving its last
/// value behind.
pub fn read_keys(pool: &sqlx::PgPool) -> futures_util::future::BoxFuture<'_, ()> {
    static SEEN: std::sync::Mutex<BTreeSet<(String, String, String)>> =
        std::sync::Mutex::new(BTreeSet::new());
    static ROUTES: std::sync::Mutex<BTreeSet<String>> = std::sync::Mutex::new(BTreeSet::new());
    Box::pin(async move {
        let counts = match idempotency::gauges::key_counts(pool).await {
            Ok(counts) => counts,
            Err(error) => {
                tracing::warn!(%error, "cannot read the keys past their recovery point");
                return;
            }
        };
        let mut seen = SEEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut routes = ROUTES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut now = BTreeSet::new();
        let mut oldest = std::collections::BTreeMap::new();
        for count in counts {
            let labels = (count.state, count.route, count.recovery_point);
            gauge!(KEYS_NOW, "state" => labels.0.clone(), "route" => labels.1.clone(),
                "recovery_point" => labels.2.clone())
            .set(count.keys as f64);
            if labels.0 == "suspended" {
                let age: &mut f64 = oldest.entry(labels.1.clone()).or_default();
                *age = age.max(count.oldest_seconds);
            }
            now.insert(labels);
        }
        for (state, route, point) in seen.difference(&now) {
            gauge!(KEYS_NOW, "state" => state.clone(), "route" => route.clone(),
                "recovery_point" => point.clone())
            .set(0.0);
        }
        // A route with keys in any state has an oldest suspended age, 0 when none is suspended,
        // so that its series exists before its first suspension (and an alert sees it fall).
        routes.extend(now.iter().map(|(_, route, _)| route.clone()));
        for route in routes.iter() {
            if !oldest.contains_key(route) {
                gauge!(OLDEST_SUSPENDED, "route" => route.clone()).set(0.0);
            }
        }
        for (route, age) in oldest {
            gauge!(OLDEST_SUSPENDED, "route" => route.clone()).set(age);
            routes.insert(route);
        }
        seen.extend(now);
    })
}

/// Describes the keys' gauges to the recorder.
pub fn describe_key_gauges() {
    describe_gauge!(
        KEYS_NOW,
        "Keys past their recovery point now, read from the table at each scrape, by state \
         (in_progress: at the call downstream; suspended: outcome unknown, waiting for a retry or \
         the recovery job; held: waiting for an operator), route and recovery point."
    );
    describe_gauge!(
        OLDEST_SUSPENDED,
        metrics::Unit::Seconds,
        "Age (since creation) of the oldest suspended key, by route; 0 when none."
    );
}
