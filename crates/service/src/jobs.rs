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
