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
use std::sync::{Arc, Mutex};

use crate::fingerprint::FingerprintVersion;

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
pub(crate) struct Reported(pub(crate) Arc<Mutex<BTreeSet<i64>>>);
