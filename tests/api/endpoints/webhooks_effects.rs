//! Webhook intake, what an event does to its payment: status syncs, stale and unknown events,
//! failed refunds, and disputes that take only what fits.

use idempay_test_macros::api_test;
use serde_json::{Value, json};
use service::outbox::WebhookSecrets;

use super::webhooks::{deliver, deliver_at, disputes, event_outcomes};
use crate::support::helpers::{TestApp, new_key};
use crate::support::instance::Instance;

#[api_test(citus)]
async fn unknown_payments_and_unreadable_data_are_acknowledged_and_recorded() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let cases = [
        (
            "evt_b",
            "dispute.created",
            json!({ "payment": "pay_000000000000000000000000", "dispute": "dp_1", "amount": 5 }),
        ),
        ("evt_c", "payment.failed", json!({ "nothing": true })),
    ];
    for (id, kind, data) in &cases {
        let answer = deliver(&app, &secret, id, kind, data).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["outcome"], "ignored", "{kind}");
    }
    let outcomes: Vec<String> =
        sqlx::query_scalar("SELECT outcome FROM processed_events ORDER BY id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(outcomes, ["ignored", "ignored"]);
    let again = deliver(&app, &secret, "evt_c", "payment.failed", &cases[1].2).await;
    assert_eq!(again.json()["outcome"], "duplicate");
}

/// A type this release does not know may be one a newer release applies (during a deploy the
/// processor sends both releases its events): refused with 503 and `Retry-After`, its id left
/// unspent, so that every redelivery is refused alike and none is lost as `ignored`.
#[api_test(citus)]
async fn an_unknown_type_is_refused_with_503_and_recorded_nowhere_for_a_release_that_knows_it() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let data = json!({ "charge": "ch_1" });
    for _ in 0..2 {
        let answer = deliver(&app, &secret, "evt_a", "charge.invented", &data).await;
        let problem = answer.assert_problem(503, "webhook-event-type-unknown");
        assert_eq!(answer.header("retry-after"), Some("60"));
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("`charge.invented`"), "{detail}");
    }
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM processed_events")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(recorded, 0, "its id stays unspent");
    let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM parked_events")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(parked, 0);
}

#[api_test(citus)]
async fn payment_events_sync_the_status() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;

    deliver(
        &app,
        &secret,
        "evt_f",
        "payment.failed",
        &json!({ "payment": paid }),
    )
    .await;
    assert_eq!(app.get_payment(&paid).await.json()["status"], "failed");
    let refund = app.post_refund(&paid, &new_key(), &json!({})).await;
    refund.assert_problem(400, "payment-not-refundable");

    deliver(
        &app,
        &secret,
        "evt_s",
        "payment.succeeded",
        &json!({ "payment": paid }),
    )
    .await;
    assert_eq!(app.get_payment(&paid).await.json()["status"], "succeeded");
}

#[api_test(citus)]
async fn a_failed_refund_makes_its_amount_refundable_again() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let refund = app.post_refund(&paid, &new_key(), &json!({})).await.json();
    assert_eq!(app.get_payment(&paid).await.json()["status"], "refunded");

    let answer = deliver(
        &app,
        &secret,
        "evt_r",
        "refund.failed",
        &json!({ "refund": refund["id"] }),
    )
    .await;

    assert_eq!(answer.json()["outcome"], "applied");
    let payment = app.get_payment(&paid).await.json();
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount_refunded"], 0);
    let failed = app
        .get(&format!("/v1/refunds/{}", refund["id"].as_str().unwrap()))
        .await;
    assert_eq!(failed.json()["status"], "failed");
    // The processor's side of the failure: its refund failed too, so it refunds again.
    sqlx::raw_sql(
        "UPDATE processor_charges SET amount_refunded = 0; DELETE FROM processor_refunds",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let again = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 5000 }))
        .await;
    assert_eq!(again.status, 201, "the amount is refundable again");
}

/// The payment's disputed amount takes only what fits: the dispute itself is recorded in full.
#[api_test]
async fn the_disputed_amount_never_exceeds_the_payment() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(1000).await;

    let too_much = deliver(
        &app,
        &secret,
        "evt_big",
        "dispute.created",
        &json!({ "payment": paid, "dispute": "dp_big", "amount": 1001 }),
    )
    .await;

    assert_eq!(too_much.json()["outcome"], "needs_review");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1000);
    assert_eq!(
        disputes(&app).await,
        [("dp_big".to_owned(), 1001, "needs_review".to_owned())]
    );
}

/// A `payment.succeeded` from before a `payment.failed`, arriving after it (a redelivery, a
/// retry), must not make the failed payment refundable: it is recorded as stale.
#[api_test]
async fn a_late_success_older_than_the_failure_is_stale_and_the_payment_stays_failed() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let now = chrono::Utc::now();
    let data = json!({ "payment": paid });

    let failed = deliver_at(&app, &secret, "evt_t2", "payment.failed", &data, now).await;
    let earlier = now - chrono::Duration::seconds(60);
    let late = deliver_at(&app, &secret, "evt_t1", "payment.succeeded", &data, earlier).await;

    assert_eq!(failed.json()["outcome"], "applied");
    assert_eq!(late.status, 200);
    assert_eq!(
        late.json(),
        json!({ "event": "evt_t1", "outcome": "stale" })
    );
    assert_eq!(app.get_payment(&paid).await.json()["status"], "failed");
    app.post_refund(&paid, &new_key(), &json!({}))
        .await
        .assert_problem(400, "payment-not-refundable");
    assert_eq!(event_outcomes(&app).await, ["stale", "applied"]);
    // A newer event still applies.
    let later = now + chrono::Duration::seconds(1);
    let newer = deliver_at(&app, &secret, "evt_t3", "payment.succeeded", &data, later).await;
    assert_eq!(newer.json()["outcome"], "applied");
    assert_eq!(app.get_payment(&paid).await.json()["status"], "succeeded");
}

/// A declined charge is the processor's final answer: no event moves the payment.
#[api_test]
async fn a_declined_payment_stays_declined_whatever_event_arrives() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let declined = app
        .post_payment(
            &new_key(),
            &json!({ "amount": 100, "currency": "eur", "payment_method": "pm_card_chargeDeclined" }),
        )
        .await;
    let problem = declined.assert_problem(402, "card-declined");
    let id = problem["payment"].as_str().unwrap().to_owned();

    for (event, kind) in [("evt_s", "payment.succeeded"), ("evt_f", "payment.failed")] {
        let answer = deliver(&app, &secret, event, kind, &json!({ "payment": id })).await;
        assert_eq!(answer.json()["outcome"], "ignored", "{kind}");
    }

    assert_eq!(app.get_payment(&id).await.json()["status"], "declined");
}

/// A real chargeback over what remains (after a refund) is not dropped: it is recorded in full,
/// flagged for review, answered `needs_review` and counted; the payment takes what fits.
#[api_test]
async fn a_dispute_over_what_remains_is_recorded_flagged_and_counted() {
    let app = TestApp::spawn().await;
    let secret = WebhookSecrets::generate();
    // A process of its own, so its metrics count this test's events alone.
    let instance = Instance::start(
        &app.database_url(),
        &[("IDEMPAY_WEBHOOK_SECRET", &secret.expose())],
    )
    .await;
    let paid = app.paid(100).await;
    let refund = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 60 }))
        .await;
    assert_eq!(refund.status, 201);
    let url = format!("{}/v1/webhooks/processor", instance.address);
    let data = json!({ "payment": paid, "dispute": "dp_chargeback", "amount": 100 });

    let (status, body) = idempay::webhooks::send(&url, &secret, "evt_cb", "dispute.created", data)
        .await
        .unwrap();

    assert_eq!(status, 200);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        answer,
        json!({ "event": "evt_cb", "outcome": "needs_review" })
    );
    let payment = app.get_payment(&paid).await.json();
    assert_eq!(payment["amount_refunded"], 60);
    assert_eq!(
        payment["amount_disputed"], 40,
        "what fits beside the refund"
    );
    assert_eq!(
        disputes(&app).await,
        [("dp_chargeback".to_owned(), 100, "needs_review".to_owned())]
    );
    assert_eq!(event_outcomes(&app).await, ["needs_review"]);
    let metrics = instance.metrics().await;
    assert_eq!(
        metrics.value(r#"idempay_webhook_events_total{outcome="needs_review"}"#),
        Some(1.0),
        "{}",
        metrics.text()
    );
}

/// Even a dispute so large that adding it to the disputed amount would overflow a bigint is
/// recorded and flagged, not a 500 that the processor would redeliver for ever.
#[api_test]
async fn a_dispute_so_large_it_would_overflow_the_disputed_amount_is_flagged() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let dispute =
        |id: &str, amount: i64| json!({ "payment": paid, "dispute": id, "amount": amount });
    let first = deliver(
        &app,
        &secret,
        "evt_1",
        "dispute.created",
        &dispute("dp_1", 10),
    )
    .await;
    assert_eq!(first.json()["outcome"], "applied");

    let huge = deliver(
        &app,
        &secret,
        "evt_2",
        "dispute.created",
        &dispute("dp_2", i64::MAX),
    )
    .await;

    assert_eq!(huge.status, 200);
    assert_eq!(huge.json()["outcome"], "needs_review");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 5000);
}
