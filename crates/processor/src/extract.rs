//! The processor's extractors: its bearer key, and the keyed request of a mutating route, checked
//! before anything is reserved as idempay's own [`Idempotent`](idempotency::Idempotent) is.
//! Only who may call differs: one API key for the processor, where idempay has accounts.

use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::ProcessorState;
use crate::problem::{Error, Problem, ProblemKind};
use idempotency::{Fingerprints, IdempotencyKey, KeyError, KeyedRequest, Scope, Target};
use service::pagination::PageRequest;

/// The owner of every processor key's scope (`processor:POST /v1/charges`). No account id has this
/// shape, so the processor's keys never meet idempay's in the shared table.
pub const SCOPE_OWNER: &str = "processor";

/// The header that carries the key, as idempay's own routes read it.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// A path parameter; one that cannot be decoded names no resource: 404.
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

/// The page a list request asks for (`?limit=&starting_after=&ending_before=`, nothing else).
#[derive(Debug)]
pub struct PageQuery(pub PageRequest);

impl<S: Send + Sync> FromRequestParts<S> for PageQuery {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        Ok(Self(PageRequest::from_uri(&parts.uri)?))
    }
}

/// The page of a list that can also be narrowed to what was made under one idempotency key
/// (`?limit=&starting_after=&ending_before=&idempotency_key=`, nothing else): how a client that
/// lost the answer to its call, and can no longer repeat it, finds what the call made.
#[derive(Debug)]
pub struct KeyedPageQuery {
    pub page: PageRequest,
    pub idempotency_key: Option<IdempotencyKey>,
}

/// The query string of a [`KeyedPageQuery`].
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyedListParams {
    limit: Option<i64>,
    starting_after: Option<String>,
    ending_before: Option<String>,
    idempotency_key: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for KeyedPageQuery {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let axum::extract::Query(params) = axum::extract::Query::<KeyedListParams>::try_from_uri(
            &parts.uri,
        )
        .map_err(|rejection| Problem::new(ProblemKind::InvalidRequest, rejection.body_text()))?;
        let idempotency_key = params
            .idempotency_key
            .map(|key| {
                IdempotencyKey::parse(key.as_bytes()).map_err(|error| {
                    Problem::new(
                        ProblemKind::InvalidRequest,
                        format!("idempotency_key is no idempotency key: {error}."),
                    )
                })
            })
            .transpose()?;
        let page = PageRequest::try_from(service::pagination::ListParams::new(
            params.limit,
            params.starting_after,
            params.ending_before,
        ))?;
        Ok(Self {
            page,
            idempotency_key,
        })
    }
}

/// Proof that the request carried the processor's API key.
#[derive(Debug)]
pub struct Authorized;

impl FromRequestParts<ProcessorState> for Authorized {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ProcessorState,
    ) -> Result<Self, Self::Rejection> {
        let presented = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "));
        match presented {
            Some(key) if state.api_key.matches(key) => Ok(Self),
            _ => Err(Problem::new(
                ProblemKind::Unauthorized,
                "Send the processor's API key as `Authorization: Bearer <key>`.",
            )),
        }
    }
}

/// A JSON body of type `T` with a valid `Idempotency-Key`, from a client holding the API key.
/// No body (or `null`) is `{}`, as a full refund is asked for with a bare POST.
#[derive(Debug)]
pub struct Keyed<T> {
    pub request: KeyedRequest,
    pub body: T,
}

impl<T> FromRequest<ProcessorState> for Keyed<T>
where
    T: DeserializeOwned,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &ProcessorState) -> Result<Self, Error> {
        let (mut parts, body) = req.into_parts();
        Authorized::from_request_parts(&mut parts, state).await?;
        let route = parts.extensions.get::<MatchedPath>().map_or_else(
            || parts.uri.path().to_owned(),
            |path| path.as_str().to_owned(),
        );
        let scope = Scope::new(SCOPE_OWNER, &parts.method, &route);
        let uri = parts.uri.clone();
        let key = key_from(&parts.headers)
            .map_err(|error| Problem::new(ProblemKind::InvalidIdempotencyKey, error.to_string()))?;
        let bytes = Bytes::from_request(Request::from_parts(parts, body), state)
            .await
            .map_err(Problem::from)?;
        let bytes = if bytes.trim_ascii().is_empty() || bytes.trim_ascii() == b"null" {
            Bytes::from_static(b"{}")
        } else {
            bytes
        };
        let body = serde_json::from_slice::<T>(&bytes)
            .map_err(|error| Problem::invalid_body::<T>(&bytes, &error))?;
        let (fingerprints, fields) =
            Fingerprints::of_json(Target::of(&uri), &bytes).map_err(invalid_body)?;
        Ok(Self {
            request: KeyedRequest::new(scope, key, fingerprints).with_fields(fields),
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

fn invalid_body(error: serde_json::Error) -> Problem {
    Problem::invalid_body::<serde_json::Value>(&[], &error)
}
