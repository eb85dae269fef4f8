//! Event types this build does not know. During a deploy the processor may already send a type
//! only the new release applies; an old instance that acknowledged it (as `ignored`, as releases
//! before this one did) would spend its event id, and the effect would be lost for good. So the
//! intake refuses it with 503 and records nothing: the processor delivers it again on its retry
//! schedule (`5s,5m,30m,2h,5h,10h,10h` by default: over 27 hours of redeliveries, where a rolling
//! deploy takes minutes), until a delivery reaches an instance that knows the type.
//!
//! Every refusal is counted (`idempay_webhook_events_total{outcome="unknown_type"}`), without the
//! type as a label: the sender chooses it, and each would be a series of its own. The log names
//! the type, once per type per process, as a WARN: a redelivery every few seconds would
//! otherwise repeat it for as long as the deploy lasts.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use super::metrics;
use crate::http::error::{Problem, ProblemKind};

/// How many types one process remembers having logged; past that, each refusal of another type
/// is logged again (at DEBUG), so that a sender inventing types cannot grow the set without bound.
const REMEMBERED: usize = 100;

/// When the processor should deliver the event again: a rolling deploy replaces an instance in
/// about this long.
const RETRY_AFTER: Duration = Duration::from_secs(60);

static LOGGED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(|| Mutex::new(HashSet::new()));

/// The refusal of event `id` of type `kind`, which this build does not know; counted, and logged
/// if it is the first of its type.
pub(super) fn refuse(id: &str, kind: &str) -> Problem {
    metrics::webhook_event_unknown_type();
    if first_of(kind) {
        tracing::warn!(event = %id, kind, "webhook refused: an event type this release does not know; the processor delivers it again for a release that does (logged once per type)");
    } else {
        tracing::debug!(event = %id, kind, "webhook refused: an event type this release does not know");
    }
    Problem::new(
        ProblemKind::WebhookEventTypeUnknown,
        format!(
            "This release of idempay does not know the event type `{kind}`; nothing was applied \
             or recorded. Deliver it again: a release that knows the type applies it."
        ),
    )
    .retry_after(RETRY_AFTER)
}

/// Whether `kind` is met for the first time by this process (and there is room to remember it).
fn first_of(kind: &str) -> bool {
    let mut logged = LOGGED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if logged.contains(kind) || logged.len() >= REMEMBERED {
        return false;
    }
    logged.insert(kind.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_type_is_logged_once_and_the_remembered_types_are_bounded() {
        let kind = "test.first_of_a_kind";
        assert!(first_of(kind));
        assert!(!first_of(kind), "the second of a type");
        // Fill the set (other tests of this process may have added to it) and go past it.
        for n in 0..=REMEMBERED {
            first_of(&format!("test.filler.{n}"));
        }
        let logged = LOGGED.lock().unwrap().len();
        assert_eq!(logged, REMEMBERED);
        assert!(!first_of("test.one_too_many"), "past the bound");
    }

    #[test]
    fn the_refusal_is_a_503_that_says_when_to_deliver_again() {
        let problem = refuse("evt_1", "charge.invented");
        assert_eq!(problem.kind(), ProblemKind::WebhookEventTypeUnknown);
        assert_eq!(problem.status().as_u16(), 503);
        let headers = problem.extra_headers();
        assert!(
            headers
                .iter()
                .any(|(name, value)| name == "retry-after" && value == "60"),
            "{headers:?}"
        );
        let document = String::from_utf8(problem.to_json()).unwrap();
        assert!(document.contains("`charge.invented`"), "{document}");
    }
}
