//! The mechanism as a layer: routes behind [`IdempotencyLayer`] need an `Idempotency-Key` on every
//! unsafe request and run at most once per key, whatever their handlers are, with no code of the
//! mechanism in them. Payments and refunds take the [`Idempotent`](super::Idempotent) extractor
//! instead, because their effect must commit in the same transaction as the key (see
//! [`Lease::complete`](super::Lease::complete)): a layer completes the key after the handler
//! answered, so a process that dies between the two leaves the key to be taken over once its lease
//! ran out, and the handler runs again. Behind a layer, put handlers whose effect is harmless to
//! repeat in that case, or that check for themselves.

use std::fmt;
use std::sync::{Arc, Mutex, Once, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, Method, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tower_layer::Layer;
use tower_service::Service;

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

/// The longest wait between two runs of the expiry job the layer starts: a key's row outlives its
/// TTL by at most this (a key past its TTL is new again anyway, so this only bounds the table).
const LONGEST_EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// Runs the routes behind it at most once per owner, route and `Idempotency-Key`: a
/// [`tower_layer::Layer`] that an axum router adds with `route_layer` (only the routes above it,
/// so a 404 reserves nothing) or `layer`. It needs the mechanism ([`Idempotency`]) and whoever
/// names the owner of each request ([`Owners`]); nothing of the router's state.
///
/// - Safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) pass through: a key on them is ignored.
/// - Any other request needs one valid `Idempotency-Key` (400 otherwise, and the handler does not
///   run). Its body is fingerprinted before anything is reserved: a JSON body in its canonical
///   form (400 if it is not JSON), any other over its raw bytes together with its `Content-Type`.
/// - The first request with a key runs the handler; its response (status, `Content-Type`,
///   `Location` and the body's bytes) is stored, and every repeat of the same request gets it
///   again with `Idempotent-Replayed: true`. The same key with another body is 422; a repeat while
///   the first still runs is 409 with `Retry-After`.
/// - A 5xx from the handler is a fault of the service, not a result: it is passed through, nothing
///   is stored and the key is released for a retry. So is a response marked [`NotStored`], and
///   an error of the inner service.
///
/// The mechanism's refusals and faults are answered as [`Error`]'s own `application/problem+json`
/// documents, unless [`IdempotencyLayer::on_error`] maps them to the service's; a refusal of
/// [`Owners`] is answered by its [`Owners::Rejection`].
///
/// The layer deletes expired keys too: the first router built with it (or, outside a runtime,
/// its first request) starts the expiry job, every `min(key TTL, 60 s)`, and the job stops when
/// the last route holding the layer is dropped. A service that runs its own expiry job says
/// [`IdempotencyLayer::without_expiry`].
///
/// The example runs as it is: a GET passes through, and a POST without a key is refused before
/// anything asks the database (the pool here never connects).
///
/// ```
/// use axum::Router;
/// use axum::body::Body;
/// use axum::http::request::Parts;
/// use axum::http::{Request, StatusCode, header};
/// use axum::routing::{get, post};
/// use idempotency::{Error, Idempotency, IdempotencyLayer, Owners, Policy};
/// use tower::ServiceExt;
///
/// #[derive(Clone)]
/// struct Shop;
///
/// impl Owners for Shop {
///     type Rejection = Error; // any `IntoResponse`: the service's own error type, say
///
///     async fn owner(&self, _parts: &mut Parts) -> Result<String, Error> {
///         Ok("shop".to_owned()) // one owner; a service with accounts authenticates here
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pool = sqlx::PgPool::connect_lazy("postgres://shop@localhost/shop").unwrap();
/// let idempotency = Idempotency::new(pool, Policy::default());
/// let app = Router::new()
///     .route("/orders", post(|| async { "ordered" }).get(|| async { "the orders" }))
///     .route_layer(IdempotencyLayer::new(idempotency, Shop).without_expiry())
///     .route("/health", get(|| async { "ok" }));
///
/// let listed = app.clone().oneshot(Request::get("/orders").body(Body::empty()).unwrap());
/// assert_eq!(listed.await.unwrap().status(), StatusCode::OK);
///
/// let keyless = Request::post("/orders").body(Body::empty()).unwrap();
/// let refused = app.oneshot(keyless).await.unwrap();
/// assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(refused.headers()[header::CONTENT_TYPE], "application/problem+json");
/// # }
/// ```
pub struct IdempotencyLayer<O> {
    idempotency: Idempotency,
    owners: O,
    on_error: OnError,
    expiry: Option<Arc<Expiry>>,
}

/// How the layer answers the mechanism's refusals and faults.
type OnError = Arc<dyn Fn(Error) -> Response + Send + Sync>;

impl<O> IdempotencyLayer<O> {
    /// Routes behind `idempotency`, owned as `owners` names them.
    pub fn new(idempotency: Idempotency, owners: O) -> Self {
        let interval = idempotency
            .policy
            .key_ttl
            .clamp(Duration::from_secs(1), LONGEST_EXPIRY_INTERVAL);
        Self {
            expiry: Some(Arc::new(Expiry::new(idempotency.clone(), interval))),
            idempotency,
            owners,
            on_error: Arc::new(IntoResponse::into_response),
        }
    }

    /// Answers the mechanism's refusals (400, 409, 413, 415, 422, 503) and faults with `hook`, so
    /// they are the service's own problem documents rather than [`Error`]'s plain ones.
    ///
    /// ```
    /// use axum::Json;
    /// use axum::response::IntoResponse;
    /// # use idempotency::{Idempotency, IdempotencyLayer, Policy};
    /// # #[derive(Clone)]
    /// # struct Shop;
    /// # impl idempotency::Owners for Shop {
    /// #     type Rejection = idempotency::Error;
    /// #     async fn owner(&self, _: &mut axum::http::request::Parts) -> Result<String, Self::Rejection> {
    /// #         Ok("shop".to_owned())
    /// #     }
    /// # }
    /// # fn layer(idempotency: Idempotency) -> IdempotencyLayer<Shop> {
    /// IdempotencyLayer::new(idempotency, Shop).on_error(|error: idempotency::Error| {
    ///     let status = match &error {
    ///         idempotency::Error::Refused(refusal) => refusal.status(),
    ///         _ => axum::http::StatusCode::SERVICE_UNAVAILABLE,
    ///     };
    ///     (status, Json(serde_json::json!({ "error": error.to_string() }))).into_response()
    /// })
    /// # }
    /// ```
    #[must_use]
    pub fn on_error(mut self, hook: impl Fn(Error) -> Response + Send + Sync + 'static) -> Self {
        self.on_error = Arc::new(hook);
        self
    }

    /// Runs the expiry job every `interval` instead of every `min(key TTL, 60 s)`.
    #[must_use]
    pub fn expiring_every(mut self, interval: Duration) -> Self {
        self.expiry = Some(Arc::new(Expiry::new(self.idempotency.clone(), interval)));
        self
    }

    /// Starts no expiry job: the service runs one of its own ([`Idempotency::spawn_expiry`], or
    /// [`Idempotency::expire_batch`] in a job that expires other tables too).
    #[must_use]
    pub fn without_expiry(mut self) -> Self {
        self.expiry = None;
        self
    }
}

impl<O: Clone> Clone for IdempotencyLayer<O> {
    fn clone(&self) -> Self {
        Self {
            idempotency: self.idempotency.clone(),
            owners: self.owners.clone(),
            on_error: Arc::clone(&self.on_error),
            expiry: self.expiry.clone(),
        }
    }
}

impl<O> fmt::Debug for IdempotencyLayer<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idempotency", &self.idempotency)
            .field(
                "expiry",
                &self.expiry.as_ref().map(|expiry| expiry.interval),
            )
            .finish_non_exhaustive()
    }
}

impl<S, O: Clone> Layer<S> for IdempotencyLayer<O> {
    type Service = IdempotencyService<S, O>;

    fn layer(&self, inner: S) -> Self::Service {
        if let Some(expiry) = &self.expiry {
            expiry.start();
        }
        IdempotencyService {
            inner,
            shared: Arc::new(Shared {
                idempotency: self.idempotency.clone(),
                owners: self.owners.clone(),
                on_error: Arc::clone(&self.on_error),
                expiry: self.expiry.clone(),
            }),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps a route in.
pub struct IdempotencyService<S, O> {
    inner: S,
    shared: Arc<Shared<O>>,
}

/// What every clone of a service shares: cloned once per request, so one `Arc`.
struct Shared<O> {
    idempotency: Idempotency,
    owners: O,
    on_error: OnError,
    /// Held so that the job runs while a route does (see [`Expiry`]).
    expiry: Option<Arc<Expiry>>,
}

impl<S: Clone, O> Clone for IdempotencyService<S, O> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S, O> fmt::Debug for IdempotencyService<S, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("idempotency", &self.shared.idempotency)
            .finish_non_exhaustive()
    }
}

impl<S, O> Service<Request> for IdempotencyService<S, O>
where
    S: Service<Request, Response = Response> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    O: Owners + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // The inner service `poll_ready` readied goes with this request, a clone stays for the
        // next one: a clone of a service is not ready because the original was.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        if let Some(expiry) = &self.shared.expiry {
            expiry.start();
        }
        if is_safe(request.method()) {
            return Box::pin(inner.call(request));
        }
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { shared.keyed(request, inner).await })
    }
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

impl<O: Owners> Shared<O> {
    /// The decision for a request that needs a key, the route's service run at most once for it.
    async fn keyed<S>(&self, request: Request, mut inner: S) -> Result<Response, S::Error>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        let (mut parts, body) = request.into_parts();
        let owner = match self.owners.owner(&mut parts).await {
            Ok(owner) => owner,
            Err(rejection) => return Ok(rejection.into_response()),
        };
        let (keyed, parts, bytes) = match read(&owner, parts, body).await {
            Ok(read) => read,
            Err(error) => return Ok((self.on_error)(error)),
        };
        // A response that is not a result goes back to the client as the handler made it.
        let passed: Passed<S::Error> = Arc::default();
        let kept = Arc::clone(&passed);
        let request = Request::from_parts(parts, Body::from(bytes));
        let answer = self
            .idempotency
            .run(keyed, move |lease| async move {
                let response = match inner.call(request).await {
                    Ok(response) => response,
                    Err(error) => return Err(not_a_result(&kept, Err(error), "failed")),
                };
                let status = response.status();
                if status.is_server_error() || response.extensions().get::<NotStored>().is_some() {
                    return Err(not_a_result(&kept, Ok(response), status.as_str()));
                }
                complete(lease, response).await
            })
            .await;
        let passed = passed.lock().unwrap_or_else(PoisonError::into_inner).take();
        match (answer, passed) {
            (Ok(response), _) => Ok(response),
            (Err(_), Some(passed)) => passed,
            (Err(error), None) => Ok((self.on_error)(error)),
        }
    }
}

/// What the route's service answered when it was no result, kept to be passed on.
type Passed<E> = Arc<Mutex<Option<Result<Response, E>>>>;

/// Keeps what the route's service answered, to pass it on, and fails the work with it: the key
/// is released, nothing stored.
fn not_a_result<T>(kept: &Mutex<Option<T>>, answer: T, how: &str) -> Error {
    *kept.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
    Error::Internal(anyhow::anyhow!("the handler answered {how}: not a result"))
}

/// The request's owner, key and body, read and fingerprinted before anything is reserved: a
/// refusal here leaves nothing behind.
async fn read(
    owner: &str,
    parts: Parts,
    body: Body,
) -> Result<(KeyedRequest, Parts, Bytes), Error> {
    let scope = Scope::of(owner, &parts);
    let key = key_from(&parts.headers).map_err(refused::<Error>)?;
    // The body limit and the read timeout of the service apply, as to any extractor.
    let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), &())
        .await
        .map_err(refused::<Error>)?;
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
        .map_err(refused::<Error>)?;
    Ok((keyed, parts, bytes))
}

/// The expiry job a layer starts: once, on the first router built with it (where a runtime runs)
/// or its first request, and stopped when the last route holding it is dropped. An adopter so
/// holds no token and no handle: the job lives as long as the routes it keeps tidy.
struct Expiry {
    idempotency: Idempotency,
    interval: Duration,
    started: Once,
    stop: CancellationToken,
}

impl Expiry {
    fn new(idempotency: Idempotency, interval: Duration) -> Self {
        Self {
            idempotency,
            interval,
            started: Once::new(),
            stop: CancellationToken::new(),
        }
    }

    fn start(&self) {
        // Asked on every request: once started, nothing more to look at.
        if self.started.is_completed() {
            return;
        }
        // Outside a runtime (a router built before one starts) there is nowhere to run it yet:
        // the first request, which runs in one, starts it.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.started.call_once(|| {
            drop(
                self.idempotency
                    .spawn_expiry(self.interval, self.stop.clone()),
            );
        });
    }
}

impl Drop for Expiry {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The request's fingerprints, with its members' digests when the body is a JSON object. The
/// target is the path and query under every version: the layer read the query before versions too.
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
