//! Extractors whose rejections are problem documents, like every other error of the API.

use std::error::Error;

use axum::extract::FromRequestParts;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::http::StatusCode;
use axum::http::request::Parts;
use service::ids::{NoSuch, PublicId};
use service::pagination::{ListError, ListQuery, PageError};

use crate::http::error::{ApiError, Problem, ProblemKind};

/// A path parameter. A segment that cannot be decoded (not UTF-8) names no resource: 404.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(Problem))]
pub struct Path<T>(pub T);

impl From<PathRejection> for Problem {
    fn from(rejection: PathRejection) -> Self {
        Problem::new(
            ProblemKind::NotFound,
            format!("No such resource: {}.", rejection.body_text()),
        )
    }
}

/// A path whose id cannot be of its kind ([`PathId`]), or names no object the account has: 404
/// `not-found`.
impl From<NoSuch> for Problem {
    fn from(no_such: NoSuch) -> Self {
        Problem::new(ProblemKind::NotFound, no_such.0)
    }
}

impl From<NoSuch> for ApiError {
    fn from(no_such: NoSuch) -> Self {
        Problem::from(no_such).into()
    }
}

/// An object's id from the route's `{id}`, of the kind `T`: `PathId(id): PathId<PaymentId>`. One
/// that cannot be such an id is a 404 `not-found`, as one that names nothing the caller may see.
#[derive(Debug)]
pub struct PathId<T>(pub T);

impl<S: Send + Sync, T: PublicId> FromRequestParts<S> for PathId<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Ok(Self(service::ids::from_path(parts, state).await?))
    }
}

/// The query of a list (`FilteredQuery(mut query): FilteredQuery`): its page, its `created` range
/// and its own filters, if it has any, which the handler takes by name before
/// [`ListQuery::finish`] refuses any other. A malformed page or range is a 400 problem at once.
#[derive(Debug)]
pub struct FilteredQuery(pub ListQuery);

impl<S: Send + Sync> FromRequestParts<S> for FilteredQuery {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        Ok(Self(ListQuery::from_uri(&parts.uri)?))
    }
}

/// A list request idempay cannot answer: an invalid query is 400 `invalid-request`, a cursor that
/// names no object of the list 404 `not-found`, each with the pagination's words as its detail.
impl From<PageError> for Problem {
    fn from(error: PageError) -> Self {
        let kind = match error {
            PageError::Invalid(_) => ProblemKind::InvalidRequest,
            PageError::UnknownCursor(_) => ProblemKind::NotFound,
        };
        Problem::new(kind, error.to_string())
    }
}

impl From<PageError> for ApiError {
    fn from(error: PageError) -> Self {
        Problem::from(error).into()
    }
}

impl From<ListError> for ApiError {
    fn from(error: ListError) -> Self {
        match error {
            ListError::Page(error) => error.into(),
            ListError::Database(error) => error.into(),
        }
    }
}

/// A body that could not be read whole: over the size limit (413), stalled past the body read
/// timeout (408), or otherwise broken off (400; the client has usually gone by then).
impl From<BytesRejection> for Problem {
    fn from(rejection: BytesRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(ProblemKind::PayloadTooLarge, rejection.body_text())
        } else if timed_out(&rejection) {
            Problem::new(
                ProblemKind::RequestTimeout,
                "The request body stopped arriving before it was complete. Nothing was recorded: \
                 send the whole request again, with the same Idempotency-Key.",
            )
        } else {
            Problem::new(ProblemKind::InvalidRequest, rejection.body_text())
        }
    }
}

/// Whether the body read timeout (`tower_http`'s request body timeout) cut the body off; the
/// error is wrapped a few times on its way to the extractor.
fn timed_out(rejection: &BytesRejection) -> bool {
    let mut cause: Option<&(dyn Error + 'static)> = Some(rejection);
    while let Some(error) = cause {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = error.source();
    }
    false
}
