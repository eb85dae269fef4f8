//! The checkout page's server side (`IDEMPAY_DEMO_UI`): it exists only with the setting, its
//! session is an HttpOnly cookie good for minutes, it never shows an API key, and its calls act as
//! the demo account only, with a live session only. The page itself, double-clicked in a real
//! browser, is checked by `make contract`.

use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use idempay::config::Settings;
use idempay::dev::checkout::{SESSION_COOKIE, SESSION_TTL};
use idempay_test_macros::api_test;
use reqwest::{Method, RequestBuilder};
use serde_json::json;

use crate::support::helpers::{TestApp, TestResponse, retry_while_in_flight};
use crate::support::instance::Instance;

fn demo_ui() -> Settings {
    Settings {
        demo_ui: true,
        shared: SharedArgs {
            slow_charge: Duration::from_millis(1500),
            ..SharedArgs::default()
        },
        ..Settings::default()
    }
}

/// The page and its assets, each answered 200, with the `Cookie` header the page's session
/// makes.
async fn open_checkout(app: &TestApp) -> (TestResponse, String) {
    let page = app.send(app.client().get(app.url("/demo/checkout"))).await;
    page.assert_status(200);
    let set_cookie = page.header("set-cookie").expect("a session cookie");
    let pair = set_cookie.split(';').next().unwrap().trim().to_owned();
    assert!(
        pair.starts_with(&format!("{SESSION_COOKIE}=")),
        "{set_cookie}"
    );
    (page, pair)
}

/// `method path` in the checkout page's session (with its `Cookie` header), not yet sent.
fn in_session(app: &TestApp, cookie: &str, method: Method, path: &str) -> RequestBuilder {
    app.client()
        .request(method, app.url(path))
        .header("cookie", cookie)
}

/// The key's inspection, as the page reads it in its session.
async fn inspected(app: &TestApp, cookie: &str, key: &str) -> TestResponse {
    let path = format!("/demo/api/idempotency_keys/{key}");
    app.send(in_session(app, cookie, Method::GET, &path)).await
}

async fn demo_payment(app: &TestApp, cookie: Option<&str>, key: &str) -> TestResponse {
    let mut request = app
        .client()
        .post(app.url("/demo/api/payments"))
        .header("idempotency-key", key)
        .json(&json!({ "amount": 4200, "currency": "eur", "payment_method": "pm_card_slow" }));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    app.send(request).await
}

#[api_test]
async fn the_checkout_page_exists_only_when_the_demo_ui_setting_is_on() {
    let app = TestApp::spawn().await;
    for path in ["/demo/checkout", "/demo/checkout.js", "/demo/api/payments"] {
        app.send(app.client().get(app.url(path)))
            .await
            .assert_problem(404, "not-found");
    }

    // `serve` as an operator runs it: off unless IDEMPAY_DEMO_UI turns it on.
    let url = app.database_url();
    let serve = Instance::start(&url, &[]).await;
    assert_eq!(serve.get("/demo/checkout").await.status, 404);
    let with_demo_ui = Instance::start(&url, &[("IDEMPAY_DEMO_UI", "true")]).await;
    let page = with_demo_ui.get("/demo/checkout").await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .is_some_and(|value| value.starts_with("text/html"))
    );
}

#[api_test]
async fn the_demo_session_is_an_httponly_strict_cookie_that_lasts_minutes() {
    let app = TestApp::spawn_with(demo_ui()).await;
    let (page, _) = open_checkout(&app).await;
    let set_cookie = page.header("set-cookie").unwrap();
    let attributes: Vec<&str> = set_cookie.split(';').map(str::trim).skip(1).collect();

    assert!(attributes.contains(&"HttpOnly"), "{set_cookie}");
    assert!(attributes.contains(&"SameSite=Strict"), "{set_cookie}");
    assert!(attributes.contains(&"Path=/demo"), "{set_cookie}");
    let max_age: u64 = attributes
        .iter()
        .find_map(|attribute| attribute.strip_prefix("Max-Age="))
        .expect("a Max-Age")
        .parse()
        .unwrap();
    assert_eq!(max_age, SESSION_TTL.as_secs());
    assert!(
        (60..=3600).contains(&max_age),
        "minutes, not hours: {max_age}"
    );
    assert_eq!(page.header("cache-control"), Some("no-store"));

    // A session per load: two loads, two sessions.
    let (_, another) = open_checkout(&app).await;
    assert_ne!(set_cookie.split(';').next().unwrap(), another);
}

#[api_test]
async fn the_checkout_page_and_its_assets_never_contain_an_api_key() {
    let app = TestApp::spawn_with(demo_ui()).await;
    let (_, cookie) = open_checkout(&app).await;
    // A payment first, so that the demo account and its key exist when the page is read again.
    let paid = demo_payment(&app, Some(&cookie), &uuid::Uuid::new_v4().to_string()).await;
    assert_eq!(paid.status, 201);

    let (page, _) = open_checkout(&app).await;
    let mut served = vec![page];
    for asset in ["/demo/checkout.js", "/demo/checkout.css"] {
        let response = app.send(app.client().get(app.url(asset))).await;
        assert_eq!(response.status, 200, "{asset}");
        served.push(response);
    }
    for response in &served {
        let text = format!(
            "{:?}\n{}",
            response.headers,
            String::from_utf8_lossy(&response.body)
        );
        assert!(!text.contains("sk_"), "an API key is served: {text}");
        assert!(!text.contains(&app.api_key));
        assert!(
            !text.contains("http://") && !text.contains("https://"),
            "nothing loaded from elsewhere"
        );
    }
}

#[api_test]
async fn a_demo_api_call_without_a_live_session_is_refused_with_401_and_reaches_nothing() {
    let app = TestApp::spawn_with(demo_ui()).await;
    let key = uuid::Uuid::new_v4().to_string();

    demo_payment(&app, None, &key)
        .await
        .assert_problem(401, "unauthorized");
    let made_up = format!("{SESSION_COOKIE}=ds_{}", "a".repeat(32));
    demo_payment(&app, Some(&made_up), &key)
        .await
        .assert_problem(401, "unauthorized");
    // An API key does not stand in for the session: the demo routes ignore Authorization.
    let with_api_key = app
        .client()
        .post(app.url("/demo/api/payments"))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", &key)
        .json(&json!({ "amount": 4200, "currency": "eur" }));
    app.send(with_api_key)
        .await
        .assert_problem(401, "unauthorized");
    for path in [
        "/demo/api/payments".to_owned(),
        format!("/demo/api/idempotency_keys/{key}"),
    ] {
        app.send(app.client().get(app.url(&path)))
            .await
            .assert_problem(401, "unauthorized");
    }
    assert_eq!(app.payment_count().await, 0);
    assert_eq!(app.key_count().await, 0);
}

#[api_test]
async fn a_double_click_through_the_demo_session_pays_once_as_the_demo_account_only() {
    let app = TestApp::spawn_with(demo_ui()).await;
    let (_, cookie) = open_checkout(&app).await;
    let key = uuid::Uuid::new_v4().to_string();

    let first = tokio::spawn({
        let (app_url, cookie, key) = (app.url("/demo/api/payments"), cookie.clone(), key.clone());
        let client = app.client().clone();
        async move {
            crate::support::helpers::send(
                client
                    .post(app_url)
                    .header("cookie", cookie)
                    .header("idempotency-key", key)
                    .json(&json!({ "amount": 4200, "currency": "eur", "payment_method": "pm_card_slow" })),
            )
            .await
        }
    });
    app.wait_for_keys(1).await;
    // The second click, while the slow charge of the first is in flight.
    let second = demo_payment(&app, Some(&cookie), &key).await;
    second.assert_problem(409, "idempotency-key-in-use");
    assert!(second.header("retry-after").is_some());

    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let retried = retry_while_in_flight(|| demo_payment(&app, Some(&cookie), &key)).await;
    assert_eq!(retried.status, 201);
    assert!(retried.replayed());
    assert_eq!(retried.body, first.body);
    assert_eq!(app.payment_count().await, 1);

    // The key's timeline, as the page reads it.
    let inspection = inspected(&app, &cookie, &key).await;
    assert_eq!(inspection.status, 200);
    assert_eq!(inspection.json()["uses"][0]["state"], "completed");
    assert_eq!(inspection.json()["uses"][0]["response_status"], 201);

    // The payment is the demo account's: the page lists it, the test merchant does not see it.
    let listed = app
        .send(in_session(
            &app,
            &cookie,
            Method::GET,
            "/demo/api/payments?limit=5",
        ))
        .await;
    assert_eq!(listed.json()["data"][0]["id"], first.json()["id"]);
    let merchants = app.get("/v1/payments").await;
    assert_eq!(merchants.json()["data"], json!([]));
}

/// The "Ship" button: what "Pay" authorized is captured through the session, under a key of its
/// own, replayed; a capture without a session reaches nothing; the inspection shows both keys.
#[api_test]
async fn a_payment_authorized_through_the_demo_session_is_shipped_by_one_capture() {
    let app = TestApp::spawn_with(demo_ui()).await;
    let (_, cookie) = open_checkout(&app).await;
    let post = |path: String, key: &str, body: serde_json::Value| {
        app.send(
            app.client()
                .post(app.url(&path))
                .header("cookie", &cookie)
                .header("idempotency-key", key)
                .json(&body),
        )
    };
    let (pay_key, ship_key) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let held = post(
        "/demo/api/payments".to_owned(),
        &pay_key,
        json!({ "amount": 4200, "currency": "eur", "capture_method": "manual" }),
    )
    .await;
    assert_eq!(held.json()["status"], "requires_capture");
    let id = held.json()["id"].as_str().unwrap().to_owned();
    let capture = format!("/demo/api/payments/{id}/capture");

    let without_session = app
        .send(
            app.client()
                .post(app.url(&capture))
                .header("idempotency-key", &ship_key)
                .json(&json!({})),
        )
        .await;
    let shipped = post(capture.clone(), &ship_key, json!({})).await;
    let again = post(capture.clone(), &ship_key, json!({})).await;

    without_session.assert_problem(401, "unauthorized");
    assert_eq!(shipped.status, 200);
    assert_eq!(shipped.json()["amount_captured"], 4200);
    assert!(again.replayed());
    assert_eq!(again.body, shipped.body);
    for (key, route) in [
        (&pay_key, "POST /v1/payments"),
        (&ship_key, "POST /v1/payments/{id}/capture"),
    ] {
        let inspection = inspected(&app, &cookie, key).await;
        assert_eq!(inspection.json()["uses"][0]["route"], route);
        assert_eq!(inspection.json()["uses"][0]["state"], "completed");
    }
}

#[api_test]
async fn bad_input_through_the_demo_session_is_answered_as_the_api_answers_it() {
    let app = TestApp::spawn_with(demo_ui()).await;
    let (_, cookie) = open_checkout(&app).await;
    let request = |method: Method, path: &str| in_session(&app, &cookie, method, path);

    let no_key = request(Method::POST, "/demo/api/payments")
        .json(&json!({ "amount": 4200, "currency": "eur" }));
    app.send(no_key)
        .await
        .assert_problem(400, "invalid-idempotency-key");
    let bad_body = request(Method::POST, "/demo/api/payments")
        .header("idempotency-key", "k1")
        .json(&json!({ "amount": -1, "currency": "eur" }));
    app.send(bad_body)
        .await
        .assert_problem(400, "invalid-request");
    app.send(request(Method::GET, "/demo/api/payments?limit=many"))
        .await
        .assert_problem(400, "invalid-request");
    // Only paying, listing and inspecting a key pass: refunds and other methods do not exist here.
    app.send(request(Method::POST, "/demo/api/payments/pay_x/refunds"))
        .await
        .assert_problem(404, "not-found");
    app.send(request(Method::DELETE, "/demo/api/payments"))
        .await
        .assert_problem(405, "method-not-allowed");
    assert_eq!(app.payment_count().await, 0);
}
