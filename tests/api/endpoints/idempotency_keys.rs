//! `GET /v1/idempotency_keys/{key}`: a key's life, route by route, as its account sees it.

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::{
    TestApp, TestResponse, new_key, payment, reserve_as_a_dead_process, slow_payment,
    with_slow_charge,
};

impl TestApp {
    /// `GET /v1/idempotency_keys/{key}` with this app's account; `key` goes into the path as is.
    async fn inspect(&self, key: &str) -> TestResponse {
        self.get(&format!("/v1/idempotency_keys/{key}")).await
    }

    /// `GET path` with another account's API key.
    async fn get_as(&self, api_key: &str, path: &str) -> TestResponse {
        self.send(self.client().get(self.url(path)).bearer_auth(api_key))
            .await
    }
}

#[api_test]
async fn a_completed_key_shows_its_response_status_location_and_fingerprint() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let paid = app.post_payment(&key, &payment(4200)).await;

    let shown = app.inspect(&key).await;

    assert_eq!(shown.status, 200);
    let body = shown.json();
    assert_eq!(body["key"], key.as_str());
    let uses = body["uses"].as_array().unwrap();
    assert_eq!(uses.len(), 1, "{body}");
    let used = &uses[0];
    assert_eq!(used["route"], "POST /v1/payments");
    assert_eq!(used["state"], "completed");
    assert_eq!(used["response_status"], 201);
    assert_eq!(used["response_location"], paid.header("location").unwrap());
    assert_eq!(used["locked_until"], json!(null));
    assert_eq!(used["takeovers"], 0);
    assert!(used["completed_at"].as_str().is_some(), "{used}");
    assert!(used["downstream_key"].as_str().is_some(), "{used}");
    let fingerprint: String = sqlx::query_scalar(
        "SELECT encode(request_hash, 'hex') FROM idempotency_keys WHERE idem_key = $1",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(used["fingerprint"], fingerprint);
}

#[api_test]
async fn a_key_in_progress_shows_its_lease_and_recovery_point() {
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_millis(1500))).await;
    let key = new_key();
    let running = app.start_payment(&key, &slow_payment(100)).await;

    let shown = app.inspect(&key).await;

    assert_eq!(shown.status, 200);
    let used = &shown.json()["uses"][0];
    assert_eq!(used["state"], "in_progress");
    assert!(used["locked_until"].as_str().is_some(), "{used}");
    assert_eq!(used["recovery_point"], "payment.charge_requested");
    assert!(used["downstream_key"].as_str().is_some(), "{used}");
    assert_eq!(used["response_status"], json!(null));
    assert_eq!(used["completed_at"], json!(null));
    assert_eq!(running.await.unwrap().status, 201);
    assert_eq!(
        app.inspect(&key).await.json()["uses"][0]["state"],
        "completed"
    );
}

#[api_test(citus)]
async fn a_key_taken_over_once_counts_one_takeover() {
    let app = TestApp::spawn().await;
    let key = new_key();
    reserve_as_a_dead_process(&app, &key, &payment(4200), "now() - interval '1 second'").await;

    let retried = app.post_payment(&key, &payment(4200)).await;

    assert_eq!(retried.status, 201);
    let used = &app.inspect(&key).await.json()["uses"][0];
    assert_eq!(used["takeovers"], 1, "{used}");
    assert_eq!(used["state"], "completed");
}

#[api_test]
async fn a_key_used_on_two_routes_shows_one_entry_per_route() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let paid = app.post_payment(&key, &payment(4200)).await;
    let id = paid.json()["id"].as_str().unwrap().to_owned();
    let refunded = app.post_refund(&id, &key, &json!({ "amount": 200 })).await;
    assert_eq!(refunded.status, 201);

    let body = app.inspect(&key).await.json();

    let routes: Vec<&str> = body["uses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|used| used["route"].as_str().unwrap())
        .collect();
    assert_eq!(
        routes,
        ["POST /v1/payments", "POST /v1/payments/{id}/refunds"]
    );
    assert_eq!(
        body["uses"][1]["response_location"],
        refunded.header("location").unwrap()
    );
}

#[api_test]
async fn another_account_s_key_is_not_found_exactly_like_an_unknown_key() {
    let app = TestApp::spawn().await;
    let (_, other_api_key) = app.create_account("another merchant").await;
    let key = new_key();
    let theirs = app
        .post_payment_as(&other_api_key, &key, &payment(4200))
        .await;
    assert_eq!(theirs.status, 201);

    let hidden = app.inspect(&key).await;
    let unknown = app.inspect(&new_key()).await;

    hidden.assert_problem(404, "not-found");
    unknown.assert_problem(404, "not-found");
    assert_eq!(hidden.body, unknown.body, "nothing tells the two apart");
    // Its own account sees it.
    let own = app
        .get_as(&other_api_key, &format!("/v1/idempotency_keys/{key}"))
        .await;
    assert_eq!(own.status, 200);
}

#[api_test]
async fn the_processor_s_own_keys_are_never_shown() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.post_payment(&key, &payment(4200)).await;
    let downstream: String =
        sqlx::query_scalar("SELECT idem_key FROM idempotency_keys WHERE scope LIKE 'processor:%'")
            .fetch_one(&app.db)
            .await
            .unwrap();

    app.inspect(&downstream)
        .await
        .assert_problem(404, "not-found");
    // The account's own key, whose downstream key that is, is shown with it.
    let own = app.inspect(&key).await;
    assert_eq!(own.status, 200);
    assert_eq!(own.json()["uses"][0]["downstream_key"], downstream.as_str());
}

#[api_test]
async fn a_malformed_key_is_refused_with_400() {
    let app = TestApp::spawn().await;
    let too_long = "k".repeat(256);
    for malformed in ["a%20b", "%22abc", too_long.as_str(), "cl%C3%A9"] {
        let problem = app
            .inspect(malformed)
            .await
            .assert_problem(400, "invalid-idempotency-key");
        assert!(
            !problem["detail"].as_str().unwrap().contains("header"),
            "{problem}"
        );
    }
}

#[api_test]
async fn a_key_with_a_slash_is_found_percent_encoded() {
    let app = TestApp::spawn().await;
    let key = format!("order/{}", new_key());
    assert_eq!(app.post_payment(&key, &payment(4200)).await.status, 201);

    let shown = app.inspect(&key.replace('/', "%2F")).await;

    assert_eq!(shown.status, 200);
    assert_eq!(shown.json()["key"], key.as_str());
}
