//! The mechanism's refusals as idempay's problem documents: the mechanism (the `idempotency`
//! crate) knows no catalogue, so idempay names each of its refusals here, once.

use idempotency::{BodyError, Refusal, StoredResponse};

use super::error::{ApiError, PROBLEM_JSON, Problem, ProblemKind};

/// A held key's detail in idempay's words: its one call to another system is the processor's.
const HELD: &str = "The call to the processor made for this Idempotency-Key could not be settled \
    within the recovery window, so whether it took effect is not known, and it is held for an \
    operator to settle. Do not retry this intent under a new key: it may have taken effect. This \
    key answers the same until the operator settles it, then with its result.";

impl From<idempotency::Error> for ApiError {
    fn from(error: idempotency::Error) -> Self {
        match error {
            idempotency::Error::Refused(refusal) => Self::Problem(refusal.into()),
            idempotency::Error::Database(error) => Self::Database(error),
            idempotency::Error::Internal(error) => Self::Internal(error),
        }
    }
}

impl From<Refusal> for Problem {
    fn from(refusal: Refusal) -> Self {
        let detail = refusal.detail();
        match refusal {
            Refusal::InvalidKey(_) => Problem::new(ProblemKind::InvalidIdempotencyKey, detail),
            Refusal::UnsupportedMediaType => {
                Problem::new(ProblemKind::UnsupportedMediaType, detail)
            }
            Refusal::InvalidBody(error) => error.into(),
            Refusal::Unreadable(rejection) => rejection.into(),
            Refusal::InFlight { retry_after } => {
                Problem::new(ProblemKind::IdempotencyKeyInUse, detail).retry_after(retry_after)
            }
            Refusal::Mismatch { fields } => {
                Problem::new(ProblemKind::IdempotencyKeyMismatch, detail).mismatched_fields(fields)
            }
            Refusal::Held => Problem::new(ProblemKind::IdempotencyKeyHeld, HELD),
            // Written by another release: this instance cannot answer it now, one that reads it can.
            Refusal::UnknownFormat { retry_after } => {
                Problem::new(ProblemKind::ServiceUnavailable, detail).retry_after(retry_after)
            }
        }
    }
}

impl From<BodyError> for Problem {
    fn from(error: BodyError) -> Self {
        let problem = Problem::new(ProblemKind::InvalidRequest, error.detail());
        match error.pointer() {
            Some(pointer) => problem.param(pointer),
            None => problem,
        }
    }
}

impl Problem {
    /// The problem as a result, not a fault (a declined card): stored with its key and replayed
    /// like any response, `Retry-After` included.
    pub fn stored(&self) -> StoredResponse {
        let mut stored = StoredResponse::raw(self.status(), self.to_json().into())
            .with_header(axum::http::header::CONTENT_TYPE, PROBLEM_JSON);
        for (name, value) in self.extra_headers() {
            if let Ok(value) = value.to_str() {
                stored = stored.with_header(name, value);
            }
        }
        stored
    }
}
