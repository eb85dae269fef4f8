//! What the mechanism reads of a request: who owns it (told by the adopting service, see
//! [`Owners`]), its scope, its key, and the extractor every idempotent JSON route takes, which
//! checks the key and the body **before** anything is reserved, so a rejected request leaves
//! nothing behind and does not burn its key.

use std::fmt;
use std::future::Future;

use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, Uri, header};
use axum::response::IntoResponse;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::form;

use super::{
    BodyError, Error, FieldDigests, Fingerprint, Fingerprints, IdempotencyKey, KeyError, Refusal,
    Target,
};

/// The header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How a service that adopts the mechanism tells it who owns a request: the first part of every
/// key's scope (`acct_42` in `acct_42:POST /v1/payments`). The mechanism knows no accounts; the
/// service implements this trait, usually by authenticating the request, on whatever it hands the
/// [`IdempotencyLayer`](super::IdempotencyLayer), or on its state for the [`Owner`] and
/// [`Idempotent`] extractors.
///
/// Keys are never shared between owners, so two owners must never have the same name: a service
/// may name an account by its id (`acct_…`), and a second service sharing the table names itself
/// by a word no id has the shape of. A name has no
/// `:` (the scope's separator), and it is what a key row is found by first: on Citus, the value
/// that decides which node holds the key.
///
/// [`Owners::Rejection`] answers the service's own refusals (401, 429…): any `IntoResponse`. A
/// service without a catalogue of its own can take [`Error`], which answers plain RFC 9457
/// documents. Behind the layer, the mechanism's refusals are answered apart (its
/// [`on_error`](super::IdempotencyLayer::on_error)); the [`Idempotent`] extractor answers them
/// with the rejection too, so there it must take them in: `From<Error>`.
///
/// ```
/// use axum::http::request::Parts;
/// use idempotency::{Error, Owners};
///
/// #[derive(Clone)]
/// struct Shop;
///
/// impl Owners for Shop {
///     type Rejection = Error;
///
///     async fn owner(&self, parts: &mut Parts) -> Result<String, Error> {
///         // A real service checks a credential here; the owner is whoever it names.
///         match parts.headers.get("x-tenant").and_then(|value| value.to_str().ok()) {
///             Some(tenant) => Ok(format!("tenant_{tenant}")),
///             None => Err(anyhow::anyhow!("no tenant").into()),
///         }
///     }
/// }
/// ```
pub trait Owners: Send + Sync {
    /// How the service answers a request it refuses before anything is reserved.
    type Rejection: IntoResponse + Send + 'static;

    /// The owner of the request, or the refusal (401, 429…) that ends it before anything is
    /// reserved.
    fn owner(
        &self,
        parts: &mut Parts,
    ) -> impl Future<Output = Result<String, Self::Rejection>> + Send;
}

/// The owner of a request, as the state's [`Owners`] names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner(pub String);

impl<S: Owners> FromRequestParts<S> for Owner {
    type Rejection = S::Rejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, S::Rejection> {
        state.owner(parts).await.map(Self)
    }
}

/// Where a key is valid: owner + method + route template, e.g. `acct_42:POST /v1/payments`.
/// A key shared by two owners, or sent to two endpoints, names two separate keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope(String);

impl Scope {
    pub fn new(owner: &str, method: &Method, route: &str) -> Self {
        Self(format!("{owner}:{method} {route}"))
    }

    /// The scope of a request: its owner, its method and the template of the route it matched.
    pub(super) fn of(owner: &str, parts: &Parts) -> Self {
        let route = parts.extensions.get::<MatchedPath>().map_or_else(
            || parts.uri.path().to_owned(),
            |path| path.as_str().to_owned(),
        );
        Self::new(owner, &parts.method, &route)
    }

    /// A scope as a key row stores it, for the recovery job that resumes the key.
    pub(super) fn stored(scope: String) -> Self {
        Self(scope)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The route template the scope names (`/v1/payments`), the label its outcomes are counted by.
    pub fn route(&self) -> &str {
        self.0
            .split_once(':')
            .and_then(|(_, rest)| rest.split_once(' '))
            .map_or("unknown", |(_, route)| route)
    }

    /// The owner the scope starts with: the key row's `account_id`, the value its table is
    /// partitioned by on a distributed database (an owner's name has no `:`).
    pub fn owner(&self) -> &str {
        self.0
            .split_once(':')
            .map_or(self.0.as_str(), |(owner, _)| owner)
    }
}

/// What identifies one business intent: its scope, its key and the fingerprints of its payload
/// (one per version of the fingerprint, see [`Fingerprints`]).
#[derive(Debug)]
pub struct KeyedRequest {
    pub(super) scope: Scope,
    pub(super) key: IdempotencyKey,
    pub(super) fingerprints: Fingerprints,
    /// The digests of the body's top-level members, stored with a new key so that a mismatch can
    /// name the members that changed; `None` when the caller has none (a key rebuilt from its row).
    pub(super) fields: Option<FieldDigests>,
    /// The recovery point the reservation records with a new key, if the work starts at one.
    pub(super) first_point: Option<(&'static str, serde_json::Value)>,
    /// The point's state before it is made: a replay answered from memory never makes it.
    unmade_point: Option<(&'static str, MakeState)>,
    /// SHA-256 of the target and the body's bytes as they arrived, for a request taken by
    /// [`Idempotent`]. A retry usually resends the very bytes of its first attempt, so the replay
    /// cache recognises it by this digest alone; making the body canonical costs more than the
    /// rest of a replay's own work, and only a retry that serialised its body anew needs it.
    pub(super) exact: Option<Fingerprint>,
    /// A small JSON body not fingerprinted yet: [`KeyedRequest::digest`] does it when the replay
    /// cache cannot answer by the exact digest, before the database is asked.
    pub(super) undigested: Option<(Uri, Bytes)>,
}

impl KeyedRequest {
    pub fn new(scope: Scope, key: IdempotencyKey, fingerprints: Fingerprints) -> Self {
        Self {
            scope,
            key,
            fingerprints,
            fields: None,
            first_point: None,
            exact: None,
            undigested: None,
            unmade_point: None,
        }
    }

    /// A request whose JSON body is fingerprinted only if it has to be (see `exact`).
    pub(super) fn of_json(scope: Scope, key: IdempotencyKey, uri: Uri, body: Bytes) -> Self {
        // The raw-bytes fingerprint the mechanism already has, over the path and the bytes as sent.
        let exact = Fingerprint::of_bytes(Target::of(&uri).path_and_query, None, &body);
        Self {
            exact: Some(exact),
            undigested: Some((uri, body)),
            ..Self::new(scope, key, Fingerprints::default())
        }
    }

    /// What the database needs of a request that the replay cache did not answer: its body
    /// fingerprinted, and the state of the point its work starts at.
    pub(super) fn prepare(&mut self) -> Result<(), Error> {
        self.digest()?;
        if let Some((name, make)) = self.unmade_point.take() {
            let state = make.call().map_err(|error| Error::Internal(error.into()))?;
            self.first_point = Some((name, state));
        }
        Ok(())
    }

    /// Fingerprints the body if it is not yet: its canonical form's digests under every version,
    /// and its members'. Refused for a body the typed parse accepted and the canonical one does
    /// not (never one field's); nothing is reserved then.
    pub(super) fn digest(&mut self) -> Result<(), Refusal> {
        if let Some((uri, body)) = self.undigested.take() {
            let (fingerprints, fields) =
                Fingerprints::of_json(Target::of(&uri), &body).map_err(invalid_body)?;
            self.fingerprints = fingerprints;
            self.fields = Some(fields);
        }
        Ok(())
    }

    /// The request's body digested member by member (see [`Fingerprints::of_json`]).
    #[must_use]
    pub fn with_fields(mut self, fields: FieldDigests) -> Self {
        self.fields = Some(fields);
        self
    }

    /// Work whose first step is a call to another system starts at a recovery point: the
    /// reservation of a new key records it (`name`, `state` and a fresh downstream key) in the
    /// same statement, instead of a commit of its own after it. The work then finds it on its
    /// lease, fresh or taken over alike.
    ///
    /// `state` makes the point's state (the work's parameters as JSON). It is called only when
    /// the database is asked: a replay answered from memory does not pay for it.
    #[must_use]
    pub fn starting_at(
        mut self,
        name: &'static str,
        state: impl FnOnce() -> Result<serde_json::Value, serde_json::Error> + Send + Sync + 'static,
    ) -> Self {
        self.first_point = None;
        self.unmade_point = Some((name, MakeState(Box::new(state))));
        self
    }
}

/// Makes a recovery point's state (see [`KeyedRequest::starting_at`]).
struct MakeState(Box<dyn FnOnce() -> Result<serde_json::Value, serde_json::Error> + Send + Sync>);

impl MakeState {
    fn call(self) -> Result<serde_json::Value, serde_json::Error> {
        (self.0)()
    }
}

impl fmt::Debug for MakeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MakeState(..)")
    }
}

/// A JSON body of type `T` that arrived with a valid `Idempotency-Key`, from the owner the state
/// names ([`Owners`]). Rejections are problem documents: the owner's own first (a 401 without a
/// valid API key, say, or a 429 over the account's rate limit, so that a throttled request
/// reserves nothing), then 400 for the key or the body, 415 for a body that is not JSON, 413 for
/// one over the size limit, 408 for one that stopped arriving.
#[derive(Debug)]
pub struct Idempotent<T> {
    pub request: KeyedRequest,
    pub body: T,
}

/// Bodies larger than this are parsed and hashed on the blocking pool: near the 64 KiB limit that
/// is a fraction of a millisecond of CPU, too long to hold a runtime thread that serves other
/// requests. Smaller ones, every honest payment among them, stay inline, where the hop to another
/// thread would cost more than the work.
const INLINE_BODY_BYTES: usize = 8 * 1024;

impl<S, T> FromRequest<S> for Idempotent<T>
where
    S: Owners,
    S::Rejection: From<Error>,
    T: DeserializeOwned + Send + 'static,
{
    type Rejection = S::Rejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let (mut parts, body) = req.into_parts();
        let owner = state.owner(&mut parts).await?;
        let scope = Scope::of(&owner, &parts);
        let uri = parts.uri.clone();
        let req = Request::from_parts(parts, body);
        let key = key_from(req.headers()).map_err(refused)?;
        let typed = req.headers().contains_key(header::CONTENT_TYPE);
        let encoding = if typed {
            encoding_of(req.headers()).map_err(refused)?
        } else {
            Encoding::Json
        };
        let bytes = Bytes::from_request(req, state).await.map_err(refused)?;
        if encoding == Encoding::Form {
            return Self::from_form(scope, key, uri, bytes).await;
        }
        // No body at all, or `null`, is an empty object, as a full refund is asked for with a bare
        // POST; a body needs its content type.
        let bytes = match (typed, bytes.is_empty()) {
            (false, false) => return Err(refused(Refusal::UnsupportedMediaType)),
            (false, true) => Bytes::from_static(b"{}"),
            // An empty body is no body, whatever its Content-Type says: generated clients send
            // `Content-Type: application/json` with nothing after it for an optional body left out.
            (true, _) if bytes.trim_ascii().is_empty() || bytes.trim_ascii() == b"null" => {
                Bytes::from_static(b"{}")
            }
            (true, _) => bytes,
        };
        let bytes_len = bytes.len();
        // Typed parsing straight from the bytes refuses what a generic parse would let through,
        // such as a field given twice.
        let parse = |bytes: &[u8]| {
            serde_json::from_slice::<T>(bytes).map_err(|error| BodyError::of::<T>(bytes, &error))
        };
        if bytes_len <= INLINE_BODY_BYTES {
            // Fingerprinted later, and only if the replay cache cannot answer it by its bytes.
            let body = parse(&bytes).map_err(refused)?;
            return Ok(Self {
                request: KeyedRequest::of_json(scope, key, uri, bytes),
                body,
            });
        }
        let (body, request) = tokio::task::spawn_blocking(move || -> Result<_, Refusal> {
            let body = parse(&bytes)?;
            let mut request = KeyedRequest::of_json(scope, key, uri, bytes);
            request.digest()?;
            Ok((body, request))
        })
        .await
        .map_err(|error| S::Rejection::from(Error::Internal(error.into())))?
        .map_err(refused)?;
        Ok(Self { request, body })
    }
}

impl<T: DeserializeOwned + Send + 'static> Idempotent<T> {
    /// A form body: parsed as `T`, its values taking the types `T` asks for, and fingerprinted as
    /// the JSON it is equivalent to (`form.rs`), so that a retry may switch encodings. Large ones
    /// on the blocking pool, as JSON ones.
    async fn from_form<R: From<Error>>(
        scope: Scope,
        key: IdempotencyKey,
        uri: Uri,
        bytes: Bytes,
    ) -> Result<Self, R> {
        let inline = bytes.len() <= INLINE_BODY_BYTES;
        let parse = move || -> Result<_, Refusal> {
            let (body, json) = form::parse::<T>(&bytes)?;
            let mut request = KeyedRequest::of_json(scope, key, uri, Bytes::from(json));
            if !inline {
                request.digest()?;
            }
            Ok(Self { request, body })
        };
        if inline {
            return parse().map_err(refused);
        }
        tokio::task::spawn_blocking(parse)
            .await
            .map_err(|error| R::from(Error::Internal(error.into())))?
            .map_err(refused)
    }
}

/// How a body is encoded, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Encoding {
    Json,
    Form,
}

/// JSON (`application/json`, `application/*+json`) or a form
/// (`application/x-www-form-urlencoded`), with parameters such as `charset`; anything else is
/// refused (415).
fn encoding_of(headers: &HeaderMap) -> Result<Encoding, Refusal> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    match content_type {
        Some(json) if is_json(json) => Ok(Encoding::Json),
        Some(form) if form::is_form(form) => Ok(Encoding::Form),
        _ => Err(Refusal::UnsupportedMediaType),
    }
}

/// The request's one `Idempotency-Key`.
pub(super) fn key_from(headers: &HeaderMap) -> Result<IdempotencyKey, KeyError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let value = values.next().ok_or(KeyError::Missing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    IdempotencyKey::parse(value.as_bytes())
}

/// A refusal in the service's own terms.
pub(super) fn refused<R: From<Error>>(refusal: impl Into<Refusal>) -> R {
    R::from(Error::Refused(refusal.into()))
}

/// Whether a `Content-Type` names JSON: `application/json` or `application/*+json`.
pub(super) fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// A body the typed parse accepted and the fingerprint's generic one refused (or the other way
/// round, for a body only fingerprinted): rare, and never one field's.
pub(super) fn invalid_body(error: serde_json::Error) -> BodyError {
    BodyError::of::<serde_json::Value>(&[], &error)
}

/// What the API description says of the header: the whole mechanism, from the client's side.
const KEY_DOCUMENTATION: &str = "\
One key per business intent: generate a UUID v4 when the intent arises (a checkout, a refund) and \
send it on every attempt and every retry of that intent. Never generate a new key for a retry: \
that would be a new intent, and charge twice.

1 to {max_key_len} visible ASCII characters, sent bare (`5f0c8b1e-…`) or as an RFC 8941 sf-string \
(`\"5f0c8b1e-…\"`); both forms are the same key. The key is scoped to the account and the \
endpoint (method and route): another account, or another endpoint, never sees this key's result.

The first request with a key executes and its response is stored: status, headers and body. \
Every later request with the same key and the same body (compared by SHA-256 of its canonical \
JSON and the request's path, so key order, whitespace and the notation of a number (`4200`, \
`42e2`, `4200.0`) do not matter) receives that response byte for byte, with \
`Idempotent-Replayed: true`. The same key with a different body is refused with 422. While the \
first request is still running, a retry gets 409 with `Retry-After`. If the first request failed \
on our side (5xx), nothing was stored and a retry executes afresh. If its process died, a retry \
takes the key over once the request's lease has run out ({lease} by default).

Expiry: a key and its stored response are kept for the key TTL ({key_ttl} by default) after the \
request completed; after that the key is new again.";

/// Both forms as one regular expression: a bare key of 1 to 255 visible ASCII characters that does
/// not start with a quote, or a quoted one whose 1 to 255 characters may escape `"` and `\`.
const KEY_PATTERN: &str =
    r#"^(?:[\x21\x23-\x7e][\x21-\x7e]{0,254}|"(?:[\x21\x23-\x5b\x5d-\x7e]|\\["\\]){1,255}")$"#;

impl utoipa::IntoParams for IdempotencyKey {
    fn into_params(
        _parameter_in_provider: impl Fn() -> Option<utoipa::openapi::path::ParameterIn>,
    ) -> Vec<utoipa::openapi::path::Parameter> {
        use utoipa::openapi::Required;
        use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
        vec![
            ParameterBuilder::new()
                .name("Idempotency-Key")
                .parameter_in(ParameterIn::Header)
                .required(Required::True)
                .description(Some(KEY_DOCUMENTATION))
                .schema(Some(key_schema()))
                .build(),
        ]
    }
}

/// The schema of a key wherever the API description names one: the header, and the path of
/// `GET /v1/idempotency_keys/{key}`.
pub fn key_schema() -> utoipa::openapi::schema::ObjectBuilder {
    use utoipa::openapi::schema::{ObjectBuilder, Type};

    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .pattern(Some(KEY_PATTERN))
        .examples([serde_json::json!("5f0c8b1e-2a3d-4c6f-9b21-7d0e4a9c1f88")])
}
