//! The processor's problem documents (RFC 9457), from a catalogue of its own: it is another
//! company's API, and idempay reads its answers as any client would (`ProblemKind::from_type_uri`
//! in idempay's client). The slugs are those a Stripe-like acquirer answers with, and a refusal
//! idempay stores as a result (`refund-exceeds-payment`, `payment-not-refundable`) is told apart by
//! its `type` alone.

use std::num::NonZeroU64;
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idempotency::{BodyError, Refusal, StoredResponse};
use serde::Serialize;
use service::ids::NoSuch;
use service::pagination::{ListError, PageError};
use service::problem::PROBLEM_JSON;

service::problem_catalogue! {
    /// The kinds of problem the processor answers with; `type` is `/problems/{slug}`.
    pub enum ProblemKind {
        InvalidRequest {
            slug: "invalid-request",
            status: BAD_REQUEST,
            title: "The request is invalid",
        }
        InvalidIdempotencyKey {
            slug: "invalid-idempotency-key",
            status: BAD_REQUEST,
            title: "The Idempotency-Key header is missing or invalid",
        }
        Unauthorized {
            slug: "unauthorized",
            status: UNAUTHORIZED,
            title: "Authentication required",
        }
        CardDeclined {
            slug: "card-declined",
            status: PAYMENT_REQUIRED,
            title: "The card was declined",
        }
        NotFound {
            slug: "not-found",
            status: NOT_FOUND,
            title: "Not found",
        }
        RequestTimeout {
            slug: "request-timeout",
            status: REQUEST_TIMEOUT,
            title: "The request body stopped arriving",
        }
        IdempotencyKeyInUse {
            slug: "idempotency-key-in-use",
            status: CONFLICT,
            title: "A request with this Idempotency-Key is still in progress",
        }
        IdempotencyKeyHeld {
            slug: "idempotency-key-held",
            status: CONFLICT,
            title: "This Idempotency-Key's request is held for an operator",
        }
        PayloadTooLarge {
            slug: "payload-too-large",
            status: PAYLOAD_TOO_LARGE,
            title: "The request body is too large",
        }
        UnsupportedMediaType {
            slug: "unsupported-media-type",
            status: UNSUPPORTED_MEDIA_TYPE,
            title: "The request body must be JSON or a form",
        }
        IdempotencyKeyMismatch {
            slug: "idempotency-key-mismatch",
            status: UNPROCESSABLE_ENTITY,
            title: "The Idempotency-Key was already used with a different request",
        }
        PaymentNotRefundable {
            slug: "payment-not-refundable",
            status: BAD_REQUEST,
            title: "The charge cannot be refunded",
        }
        RefundExceedsPayment {
            slug: "refund-exceeds-payment",
            status: BAD_REQUEST,
            title: "The refund exceeds what remains refundable",
        }
        ChargeNotCapturable {
            slug: "charge-not-capturable",
            status: BAD_REQUEST,
            title: "The charge cannot be captured",
        }
        ChargeNotVoidable {
            slug: "charge-not-voidable",
            status: BAD_REQUEST,
            title: "The charge cannot be voided",
        }
        CallDeadlinePassed {
            slug: "call-deadline-passed",
            status: UNPROCESSABLE_ENTITY,
            title: "The call's deadline passed before it could act",
        }
        Internal {
            slug: "internal",
            status: INTERNAL_SERVER_ERROR,
            title: "Internal server error",
        }
        ServiceUnavailable {
            slug: "service-unavailable",
            status: SERVICE_UNAVAILABLE,
            title: "Service temporarily unavailable",
        }
    }
}

/// A problem document of the processor's: its kind, the occurrence's detail, and the members
/// only some kinds carry. Small, as every `Result` of a handler carries it.
#[derive(Debug, Clone)]
pub struct Problem {
    kind: ProblemKind,
    detail: String,
    extensions: Option<Box<Extensions>>,
    /// Whole seconds, already rounded up.
    retry_after: Option<NonZeroU64>,
}

/// The members some kinds add to the document.
#[derive(Debug, Clone, Default, Serialize)]
struct Extensions {
    /// The JSON pointer of the one request field at fault.
    #[serde(skip_serializing_if = "Option::is_none")]
    param: Option<String>,
    /// For `card-declined`: the charge recorded as declined, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    charge: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    decline_code: Option<String>,
    /// For `idempotency-key-mismatch`: the top-level members that differ, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    mismatched_fields: Option<Vec<String>>,
}

/// The document as it is sent: RFC 9457's members, `code` (the slug, as Stripe's), then the
/// extensions.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "type")]
    type_uri: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    code: &'static str,
    #[serde(flatten)]
    extensions: Option<&'a Extensions>,
}

impl Problem {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: idempotency::sentence(&detail.into()),
            extensions: None,
            retry_after: None,
        }
    }

    fn with(mut self, extend: impl FnOnce(&mut Extensions)) -> Self {
        extend(self.extensions.get_or_insert_with(Box::default));
        self
    }

    /// A charge declined: names the charge recorded as declined and why.
    pub fn charge_declined(charge: &str, decline_code: &str) -> Self {
        Self::new(
            ProblemKind::CardDeclined,
            format!("The card was declined ({decline_code}); charge `{charge}` records it."),
        )
        .with(|extensions| {
            extensions.charge = Some(charge.to_owned());
            extensions.decline_code = Some(decline_code.to_owned());
        })
    }

    /// A body that is not the JSON the route takes, naming the field at fault where one is.
    pub fn invalid_body<T: serde::de::DeserializeOwned>(
        bytes: &[u8],
        error: &serde_json::Error,
    ) -> Self {
        Self::from(BodyError::of::<T>(bytes, error))
    }

    /// When a retry may succeed, rounded up to whole seconds (at least one).
    pub fn retry_after(mut self, after: Duration) -> Self {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.retry_after = NonZeroU64::new(seconds.max(1));
        self
    }

    fn to_json(&self) -> Vec<u8> {
        let document = Document {
            type_uri: self.kind.type_uri(),
            title: self.kind.title(),
            status: self.kind.status().as_u16(),
            detail: &self.detail,
            code: self.kind.slug(),
            extensions: self.extensions.as_deref(),
        };
        serde_json::to_vec(&document).expect("a problem document always serializes")
    }

    /// The problem as a result, not a fault (a declined card, a refund refused): stored with its
    /// key and replayed like any response.
    pub fn stored(&self) -> StoredResponse {
        let mut stored = StoredResponse::raw(self.kind.status(), self.to_json().into())
            .with_header(header::CONTENT_TYPE, PROBLEM_JSON);
        if let Some(seconds) = self.retry_after {
            stored = stored.with_header(header::RETRY_AFTER, seconds.to_string());
        }
        stored
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut response = (
            self.kind.status(),
            [(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON))],
            self.to_json(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds.get()));
        }
        if self.kind == ProblemKind::Unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"processor\""),
            );
        }
        response
    }
}

impl From<Refusal> for Problem {
    fn from(refusal: Refusal) -> Self {
        let detail = refusal.detail();
        match refusal {
            Refusal::InvalidKey(_) => Self::new(ProblemKind::InvalidIdempotencyKey, detail),
            Refusal::UnsupportedMediaType => Self::new(ProblemKind::UnsupportedMediaType, detail),
            Refusal::InvalidBody(error) => error.into(),
            Refusal::Unreadable(rejection) => rejection.into(),
            Refusal::InFlight { retry_after } => {
                Self::new(ProblemKind::IdempotencyKeyInUse, detail).retry_after(retry_after)
            }
            Refusal::Mismatch { fields } => match fields {
                Some(fields) => Self::new(ProblemKind::IdempotencyKeyMismatch, detail)
                    .with(|extensions| extensions.mismatched_fields = Some(fields)),
                None => Self::new(ProblemKind::IdempotencyKeyMismatch, detail),
            },
            Refusal::Held => Self::new(ProblemKind::IdempotencyKeyHeld, detail),
            Refusal::UnknownFormat { retry_after } => {
                Self::new(ProblemKind::ServiceUnavailable, detail).retry_after(retry_after)
            }
        }
    }
}

impl From<BodyError> for Problem {
    fn from(error: BodyError) -> Self {
        let problem = Self::new(ProblemKind::InvalidRequest, error.detail());
        match error.pointer() {
            Some(pointer) => problem.with(|extensions| extensions.param = Some(pointer.to_owned())),
            None => problem,
        }
    }
}

impl From<BytesRejection> for Problem {
    fn from(rejection: BytesRejection) -> Self {
        let kind = match rejection.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ProblemKind::PayloadTooLarge,
            StatusCode::REQUEST_TIMEOUT => ProblemKind::RequestTimeout,
            _ => ProblemKind::InvalidRequest,
        };
        Self::new(kind, rejection.body_text())
    }
}

/// What a handler of the processor fails with: a problem for the client, or a fault of its own,
/// logged and answered 503 (the database is away: retry with the same key) or 500.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}", .0.detail)]
    Problem(Problem),
    #[error("database error")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<Problem> for Error {
    fn from(problem: Problem) -> Self {
        Self::Problem(problem)
    }
}

impl From<idempotency::Error> for Error {
    fn from(error: idempotency::Error) -> Self {
        match error {
            idempotency::Error::Refused(refusal) => Self::Problem(refusal.into()),
            idempotency::Error::Database(error) => Self::Database(error),
            idempotency::Error::Internal(error) => Self::Internal(error),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        match self {
            Self::Problem(problem) => problem.into_response(),
            Self::Database(error) if idempotency::is_unavailable(&error) => {
                tracing::error!(error = %error, "processor database unavailable");
                Problem::new(
                    ProblemKind::ServiceUnavailable,
                    "The processor's database is unreachable; retry with the same Idempotency-Key.",
                )
                .retry_after(Duration::from_secs(1))
                .into_response()
            }
            Self::Database(error) => {
                tracing::error!(error = ?error, "processor database error");
                internal().into_response()
            }
            Self::Internal(error) => {
                tracing::error!(error = ?error, "processor internal error");
                internal().into_response()
            }
        }
    }
}

/// A list request the processor cannot answer: an invalid query is 400, a cursor that names no
/// object of the list 404, each with the pagination's words as its detail.
impl From<PageError> for Problem {
    fn from(error: PageError) -> Self {
        let kind = match error {
            PageError::Invalid(_) => ProblemKind::InvalidRequest,
            PageError::UnknownCursor(_) => ProblemKind::NotFound,
        };
        Self::new(kind, error.to_string())
    }
}

/// A path that names no object of its kind, or none that exists: 404 `not-found`.
impl From<NoSuch> for Problem {
    fn from(no_such: NoSuch) -> Self {
        Problem::new(ProblemKind::NotFound, no_such.0)
    }
}

impl From<NoSuch> for Error {
    fn from(no_such: NoSuch) -> Self {
        Self::Problem(no_such.into())
    }
}

impl From<PageError> for Error {
    fn from(error: PageError) -> Self {
        Self::Problem(error.into())
    }
}

impl From<ListError> for Error {
    fn from(error: ListError) -> Self {
        match error {
            ListError::Page(error) => error.into(),
            ListError::Database(error) => error.into(),
        }
    }
}

/// The answer to a fault of the processor's: nothing was recorded.
pub fn internal() -> Problem {
    Problem::new(
        ProblemKind::Internal,
        "The request failed on the processor and nothing was recorded; retry it with the same \
         Idempotency-Key.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_own_type_and_is_found_by_it() {
        for kind in ProblemKind::ALL {
            assert_eq!(ProblemKind::from_type_uri(kind.type_uri()), Some(*kind));
        }
        assert_eq!(ProblemKind::from_type_uri("/problems/unheard-of"), None);
    }

    #[test]
    fn a_declined_charge_names_its_charge_and_reason() {
        let body: serde_json::Value =
            serde_json::from_slice(&Problem::charge_declined("ch_1", "generic_decline").to_json())
                .unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "type": "/problems/card-declined",
                "title": "The card was declined",
                "status": 402,
                "detail": "The card was declined (generic_decline); charge `ch_1` records it.",
                "code": "card-declined",
                "charge": "ch_1",
                "decline_code": "generic_decline",
            })
        );
    }
}
