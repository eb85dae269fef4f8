//! Refunds: exactly once per key, never more than was paid, replayed refusals.

use futures::future::join_all;
use idempay_test_macros::api_test;
use serde_json::json;
use service::outbox::WebhookSecrets;

use crate::support::helpers::{TestApp, new_key, retry_while_in_flight};

#[api_test]
async fn a_partial_refund_leaves_the_payment_succeeded() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000).await;

    let response = app
        .post_refund(
            &paid,
            &new_key(),
            &json!({ "amount": 1200, "reason": "requested_by_customer" }),
        )
        .await;

    assert_eq!(response.status, 201);
    let refund = response.json();
    assert!(refund["id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["payment"], paid.as_str());
    assert_eq!(refund["amount"], 1200);
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["reason"], "requested_by_customer");
    let payment = app.get_payment(&paid).await.json();
    assert_eq!(payment["amount_refunded"], 1200);
    assert_eq!(payment["status"], "succeeded");
}

#[api_test]
async fn a_refund_without_amount_refunds_what_remains_and_marks_the_payment_refunded() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000).await;
    app.post_refund(&paid, &new_key(), &json!({ "amount": 1000 }))
        .await;

    let bare = app
        .client()
        .post(app.url(&format!("/v1/payments/{paid}/refunds")))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", new_key());
    let rest = app.send(bare).await;

    assert_eq!(rest.status, 201);
    assert_eq!(rest.json()["amount"], 4000);
    // What a generated client sends for the optional body left out: a JSON content type and
    // nothing after it. It asks for what remains, as the bare POST did: nothing now (before,
    // the empty body was refused as invalid JSON).
    let typed_but_empty = app
        .client()
        .post(app.url(&format!("/v1/payments/{paid}/refunds")))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", new_key())
        .header("content-type", "application/json");
    app.send(typed_but_empty)
        .await
        .assert_problem(400, "payment-not-refundable");
    let payment = app.get_payment(&paid).await.json();
    assert_eq!(payment["amount_refunded"], 5000);
    assert_eq!(payment["status"], "refunded");
    let again = app.post_refund(&paid, &new_key(), &json!({})).await;
    again.assert_problem(400, "payment-not-refundable");
}

#[api_test(citus)]
async fn a_refund_is_replayed_byte_for_byte_and_made_once() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000).await;
    let key = new_key();
    let first = app
        .post_refund(&paid, &key, &json!({ "amount": 700 }))
        .await;

    let replay = app
        .post_refund(&paid, &key, &json!({ "amount": 700 }))
        .await;

    assert_eq!(first.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(app.get_payment(&paid).await.json()["amount_refunded"], 700);
    assert_eq!(refund_count(&app).await, 1);
}

#[api_test(citus)]
async fn twenty_simultaneous_refunds_of_10_on_a_payment_of_50_make_exactly_five() {
    let app = TestApp::spawn().await;
    let paid = app.paid(50).await;
    let keys: Vec<String> = (0..20).map(|_| new_key()).collect();
    let body = json!({ "amount": 10 });
    // The barrier: the test holds the processor's charge, which each refund locks to refund it.
    // Every refund passes idempay's own check (50 remain) and waits there; the processor's row
    // lock then decides, one at a time, and refuses what would go beyond the charge.
    let barrier = super::hold_the_charge(&app, &paid).await;

    let (responses, together) = tokio::join!(
        // Each sent as a client would: an answer that is not final yet (409 in progress, or 503
        // for a processor that answered later than idempay waits, busy with the others) is asked
        // again with the same key, so the test counts what the keys ended as, not how fast.
        join_all(
            keys.iter()
                .map(|key| retry_while_in_flight(|| app.post_refund(&paid, key, &body)))
        ),
        async {
            // They overlap: many wait at the barrier at once. Sent one after another, one would.
            let together = app
                .until_statements_wait_together(
                    "refunds wait at the charge's lock together",
                    "%FROM processor_charges WHERE id = $1 FOR UPDATE%",
                    5,
                )
                .await;
            barrier.commit().await.unwrap();
            together
        }
    );
    eprintln!("refunds: {together} of 20 waited at the charge's lock at once");

    let made = responses.iter().filter(|r| r.status == 201).count();
    let answers: Vec<(u16, String)> = responses
        .iter()
        .map(|r| (r.status, r.json()["type"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert_eq!(made, 5, "{answers:?}");
    for refused in responses.iter().filter(|r| r.status != 201) {
        // Refused for exceeding what remains, or, once the payment is fully refunded, for its state.
        let kind = refused.json()["type"].as_str().unwrap().to_owned();
        let kind = kind.trim_start_matches("/problems/");
        assert!(
            ["refund-exceeds-payment", "payment-not-refundable"].contains(&kind),
            "{kind}"
        );
        refused.assert_problem(400, kind);
    }
    assert_eq!(refund_count(&app).await, 5);
    let payment = app.get_payment(&paid).await.json();
    assert_eq!(payment["amount_refunded"], 50);
    assert_eq!(payment["status"], "refunded");
}

#[api_test(citus)]
async fn a_refund_beyond_what_remains_is_refused_and_the_refusal_is_replayed() {
    let app = TestApp::spawn().await;
    let paid = app.paid(1000).await;
    let key = new_key();

    let refused = app
        .post_refund(&paid, &key, &json!({ "amount": 1001 }))
        .await;

    let problem = refused.assert_problem(400, "refund-exceeds-payment");
    assert!(
        problem["detail"].as_str().unwrap().contains("1000"),
        "{problem}"
    );
    let replay = app
        .post_refund(&paid, &key, &json!({ "amount": 1001 }))
        .await;
    assert!(replay.replayed());
    assert_eq!(replay.body, refused.body);
    assert_eq!(refund_count(&app).await, 0);
}

#[api_test]
async fn a_declined_payment_cannot_be_refunded() {
    let app = TestApp::spawn().await;
    let declined = app
        .post_payment(
            &new_key(),
            &json!({ "amount": 500, "currency": "eur", "payment_method": "pm_card_chargeDeclined" }),
        )
        .await
        .json();
    let id = declined["payment"].as_str().unwrap();

    let refused = app.post_refund(id, &new_key(), &json!({})).await;

    refused.assert_problem(400, "payment-not-refundable");
    assert_eq!(refund_count(&app).await, 0);
}

#[api_test]
async fn another_accounts_payment_cannot_be_refunded() {
    let app = TestApp::spawn().await;
    let paid = app.paid(1000).await;
    let (_, other_key) = app.create_account("someone else").await;

    let response = app
        .send(
            app.client()
                .post(app.url(&format!("/v1/payments/{paid}/refunds")))
                .bearer_auth(other_key)
                .header("idempotency-key", new_key())
                .json(&json!({ "amount": 10 })),
        )
        .await;

    response.assert_problem(404, "not-found");
    assert_eq!(app.get_payment(&paid).await.json()["amount_refunded"], 0);
    let unknown = app
        .post_refund("pay_000000000000000000000000", &new_key(), &json!({}))
        .await;
    unknown.assert_problem(404, "not-found");
    let malformed = app.post_refund("nonsense", &new_key(), &json!({})).await;
    malformed.assert_problem(404, "not-found");
}

#[api_test]
async fn invalid_refund_bodies_are_refused_before_the_key_is_reserved() {
    let app = TestApp::spawn().await;
    let paid = app.paid(1000).await;
    let key = new_key();
    let before = app.key_count().await;
    for body in [
        json!({ "amount": 0 }),
        json!({ "amount": -5 }),
        json!({ "amount": 1.5 }),
        json!({ "reason": "r".repeat(501) }),
        json!({ "reason": "a\u{0}b" }),
        json!({ "amount": 10, "currency": "eur" }),
    ] {
        app.post_refund(&paid, &key, &body)
            .await
            .assert_problem(400, "invalid-request");
    }
    let form = app
        .client()
        .post(app.url(&format!("/v1/payments/{paid}/refunds")))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", &key)
        .header("content-type", "text/plain")
        .body("amount=10");
    app.send(form)
        .await
        .assert_problem(415, "unsupported-media-type");
    let huge = json!({ "reason": "r".repeat(70 * 1024) });
    app.post_refund(&paid, &key, &huge)
        .await
        .assert_problem(413, "payload-too-large");
    assert_eq!(app.key_count().await, before);
    let valid = app.post_refund(&paid, &key, &json!({ "amount": 10 })).await;
    assert_eq!(valid.status, 201);
}

#[api_test]
async fn a_refund_amount_with_a_fraction_too_small_for_a_float_is_refused_and_the_key_stays_free() {
    let app = TestApp::spawn().await;
    let paid = app.paid(1000).await;
    let key = new_key();
    let before = app.key_count().await;
    let refund = |body: &'static str| {
        app.client()
            .post(app.url(&format!("/v1/payments/{paid}/refunds")))
            .bearer_auth(&app.api_key)
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(body)
    };
    // As an f64 this is 100.0 exactly: only its text shows the fraction.
    let problem = app
        .send(refund(r#"{"amount": 100.000000000000001}"#))
        .await
        .assert_problem(400, "invalid-request");
    super::assert_refuses_a_fractional_amount(&problem);
    assert_eq!(app.key_count().await, before);
    assert_eq!(app.get_payment(&paid).await.json()["amount_refunded"], 0);

    let valid = app.send(refund(r#"{"amount": 1e2}"#)).await;
    assert_eq!(valid.status, 201);
    assert_eq!(valid.json()["amount"], 100);
}

#[api_test]
async fn the_same_key_on_another_payment_is_a_mismatch() {
    let app = TestApp::spawn().await;
    let (first, second) = (app.paid(1000).await, app.paid(1000).await);
    let key = new_key();
    let made = app
        .post_refund(&first, &key, &json!({ "amount": 10 }))
        .await;

    let other = app
        .post_refund(&second, &key, &json!({ "amount": 10 }))
        .await;

    assert_eq!(made.status, 201);
    other.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(app.get_payment(&second).await.json()["amount_refunded"], 0);
}

#[api_test]
async fn refunds_are_listed_newest_first_and_readable_at_their_location() {
    let app = TestApp::spawn().await;
    let paid = app.paid(1000).await;
    let mut made = Vec::new();
    for amount in [100, 200, 300] {
        let refund = app
            .post_refund(&paid, &new_key(), &json!({ "amount": amount }))
            .await;
        let location = refund.header("location").unwrap().to_owned();
        assert_eq!(app.get(&location).await.json(), refund.json());
        made.push(refund.json()["id"].clone());
    }

    let list = app.get(&format!("/v1/payments/{paid}/refunds")).await;

    assert_eq!(list.status, 200);
    let list = list.json();
    assert_eq!(list["object"], "list");
    assert_eq!(list["has_more"], false);
    let ids: Vec<_> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].clone())
        .collect();
    made.reverse();
    assert_eq!(ids, made);
    let page = app
        .get(&format!("/v1/payments/{paid}/refunds?limit=2"))
        .await
        .json();
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"].as_array().unwrap().len(), 2);
    let missing = app
        .get("/v1/payments/pay_000000000000000000000000/refunds")
        .await;
    missing.assert_problem(404, "not-found");
    let bad_limit = app
        .get(&format!("/v1/payments/{paid}/refunds?limit=0"))
        .await;
    bad_limit.assert_problem(400, "invalid-request");
    let unknown = app.get("/v1/refunds/re_000000000000000000000000").await;
    unknown.assert_problem(404, "not-found");
    let bad_cursor = app
        .get(&format!("/v1/payments/{paid}/refunds?starting_after=re_x"))
        .await;
    bad_cursor.assert_problem(404, "not-found");
    let older = app
        .get(&format!(
            "/v1/payments/{paid}/refunds?limit=1&starting_after={}",
            made[0].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(older["data"][0]["id"], made[1]);
    let newer = app
        .get(&format!(
            "/v1/payments/{paid}/refunds?ending_before={}",
            made[2].as_str().unwrap()
        ))
        .await
        .json();
    assert_eq!(newer["data"].as_array().unwrap().len(), 2);
}

/// Disputed money is the cardholder's bank's to take back: refunding it as well would pay twice.
/// What remains refundable is `amount − amount_refunded − amount_disputed`.
#[api_test]
async fn a_disputed_amount_is_not_refundable() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let whole = app.paid(100).await;
    let part = app.paid(100).await;
    dispute(&app, &secret, &whole, "dp_whole", 100).await;
    dispute(&app, &secret, &part, "dp_part", 40).await;

    let all_disputed = app
        .post_refund(&whole, &new_key(), &json!({ "amount": 100 }))
        .await;
    let nothing_left = app.post_refund(&whole, &new_key(), &json!({})).await;
    let over = app
        .post_refund(&part, &new_key(), &json!({ "amount": 61 }))
        .await;
    let rest = app
        .post_refund(&part, &new_key(), &json!({ "amount": 60 }))
        .await;

    let problem = all_disputed.assert_problem(400, "refund-exceeds-payment");
    assert!(
        problem["detail"].as_str().unwrap().contains("100 disputed"),
        "{problem}"
    );
    nothing_left.assert_problem(400, "refund-exceeds-payment");
    over.assert_problem(400, "refund-exceeds-payment");
    assert_eq!(rest.status, 201, "{rest:?}");
    let payment = app.get_payment(&part).await.json();
    assert_eq!(
        (
            payment["amount_refunded"].clone(),
            payment["amount_disputed"].clone()
        ),
        (json!(60), json!(40))
    );
    assert_eq!(app.get_payment(&whole).await.json()["amount_refunded"], 0);
}

/// The schema holds the rules whatever the code does: refunded and disputed together never exceed
/// what was captured (`payments_money_held`), and a refund names its payment with that payment's
/// account.
#[api_test]
async fn the_database_refuses_refunds_beyond_the_undisputed_amount_and_across_accounts() {
    let app = TestApp::spawn().await;
    let paid = app.paid(100).await;
    let (other_account, _) = app.create_account("another merchant").await;

    let over =
        sqlx::query("UPDATE payments SET amount_refunded = 60, amount_disputed = 41 WHERE id = $1")
            .bind(&paid)
            .execute(&app.db)
            .await
            .unwrap_err();
    let elsewhere = sqlx::query(
        "INSERT INTO refunds (id, payment_id, account_id, amount, status, idempotency_key)
         VALUES ('re_000000000000000000000000', $1, $2, 1, 'succeeded', 'k')",
    )
    .bind(&paid)
    .bind(&other_account)
    .execute(&app.db)
    .await
    .unwrap_err();

    let code = |error: &sqlx::Error| {
        error
            .as_database_error()
            .and_then(|error| error.code())
            .map(|code| code.into_owned())
    };
    assert_eq!(code(&over).as_deref(), Some("23514"), "a CHECK: {over}");
    assert!(over.to_string().contains("payments_money_held"), "{over}");
    assert_eq!(
        code(&elsewhere).as_deref(),
        Some("23503"),
        "a foreign key: {elsewhere}"
    );
    assert!(
        elsewhere
            .to_string()
            .contains("refunds_payment_account_fkey"),
        "{elsewhere}"
    );
}

/// Delivers idempay's own `dispute.created` event, as the processor would, and checks it applied.
async fn dispute(app: &TestApp, secret: &WebhookSecrets, payment: &str, id: &str, amount: i64) {
    let data = json!({ "payment": payment, "dispute": id, "amount": amount });
    let url = app.url("/v1/webhooks/processor");
    let event = format!("evt_{id}");
    let (status, body) = idempay::webhooks::send(&url, secret, &event, "dispute.created", data)
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("applied"), "{body}");
}

async fn refund_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM refunds")
        .fetch_one(&app.db)
        .await
        .unwrap()
}
