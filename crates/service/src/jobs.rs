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

const UP: &str = "idempay_job_up";
const LAST_SUCCESS: &str = "idempay_job_last_success_timestamp_seconds";

/// Marks the end of a successful pass of `job` (its name as [`Jobs::watch`] has it): the time of
/// the last one is exported, so that a job alive but failing every pass is seen too.
pub fn succeeded(job: &'static str) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    metrics::gauge!(LAST_SUCCESS, "job" => job).set(now);
}

/// Describes the jobs' series to the recorder.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        UP,
        "1 while a background job runs, 0 once it died (the process must be restarted), by job."
    );
    metrics::describe_gauge!(
        LAST_SUCCESS,
        metrics::Unit::Seconds,
        "Unix time of the end of a background job's last successful pass, by job."
    );
}

/// The jobs of one process that died, shared by their watchers and the readiness probe.
#[derive(Clone, Debug, Default)]
pub struct Jobs(Arc<Mutex<Vec<Death>>>);

/// A job that died, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    /// The job's name, as logs and `/readyz` give it (`expiry`, `recovery`, …).
    pub job: &'static str,
    /// What ended it: a panic and its message, or an end before `stop`.
    pub cause: String,
}

impl Jobs {
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
        metrics::gauge!(UP, "job" => job).set(1.0);
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
                job,
                cause,
                "a background job died: the process must be restarted (idempay's /readyz answers 503 until then)"
            );
            metrics::gauge!(UP, "job" => job).set(0.0);
            jobs.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Death { job, cause });
        })
    }

    /// The first job that died, if one did.
    pub fn first_death(&self) -> Option<Death> {
        self.0
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

    #[tokio::test]
    async fn a_panic_or_an_early_end_is_a_death_and_an_end_after_stop_is_not() {
        let jobs = Jobs::default();
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

        let jobs = Jobs::default();
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
            jobs.0.lock().unwrap().len(),
            1,
            "an end after stop is no death"
        );
    }
}
