//! The mechanism as a layer: routes behind [`guard`] need an `Idempotency-Key` on every unsafe
//! request and run at most once per key, whatever their handlers are, with no code of the
//! mechanism in them. Payments and refunds take the [`Idempotent`](super::Idempotent) extractor
//! instead, because their effect must commit in the same transaction as the key (see
//! [`Lease::complete`](super::Lease::complete)): a layer completes the key after the handler
//! answered, so a process that dies between the two leaves the key to be taken over once its lease
//! ran out, and the handler runs again. Behind a layer, put handlers whose effect is harmless to
//! repeat in that case, or that check for themselves.

use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::{FromRef, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderName, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use super::request::{invalid_body, is_json, key_from, refused};
use super::{
    BodyError, Completion, Error, Fingerprints, Idempotency, KeyedRequest, Lease, Owners, Scope,
    Target,
};

/// The headers of a handler's response kept with its key and replayed: the ones a client relies
/// on. Every other header is the transport's or is computed again on each answer.
const KEPT_HEADERS: [HeaderName; 2] = [header::CONTENT_TYPE, header::LOCATION];

/// The largest response body a key stores; a larger one is a fault (500), not a result.
pub const MAX_STORED_BODY: usize = 64 * 1024 * 1024;

/// Runs the route behind it at most once per owner, route and `Idempotency-Key`, as an axum
/// middleware: mount it with [`axum::middleware::from_fn_with_state`] on a state that names the
/// owner of each request ([`Owners`]) and holds the mechanism ([`Idempotency`]).
///
/// - Safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) pass through: a key on them is ignored.
/// - Any other request needs one valid `Idempotency-Key` (400 problem otherwise, and the handler
///   does not run). Its body is fingerprinted before anything is reserved: a JSON body in its
///   canonical form (400 if it is not JSON), any other over its raw bytes together with its
///   `Content-Type`.
/// - The first request with a key runs the handler; its response (status, `Content-Type`,
///   `Location` and the body's bytes) is stored, and every repeat of the same request gets it
///   again with `Idempotent-Replayed: true`. The same key with another body is 422; a repeat while
///   the first still runs is 409 with `Retry-After`.
/// - A 5xx from the handler is a fault of the service, not a result: it is passed through, nothing
///   is stored and the key is released for a retry. So is a response marked [`NotStored`].
///
/// ```
/// use axum::extract::FromRef;
/// use axum::http::request::Parts;
/// use axum::routing::{get, post};
/// use axum::{Router, middleware};
/// use idempotency::{Error, Idempotency, Owners};
///
/// #[derive(Clone)]
/// struct Shop {
///     idempotency: Idempotency,
/// }
///
/// impl FromRef<Shop> for Idempotency {
///     fn from_ref(shop: &Shop) -> Self {
///         shop.idempotency.clone()
///     }
/// }
///
/// impl Owners for Shop {
///     type Rejection = Error;
///
///     async fn owner(&self, _parts: &mut Parts) -> Result<String, Error> {
///         Ok("shop".to_owned()) // one owner; a service with accounts authenticates here
///     }
/// }
///
/// fn router(shop: Shop) -> Router {
///     Router::new()
///         .route("/orders", post(|| async { "ordered" }).get(|| async { "the orders" }))
///         // Only the routes above are behind it; a 404 reserves nothing.
///         .route_layer(middleware::from_fn_with_state(shop.clone(), idempotency::guard::<Shop>))
///         .route("/health", get(|| async { "ok" }))
///         .with_state(shop)
/// }
/// ```
pub async fn guard<S>(State(state): State<S>, request: Request, next: Next) -> Response
where
    S: Owners + Clone + 'static,
    Idempotency: FromRef<S>,
{
    if is_safe(request.method()) {
        return next.run(request).await;
    }
    keyed(state, request, next)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Methods that change nothing: the draft's key is for the others ("non-idempotent HTTP methods
/// such as POST or PATCH").
fn is_safe(method: &Method) -> bool {
    [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE].contains(method)
}

/// Marks a response that refuses the request before the handler acted on it (its input is
/// invalid): like a 5xx it is passed through, not stored, and the key is released, so the
/// corrected request can use it. Add it to the response's extensions.
#[derive(Clone, Copy, Debug)]
pub struct NotStored;

async fn keyed<S>(state: S, request: Request, next: Next) -> Result<Response, S::Rejection>
where
    S: Owners + Clone + 'static,
    Idempotency: FromRef<S>,
{
    let (mut parts, body) = request.into_parts();
    let owner = state.owner(&mut parts).await?;
    let scope = Scope::of(&owner, &parts);
    let key = key_from(&parts.headers).map_err(refused)?;
    // The body limit and the read timeout of the service apply, as to any extractor.
    let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), &state)
        .await
        .map_err(refused)?;
    let target = parts
        .uri
        .path_and_query()
        .map_or("/", |target| target.as_str());
    let keyed = fingerprint(Target::same(target), &parts.headers, &bytes)
        .map(|digests| match digests {
            (fingerprint, Some(fields)) => {
                KeyedRequest::new(scope, key, fingerprint).with_fields(fields)
            }
            (fingerprint, None) => KeyedRequest::new(scope, key, fingerprint),
        })
        .map_err(refused)?;

    // A response that is not a result goes back to the client as the handler made it.
    let passed: Arc<Mutex<Option<Response>>> = Arc::default();
    let kept = Arc::clone(&passed);
    let request = Request::from_parts(parts, Body::from(bytes));
    let answer = Idempotency::from_ref(&state)
        .run(keyed, move |lease| async move {
            let response = next.run(request).await;
            let status = response.status();
            if status.is_server_error() || response.extensions().get::<NotStored>().is_some() {
                *kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(response);
                let fault = anyhow::anyhow!("the handler answered {status}: not a result");
                return Err(S::Rejection::from(Error::Internal(fault)));
            }
            complete(lease, response).await.map_err(S::Rejection::from)
        })
        .await;
    let passed = passed.lock().unwrap_or_else(PoisonError::into_inner).take();
    match (answer, passed) {
        (Ok(response), _) => Ok(response),
        (Err(_), Some(response)) => Ok(response),
        (Err(error), None) => Err(error),
    }
}

/// The request's fingerprints, with its members' digests when the body is a JSON object. The
/// target is the path and query under every version: `guard` read the query before versions too.
fn fingerprint(
    target: Target<'_>,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Fingerprints, Option<super::FieldDigests>), BodyError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    match content_type.as_deref() {
        Some(json) if is_json(json) && !body.is_empty() => Fingerprints::of_json(target, body)
            .map(|(fingerprint, fields)| (fingerprint, Some(fields)))
            .map_err(invalid_body),
        other => Ok((Fingerprints::of_bytes(target, other, body), None)),
    }
}

/// Stores the handler's response with the key: its status, the headers a client relies on and
/// its body's bytes.
async fn complete(lease: Lease, response: Response) -> Result<Completion, Error> {
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, MAX_STORED_BODY)
        .await
        .map_err(|error| anyhow::anyhow!("the handler's response could not be read: {error}"))?;
    let mut stored = super::StoredResponse::raw(parts.status, body);
    for name in KEPT_HEADERS {
        if let Some(value) = parts
            .headers
            .get(&name)
            .and_then(|value| value.to_str().ok())
        {
            stored = stored.with_header(name, value);
        }
    }
    // No effect of its own to commit with the key: the handler's is done.
    let tx = lease.begin().await?;
    Ok(lease.complete(tx, stored).await?)
}
