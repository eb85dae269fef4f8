//! The processor's extractors: its bearer key, the owner of its keys (so that its mutating routes
//! take the mechanism's [`Idempotent`](idempotency::Idempotent)) and pages; a path's id is
//! [`PathId`].
//! Only who may call differs from idempay: one API key for the processor, where idempay has
//! accounts.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::ProcessorState;
use crate::problem::{Error, Problem, ProblemKind};
use idempotency::{IdempotencyKey, Owners};
use service::ids::PublicId;
use service::pagination::PageRequest;

/// The owner of every processor key's scope (`processor:POST /v1/charges`). No account id has this
/// shape, so the processor's keys never meet idempay's in the shared table.
pub const SCOPE_OWNER: &str = "processor";

/// An object's id from the route's `{id}`, of the kind `T`: `PathId(id): PathId<ChargeId>`. One
/// that cannot be such an id is a 404 `not-found`, as one that names nothing the caller may see.
#[derive(Debug)]
pub struct PathId<T>(pub T);

impl<S: Send + Sync, T: PublicId> FromRequestParts<S> for PathId<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Ok(Self(service::ids::from_path(parts, state).await?))
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
            .map(|key| parse_key(&key))
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

/// The query string of a read of one object: `?idempotency_key=…`, or nothing. With a key, the
/// read answers 409 while a request under that key is still changing the object (`GET
/// /v1/charges/{id}?idempotency_key=…` while a capture or a void under it is being made).
pub struct KeyQuery(pub Option<IdempotencyKey>);

/// The query string of a [`KeyQuery`].
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyParams {
    idempotency_key: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for KeyQuery {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let axum::extract::Query(params) =
            axum::extract::Query::<KeyParams>::try_from_uri(&parts.uri).map_err(|rejection| {
                Problem::new(ProblemKind::InvalidRequest, rejection.body_text())
            })?;
        params
            .idempotency_key
            .map(|key| parse_key(&key))
            .transpose()
            .map(Self)
    }
}

fn parse_key(key: &str) -> Result<IdempotencyKey, Problem> {
    IdempotencyKey::parse(key.as_bytes()).map_err(|error| {
        Problem::new(
            ProblemKind::InvalidRequest,
            format!("idempotency_key is no idempotency key: {error}."),
        )
    })
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

/// The processor has one caller, whose API key every keyed route checks first; the owner of its
/// keys' scopes is then `processor` (`SCOPE_OWNER`). With this, its keyed routes take the
/// mechanism's [`Idempotent`](idempotency::Idempotent) as any service adopting the crate does.
impl Owners for ProcessorState {
    type Rejection = Error;

    async fn owner(&self, parts: &mut Parts) -> Result<String, Error> {
        Authorized::from_request_parts(parts, self).await?;
        Ok(SCOPE_OWNER.to_owned())
    }
}
