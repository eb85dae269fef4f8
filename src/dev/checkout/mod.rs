//! The checkout page (`/demo/checkout`): an order and a "Pay" button, where a double click charges
//! once because the page sends one `Idempotency-Key` per intent. Served only when
//! `IDEMPAY_DEMO_UI` is on (`idempay dev` turns it on); off, none of these routes exist. Its
//! assets are compiled in, so it works offline. README.md beside this file tells the story.
//!
//! The page never sees an API key. Loading it starts a demo session (an HttpOnly cookie, valid
//! for [`SESSION_TTL`]), and the page's calls to `/demo/api/...` are passed, in process, to the
//! same API routes a client calls, with the demo account's key added here. See `forward` for
//! why this is no way around authentication.

mod session;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::uri::PathAndQuery;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sqlx::PgPool;
use tokio::sync::OnceCell;
use tower::ServiceExt;

use crate::accounts::{self, ApiKey};
use crate::app::Application;
use crate::http::error::{Problem, ProblemKind};
use session::Sessions;
pub use session::{SESSION_COOKIE, SESSION_TTL};

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("checkout.js");
const STYLE: &str = include_str!("checkout.css");

/// The page's own scripts and styles only, nothing inline and nothing from elsewhere; no site
/// may frame it (a framed "Pay" button could be clicked on the user's behalf).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Where the page's calls arrive, and the API route each becomes: `/demo/api/...` → `/v1/...`.
const DEMO_API: &str = "/demo/api";
const API: &str = "/v1";

/// The name of the account the page pays as, when the server creates it.
const DEMO_ACCOUNT_NAME: &str = "demo checkout";

/// The checkout page of one server: the account it pays as and its live sessions.
#[derive(Clone, Debug)]
pub struct Checkout {
    account: Arc<DemoAccount>,
    sessions: Arc<Sessions>,
}

/// The one account the page may act as. `idempay dev` gives it the account its banner shows;
/// otherwise the first page load creates one, whose key exists only in this process's memory.
#[derive(Debug)]
struct DemoAccount {
    pool: PgPool,
    key: OnceCell<ApiKey>,
}

impl DemoAccount {
    async fn key(&self) -> anyhow::Result<&ApiKey> {
        self.key
            .get_or_try_init(|| async {
                let (account, key) = accounts::create(&self.pool, DEMO_ACCOUNT_NAME).await?;
                tracing::info!(account = %account.id(), "the checkout page pays as a new demo account");
                Ok(key)
            })
            .await
    }
}

/// Serves the checkout page beside `app` when its settings turn the demo UI on
/// (`IDEMPAY_DEMO_UI`): paying as `key`'s account (`idempay dev`: the account its banner shows),
/// or as a demo account it creates on first use. Every command that serves the API calls it.
pub fn mount(app: Application, key: Option<ApiKey>) -> Application {
    if !app.settings().demo_ui {
        return app;
    }
    let pool = app.pool().clone();
    let checkout = match key {
        Some(key) => Checkout::paying_as(pool, key),
        None => Checkout::new(pool),
    };
    app.with_routes_beside(move |api| checkout.router(api))
}

impl Checkout {
    /// A checkout page that pays as a demo account it creates on first use.
    pub fn new(pool: PgPool) -> Self {
        Self {
            account: Arc::new(DemoAccount {
                pool,
                key: OnceCell::new(),
            }),
            sessions: Arc::new(Sessions::default()),
        }
    }

    /// A checkout page that pays as the account of `key`.
    pub fn paying_as(pool: PgPool, key: ApiKey) -> Self {
        Self {
            account: Arc::new(DemoAccount {
                pool,
                key: OnceCell::new_with(Some(key)),
            }),
            sessions: Arc::new(Sessions::default()),
        }
    }

    /// The page, its assets and its calls, which `api` (the API's routes, with their state)
    /// answers.
    pub fn router(self, api: Router) -> Router {
        let state = Demo {
            checkout: self,
            api,
        };
        Router::new()
            .route("/demo/checkout", get(page))
            .route("/demo/checkout.js", get(script))
            .route("/demo/checkout.css", get(style))
            .route("/demo/api/payments", get(forward).post(forward))
            .route("/demo/api/payments/{id}/capture", post(forward))
            .route("/demo/api/idempotency_keys/{key}", get(forward))
            .with_state(state)
    }
}

#[derive(Clone)]
struct Demo {
    checkout: Checkout,
    api: Router,
}

/// The page, with a new demo session.
async fn page(State(demo): State<Demo>) -> Response {
    let cookie = demo.checkout.sessions.start();
    let mut response = asset("text/html; charset=utf-8", PAGE);
    let headers = response.headers_mut();
    headers.insert(header::SET_COOKIE, cookie);
    // A session per load: neither a cache nor the back button may hand out a page without one.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// Headers of the page's calls that reach the API; the cookie, and anything else, does not.
const FORWARDED: [HeaderName; 4] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    HeaderName::from_static("idempotency-key"),
    HeaderName::from_static("x-request-id"),
];

/// A call of the page, answered by the API route of the same name under `/v1` as the demo
/// account: status, headers and body unchanged (`Idempotent-Replayed`, `Retry-After`, problems).
///
/// Why this is no way around authentication:
/// - the routes exist only when `IDEMPAY_DEMO_UI` is on, which `serve` never turns on by itself;
/// - the call must carry a session this process started, within [`SESSION_TTL`]; without one it
///   is answered 401 and reaches nothing;
/// - it always acts as the demo account, whose key never leaves this process: no cookie, header
///   or path chooses another account, and the `Authorization` a caller sends is dropped;
/// - only the four routes above are passed on (pay, capture, list payments, inspect a key), never
///   refunds or anything else;
/// - the cookie is `SameSite=Strict`, so another site's page cannot make the browser send it
///   (no cross-site request forgery), and `HttpOnly`, so no script reads it.
///
/// What remains is by design: whoever can load the page can pay as the demo account. That is why
/// the setting is for the demo only.
async fn forward(State(demo): State<Demo>, request: Request) -> Response {
    if !demo.checkout.sessions.admits(request.headers()) {
        return Problem::new(
            ProblemKind::Unauthorized,
            format!(
                "No live demo session: load /demo/checkout, which starts one for {} minutes.",
                SESSION_TTL.as_secs() / 60
            ),
        )
        .into_response();
    }
    let key = match demo.checkout.account.key().await {
        Ok(key) => key,
        Err(error) => {
            tracing::error!(
                error = format!("{error:#}"),
                "cannot create the demo account"
            );
            return Problem::new(
                ProblemKind::Internal,
                "The demo account could not be created.",
            )
            .into_response();
        }
    };
    let (parts, body) = request.into_parts();
    let mut forwarded = Request::new(body);
    *forwarded.method_mut() = parts.method;
    *forwarded.uri_mut() = api_uri(&parts.uri);
    copy_headers(&parts.headers, forwarded.headers_mut());
    let mut authorization = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
        .expect("an API key is visible ASCII");
    authorization.set_sensitive(true);
    forwarded
        .headers_mut()
        .insert(header::AUTHORIZATION, authorization);
    match demo.api.oneshot(forwarded).await {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    }
}

/// `/demo/api/payments?limit=5` → `/v1/payments?limit=5`. Only the routes above reach here, so the
/// path starts with the demo prefix.
fn api_uri(uri: &axum::http::Uri) -> axum::http::Uri {
    let path_and_query = uri.path_and_query().map_or("", PathAndQuery::as_str);
    let rest = path_and_query
        .strip_prefix(DEMO_API)
        .unwrap_or(path_and_query);
    format!("{API}{rest}")
        .parse()
        .expect("a valid path with another valid prefix is valid")
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for name in FORWARDED {
        for value in from.get_all(&name) {
            to.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demo_call_becomes_the_api_route_of_the_same_name() {
        for (demo, api) in [
            ("/demo/api/payments", "/v1/payments"),
            ("/demo/api/payments?limit=5", "/v1/payments?limit=5"),
            (
                "/demo/api/idempotency_keys/5f0c%20x",
                "/v1/idempotency_keys/5f0c%20x",
            ),
        ] {
            assert_eq!(api_uri(&demo.parse().unwrap()).to_string(), api);
        }
    }

    #[test]
    fn the_page_and_its_assets_load_nothing_from_elsewhere() {
        for asset in [PAGE, SCRIPT, STYLE] {
            assert!(!asset.contains("http://") && !asset.contains("https://"));
        }
    }
}
