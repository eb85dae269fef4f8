//! A caller's deadline on a keyed call: `Call-Deadline`, an RFC 3339 instant after which the call
//! must not act. idempay sends it with every call it makes under a downstream key: past it, its own
//! key may be held and an operator settle it from what this processor made under that key, and a
//! call of a stalled holder (a paused process) that arrives later must not make anything the settle
//! did not see. A check of its lease by the caller before it sends cannot promise that, since the
//! stall can fall between the check and the send; only the side that acts can, on its own clock.
//!
//! The check runs in the work, after the key's reservation and the injected latency, right before
//! the transaction that acts: while it runs, the key is in progress here, and a read of what was
//! made under it answers 409 (or fences a holder whose lease ran out), so no read sees "nothing"
//! and then a charge. A refused call stores nothing under its key: the work fails, and the
//! mechanism releases the key.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use chrono::{DateTime, SecondsFormat, Utc};

use crate::problem::{Problem, ProblemKind};

/// The header's name.
pub const CALL_DEADLINE: &str = "call-deadline";

/// The header's value for `deadline`: RFC 3339 in UTC, to the millisecond.
pub fn header_value(deadline: DateTime<Utc>) -> String {
    deadline.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The deadline a call carries, if it carries one (a caller without keys of its own to settle
/// sends none).
#[derive(Clone, Copy, Debug)]
pub struct CallDeadline(Option<DateTime<Utc>>);

impl CallDeadline {
    /// Refuses the call if its deadline passed on this processor's clock: a 422 that stores
    /// nothing under the key.
    pub(crate) fn check(self) -> Result<(), Problem> {
        self.check_at(Utc::now())
    }

    fn check_at(self, now: DateTime<Utc>) -> Result<(), Problem> {
        match self.0 {
            Some(deadline) if now >= deadline => Err(Problem::new(
                ProblemKind::CallDeadlinePassed,
                format!(
                    "The call's Call-Deadline ({}) passed before it could act (it is {} here): \
                     nothing was made, and nothing is stored under its Idempotency-Key.",
                    header_value(deadline),
                    header_value(now)
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for CallDeadline {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Problem> {
        let Some(value) = parts.headers.get(CALL_DEADLINE) else {
            return Ok(Self(None));
        };
        value
            .to_str()
            .ok()
            .and_then(|value| DateTime::parse_from_rfc3339(value).ok())
            .map(|deadline| Self(Some(deadline.with_timezone(&Utc))))
            .ok_or_else(|| {
                Problem::new(
                    ProblemKind::InvalidRequest,
                    "The Call-Deadline header must be an RFC 3339 instant, such as \
                     2026-12-07T12:00:00.000Z.",
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_refused_from_its_deadline_on_and_never_without_one() {
        let deadline = DateTime::parse_from_rfc3339("2026-12-07T12:00:00.000Z")
            .unwrap()
            .with_timezone(&Utc);
        let before = deadline - chrono::Duration::milliseconds(1);
        assert!(CallDeadline(Some(deadline)).check_at(before).is_ok());
        assert!(CallDeadline(Some(deadline)).check_at(deadline).is_err());
        assert!(CallDeadline(None).check_at(deadline).is_ok());
        assert_eq!(header_value(deadline), "2026-12-07T12:00:00.000Z");
    }
}
