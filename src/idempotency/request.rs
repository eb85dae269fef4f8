//! The extractor every idempotent route takes: it checks the key and the body **before** anything
//! is reserved, so a rejected request leaves nothing behind and does not burn its key.

use axum::extract::{FromRequest, MatchedPath, Request};
use axum::http::{HeaderMap, Method, StatusCode, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::{Fingerprint, IdempotencyKey, KeyError};
use crate::accounts::{Account, AccountId};
use crate::error::{Problem, ProblemKind};

/// The header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Where a key is valid: account + method + route template, e.g. `acct_42:POST /v1/payments`.
/// A key shared by two accounts, or sent to two endpoints, names two separate keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope(String);

impl Scope {
    pub fn new(account: &AccountId, method: &Method, route: &str) -> Self {
        Self(format!("{account}:{method} {route}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What identifies one business intent: its scope, its key and the fingerprint of its payload.
#[derive(Clone, Debug)]
pub struct KeyedRequest {
    pub(super) scope: Scope,
    pub(super) key: IdempotencyKey,
    pub(super) fingerprint: Fingerprint,
}

impl KeyedRequest {
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            key,
            fingerprint,
        }
    }

    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }
}

/// A JSON body of type `T` that arrived with a valid `Idempotency-Key`, from an authenticated
/// account. Rejections are problem documents: 400 for the key or the body, 415 for a body that is
/// not JSON, 413 for one over the size limit.
#[derive(Debug)]
pub struct Idempotent<T> {
    pub request: KeyedRequest,
    pub body: T,
}

impl<S, T> FromRequest<S> for Idempotent<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let account = req.extensions().get::<Account>().ok_or_else(|| {
            Problem::new(ProblemKind::Unauthorized, "This request needs an API key.")
        })?;
        let route = req.extensions().get::<MatchedPath>().map_or_else(
            || req.uri().path().to_owned(),
            |path| path.as_str().to_owned(),
        );
        let scope = Scope::new(account.id(), req.method(), &route);
        let key = key_from(req.headers())
            .map_err(|error| Problem::new(ProblemKind::InvalidIdempotencyKey, error.to_string()))?;
        require_json(req.headers())?;

        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                Problem::new(ProblemKind::PayloadTooLarge, rejection.body_text())
            } else {
                Problem::new(ProblemKind::InvalidRequest, rejection.body_text())
            }
        })?;
        // Typed parsing straight from the bytes refuses what a generic parse would let through,
        // such as a field given twice.
        let body = serde_json::from_slice::<T>(&bytes).map_err(invalid_body)?;
        let document = serde_json::from_slice(&bytes).map_err(invalid_body)?;
        Ok(Self {
            request: KeyedRequest::new(scope, key, Fingerprint::of_json(&document)),
            body,
        })
    }
}

fn key_from(headers: &HeaderMap) -> Result<IdempotencyKey, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    IdempotencyKey::parse(value.as_bytes())
}

/// Accepts `application/json` and `application/*+json`, with parameters such as `charset`.
fn require_json(headers: &HeaderMap) -> Result<(), Problem> {
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase());
    match essence.as_deref() {
        Some(essence)
            if essence == "application/json"
                || (essence.starts_with("application/") && essence.ends_with("+json")) =>
        {
            Ok(())
        }
        _ => Err(Problem::new(
            ProblemKind::UnsupportedMediaType,
            "Send the request body as JSON with Content-Type: application/json.",
        )),
    }
}

fn invalid_body(error: serde_json::Error) -> Problem {
    Problem::new(
        ProblemKind::InvalidRequest,
        format!("The request body is invalid: {error}."),
    )
}
