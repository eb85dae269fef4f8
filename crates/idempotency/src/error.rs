//! What the mechanism answers instead of a response. A service maps [`Error`] to its own problem
//! documents (the layer's [`on_error`](crate::IdempotencyLayer::on_error) hook; `From<Error>` for
//! the rejection of the [`Idempotent`](crate::Idempotent) extractor); one that has none answers
//! with [`Error`]'s own `IntoResponse`, a plain RFC 9457 `application/problem+json` document.

use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::body::BodyError;
use crate::key::KeyError;

/// Why the mechanism did not answer with the work's response.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is refused for a reason of its own: nothing was reserved, or the key's state
    /// answers it (409, 422). Never a fault of the service.
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// The database failed: a fault of the service, nothing is stored, and a retry with the same
    /// key is safe.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// Anything else that failed on the service's side (a task that panicked, a stored row that
    /// does not read): nothing is stored.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// A request the mechanism refuses, each with the status a client should see.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The `Idempotency-Key` header is missing, repeated or malformed (400).
    #[error("{0}")]
    InvalidKey(#[from] KeyError),
    /// The body came with a content type that is neither JSON nor a form (415), or with none.
    #[error("send the request body as JSON or as a form")]
    UnsupportedMediaType,
    /// The body is not the JSON (or form) the route takes (400), with the pointer of the field at
    /// fault.
    #[error("{0}")]
    InvalidBody(#[from] BodyError),
    /// The body could not be read: too large (413), stalled (408), or cut short (400), as axum
    /// reports it.
    #[error("{0}")]
    Unreadable(#[from] BytesRejection),
    /// Another request holds the key under a live lease (409); retry after `retry_after`.
    #[error("a request with this key is in progress")]
    InFlight { retry_after: Duration },
    /// The key was used with another payload (422): the pointers of the top-level members that
    /// differ, when the key's row has their digests.
    #[error("the key was used with another request")]
    Mismatch { fields: Option<Vec<String>> },
    /// The key's call to another system stayed unresolved past the recovery window: held for an
    /// operator (409).
    #[error("the key is held for an operator")]
    Held,
    /// The key is in a format this release does not read (a later release wrote it, see
    /// `formats.rs`): left alone, nothing done (503); retry after `retry_after`, when an instance
    /// that reads it may answer.
    #[error("the key is in a format this release does not read")]
    UnknownFormat { retry_after: Duration },
}

impl Refusal {
    /// The status a client should see.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidKey(_) | Self::InvalidBody(_) => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unreadable(rejection) => rejection.status(),
            Self::InFlight { .. } | Self::Held => StatusCode::CONFLICT,
            Self::UnknownFormat { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Mismatch { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// What the client should do, as a sentence for a problem document's `detail`.
    pub fn detail(&self) -> String {
        match self {
            Self::InvalidKey(error) => sentence(&error.to_string()),
            Self::UnsupportedMediaType => "Send the request body as JSON with Content-Type: \
                 application/json, or as a form with Content-Type: \
                 application/x-www-form-urlencoded (Stripe's bracket notation for nested fields)."
                .to_owned(),
            Self::InvalidBody(error) => error.detail(),
            Self::Unreadable(rejection) => sentence(&rejection.body_text()),
            Self::InFlight { .. } => IN_FLIGHT.to_owned(),
            Self::Mismatch { .. } => MISMATCH.to_owned(),
            Self::Held => HELD.to_owned(),
            Self::UnknownFormat { .. } => UNKNOWN_FORMAT.to_owned(),
        }
    }

    /// When a retry may succeed, rounded up to whole seconds by whoever writes the header.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::InFlight { retry_after } | Self::UnknownFormat { retry_after } => {
                Some(*retry_after)
            }
            _ => None,
        }
    }
}

const IN_FLIGHT: &str = "A request with this Idempotency-Key is still being processed. Retry \
    after the time given in Retry-After to receive its result.";

const MISMATCH: &str = "This Idempotency-Key was already used with a different request body. Use \
    a new key for a new request.";

const HELD: &str = "The call to another system made for this Idempotency-Key could not be settled \
    within the recovery window, so whether it took effect is not known, and it is held for an \
    operator to settle. Do not retry this intent under a new key: it may have taken effect. This \
    key answers the same until the operator settles it, then with its result.";

const UNKNOWN_FORMAT: &str = "This Idempotency-Key was last written by another release of the \
    service, in a format this instance does not read, so it was left as it is and nothing was \
    done. Retry after the time given in Retry-After, with the same key and body: an instance \
    that reads it answers.";

/// `text` as a sentence, whoever wrote it: the first letter upper case, a final stop unless it has
/// one; nothing stays nothing. Messages of parsers and libraries (axum's rejections, serde's
/// errors) arrive lower case and unterminated, and a client showing a problem's `detail` to a
/// person should not have to mend it: the mechanism's refusals are written so, and a service words
/// its own problems with the same function.
pub fn sentence(text: &str) -> String {
    let mut chars = text.trim().chars();
    let mut sentence: String = chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default();
    if !sentence.is_empty() && !sentence.ends_with(['.', '!', '?']) {
        sentence.push('.');
    }
    sentence
}

/// A plain problem document, for a service without a catalogue of its own: `type` is
/// `about:blank` and `title` the status's reason, as RFC 9457 has it. Faults of the service say
/// nothing of their cause.
impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, detail, retry_after) = match &self {
            Self::Refused(refusal) => (refusal.status(), refusal.detail(), refusal.retry_after()),
            Self::Database(_) | Self::Internal(_) => {
                tracing::error!(error = %self, "the idempotency mechanism failed");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "The request failed on our side; retry it with the same Idempotency-Key."
                        .to_owned(),
                    Some(Duration::from_secs(1)),
                )
            }
        };
        let body = serde_json::json!({
            "type": "about:blank",
            "title": status.canonical_reason().unwrap_or_default(),
            "status": status.as_u16(),
            "detail": detail,
        });
        let mut response = (status, body.to_string()).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(after) = retry_after {
            let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
        }
        response
    }
}

/// Whether a database error says the database cannot serve this request right now, as opposed to
/// a bad statement: the same request is worth retrying in a moment, with the same key. A service
/// answers such an error 503 with `Retry-After`.
pub fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(error) => error.code().is_some_and(|code| is_transient(&code)),
        _ => false,
    }
}

/// SQLSTATEs of a database that is going away, overloaded or busy, never of a wrong statement.
fn is_transient(sqlstate: &str) -> bool {
    sqlstate.starts_with("08") // connection exception
        || matches!(
            sqlstate,
            "57P01" // admin_shutdown: the server is stopping
            | "57P02" // crash_shutdown
            | "57P03" // cannot_connect_now: starting up or shutting down
            | "53300" // too_many_connections
            | "57014" // query_canceled: the statement timeout fired
            | "55P03" // lock_not_available: the lock timeout fired
            | "40001" // serialization_failure
            | "40P01" // deadlock_detected
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_is_made_a_sentence() {
        assert_eq!(sentence("failed to parse"), "Failed to parse.");
        assert_eq!(sentence(" Done. "), "Done.");
        assert_eq!(sentence("Why?"), "Why?");
        assert_eq!(sentence(" "), "", "nothing stays nothing");
    }

    #[test]
    fn a_refusal_is_a_sentence_with_the_status_a_client_expects() {
        let refusal = Refusal::from(KeyError::Missing);
        assert_eq!(refusal.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            refusal.detail(),
            "The Idempotency-Key header is required on this request."
        );
        let in_flight = Refusal::InFlight {
            retry_after: Duration::from_millis(1500),
        };
        assert_eq!(in_flight.status(), StatusCode::CONFLICT);
        assert_eq!(in_flight.retry_after(), Some(Duration::from_millis(1500)));
    }

    #[test]
    fn the_plain_document_rounds_retry_after_up_and_names_no_cause() {
        let response = Error::from(Refusal::InFlight {
            retry_after: Duration::from_millis(1500),
        })
        .into_response();
        assert_eq!(response.status(), StatusCode::CONFLICT);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        let fault = Error::from(anyhow::anyhow!("secret cause")).into_response();
        assert_eq!(fault.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn a_database_going_away_or_too_busy_is_unavailable_and_a_bad_statement_is_not() {
        for sqlstate in [
            "08006", "57P01", "57P03", "53300", "57014", "55P03", "40001", "40P01",
        ] {
            assert!(is_transient(sqlstate), "{sqlstate}");
        }
        for sqlstate in ["23505", "22003", "42P01", "23514"] {
            assert!(!is_transient(sqlstate), "{sqlstate}");
        }
        assert!(is_unavailable(&sqlx::Error::PoolTimedOut));
        assert!(!is_unavailable(&sqlx::Error::RowNotFound));
        // What the server said, read from its SQLSTATE.
        assert!(is_unavailable(&Sqlstate::error("57P01")));
        assert!(!is_unavailable(&Sqlstate::error("23505")));
    }

    #[test]
    fn retry_after_of_whole_seconds_is_not_rounded_up() {
        let response = Error::from(Refusal::InFlight {
            retry_after: Duration::from_secs(2),
        })
        .into_response();
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }

    /// An error of the database server with a SQLSTATE, as sqlx hands it over.
    #[derive(Debug)]
    struct Sqlstate(&'static str);

    impl Sqlstate {
        fn error(code: &'static str) -> sqlx::Error {
            sqlx::Error::Database(Box::new(Self(code)))
        }
    }

    impl std::fmt::Display for Sqlstate {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Sqlstate {}

    impl sqlx::error::DatabaseError for Sqlstate {
        fn message(&self) -> &str {
            self.0
        }

        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }
}
