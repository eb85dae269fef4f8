//! The background jobs beside the API (expiry, recovery, webhook delivery, the API key listener,
//! the embedded processor and its own jobs), watched. A job that dies, by a panic or by an end
//! nobody asked for, would leave the instance serving while its keys no longer expire or its
//! suspended charges are no longer resumed: the death is logged as an error at once and takes
//! readiness (`/readyz`) down with it, so that an orchestrator sends the instance no more traffic
//! and an operator restarts it. A job is never restarted in place: whatever killed it would likely
//! kill it again, and a loop of panics hides the cause.

use std::any::Any;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::name::ServiceName;

/// The series' names after the service's prefix: `idempay_job_up`, `processor_job_up`.
const UP: &str = "job_up";
const LAST_SUCCESS: &str = "job_last_success_timestamp_seconds";

/// Marks the end of a successful pass of `service`'s `job` (its name as [`Jobs::watch`] has it):
/// the time of the last one is exported, so that a job alive but failing every pass is seen too.
pub fn succeeded(service: ServiceName, job: &'static str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    metrics::gauge!(service.metric(LAST_SUCCESS), "job" => job).set(now);
}

/// Describes `service`'s jobs' series to the recorder.
pub fn describe_metrics(service: ServiceName) {
    metrics::describe_gauge!(
        service.metric(UP),
        "1 while a background job runs, 0 once it died (the process must be restarted), by job."
    );
    metrics::describe_gauge!(
        service.metric(LAST_SUCCESS),
        metrics::Unit::Seconds,
        "Unix time of the end of a background job's last successful pass, by job."
    );
}

/// The jobs of one process that died, shared by their watchers and the readiness probe, and the
/// service whose series a watch writes (`{service}_job_up`).
#[derive(Clone, Debug)]
pub struct Jobs {
    deaths: Arc<Mutex<Vec<Death>>>,
    service: ServiceName,
}

/// A job that died, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    /// The job's name, as logs and `/readyz` give it (`expiry`, `recovery`, …).
    pub job: &'static str,
    /// What ended it: a panic and its message, or an end before `stop`.
    pub cause: String,
}

impl Jobs {
    /// No death yet; the jobs watched report as `service`'s.
    pub fn new(service: ServiceName) -> Self {
        Self {
            deaths: Arc::default(),
            service,
        }
    }

    /// The same deaths, the jobs watched through it reporting as `service`'s: how a service
    /// embedded in another's process has its jobs' deaths taken by that process's readiness and
    /// their series named as its own.
    #[must_use]
    pub fn reporting_as(&self, service: ServiceName) -> Self {
        Self {
            deaths: Arc::clone(&self.deaths),
            service,
        }
    }

    /// Watches the task `job` runs in until it ends: an end before `stop` is cancelled, or a
    /// panic at any time, is a death. Returns the watcher, to await at shutdown after `stop`.
    pub fn watch(
        &self,
        job: &'static str,
        task: JoinHandle<()>,
        stop: &CancellationToken,
    ) -> JoinHandle<()> {
        let jobs = self.clone();
        let stop = stop.clone();
        let up = self.service.metric(UP);
        metrics::gauge!(up.clone(), "job" => job).set(1.0);
        tokio::spawn(async move {
            let cause = match task.await {
                Ok(()) if stop.is_cancelled() => return,
                Ok(()) => "it ended while nothing asked it to stop".to_owned(),
                Err(error) if error.is_panic() => {
                    format!("it panicked: {}", panic_message(&*error.into_panic()))
                }
                Err(error) => format!("it was cancelled: {error}"),
            };
            tracing::error!(
                service = jobs.service.as_str(),
                job,
                cause,
                "a background job died: the process must be restarted (its /readyz, where it has one, answers 503 until then)"
            );
            metrics::gauge!(up, "job" => job).set(0.0);
            jobs.deaths
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Death { job, cause });
        })
    }

    /// The first job that died, if one did.
    pub fn first_death(&self) -> Option<Death> {
        self.deaths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .first()
            .cloned()
    }
}

/// The message a panic was raised with, when it is text (`panic!("…")` makes a `&str` or a
/// `String`).
fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TESTS: ServiceName = ServiceName::new("tests", "0");

    #[tokio::test]
    async fn a_panic_or_an_early_end_is_a_death_and_an_end_after_stop_is_not() {
        let jobs = Jobs::new(TESTS);
        let stop = CancellationToken::new();
        jobs.watch("ends", tokio::spawn(async {}), &stop)
            .await
            .unwrap();
        assert_eq!(
            jobs.first_death(),
            Some(Death {
                job: "ends",
                cause: "it ended while nothing asked it to stop".to_owned()
            })
        );

        let jobs = Jobs::new(TESTS);
        let stopped = stop.clone();
        let waits = jobs.watch(
            "waits",
            tokio::spawn(async move { stopped.cancelled().await }),
            &stop,
        );
        let panics = jobs.watch(
            "panics",
            tokio::spawn(async { panic!("interval of zero") }),
            &stop,
        );
        panics.await.unwrap();
        let death = jobs.first_death().expect("a death");
        assert_eq!(death.job, "panics");
        assert!(death.cause.contains("interval of zero"), "{}", death.cause);
        stop.cancel();
        waits.await.unwrap();
        assert_eq!(
            jobs.deaths.lock().unwrap().len(),
            1,
            "an end after stop is no death"
        );
    }
}
