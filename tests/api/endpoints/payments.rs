//! The payment resource: creating, reading, and what each test card does.

use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::{TestApp, new_key, payment};

#[api_test(citus)]
async fn a_payment_is_created_with_201_and_its_location() {
    let app = TestApp::spawn().await;
    let response = app.post_payment(&new_key(), &payment(4200)).await;

    assert_eq!(response.status, 201);
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert!(!response.replayed());
    let body = response.json();
    let id = body["id"].as_str().expect("an id");
    assert!(id.starts_with("pay_"), "{id}");
    assert_eq!(
        response.header("location"),
        Some(format!("/v1/payments/{id}").as_str())
    );
    assert_eq!(body["object"], "payment");
    assert_eq!(body["amount"], 4200);
    assert_eq!(body["currency"], "eur");
    assert_eq!(body["status"], "succeeded");
    assert_eq!(body["payment_method"], "pm_card_visa");
    assert_eq!(body["order"], "cmd_9182");
    assert!(body["created_at"].as_str().is_some());
    assert_eq!(app.payment_count().await, 1);
}

#[api_test(citus)]
async fn a_payment_can_be_read_back_in_the_same_representation() {
    let app = TestApp::spawn().await;
    let created = app.post_payment(&new_key(), &payment(4200)).await.json();

    let fetched = app.get_payment(created["id"].as_str().unwrap()).await;

    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.json(), created);
}

#[api_test]
async fn optional_fields_default_sensibly() {
    let app = TestApp::spawn().await;
    let response = app
        .post_payment(&new_key(), &json!({ "amount": 1.0, "currency": "jpy" }))
        .await;

    assert_eq!(response.status, 201);
    let body = response.json();
    assert_eq!(
        body["amount"], 1,
        "a whole number written with a decimal point is the integer"
    );
    assert_eq!(body["payment_method"], "pm_card_visa");
    assert_eq!(body["order"], json!(null));
    assert_eq!(body["description"], json!(null));
}

#[api_test]
async fn a_declined_card_records_a_declined_payment_and_answers_402() {
    let app = TestApp::spawn().await;
    let body =
        json!({ "amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined" });

    let response = app.post_payment(&new_key(), &body).await;

    let problem = response.assert_problem(402, "card-declined");
    assert_eq!(problem["decline_code"], "generic_decline");
    let id = problem["payment"]
        .as_str()
        .expect("the declined payment's id");
    let payment = app.get_payment(id).await;
    assert_eq!(payment.status, 200);
    assert_eq!(payment.json()["status"], "declined");
    assert_eq!(app.payment_count().await, 1);
}

#[api_test]
async fn another_accounts_payment_is_not_found() {
    let app = TestApp::spawn().await;
    let created = app.post_payment(&new_key(), &payment(4200)).await.json();
    let (_, other_key) = app.create_account("someone else").await;

    let response = app
        .send(
            app.client()
                .get(app.url(&format!("/v1/payments/{}", created["id"].as_str().unwrap())))
                .bearer_auth(other_key),
        )
        .await;

    response.assert_problem(404, "not-found");
}

#[api_test]
async fn unknown_and_malformed_payment_ids_are_not_found() {
    let app = TestApp::spawn().await;
    for id in [
        "pay_000000000000000000000000",
        "pay_x",
        "nothing",
        "%27%3B--",
    ] {
        app.get_payment(id).await.assert_problem(404, "not-found");
    }
}

#[api_test]
async fn health_and_readiness_answer_when_the_database_is_up() {
    let app = TestApp::spawn().await;
    for path in ["/healthz", "/readyz"] {
        let response = app.send(app.client().get(app.url(path))).await;
        assert_eq!(response.status, 200, "{path}");
    }
}

/// A body of tens of kilobytes (hashed off the async runtime) is bound to its key like any other:
/// the same document laid out differently replays, another document is refused.
#[api_test]
async fn a_large_body_is_fingerprinted_like_a_small_one() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let padded = |padding: usize, amount: i64| {
        format!(
            r#"{{"amount":{amount},{}"currency":"eur"}}"#,
            " ".repeat(padding)
        )
    };
    let send = |body: String| {
        app.send(
            app.client()
                .post(app.url("/v1/payments"))
                .bearer_auth(&app.api_key)
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(body),
        )
    };

    let first = send(padded(40_000, 4200)).await;
    assert_eq!(first.status, 201);
    let replay = send(padded(20_000, 4200)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    send(padded(40_000, 4201))
        .await
        .assert_problem(422, "idempotency-key-mismatch");
}

#[api_test(citus)]
async fn metadata_is_kept_returned_listed_in_events_and_part_of_the_key() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let tagged = json!({
        "amount": 4200, "currency": "eur",
        "metadata": { "order_id": "6735", "channel": "web" },
    });
    let created = app.post_payment(&key, &tagged).await;
    assert_eq!(created.status, 201);
    let payment = created.json();
    assert_eq!(
        payment["metadata"],
        json!({ "channel": "web", "order_id": "6735" })
    );
    let id = payment["id"].as_str().unwrap();
    assert_eq!(
        app.get_payment(id).await.json()["metadata"],
        payment["metadata"]
    );
    let listed = app.get("/v1/payments").await.json();
    assert_eq!(listed["data"][0]["metadata"], payment["metadata"]);
    // The feed lists an event once every older transaction has ended: on a loaded machine that
    // can take a moment after the 201.
    let mut events = app.get("/v1/events").await.json();
    for _ in 0..100 {
        if events["data"][0].is_object() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        events = app.get("/v1/events").await.json();
    }
    assert_eq!(
        events["data"][0]["data"]["object"]["metadata"],
        payment["metadata"]
    );

    // A payment without metadata has an empty object, never null.
    let bare = app.post_payment(&new_key(), &payment_body()).await.json();
    assert_eq!(bare["metadata"], json!({}));

    // The same key with one entry changed is another request, and the 422 names that entry.
    let changed = json!({
        "amount": 4200, "currency": "eur",
        "metadata": { "order_id": "6736", "channel": "web" },
    });
    let refused = app.post_payment(&key, &changed).await;
    let problem = refused.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(problem["mismatched_fields"], json!(["/metadata/order_id"]));
    // The entries in another order are the same request: a replay.
    let reordered = json!({
        "currency": "eur", "amount": 4200,
        "metadata": { "channel": "web", "order_id": "6735" },
    });
    let replay = app.post_payment(&key, &reordered).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, created.body);

    // Refunds carry their own.
    let refund = app
        .post_refund(
            id,
            &new_key(),
            &json!({ "amount": 100, "metadata": { "ticket": "T-9" } }),
        )
        .await;
    assert_eq!(refund.status, 201);
    assert_eq!(refund.json()["metadata"], json!({ "ticket": "T-9" }));
    let refund_id = refund.json()["id"].as_str().unwrap().to_owned();
    let read = app.get(&format!("/v1/refunds/{refund_id}")).await.json();
    assert_eq!(read["metadata"], json!({ "ticket": "T-9" }));
}

#[api_test]
async fn metadata_out_of_bounds_is_refused_naming_the_entry_and_the_key_stays_free() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let many: serde_json::Map<String, serde_json::Value> =
        (0..51).map(|n| (format!("k{n}"), json!("v"))).collect();
    let long_key = "k".repeat(41);
    for (metadata, param) in [
        (
            json!({ "note": "v".repeat(501) }),
            "/metadata/note".to_owned(),
        ),
        (json!({ "note": 7 }), "/metadata/note".to_owned()),
        (
            json!({ long_key.clone(): "v" }),
            format!("/metadata/{long_key}"),
        ),
        (serde_json::Value::Object(many), "/metadata".to_owned()),
        (json!(["a"]), "/metadata".to_owned()),
    ] {
        let body = json!({ "amount": 100, "currency": "eur", "metadata": metadata });
        let problem = app
            .post_payment(&key, &body)
            .await
            .assert_problem(400, "invalid-request");
        assert_eq!(problem["param"], param.as_str(), "{problem}");
    }
    assert_eq!(app.key_count().await, 0);
    let fifty: serde_json::Map<String, serde_json::Value> = (0..50)
        .map(|n| (format!("k{n}"), json!("v".repeat(500))))
        .collect();
    let body = json!({ "amount": 100, "currency": "eur", "metadata": fifty });
    assert_eq!(app.post_payment(&key, &body).await.status, 201);
}

fn payment_body() -> serde_json::Value {
    payment(100)
}
