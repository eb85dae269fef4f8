//! Extractors whose rejections are problem documents, like every other error of the API.

use axum::extract::FromRequestParts;
use axum::extract::rejection::PathRejection;

use crate::error::{Problem, ProblemKind};

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
