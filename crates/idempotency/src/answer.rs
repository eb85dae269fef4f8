//! How a request that the mechanism does not execute is answered: the stored response replayed,
//! or a refusal, each counted as its outcome.

use std::time::Duration;

use axum::response::Response;

use crate::instrumentation::Instrumentation;
use crate::metrics::KeyOutcome;
use crate::{Error, Refusal, StoredResponse};

/// The longest `Retry-After` a 409 suggests. A live request usually finishes within it, and a
/// dead one is taken over once its lease runs out, so a client retrying every second is answered
/// as soon as either happens, instead of waiting out a whole lease.
pub(crate) const IN_FLIGHT_RETRY_HINT: Duration = Duration::from_secs(1);

/// How a request that does not execute is answered.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The key completed: answer with the stored response.
    Replay(StoredResponse),
    /// Another request holds a live lease on the key.
    InFlight { retry_after: Duration },
    /// The key's call to another system stayed unresolved past the recovery window: it waits for
    /// an operator, and no request resumes it.
    Held,
    /// The key is in a format this release does not read (`formats.rs`): left alone for one
    /// that reads it.
    UnknownFormat,
    /// The key was used with a different payload: the pointers of the body's top-level members
    /// that differ, when the key's row has their digests (keys reserved before they were
    /// recorded have none, and the 422 then omits the list).
    Mismatch(Option<Vec<String>>),
}

impl Answer {
    /// The replay or the refusal, with its outcome counted.
    pub(crate) fn respond(
        self,
        instrumentation: Instrumentation,
        route: &str,
    ) -> Result<Response, Error> {
        match self {
            Answer::Replay(stored) => {
                instrumentation.record(KeyOutcome::Replayed, route);
                Ok(stored.replay())
            }
            Answer::InFlight { retry_after } => {
                instrumentation.record(KeyOutcome::ConflictInFlight, route);
                Err(Refusal::InFlight { retry_after }.into())
            }
            Answer::Mismatch(fields) => {
                instrumentation.record(KeyOutcome::Mismatch, route);
                Err(Refusal::Mismatch { fields }.into())
            }
            Answer::Held => {
                instrumentation.record(KeyOutcome::Held, route);
                Err(Refusal::Held.into())
            }
            Answer::UnknownFormat => {
                instrumentation.record(KeyOutcome::UnknownFormat, route);
                Err(Refusal::UnknownFormat {
                    retry_after: IN_FLIGHT_RETRY_HINT,
                }
                .into())
            }
        }
    }
}
