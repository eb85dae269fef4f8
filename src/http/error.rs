//! The one error type of the HTTP layer. Every failure a client can see is an RFC 9457
//! `application/problem+json` document with a stable `type` per kind of problem; internal causes
//! are logged with their chain and never echoed to the client.

mod catalogue;

use std::num::NonZeroU64;
use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idempotency::BodyError;
use serde::Serialize;
use utoipa::{IntoResponses, ToSchema};

/// The media type of every error body.
pub use service::problem::PROBLEM_JSON;

pub use catalogue::ProblemKind;

/// An RFC 9457 problem document: every error the API answers is one.
///
/// `type` identifies the kind of problem and resolves, relative to the API, to a page that
/// explains it. Some kinds carry extension members, such as the declined `payment`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({
    "type": "/problems/idempotency-key-mismatch",
    "title": "The Idempotency-Key was already used with a different request",
    "status": 422,
    "detail": "This Idempotency-Key was already used with a different request body. Use a new key for a new request."
}))]
pub struct Problem {
    /// The kind of problem: `/problems/{name}`, a page that explains it.
    #[serde(rename = "type")]
    type_uri: &'static str,
    /// A short summary of the kind of problem; the same for every occurrence.
    title: &'static str,
    /// The HTTP status code of the response.
    #[schema(minimum = 400, maximum = 599)]
    status: u16,
    /// What happened in this occurrence, in full sentences meant for a person.
    detail: String,
    /// The kind of problem for a program to branch on: the last segment of `type`
    /// (`idempotency-key-mismatch`), stable across releases, as `code` is in Stripe's errors.
    #[serde(rename = "code", serialize_with = "serialize_slug")]
    #[schema(value_type = String, example = "idempotency-key-mismatch")]
    kind: ProblemKind,
    /// When one field of the request is at fault: its JSON pointer (RFC 6901) in the request
    /// body (`/amount`, `/metadata/order_id`), as Stripe's `param` names it. Left out when the
    /// problem is not one field's.
    // Boxed, to keep the problem (carried by every `Result` of the HTTP layer) small.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "/amount")]
    param: Option<Box<Text>>,
    /// For `card-declined`: the payment that was recorded as declined.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    payment: Option<Box<Text>>,
    /// For `card-declined`: why the processor declined.
    #[serde(skip_serializing_if = "Option::is_none")]
    decline_code: Option<Box<str>>,
    /// For `idempotency-key-mismatch`: the JSON pointers (RFC 6901) of the request body's
    /// top-level members that differ from the request the key was first used with (one present
    /// in only one of them included), sorted. Never their values. Left out when the key predates
    /// this list, or when the bodies are equal and the request went to another resource under the
    /// same route (a refund of another payment).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<String>>, example = json!(["/amount"]))]
    mismatched_fields: Option<Box<FieldPointers>>,
    #[serde(skip)]
    /// Whole seconds, already rounded up: half the size of a `Duration`, which keeps the problem
    /// (carried by every `Result` of the HTTP layer) under clippy's large-error bound.
    retry_after: Option<NonZeroU64>,
}

/// The JSON pointers of a mismatch, boxed in the problem for the same reason as `param`.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
struct FieldPointers(Vec<String>);

/// A member's text, boxed in the problem to keep it small: one pointer wide.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
struct Text(String);

/// The problems any operation that needs an API key may answer, as the API description lists them.
#[derive(IntoResponses)]
pub enum AuthenticatedProblems {
    /// No valid API key (`unauthorized`).
    #[response(
        status = 401,
        content_type = "application/problem+json",
        headers(("WWW-Authenticate" = String, description = "`Bearer realm=\"idempay\"`"))
    )]
    Unauthorized(Problem),
    /// The account is over its rate limit (`rate-limited`). Nothing was done and the key, if the
    /// request carried one, was not used: retry after `Retry-After` seconds with the same key.
    #[response(
        status = 429,
        content_type = "application/problem+json",
        headers(("Retry-After" = i64, description = "Seconds to wait before retrying."))
    )]
    RateLimited(Problem),
    /// A fault of ours (`internal`). Nothing was recorded: retry, a POST with the same key.
    #[response(status = 500, content_type = "application/problem+json")]
    Internal(Problem),
    /// The database is unreachable or busy, or the request did not finish in time, or, during a
    /// deploy, the key was last written by another release in a format this instance does not
    /// read (`service-unavailable`). Retry, a POST with the same key: it receives the first attempt's
    /// result if that went through meanwhile. A payment or refund may also answer
    /// `processor-outcome-unknown` (the processor's answer did not arrive: the key is kept, and the
    /// retry records the one charge it made, if any) or `processor-unavailable` (the processor
    /// refused before acting: nothing was charged).
    #[response(
        status = 503,
        content_type = "application/problem+json",
        headers(("Retry-After" = i64, description = "Seconds to wait before retrying."))
    )]
    ServiceUnavailable(Problem),
}

/// The problems of the idempotency mechanism, answered by every operation that takes a key.
#[derive(IntoResponses)]
pub enum IdempotencyProblems {
    /// A request with this key is still being processed (`idempotency-key-in-use`). Retry after
    /// `Retry-After` seconds with the same key and body to receive its result. Or, without
    /// `Retry-After`, its call to the processor stayed unresolved past the recovery window and
    /// waits for an operator (`idempotency-key-held`): do not retry under a new key. Once the
    /// operator settled it, the key answers with the result, or, if the processor made nothing,
    /// with `processor-made-nothing`, final and replayed.
    #[response(
        status = 409,
        content_type = "application/problem+json",
        headers(("Retry-After" = i64, description = "Seconds to wait before retrying with the same key."))
    )]
    KeyInUse(Problem),
    /// The body stopped arriving before it was complete (`request-timeout`). Nothing was
    /// reserved: send the request again with the same key.
    #[response(status = 408, content_type = "application/problem+json")]
    RequestTimeout(Problem),
    /// The body is over {body_limit} (`payload-too-large`). Nothing was reserved.
    #[response(status = 413, content_type = "application/problem+json")]
    PayloadTooLarge(Problem),
    /// The body is neither `application/json` nor `application/x-www-form-urlencoded`
    /// (`unsupported-media-type`). Nothing was reserved.
    #[response(status = 415, content_type = "application/problem+json")]
    UnsupportedMediaType(Problem),
    /// The key was already used with a different request (`idempotency-key-mismatch`). Nothing
    /// was executed.
    #[response(status = 422, content_type = "application/problem+json")]
    KeyMismatch(Problem),
}

fn serialize_slug<S: serde::Serializer>(
    kind: &ProblemKind,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(kind.slug())
}

impl Problem {
    pub fn new(kind: ProblemKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            type_uri: kind.type_uri(),
            title: kind.title(),
            status: kind.status().as_u16(),
            detail: idempotency::sentence(&detail.into()),
            param: None,
            payment: None,
            decline_code: None,
            mismatched_fields: None,
            retry_after: None,
        }
    }

    /// A declined charge: names the payment recorded as declined and the processor's reason.
    pub fn card_declined(payment: &str, decline_code: &str) -> Self {
        Self {
            payment: Some(Box::new(Text(payment.to_owned()))),
            decline_code: Some(decline_code.into()),
            ..Self::new(
                ProblemKind::CardDeclined,
                format!("The card was declined ({decline_code})."),
            )
        }
    }

    /// A capture or cancel of `payment`, which is `status` and not `requires_capture`: `doing`
    /// says what was asked (`captured`, `canceled`).
    pub fn payment_unexpected_state(payment: &str, status: &str, doing: &str) -> Self {
        Self {
            payment: Some(Box::new(Text(payment.to_owned()))),
            ..Self::new(
                ProblemKind::PaymentUnexpectedState,
                format!(
                    "Payment `{payment}` is `{status}`: only a payment that `requires_capture` \
                     can be {doing}. Nothing was {doing}."
                ),
            )
        }
    }

    /// Names the one request field at fault, by its JSON pointer (`/amount`).
    pub fn param(mut self, pointer: impl Into<String>) -> Self {
        self.param = Some(Box::new(Text(pointer.into())));
        self
    }

    /// A request body that is not JSON, or not the JSON the operation takes: names the field at
    /// fault where one is (`param`), and says what is wrong with it in a sentence, without the
    /// parser's line and column, which mean nothing for a one-line body.
    ///
    /// `error` is the typed parse's error; the body is parsed again only now, tracking the path,
    /// so that a body that parses pays nothing for it.
    pub fn invalid_body<T: serde::de::DeserializeOwned>(
        bytes: &[u8],
        error: &serde_json::Error,
    ) -> Self {
        Self::from(BodyError::of::<T>(bytes, error))
    }

    /// Names the members of the body that differ from the key's first request, if known.
    pub fn mismatched_fields(mut self, fields: Option<Vec<String>>) -> Self {
        self.mismatched_fields = fields.map(|fields| Box::new(FieldPointers(fields)));
        self
    }

    /// Tells the client when a retry may succeed, rounded up to whole seconds (at least one).
    pub fn retry_after(mut self, after: Duration) -> Self {
        let seconds = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        self.retry_after = NonZeroU64::new(seconds.max(1));
        self
    }

    pub fn kind(&self) -> ProblemKind {
        self.kind
    }

    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The serialized document. It cannot fail: every member is a string or a number.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a problem document always serializes")
    }

    /// Headers that belong with this problem, besides `Content-Type`.
    pub fn extra_headers(&self) -> Vec<(header::HeaderName, HeaderValue)> {
        let mut headers = Vec::new();
        if let Some(seconds) = self.retry_after {
            headers.push((header::RETRY_AFTER, HeaderValue::from(seconds.get())));
        }
        if self.kind == ProblemKind::RequestTimeout {
            // The rest of the body may still arrive: the connection cannot carry another request.
            headers.push((header::CONNECTION, HeaderValue::from_static("close")));
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
            Self::Database(error) if idempotency::is_unavailable(&error) => {
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
        "The request failed on our side and nothing was recorded; it is safe to retry it as it \
         was (a POST with the same Idempotency-Key).",
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
    use serde_json::json;

    #[test]
    fn a_problem_document_carries_type_title_status_detail_and_extensions() {
        let problem = Problem::card_declined("pay_1", "generic_decline");
        let body: serde_json::Value = serde_json::from_slice(&problem.to_json()).unwrap();
        assert_eq!(
            body,
            json!({
                "type": "/problems/card-declined",
                "title": "The card was declined",
                "status": 402,
                "detail": "The card was declined (generic_decline).",
                "code": "card-declined",
                "payment": "pay_1",
                "decline_code": "generic_decline",
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
    fn a_plain_problem_has_no_extension_members() {
        let body: serde_json::Value =
            serde_json::from_slice(&Problem::new(ProblemKind::NotFound, "gone").to_json()).unwrap();
        assert_eq!(body.as_object().unwrap().len(), 5, "{body}");
        assert_eq!(body["code"], "not-found");
        assert_eq!(body["detail"], "Gone.", "a sentence, whoever wrote it");
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Order {
        amount: u32,
        #[serde(default)]
        lines: Vec<Line>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Line {
        sku: String,
    }

    fn refusal(body: &str) -> serde_json::Value {
        let error = serde_json::from_slice::<Order>(body.as_bytes()).unwrap_err();
        serde_json::from_slice(&Problem::invalid_body::<Order>(body.as_bytes(), &error).to_json())
            .unwrap()
    }

    #[test]
    fn a_body_refused_names_the_field_at_fault_in_a_sentence_without_parser_positions() {
        let cases = [
            (r#"{"amount": "x"}"#, Some("/amount")),
            (r#"{}"#, Some("/amount")),
            (r#"{"amount": 1, "colour": "red"}"#, Some("/colour")),
            (
                r#"{"amount": 1, "lines": [{"sku": "a"}, {"sku": 2}]}"#,
                Some("/lines/1/sku"),
            ),
            (r#"{"amount": 1,"#, None),
            (r#""an order""#, None),
        ];
        for (body, param) in cases {
            let problem = refusal(body);
            assert_eq!(problem["param"].as_str(), param, "{body}: {problem}");
            let detail = problem["detail"].as_str().unwrap();
            assert!(!detail.contains("line 1"), "{body}: {detail}");
            assert!(detail.starts_with("The "), "{body}: {detail}");
            assert!(detail.ends_with('.'), "{body}: {detail}");
            assert_eq!(problem["code"], "invalid-request");
        }
    }

    #[test]
    fn every_kind_has_a_distinct_slug() {
        let mut slugs: Vec<_> = ProblemKind::ALL.iter().map(|kind| kind.slug()).collect();
        slugs.sort_unstable();
        slugs.dedup();
        assert_eq!(slugs.len(), ProblemKind::ALL.len());
    }
}
