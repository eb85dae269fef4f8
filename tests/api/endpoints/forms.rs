//! Form-encoded bodies, as Stripe's SDKs and every `curl -d` send them: every keyed `POST` takes
//! `application/x-www-form-urlencoded` with Stripe's bracket notation, its values the types the
//! JSON body has, and a form and its JSON twin are one request to the key: a retry may switch
//! encodings and still replay, and a change is a 422 naming the field as JSON's would.

use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::{TestApp, TestResponse, new_key};

/// `POST path` with the form `body` under `key`, as `curl -d` sends it.
async fn post_form(app: &TestApp, path: &str, key: &str, body: &str) -> TestResponse {
    let request = reqwest::Client::new()
        .post(app.url(path))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", key)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned());
    app.send(request).await
}

#[api_test]
async fn a_form_encoded_payment_replays_as_json_under_the_same_key() {
    let app = TestApp::spawn().await;
    let key = new_key();

    let form = "amount=1000&currency=eur&description=Two%20books&metadata[order_id]=6735";
    let created = post_form(&app, "/v1/payments", &key, form).await;

    created.assert_status(201);
    let payment = created.json();
    assert_eq!(payment["amount"], 1000);
    assert_eq!(payment["description"], "Two books");
    assert_eq!(
        payment["metadata"],
        json!({ "order_id": "6735" }),
        "text stays text"
    );
    let twin = json!({
        "currency": "eur", "amount": 1000, "metadata": { "order_id": "6735" },
        "description": "Two books"
    });
    let replayed = app.post_payment(&key, &twin).await;
    replayed.assert_status(201);
    assert!(replayed.replayed(), "the JSON twin is the same request");
    assert_eq!(replayed.body, created.body, "byte for byte");
    let again = post_form(&app, "/v1/payments", &key, form).await;
    assert!(again.replayed());
    assert_eq!(app.payment_count().await, 1);
}

#[api_test]
async fn a_changed_field_in_form_encoding_is_a_422_naming_it() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.post_payment(
        &key,
        &json!({ "amount": 1000, "currency": "eur", "metadata": { "order_id": "6735" } }),
    )
    .await
    .assert_status(201);

    let changed = post_form(
        &app,
        "/v1/payments",
        &key,
        "amount=1000&currency=eur&metadata[order_id]=6736",
    )
    .await;

    let problem = changed.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(problem["mismatched_fields"], json!(["/metadata/order_id"]));
    assert_eq!(app.payment_count().await, 1);
}

/// A value of the wrong type is a 400 naming the field by its JSON pointer, as a JSON body's is;
/// names that do not make one document are a 400 saying why; nothing is reserved either way.
#[api_test]
async fn a_malformed_form_is_a_400_naming_its_field_and_reserves_nothing() {
    let app = TestApp::spawn().await;
    let key = new_key();

    let wrong = post_form(&app, "/v1/payments", &key, "amount=ten&currency=eur").await;
    let problem = wrong.assert_problem(400, "invalid-request");
    assert_eq!(problem["param"], "/amount", "{problem}");
    let twice = post_form(&app, "/v1/payments", &key, "amount=1&amount=2&currency=eur").await;
    let problem = twice.assert_problem(400, "invalid-request");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("not valid form data: the field `amount` is given twice"),
        "{problem}"
    );
    assert_eq!(app.key_count().await, 0);
    post_form(&app, "/v1/payments", &key, "amount=100&currency=eur")
        .await
        .assert_status(201);
}

/// A capture and a refund of a manual payment, each form-encoded: the keyed routes of a payment
/// take forms as its creation does.
#[api_test]
async fn a_capture_and_a_refund_take_form_bodies() {
    let app = TestApp::spawn().await;
    let authorized = post_form(
        &app,
        "/v1/payments",
        &new_key(),
        "amount=5000&currency=eur&capture_method=manual",
    )
    .await;
    authorized.assert_status(201);
    let id = authorized.json()["id"].as_str().unwrap().to_owned();

    let captured = post_form(
        &app,
        &format!("/v1/payments/{id}/capture"),
        &new_key(),
        "amount_to_capture=4000",
    )
    .await;
    captured.assert_status(200);
    assert_eq!(captured.json()["amount_captured"], 4000);
    let refunded = post_form(
        &app,
        &format!("/v1/payments/{id}/refunds"),
        &new_key(),
        "amount=1500&reason=requested_by_customer&metadata[ticket]=42",
    )
    .await;
    refunded.assert_status(201);
    assert_eq!(refunded.json()["amount"], 1500);
    assert_eq!(refunded.json()["metadata"], json!({ "ticket": "42" }));
}
