//! The one error type of the HTTP layer. Every failure a client can see is an RFC 9457
//! `application/problem+json` document with a stable `type` per kind of problem; internal causes
//! are logged with their chain and never echoed to the client.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The kinds of problem the API answers with. Each has a stable `type` URI, `/problems/{slug}`,
/// relative to the API's own address, and one HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProblemKind {
    InvalidRequest,
    InvalidIdempotencyKey,
    Unauthorized,
    CardDeclined,
    NotFound,
    MethodNotAllowed,
    IdempotencyKeyInUse,
    PayloadTooLarge,
    UnsupportedMediaType,
    IdempotencyKeyMismatch,
    Internal,
    ServiceUnavailable,
}

impl ProblemKind {
    /// Every kind, for documentation and tests.
    pub const ALL: [ProblemKind; 12] = [
        Self::InvalidRequest,
        Self::InvalidIdempotencyKey,
        Self::Unauthorized,
        Self::CardDeclined,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::IdempotencyKeyInUse,
        Self::PayloadTooLarge,
        Self::UnsupportedMediaType,
        Self::IdempotencyKeyMismatch,
        Self::Internal,
        Self::ServiceUnavailable,
    ];

    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest | Self::InvalidIdempotencyKey => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::CardDeclined => StatusCode::PAYMENT_REQUIRED,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::IdempotencyKeyInUse => StatusCode::CONFLICT,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::IdempotencyKeyMismatch => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The last segment of the `type` URI.
    pub fn slug(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid-request",
            Self::InvalidIdempotencyKey => "invalid-idempotency-key",
            Self::Unauthorized => "unauthorized",
            Self::CardDeclined => "card-declined",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::IdempotencyKeyInUse => "idempotency-key-in-use",
            Self::PayloadTooLarge => "payload-too-large",
            Self::UnsupportedMediaType => "unsupported-media-type",
            Self::IdempotencyKeyMismatch => "idempotency-key-mismatch",
            Self::Internal => "internal",
            Self::ServiceUnavailable => "service-unavailable",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Self::InvalidRequest => "The request is invalid",
            Self::InvalidIdempotencyKey => "The Idempotency-Key header is missing or invalid",
            Self::Unauthorized => "Authentication required",
            Self::CardDeclined => "The card was declined",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed => "Method not allowed",
            Self::IdempotencyKeyInUse => "A request with this Idempotency-Key is still in progress",
            Self::PayloadTooLarge => "The request body is too large",
            Self::UnsupportedMediaType => "The request body must be application/json",
            Self::IdempotencyKeyMismatch => {
                "The Idempotency-Key was already used with a different request"
            }
            Self::Internal => "Internal server error",
            Self::ServiceUnavailable => "Service temporarily unavailable",
        }
    }

    pub fn type_uri(self) -> String {
        format!("/problems/{}", self.slug())
    }
}

/// An RFC 9457 problem document, with optional extension members and `Retry-After`.
#[derive(Debug, Clone)]
pub struct Problem {
    kind: ProblemKind,
    detail: String,
    extensions: Map<String, Value>,
    retry_after: Option<Duration>,
}

#[derive(Serialize)]
struct ProblemBody<'a> {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'static str,
    status: u16,
    detail: &'a str,
    #[serde(flatten)]
    extensions: &'a Map<String, Value>,
}

impl Problem {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            extensions: Map::new(),
            retry_after: None,
        }
    }

    /// Adds an extension member, such as the `payment` a declined charge created.
    pub fn with(mut self, member: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(member.to_owned(), value.into());
        self
    }

    /// Tells the client when a retry may succeed, rounded up to whole seconds (at least one).
    pub fn retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The serialized document. It cannot fail: every member is a string, a number or JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let body = ProblemBody {
            type_uri: self.kind.type_uri(),
            title: self.kind.title(),
            status: self.kind.status().as_u16(),
            detail: &self.detail,
            extensions: &self.extensions,
        };
        serde_json::to_vec(&body).expect("a problem document always serializes")
    }

    /// Headers that belong with this problem, besides `Content-Type`.
    pub fn extra_headers(&self) -> Vec<(header::HeaderName, HeaderValue)> {
        let mut headers = Vec::new();
        if let Some(after) = self.retry_after {
            let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            headers.push((header::RETRY_AFTER, HeaderValue::from(seconds.max(1))));
        }
        if self.kind == ProblemKind::Unauthorized {
            headers.push((
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"idempay\""),
            ));
        }
        headers
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (
            self.status(),
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            self.to_json(),
        )
            .into_response();
        response.headers_mut().extend(self.extra_headers());
        response
    }
}

/// What a handler can fail with: a problem meant for the client, or a fault of ours that is
/// logged and answered with a generic 500 or 503.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{}", .0.detail)]
    Problem(Problem),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<Problem> for ApiError {
    fn from(problem: Problem) -> Self {
        Self::Problem(problem)
    }
}

impl ApiError {
    /// The problem a client sees. Faults are logged here, inside the request's span.
    pub fn into_problem(self) -> Problem {
        match self {
            Self::Problem(problem) => problem,
            Self::Database(error) if is_unavailable(&error) => {
                tracing::error!(error = %error, "database unavailable");
                Problem::new(
                    ProblemKind::ServiceUnavailable,
                    "The database is unreachable; retry with the same Idempotency-Key.",
                )
                .retry_after(Duration::from_secs(1))
            }
            Self::Database(error) => {
                tracing::error!(error = ?error, "database error");
                internal()
            }
            Self::Internal(error) => {
                tracing::error!(error = ?error, "internal error");
                internal()
            }
        }
    }
}

fn internal() -> Problem {
    Problem::new(
        ProblemKind::Internal,
        "The request failed on our side and nothing was recorded; retry with the same Idempotency-Key.",
    )
}

/// Errors that say the database cannot be reached right now, as opposed to a bad query.
fn is_unavailable(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)
    )
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.into_problem().into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_document_carries_type_title_status_detail_and_extensions() {
        let problem = Problem::new(ProblemKind::CardDeclined, "declined").with("payment", "pay_1");
        let body: Value = serde_json::from_slice(&problem.to_json()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "/problems/card-declined",
                "title": "The card was declined",
                "status": 402,
                "detail": "declined",
                "payment": "pay_1",
            })
        );
    }

    #[test]
    fn retry_after_is_rounded_up_to_whole_seconds() {
        let headers = Problem::new(ProblemKind::IdempotencyKeyInUse, "busy")
            .retry_after(Duration::from_millis(1200))
            .extra_headers();
        assert_eq!(
            headers,
            vec![(header::RETRY_AFTER, HeaderValue::from(2u64))]
        );
    }

    #[test]
    fn every_kind_has_a_distinct_slug() {
        let mut slugs: Vec<_> = ProblemKind::ALL.iter().map(|kind| kind.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), ProblemKind::ALL.len());
    }
}
