//! What became of each keyed request, counted by outcome (`outcome="replayed"`…) in a counter
//! each instance of the mechanism names ([`Idempotency::counted_as`](crate::Idempotency::counted_as)),
//! and recorded as `key_outcome` on the request's span when it has that field.

use metrics::counter;

/// The route label of what the recovery job does (it serves no request).
pub const RECOVERY_ROUTE: &str = "recovery";

/// The counter an instance counts its outcomes in unless it names another.
pub const OUTCOMES: &str = "idempotency_outcomes_total";

/// What became of a request that carried an `Idempotency-Key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOutcome {
    /// The work ran under this request's lease (a fresh key, a recycled expired one) and
    /// completed: its result is stored.
    Executed,
    /// The work ran to completion after taking over a key whose holder stopped renewing its lease.
    TakenOver,
    /// The stored response was returned.
    Replayed,
    /// Another request holds the key: 409.
    ConflictInFlight,
    /// The key was used with another payload: 422.
    Mismatch,
    /// The work failed; the key was released for a retry.
    Released,
    /// The work failed after its recovery point (its call to another system may have taken
    /// effect): the key was kept for the next attempt to resume.
    Suspended,
    /// The recovery job took over a suspended key and completed its work.
    Recovered,
    /// The lease was lost before completion; the effect was rolled back.
    LeaseLost,
    /// A suspended key passed the recovery window and was held for an operator, or a request
    /// met a key so held (409).
    Held,
    /// An operator settled a held key from the other system's ledger (`Idempotency::settle`).
    Settled,
    /// A key in a format this release does not read (its fingerprint, stored response or
    /// recovery state, written by a later release) was left alone: a request met it (503), or
    /// the recovery job did, once per instance.
    UnknownFormat,
}

impl KeyOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Executed => "executed",
            Self::TakenOver => "takeover",
            Self::Replayed => "replayed",
            Self::ConflictInFlight => "conflict_in_flight",
            Self::Mismatch => "mismatch",
            Self::Released => "released",
            Self::Suspended => "suspended",
            Self::Recovered => "recovered",
            Self::LeaseLost => "lease_lost",
            Self::Held => "held",
            Self::Settled => "settled",
            Self::UnknownFormat => "unknown_format",
        }
    }

    /// Counts the outcome in `counter` by route (the route template, or `recovery` for the
    /// recovery job) and records it on the request's span. Called once per request, when it ends.
    pub(crate) fn record(self, series: &'static str, route: &str) {
        counter!(series, "route" => route.to_owned(), "outcome" => self.as_str()).increment(1);
        tracing::Span::current().record("key_outcome", self.as_str());
    }
}
