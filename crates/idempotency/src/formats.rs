//! The formats a key keeps across requests, and so across releases: its fingerprint
//! ([`FingerprintVersion`](crate::FingerprintVersion)), its stored response
//! ([`ResponseVersion`](crate::ResponseVersion)) and the state of its recovery point
//! ([`StateVersion`](crate::StateVersion)). Each records its version; a release reads the versions
//! it knows, and a key in a version it does not know (a later release wrote it, during a rolling
//! deploy or after a rollback) is left alone: never replayed as something else, refused as a
//! mismatch, resumed, released or resent; the request is answered 503 with `Retry-After`, and the
//! key reported (a warning with its id and the version, the outcome `unknown_format`).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::fingerprint::FingerprintVersion;
use crate::metrics::{KeyOutcome, RECOVERY_ROUTE};
use crate::{Idempotency, store};

/// A format of a key that this release does not read: which one, and the version the key says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnknownFormat {
    what: &'static str,
    version: String,
}

impl UnknownFormat {
    pub(crate) fn fingerprint(version: FingerprintVersion) -> Self {
        Self {
            what: "fingerprint",
            version: version.to_string(),
        }
    }

    /// A stored response's, `version` as its column holds it.
    pub(crate) fn response(version: i16) -> Self {
        Self {
            what: "stored response",
            version: version.to_string(),
        }
    }

    /// The state of the recovery point `point`, in `version` as the state writes it (its
    /// `version` member; `1` when it has none).
    pub(crate) fn recovery_state(point: &str, version: String) -> Self {
        Self {
            what: "recovery state",
            version: format!("{version} (point `{point}`)"),
        }
    }

    /// Logs the key left alone, with its id and the version.
    pub(crate) fn report(&self, key_id: i64) {
        tracing::warn!(
            key_id,
            format = self.what,
            version = self.version.as_str(),
            "a key in a format this release does not read is left alone for a release that reads it"
        );
    }
}

impl fmt::Display for UnknownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} version {}", self.what, self.version)
    }
}

/// The suspended keys the recovery job left alone for their state's version, as this instance
/// last reported them: each is logged once, not at every run.
#[derive(Clone, Default)]
pub(crate) struct Reported(Arc<Mutex<BTreeSet<i64>>>);

impl Idempotency {
    /// Reports the suspended keys that the recovery job leaves alone because no resumer of this
    /// release reads their recovery state (its version, or its point: a later release's): each
    /// logged as a warning (its id, its point, the version) and counted
    /// (`outcome="unknown_format"`) the first time this instance meets it, and returned. The
    /// recovery job calls it at every run; the end of a rolling deploy (an instance that reads
    /// them resumes them) ends them.
    pub async fn report_unknown_states(&self) -> Result<Vec<i64>, sqlx::Error> {
        let known = self.resumers.known_pairs();
        let waiting =
            store::unknown_states(&self.pool, &known, self.policy.recovery_window).await?;
        let mut reported = self
            .reported
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now: BTreeSet<i64> = waiting.iter().map(|key| key.id).collect();
        for key in &waiting {
            if !reported.contains(&key.id) {
                self.instrumentation
                    .record(KeyOutcome::UnknownFormat, RECOVERY_ROUTE);
                UnknownFormat::recovery_state(&key.recovery_point, key.version.clone())
                    .report(key.id);
            }
        }
        *reported = now;
        Ok(waiting.into_iter().map(|key| key.id).collect())
    }
}
