//! Authorize now, capture later: a manual payment holds its amount until a capture takes it (all or
//! part) or a cancel releases it, each once per key, and never twice under a new key.

use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::checks::manual;
use crate::support::helpers::{TestApp, new_key, payment, wait_until};

/// The processor's charge of `payment`: its capture state and what it took.
async fn at_the_processor(app: &TestApp, payment: &str) -> (String, Option<i64>) {
    sqlx::query_as(
        "SELECT c.capture_state, c.amount_captured FROM processor_charges c
         JOIN payments p ON p.charge = c.id WHERE p.id = $1",
    )
    .bind(payment)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The types of the events written about `payment`, oldest first.
async fn events_of(app: &TestApp, payment: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT type FROM events WHERE account_id = $1 AND convert_from(body, 'UTF8')::jsonb -> 'data' -> 'object' ->> 'id' = $2
         ORDER BY created_at, id",
    )
    .bind(&app.account_id)
    .bind(payment)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// Waits until the processor holds a `capture` or `void` call in progress under its key.
async fn until_at_the_processor(app: &TestApp, call: &str) {
    let what = format!("the {call} is at the processor");
    let scope = format!("processor:POST /v1/charges/%/{call}");
    wait_until(&what, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM idempotency_keys
                            WHERE scope LIKE $1 AND status = 'in_progress')",
        )
        .bind(&scope)
        .fetch_one(&app.db)
        .await
        .unwrap()
    })
    .await;
}

#[api_test(citus)]
async fn a_manual_payment_is_authorized_and_an_automatic_one_captured_in_full() {
    let app = TestApp::spawn().await;

    let authorized = app.post_payment(&new_key(), &manual(5000)).await;
    let automatic = app.post_payment(&new_key(), &payment(4200)).await;

    assert_eq!(authorized.status, 201);
    let held = authorized.json();
    assert_eq!(held["status"], "requires_capture");
    assert_eq!(held["capture_method"], "manual");
    assert_eq!(
        (&held["amount_capturable"], &held["amount_captured"]),
        (&json!(5000), &json!(0))
    );
    let id = held["id"].as_str().unwrap();
    assert_eq!(
        at_the_processor(&app, id).await,
        ("requires_capture".to_owned(), Some(0))
    );
    assert_eq!(events_of(&app, id).await, ["payment.authorized"]);
    let paid = automatic.json();
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(paid["capture_method"], "automatic");
    assert_eq!(
        (&paid["amount_captured"], &paid["amount_capturable"]),
        (&json!(4200), &json!(0))
    );
    // Read back as written.
    assert_eq!(app.get_payment(id).await.json(), held);
}

#[api_test(citus)]
async fn a_partial_capture_takes_part_once_its_replay_is_byte_for_byte_and_a_new_key_is_refused() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();
    let body = json!({ "amount_to_capture": 3000 });

    let captured = app.post_capture(&id, &key, &body).await;
    let replay = app.post_capture(&id, &key, &body).await;
    let again = app.post_capture(&id, &new_key(), &json!({})).await;

    captured.assert_status(200);
    let payment = captured.json();
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(
        (&payment["amount_captured"], &payment["amount_capturable"]),
        (&json!(3000), &json!(0))
    );
    assert!(replay.replayed());
    assert_eq!(replay.body, captured.body);
    let refused = again.assert_problem(409, "payment-unexpected-state");
    assert_eq!(refused["payment"], id.as_str());
    assert!(
        refused["detail"].as_str().unwrap().contains("`succeeded`"),
        "the refusal names the state: {refused}"
    );
    assert_eq!(
        at_the_processor(&app, &id).await,
        ("captured".to_owned(), Some(3000)),
        "one capture of 3000 at the processor"
    );
    assert_eq!(
        events_of(&app, &id).await,
        ["payment.authorized", "payment.captured"]
    );
}

#[api_test]
async fn a_capture_key_reused_with_another_amount_is_refused_with_the_fields_that_differ() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();
    app.post_capture(&id, &key, &json!({ "amount_to_capture": 1000 }))
        .await;

    let other = app
        .post_capture(&id, &key, &json!({ "amount_to_capture": 2000 }))
        .await;

    let problem = other.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(problem["mismatched_fields"], json!(["/amount_to_capture"]));
    assert_eq!(
        at_the_processor(&app, &id).await,
        ("captured".to_owned(), Some(1000))
    );
}

#[api_test]
async fn a_capture_in_flight_answers_its_retry_409_with_retry_after_then_its_result() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    // The barrier: the test holds the processor's charge, which the capture locks to capture it.
    let barrier = super::hold_the_charge(&app, &id).await;
    let (key, all) = (new_key(), json!({}));

    let (first, meanwhile) = tokio::join!(app.post_capture(&id, &key, &all), async {
        until_at_the_processor(&app, "capture").await;
        let meanwhile = app.post_capture(&id, &key, &all).await;
        barrier.rollback().await.unwrap();
        meanwhile
    });

    meanwhile.assert_problem(409, "idempotency-key-in-use");
    assert!(meanwhile.header("retry-after").is_some());
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["amount_captured"], 5000);
    let replay = app.post_capture(&id, &key, &json!({})).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
}

#[api_test(citus)]
async fn a_cancel_releases_the_authorization_and_a_capture_after_it_is_refused() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();
    let body = json!({ "cancellation_reason": "requested_by_customer" });

    let canceled = app.post_cancel(&id, &key, &body).await;
    let replay = app.post_cancel(&id, &key, &body).await;
    let capture = app.post_capture(&id, &new_key(), &json!({})).await;
    let cancel_again = app.post_cancel(&id, &new_key(), &json!({})).await;

    canceled.assert_status(200);
    let payment = canceled.json();
    assert_eq!(payment["status"], "canceled");
    assert_eq!(payment["cancellation_reason"], "requested_by_customer");
    assert!(payment["canceled_at"].is_string());
    assert_eq!(
        (&payment["amount_captured"], &payment["amount_capturable"]),
        (&json!(0), &json!(0))
    );
    assert!(replay.replayed());
    assert_eq!(replay.body, canceled.body);
    let refused = capture.assert_problem(409, "payment-unexpected-state");
    assert!(refused["detail"].as_str().unwrap().contains("`canceled`"));
    cancel_again.assert_problem(409, "payment-unexpected-state");
    assert_eq!(
        at_the_processor(&app, &id).await,
        ("voided".to_owned(), Some(0))
    );
    assert_eq!(
        events_of(&app, &id).await,
        ["payment.authorized", "payment.canceled"]
    );
    // Nothing was captured: nothing can be refunded.
    app.post_refund(&id, &new_key(), &json!({}))
        .await
        .assert_problem(400, "payment-not-refundable");
}

#[api_test]
async fn an_automatic_payment_cannot_be_captured_or_canceled_and_the_refusal_is_replayed() {
    let app = TestApp::spawn().await;
    let paid = app.paid(4200).await;
    let key = new_key();

    let capture = app.post_capture(&paid, &key, &json!({})).await;
    let replay = app.post_capture(&paid, &key, &json!({})).await;
    let cancel = app.post_cancel(&paid, &new_key(), &json!({})).await;

    capture.assert_problem(409, "payment-unexpected-state");
    assert!(replay.replayed());
    assert_eq!(replay.body, capture.body);
    cancel.assert_problem(409, "payment-unexpected-state");
    assert_eq!(app.get_payment(&paid).await.json()["status"], "succeeded");
}

#[api_test]
async fn a_capture_beyond_the_authorization_is_refused_and_nothing_is_captured() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();

    let over = app
        .post_capture(&id, &key, &json!({ "amount_to_capture": 5001 }))
        .await;
    let replay = app
        .post_capture(&id, &key, &json!({ "amount_to_capture": 5001 }))
        .await;

    let problem = over.assert_problem(400, "capture-exceeds-authorization");
    assert_eq!(problem["param"], "/amount_to_capture");
    assert!(replay.replayed());
    assert_eq!(
        at_the_processor(&app, &id).await,
        ("requires_capture".to_owned(), Some(0))
    );
    let whole = app.post_capture(&id, &new_key(), &json!({})).await;
    assert_eq!(whole.json()["amount_captured"], 5000);
}

#[api_test]
async fn refunds_follow_the_amount_captured() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    app.post_refund(&id, &new_key(), &json!({}))
        .await
        .assert_problem(400, "payment-not-refundable");
    app.post_capture(&id, &new_key(), &json!({ "amount_to_capture": 3000 }))
        .await;

    app.post_refund(&id, &new_key(), &json!({ "amount": 3001 }))
        .await
        .assert_problem(400, "refund-exceeds-payment");
    let all = app.post_refund(&id, &new_key(), &json!({})).await;

    all.assert_status(201);
    assert_eq!(all.json()["amount"], 3000);
    let payment = app.get_payment(&id).await.json();
    assert_eq!(payment["status"], "refunded");
    assert_eq!(payment["amount_refunded"], 3000);
}

#[api_test]
async fn bad_captures_and_cancels_are_refused_before_anything_is_reserved() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    let key = new_key();

    for body in [
        json!({ "amount_to_capture": 0 }),
        json!({ "amount_to_capture": 12.5 }),
        json!({ "amount": 100 }),
    ] {
        app.post_capture(&id, &key, &body)
            .await
            .assert_problem(400, "invalid-request");
    }
    for body in [
        json!({ "cancellation_reason": "expired" }),
        json!({ "reason": "duplicate" }),
    ] {
        app.post_cancel(&id, &key, &body)
            .await
            .assert_problem(400, "invalid-request");
    }
    app.post_capture("pay_unknown", &new_key(), &json!({}))
        .await
        .assert_problem(404, "not-found");
    app.post_capture("pay_000000000000000000000000", &new_key(), &json!({}))
        .await
        .assert_problem(404, "not-found");
    // The key was never reserved: it still captures.
    let captured = app.post_capture(&id, &key, &json!({})).await;
    assert_eq!(captured.status, 200);
}

#[api_test]
async fn a_cancel_key_reused_with_another_reason_is_refused_and_a_cancel_in_flight_answers_409() {
    let app = TestApp::spawn().await;
    let id = app.authorized(5000).await;
    // The barrier: the test holds the processor's charge, which the void locks to void it.
    let barrier = super::hold_the_charge(&app, &id).await;
    let (key, abandoned) = (new_key(), json!({ "cancellation_reason": "abandoned" }));

    let (first, (meanwhile, other)) = tokio::join!(app.post_cancel(&id, &key, &abandoned), async {
        until_at_the_processor(&app, "void").await;
        let meanwhile = app.post_cancel(&id, &key, &abandoned).await;
        let other = app
            .post_cancel(&id, &key, &json!({ "cancellation_reason": "fraudulent" }))
            .await;
        barrier.rollback().await.unwrap();
        (meanwhile, other)
    });

    meanwhile.assert_problem(409, "idempotency-key-in-use");
    assert!(meanwhile.header("retry-after").is_some());
    let problem = other.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(
        problem["mismatched_fields"],
        json!(["/cancellation_reason"])
    );
    first.assert_status(200);
    assert_eq!(first.json()["cancellation_reason"], "abandoned");
    let replay = app.post_cancel(&id, &key, &abandoned).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(
        at_the_processor(&app, &id).await,
        ("voided".to_owned(), Some(0))
    );
}

/// `serve` with its embedded processor: an authorization nobody captures is released by that
/// processor's expiry job once `IDEMPAY_PROCESSOR_AUTHORIZATION_TTL` is up, and its
/// `charge.expired` reaches this idempay's own intake (signed with a secret made up for the
/// process, since none is configured here), so the payment becomes `canceled` (`expired`) and a
/// capture of it is refused naming that state. Without the report, the payment stayed
/// `requires_capture` for good, its capture and cancel both refused by the processor.
#[api_test]
async fn an_authorization_the_embedded_processor_releases_cancels_its_payment() {
    let mut settings = idempay::config::Settings::default();
    settings.processor.authorization_ttl = std::time::Duration::from_secs(3);
    settings.shared.expiry_interval = std::time::Duration::from_millis(300);
    let app = TestApp::spawn_with(settings).await;
    let held = app.authorized(5000).await;
    let kept = app.authorized(2000).await;
    app.post_capture(&kept, &new_key(), &json!({}))
        .await
        .assert_status(200);

    wait_until("the lapsed authorization cancels its payment", || async {
        app.get_payment(&held).await.json()["status"] == "canceled"
    })
    .await;

    let payment = app.get_payment(&held).await.json();
    assert_eq!(payment["cancellation_reason"], "expired");
    assert_eq!(payment["amount_capturable"], 0);
    assert_eq!(
        at_the_processor(&app, &held).await,
        ("expired".to_owned(), Some(0))
    );
    let refused = app.post_capture(&held, &new_key(), &json!({})).await;
    let problem = refused.assert_problem(409, "payment-unexpected-state");
    assert!(
        problem["detail"].as_str().unwrap().contains("canceled"),
        "{problem}"
    );
    assert_eq!(
        app.get_payment(&kept).await.json()["status"],
        "succeeded",
        "a captured one is not the expiry's"
    );
    // Anyone else's delivery is still refused for want of a configured secret.
    let outsider = app
        .send(
            app.client()
                .post(app.url("/v1/webhooks/processor"))
                .header("webhook-id", "evt_outsider")
                .header(
                    "webhook-timestamp",
                    chrono::Utc::now().timestamp().to_string(),
                )
                .header("webhook-signature", "v1,bm90IGEgc2lnbmF0dXJl")
                .body("{}"),
        )
        .await;
    outsider.assert_problem(503, "service-unavailable");
}
