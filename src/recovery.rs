//! idempay's side of the recovery job, which resumes keys their request left at a recovery point:
//! a charge or a refund was requested at the processor, and then the request's instance died, or
//! its answer was lost and the client never came back. The job is the mechanism's
//! ([`idempotency::RecoveryJob`]: each such key taken over as a retry would, its work resumed with
//! the same downstream key, the result stored for the client's retry to replay; a key whose state
//! this build does not read left alone and reported); here it gets idempay's series' names, and
//! the gauges of the keys past their recovery point are read at each scrape.

use std::collections::BTreeSet;
use std::time::Duration;

use metrics::{describe_gauge, gauge};

use idempotency::{Idempotency, RecoveryJob};

/// The names of the recovery job's series (`idempay_recovery_runs_total`, …), which the alert
/// rules and their runbooks name.
const PREFIX: &str = "idempay_recovery";

/// idempay's recovery job: the mechanism's ([`RecoveryJob`]), run every `interval`, counted under
/// idempay's names and watched as idempay's other jobs are (`service::jobs`).
pub fn job(idempotency: &Idempotency, interval: Duration) -> RecoveryJob {
    idempotency
        .recovery_job(interval)
        .counted_as(PREFIX)
        .on_success(|| service::jobs::succeeded(crate::SERVICE, "recovery"))
}

/// Describes the recovery job's series to the recorder.
pub fn describe_metrics() {
    RecoveryJob::describe_metrics(PREFIX);
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
