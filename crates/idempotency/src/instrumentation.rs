//! How an instance counts its outcomes and where its crash points lead (see
//! [`Idempotency::counted_as`](crate::Idempotency::counted_as) and
//! [`Idempotency::crash_points`](crate::Idempotency::crash_points)).

use crate::metrics::{self, KeyOutcome};

/// How an instance of the mechanism tells what it does: the counter its outcomes go to, and the
/// hook its crash points call, so that two instances in one process (a service and the service
/// it calls, in tests) are counted apart and crashed apart.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Instrumentation {
    pub(crate) outcomes: &'static str,
    pub(crate) crash_point: fn(&'static str),
}

impl Instrumentation {
    pub(crate) fn record(self, outcome: KeyOutcome, route: &str) {
        outcome.record(self.outcomes, route);
    }

    pub(crate) fn crash_point(self, point: &'static str) {
        (self.crash_point)(point);
    }
}

impl Default for Instrumentation {
    fn default() -> Self {
        Self {
            outcomes: metrics::OUTCOMES,
            crash_point: |_| {},
        }
    }
}
