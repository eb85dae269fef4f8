//! Bad input: every refusal is a problem document, and nothing is stored or burned by it.

use futures::future::join_all;
use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::{TestApp, TestResponse, new_key, payment, send};

#[api_test]
async fn invalid_idempotency_keys_are_refused_with_400_and_nothing_is_stored() {
    let app = TestApp::spawn().await;
    let too_long = "k".repeat(256);
    for key in [
        "",
        "\"\"",
        "has space",
        too_long.as_str(),
        "\"unterminated",
        "\"a\";p=1",
    ] {
        let response = app.post_payment(key, &payment(4200)).await;
        response.assert_problem(400, "invalid-idempotency-key");
    }
    let non_ascii = app
        .raw_post()
        .header(
            "idempotency-key",
            reqwest::header::HeaderValue::from_bytes(b"cl\xc3\xa9").unwrap(),
        )
        .json(&payment(4200));
    app.send(non_ascii)
        .await
        .assert_problem(400, "invalid-idempotency-key");
    let twice = app
        .raw_post()
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .json(&payment(4200));
    app.send(twice)
        .await
        .assert_problem(400, "invalid-idempotency-key");
    assert_eq!(app.key_count().await, 0);
    assert_eq!(app.payment_count().await, 0);
    let longest = app.post_payment(&"k".repeat(255), &payment(4200)).await;
    assert_eq!(longest.status, 201, "255 characters are allowed");
}

#[api_test]
async fn a_missing_idempotency_key_is_refused() {
    let app = TestApp::spawn().await;
    let response = app.send(app.raw_post().json(&payment(4200))).await;
    let problem = response.assert_problem(400, "invalid-idempotency-key");
    assert!(
        problem["detail"].as_str().unwrap().contains("required"),
        "{problem}"
    );
    assert_eq!(app.payment_count().await, 0);
}

#[api_test]
async fn an_invalid_body_is_refused_before_the_key_is_reserved() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // Each with the JSON pointer of the field at fault (`param`), as a program reads it.
    let invalid = [
        (json!({ "amount": 0, "currency": "eur" }), "/amount"),
        (json!({ "amount": 100000000, "currency": "eur" }), "/amount"),
        (json!({ "amount": 12.5, "currency": "eur" }), "/amount"),
        (
            json!({ "amount": 100, "currency": "eur", "order": "a\u{0}b" }),
            "/order",
        ),
        (
            json!({ "amount": 100, "currency": "eur", "description": "\u{0}" }),
            "/description",
        ),
        (json!({ "amount": "12", "currency": "eur" }), "/amount"),
        (json!({ "currency": "eur" }), "/amount"),
        (json!({ "amount": 100, "currency": "EUR" }), "/currency"),
        (json!({ "amount": 100, "currency": "xyz" }), "/currency"),
        (
            json!({ "amount": 100, "currency": "eur", "payment_method": "pm_card_unknown" }),
            "/payment_method",
        ),
        (
            json!({ "amount": 100, "currency": "eur", "order": "o".repeat(256) }),
            "/order",
        ),
        (
            json!({ "amount": 100, "currency": "eur", "description": "d".repeat(1001) }),
            "/description",
        ),
        (
            json!({ "amount": 100, "currency": "eur", "amont": 100 }),
            "/amont",
        ),
        // An array is read as the fields in order; its second item is the currency.
        (json!([1, 2]), "/1"),
    ];
    for (body, param) in &invalid {
        let response = app.post_payment(&key, body).await;
        let problem = response.assert_problem(400, "invalid-request");
        assert!(problem["detail"].as_str().unwrap().len() > 20, "{problem}");
        assert_eq!(problem["param"], *param, "{body}: {problem}");
    }
    let problem = post_json_text(&app, &key, r#"{"amount": 100, "currency": "eur""#)
        .await
        .assert_problem(400, "invalid-request");
    assert!(problem.get("param").is_none(), "no one field's: {problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .starts_with("The request body is not valid JSON"),
        "{problem}"
    );
    let duplicated = r#"{"amount": 100, "amount": 200, "currency": "eur"}"#;
    post_json_text(&app, &key, duplicated)
        .await
        .assert_problem(400, "invalid-request");
    assert_eq!(app.key_count().await, 0);

    assert_the_key_is_free(&app, &key).await;
}

#[api_test]
async fn an_amount_with_a_fraction_too_small_for_a_float_is_refused_and_the_key_stays_free() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // As an f64 this is 4200.0 exactly: only its text shows the fraction.
    let fractional = r#"{"amount": 4200.0000000000001, "currency": "eur"}"#;
    let problem = post_json_text(&app, &key, fractional)
        .await
        .assert_problem(400, "invalid-request");
    super::assert_refuses_a_fractional_amount(&problem);
    assert_eq!(app.key_count().await, 0);
    assert_eq!(app.payment_count().await, 0);

    assert_the_key_is_free(&app, &key).await;
}

/// `POST /v1/payments` under `key` with `text` as its JSON body, sent as written: JSON that
/// `serde_json::Value` cannot hold (malformed, a field twice, a fraction past a float's).
async fn post_json_text(app: &TestApp, key: &str, text: &'static str) -> TestResponse {
    let request = app
        .raw_post()
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(text);
    app.send(request).await
}

/// Asserts a refusal did not burn `key`: a valid payment under it executes (it is no replay).
async fn assert_the_key_is_free(app: &TestApp, key: &str) {
    let valid = app.post_payment(key, &payment(4200)).await;
    assert_eq!(valid.status, 201);
    assert!(!valid.replayed());
}

#[api_test]
async fn a_body_neither_json_nor_a_form_is_refused_with_415() {
    let app = TestApp::spawn().await;
    for content_type in ["text/plain", "multipart/form-data; boundary=x"] {
        let other = app
            .raw_post()
            .header("idempotency-key", new_key())
            .header("content-type", content_type)
            .body("amount=100&currency=eur");
        let problem = app
            .send(other)
            .await
            .assert_problem(415, "unsupported-media-type");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("application/x-www-form-urlencoded"),
            "{problem}"
        );
    }
    let untyped = app
        .raw_post()
        .header("idempotency-key", new_key())
        .body(r#"{"amount": 100, "currency": "eur"}"#);
    app.send(untyped)
        .await
        .assert_problem(415, "unsupported-media-type");
    let bodiless = app.raw_post().header("idempotency-key", new_key());
    let problem = app
        .send(bodiless)
        .await
        .assert_problem(400, "invalid-request");
    assert!(
        problem["detail"].as_str().unwrap().contains("amount"),
        "{problem}"
    );
    assert_eq!(app.key_count().await, 0);
}

#[api_test]
async fn a_body_over_64_kib_is_refused_with_413() {
    let app = TestApp::spawn().await;
    let huge = json!({ "amount": 100, "currency": "eur", "description": "d".repeat(70 * 1024) });
    let response = app.post_payment(&new_key(), &huge).await;
    response.assert_problem(413, "payload-too-large");
    assert_eq!(app.key_count().await, 0);
}

#[api_test]
async fn a_missing_or_wrong_api_key_is_refused_with_401() {
    let app = TestApp::spawn().await;
    let anonymous = app
        .client()
        .post(app.url("/v1/payments"))
        .header("idempotency-key", new_key())
        .json(&payment(100));
    let response = app.send(anonymous).await;
    let missing = response.assert_problem(401, "unauthorized");
    assert!(response.header("www-authenticate").is_some());

    // Each refusal says what to fix, and none whether another account exists.
    let wrong = format!("sk_{}", "A".repeat(40));
    let response = app.post_payment_as(&wrong, &new_key(), &payment(100)).await;
    let unknown = response.assert_problem(401, "unauthorized");
    let response = app
        .post_payment_as("not-a-key", &new_key(), &payment(100))
        .await;
    let malformed = response.assert_problem(401, "unauthorized");
    let as_password = app
        .send(
            app.client()
                .post(app.url("/v1/payments"))
                .basic_auth("", Some(&app.api_key))
                .header("idempotency-key", new_key())
                .json(&payment(100)),
        )
        .await;
    let as_password = as_password.assert_problem(401, "unauthorized");
    let details: Vec<&str> = [&missing, &unknown, &malformed, &as_password]
        .iter()
        .map(|problem| problem["detail"].as_str().unwrap())
        .collect();
    assert!(details[0].starts_with("No API key was sent"), "{details:?}");
    assert!(
        details[1].starts_with("No account has this API key"),
        "{details:?}"
    );
    assert!(
        details[2].starts_with("The API key is malformed"),
        "{details:?}"
    );
    assert!(details[3].contains("as the user name"), "{details:?}");
    assert_eq!(app.key_count().await, 0, "no refusal reserved a key");
    let paid = app.paid(100).await;
    for (method, path) in authenticated_routes(&paid) {
        let anonymous = app
            .client()
            .request(method.clone(), app.url(&path))
            .header("idempotency-key", new_key())
            .json(&json!({}));
        app.send(anonymous)
            .await
            .assert_problem(401, "unauthorized");
    }
    assert_eq!(
        app.key_count().await,
        1,
        "only the payment made above holds a key"
    );
}

#[api_test]
async fn the_api_key_is_taken_as_the_user_name_of_http_basic_as_stripe_takes_it() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // `curl -u sk_…:`: the key as the user name, an empty password.
    let basic = app
        .send(
            app.client()
                .post(app.url("/v1/payments"))
                .basic_auth(&app.api_key, Some(""))
                .header("idempotency-key", &key)
                .json(&payment(4200)),
        )
        .await;
    basic.assert_status(201);
    // The same account: a bearer retry of the same key replays it.
    let bearer = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(bearer.status, 201);
    assert!(bearer.replayed());
    assert_eq!(bearer.body, basic.body);
    let read = app
        .send(
            app.client()
                .get(app.url("/v1/payments"))
                .basic_auth(&app.api_key, None::<&str>),
        )
        .await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["data"].as_array().unwrap().len(), 1);
}

#[api_test]
async fn unknown_routes_and_methods_answer_problem_documents() {
    let app = TestApp::spawn().await;
    let unknown = app.send(app.client().get(app.url("/v2/nothing"))).await;
    unknown.assert_problem(404, "not-found");
    let wrong_method = app
        .send(
            app.client()
                .delete(app.url("/v1/payments"))
                .bearer_auth(&app.api_key),
        )
        .await;
    wrong_method.assert_problem(405, "method-not-allowed");
    let wrong_method = app.send(app.client().post(app.url("/healthz"))).await;
    wrong_method.assert_problem(405, "method-not-allowed");
}

#[api_test]
async fn without_its_database_the_service_answers_503_and_is_not_ready() {
    // Nothing listens on port 1: every connection attempt is refused at once.
    let pool = idempay::db::pool("postgres://postgres@127.0.0.1:1/idempay").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let app = idempay::app::Application::build(Default::default(), pool, listener).unwrap();
    let base = format!("http://{}", app.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(app.run_until_stopped(stop.clone().cancelled_owned()));
    let client = reqwest::Client::new();

    let ready = send(client.get(format!("{base}/readyz"))).await;
    let problem = ready.assert_problem(503, "service-unavailable");
    assert!(ready.header("retry-after").is_some(), "{problem}");
    let alive = send(client.get(format!("{base}/healthz"))).await;
    assert_eq!(alive.status, 200, "the process itself is alive");

    // Each request waits out the pool's acquire timeout, so they are sent together.
    let api_key = format!("sk_{}", "a".repeat(40));
    let answers = join_all(
        authenticated_routes("pay_000000000000000000000000")
            .into_iter()
            .map(|(method, path)| {
                send(
                    client
                        .request(method, format!("{base}{path}"))
                        .bearer_auth(&api_key)
                        .header("idempotency-key", new_key())
                        .json(&payment(100)),
                )
            }),
    )
    .await;
    for answer in answers {
        answer.assert_problem(503, "service-unavailable");
        assert!(answer.header("retry-after").is_some());
    }
    stop.cancel();
}

/// Every route that needs an API key, with `payment` for the routes about one payment.
fn authenticated_routes(payment: &str) -> Vec<(reqwest::Method, String)> {
    use reqwest::Method;
    vec![
        (Method::POST, "/v1/payments".to_owned()),
        (Method::GET, "/v1/payments".to_owned()),
        (Method::GET, format!("/v1/payments/{payment}")),
        (Method::POST, format!("/v1/payments/{payment}/refunds")),
        (Method::GET, format!("/v1/payments/{payment}/refunds")),
        (
            Method::GET,
            "/v1/refunds/re_000000000000000000000000".to_owned(),
        ),
    ]
}

#[api_test]
async fn ids_that_cannot_be_decoded_name_nothing() {
    let app = TestApp::spawn().await;
    for path in [
        "/v1/payments/%ff",
        "/v1/payments/%ff/refunds",
        "/v1/refunds/%ff",
        "/v1/refunds/%00",
        "/v1/payments/pay_000000000000000000000000/refunds?starting_after=%00",
        "/problems/%ff",
    ] {
        app.get(path).await.assert_problem(404, "not-found");
    }
}

#[api_test]
async fn the_service_sessions_bound_statements_locks_and_idle_transactions() {
    let app = TestApp::spawn().await;
    let pool = idempay::db::pool(&app.database_url()).unwrap();
    for (setting, expected) in [
        ("statement_timeout", "10s"),
        ("lock_timeout", "5s"),
        ("idle_in_transaction_session_timeout", "30s"),
    ] {
        let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {setting}")))
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(value, expected, "{setting}");
    }
    // And none weakens durability: a payment answered 201 must survive a crash of the database,
    // so the service's sessions keep the server's `synchronous_commit` (the test's server runs
    // with it off, so its value cannot tell; where it comes from can).
    let durability = "SELECT setting, source FROM pg_settings WHERE name = 'synchronous_commit'";
    let service: (String, String) = sqlx::query_as(durability).fetch_one(&pool).await.unwrap();
    let server: (String, String) = sqlx::query_as(durability).fetch_one(&app.db).await.unwrap();
    assert_eq!(
        service, server,
        "the service's sessions set synchronous_commit"
    );
}

/// A path's id that cannot be one of its kind reads as one that names nothing: the same 404 and
/// the same sentence, so a 404 never tells which ids exist. On a keyed route it is refused before
/// the key is reserved (the body, empty here, is not even read), so the key stays free for the
/// call the client meant.
#[api_test]
async fn an_id_of_another_kind_is_the_404_of_a_missing_one_and_reserves_no_key() {
    let app = TestApp::spawn().await;
    let missing = "pay_000000000000000000000000";
    let too_long = "d".repeat(101);
    for (path, detail) in [
        (
            format!("/v1/payments/{missing}"),
            format!("No payment `{missing}`."),
        ),
        (
            "/v1/payments/re_000000000000000000000000".to_owned(),
            "No payment `re_000000000000000000000000`.".to_owned(),
        ),
        (
            format!("/v1/payments/{missing}/refunds"),
            format!("No payment `{missing}`."),
        ),
        (
            "/v1/payments/pay_short/refunds".to_owned(),
            "No payment `pay_short`.".to_owned(),
        ),
        (
            format!("/v1/refunds/{missing}"),
            format!("No refund `{missing}`."),
        ),
        (
            "/v1/events/evt_short".to_owned(),
            "No event `evt_short`.".to_owned(),
        ),
        (
            "/v1/events/evt_short/attempts".to_owned(),
            "No event `evt_short`.".to_owned(),
        ),
        (
            "/v1/webhook_endpoints/we_short".to_owned(),
            "No webhook endpoint `we_short`.".to_owned(),
        ),
        (
            format!("/v1/disputes/{too_long}"),
            format!("No dispute `{too_long}`."),
        ),
        (
            "/v1/disputes/dp_none".to_owned(),
            "No dispute `dp_none`.".to_owned(),
        ),
    ] {
        let problem = app.get(&path).await.assert_problem(404, "not-found");
        assert_eq!(problem["detail"], detail, "GET {path}");
    }
    let deleted = app
        .send(
            app.client()
                .delete(app.url("/v1/webhook_endpoints/we_short"))
                .bearer_auth(&app.api_key),
        )
        .await
        .assert_problem(404, "not-found");
    assert_eq!(deleted["detail"], "No webhook endpoint `we_short`.");

    for (path, detail) in [
        ("/v1/payments/pay_short/capture", "No payment `pay_short`."),
        ("/v1/payments/pay_short/cancel", "No payment `pay_short`."),
        ("/v1/payments/pay_short/refunds", "No payment `pay_short`."),
        ("/v1/events/evt_short/retry", "No event `evt_short`."),
    ] {
        let problem = app
            .post_keyed(path, &new_key(), &json!({}))
            .await
            .assert_problem(404, "not-found");
        assert_eq!(problem["detail"], detail, "POST {path}");
    }
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM idempotency_keys")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(keys, 0, "a refused id reserves no key");
}
