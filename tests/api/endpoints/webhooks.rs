//! Webhook intake: signed deliveries, each event applied exactly once however often it arrives.

use std::time::Duration;

use futures::future::join_all;
use idempay::config::Settings;
use idempay::webhooks::{MAX_SIGNATURES, WebhookSecrets};
use idempay_test_macros::api_test;
use serde_json::{Value, json};

use crate::support::helpers::{TestApp, TestResponse, new_key};

#[api_test]
async fn a_dispute_is_applied_once_and_its_redelivery_is_a_duplicate() {
    let (app, secret) = spawn().await;
    let paid = app.paid(5000).await;
    let data = json!({ "payment": paid, "amount": 1500 });

    let first = deliver(&app, &secret, "evt_1", "dispute.created", &data).await;
    let again = deliver(&app, &secret, "evt_1", "dispute.created", &data).await;

    assert_eq!(first.status, 200);
    assert_eq!(
        first.json(),
        json!({ "event": "evt_1", "outcome": "applied" })
    );
    assert_eq!(again.status, 200);
    assert_eq!(
        again.json(),
        json!({ "event": "evt_1", "outcome": "duplicate" })
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1500);
    let another = deliver(
        &app,
        &secret,
        "evt_2",
        "dispute.created",
        &json!({ "payment": paid, "amount": 100 }),
    )
    .await;
    assert_eq!(another.json()["outcome"], "applied");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1600);
}

#[api_test]
async fn ten_simultaneous_redeliveries_apply_the_effect_once() {
    let (app, secret) = spawn().await;
    let paid = app.paid(5000).await;
    let data = json!({ "payment": paid, "amount": 100 });

    let answers =
        join_all((0..10).map(|_| deliver(&app, &secret, "evt_storm", "dispute.created", &data)))
            .await;

    assert!(answers.iter().all(|answer| answer.status == 200));
    let outcomes: Vec<Value> = answers
        .iter()
        .map(|a| a.json()["outcome"].clone())
        .collect();
    assert_eq!(
        outcomes.iter().filter(|o| *o == "applied").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "duplicate").count(),
        9,
        "{outcomes:?}"
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 100);
}

#[api_test]
async fn a_bad_or_missing_signature_is_refused_with_401() {
    let (app, secret) = spawn().await;
    let paid = app.paid(5000).await;
    let body = envelope(
        "dispute.created",
        &json!({ "payment": paid, "amount": 100 }),
    );
    let now = chrono::Utc::now().timestamp();

    let forged = WebhookSecrets::generate()
        .sign("evt_1", now, &body)
        .unwrap();
    let wrong = post(&app, "evt_1", now, Some(&forged), body.clone()).await;
    let missing = post(&app, "evt_1", now, None, body.clone()).await;
    let tampered_body = br#"{"type":"dispute.created"}"#.to_vec();
    let tampered = post(
        &app,
        "evt_1",
        now,
        Some(&secret.sign("evt_1", now, &body).unwrap()),
        tampered_body,
    )
    .await;

    wrong.assert_problem(401, "webhook-signature-invalid");
    missing.assert_problem(401, "webhook-signature-invalid");
    tampered.assert_problem(401, "webhook-signature-invalid");
    assert_eq!(event_count(&app).await, 0);
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 0);
}

#[api_test]
async fn a_timestamp_more_than_five_minutes_away_is_refused_with_400() {
    let (app, secret) = spawn().await;
    let paid = app.paid(5000).await;
    let body = envelope(
        "dispute.created",
        &json!({ "payment": paid, "amount": 100 }),
    );
    // Ten seconds past the tolerance: timestamps are whole seconds, and a loaded machine may take
    // a second or more between signing here and checking there (at +301 s that crossing made the
    // delivery 300 s away, in tolerance). The exact boundary is unit-tested in signature.rs.
    for offset in [-310, 310, -3600] {
        let then = chrono::Utc::now().timestamp() + offset;
        let signature = secret.sign("evt_old", then, &body).unwrap();
        let answer = post(&app, "evt_old", then, Some(&signature), body.clone()).await;
        answer.assert_problem(400, "webhook-timestamp-out-of-range");
    }
    assert_eq!(event_count(&app).await, 0);
}

#[api_test]
async fn unknown_types_and_unknown_payments_are_acknowledged_and_recorded() {
    let (app, secret) = spawn().await;
    let cases = [
        ("evt_a", "customer.created", json!({ "customer": "cus_1" })),
        (
            "evt_b",
            "dispute.created",
            json!({ "payment": "pay_000000000000000000000000", "amount": 5 }),
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
    assert_eq!(outcomes, ["ignored", "ignored", "ignored"]);
    let again = deliver(&app, &secret, "evt_a", "customer.created", &cases[0].2).await;
    assert_eq!(again.json()["outcome"], "duplicate");
}

#[api_test]
async fn payment_events_sync_the_status() {
    let (app, secret) = spawn().await;
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

#[api_test]
async fn a_failed_refund_makes_its_amount_refundable_again() {
    let (app, secret) = spawn().await;
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

#[api_test]
async fn a_dispute_never_exceeds_the_payment() {
    let (app, secret) = spawn().await;
    let paid = app.paid(1000).await;

    let too_much = deliver(
        &app,
        &secret,
        "evt_big",
        "dispute.created",
        &json!({ "payment": paid, "amount": 1001 }),
    )
    .await;

    assert_eq!(too_much.json()["outcome"], "ignored");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 0);
}

#[api_test]
async fn processed_event_ids_expire_like_keys() {
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(Settings {
        key_ttl: Duration::from_secs(1),
        expiry_interval: Duration::from_millis(200),
        webhook_secrets: Some(secret.clone()),
        ..Settings::default()
    })
    .await;
    // Acknowledged means recorded: the record commits with the answer.
    let answer = deliver(&app, &secret, "evt_x", "customer.created", &json!({})).await;
    assert_eq!(answer.json()["outcome"], "ignored");

    for _ in 0..100 {
        if event_count(&app).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the processed event id never expired");
}

#[api_test]
async fn without_a_secret_webhooks_are_refused_with_503() {
    let app = TestApp::spawn().await;
    let secret = WebhookSecrets::generate();
    let answer = deliver(&app, &secret, "evt_1", "customer.created", &json!({})).await;
    answer.assert_problem(503, "service-unavailable");
}

#[api_test]
async fn the_send_command_delivers_what_the_service_accepts() {
    let (app, secret) = spawn().await;
    let paid = app.paid(5000).await;
    let url = app.url("/v1/webhooks/processor");
    let data = json!({ "payment": paid, "amount": 250 });

    let (status, body) =
        idempay::webhooks::send(&url, &secret, "evt_cli", "dispute.created", data.clone())
            .await
            .unwrap();
    let (again, _) = idempay::webhooks::send(&url, &secret, "evt_cli", "dispute.created", data)
        .await
        .unwrap();

    assert_eq!((status, again), (200, 200));
    assert!(body.contains("applied"), "{body}");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 250);
}

#[api_test]
async fn a_signed_body_that_is_no_envelope_is_refused_with_400() {
    let (app, secret) = spawn().await;
    let body = br#"{"kind": "nothing"}"#.to_vec();
    let now = chrono::Utc::now().timestamp();
    let answer = post(
        &app,
        "evt_bad",
        now,
        Some(&secret.sign("evt_bad", now, &body).unwrap()),
        body,
    )
    .await;
    answer.assert_problem(400, "invalid-request");
    let huge = vec![b' '; 70 * 1024];
    let now = chrono::Utc::now().timestamp();
    let signature = secret.sign("evt_huge", now, &huge).unwrap();
    let too_large = post(&app, "evt_huge", now, Some(&signature), huge).await;
    too_large.assert_problem(413, "payload-too-large");
    // Standard Webhooks signs text, and JSON is UTF-8: such a body is refused as it is.
    let latin1 = b"{\"type\": \"r\xe9sum\xe9\"}".to_vec();
    let now = chrono::Utc::now().timestamp();
    let not_utf8 = post(&app, "evt_latin1", now, Some("v1,AAAA"), latin1).await;
    not_utf8.assert_problem(400, "invalid-request");
    assert_eq!(event_count(&app).await, 0);
}

/// Even a dispute so large that adding it to the disputed amount would overflow a bigint is
/// ignored, not a 500 that the processor would redeliver for ever.
#[api_test]
async fn a_dispute_so_large_it_would_overflow_the_disputed_amount_is_ignored() {
    let (app, secret) = spawn().await;
    let paid = app.paid(5000).await;
    let dispute = |amount: i64| json!({ "payment": paid, "amount": amount });
    let first = deliver(&app, &secret, "evt_1", "dispute.created", &dispute(10)).await;
    assert_eq!(first.json()["outcome"], "applied");

    let huge = deliver(
        &app,
        &secret,
        "evt_2",
        "dispute.created",
        &dispute(i64::MAX),
    )
    .await;

    assert_eq!(huge.status, 200);
    assert_eq!(huge.json()["outcome"], "ignored");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 10);
}

/// The MAC is computed once per secret whatever the header holds, and a header with more entries
/// than any sender sends is refused before it is computed at all: even with the right signature
/// among them.
#[api_test]
async fn a_signature_header_over_the_cap_is_refused_with_400_even_with_the_right_signature_in_it() {
    let (app, secret) = spawn().await;
    let body = envelope("unknown.type", &json!({}));
    let now = chrono::Utc::now().timestamp();
    let good = secret.sign("evt_many", now, &body).unwrap();
    let with_decoys = |decoys: usize| format!("{} {good}", vec!["v1,AAAA"; decoys].join(" "));

    for decoys in [MAX_SIGNATURES, 3_500] {
        let refused = post(
            &app,
            "evt_many",
            now,
            Some(&with_decoys(decoys)),
            body.clone(),
        )
        .await;
        let problem = refused.assert_problem(400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("more than"), "{decoys} decoys: {detail}");
    }
    assert_eq!(event_count(&app).await, 0);
    let at_cap = post(
        &app,
        "evt_many",
        now,
        Some(&with_decoys(MAX_SIGNATURES - 1)),
        body,
    )
    .await;
    assert_eq!(at_cap.json()["outcome"], "ignored");
}

/// While a secret is rotated, `IDEMPAY_WEBHOOK_SECRET` lists both: a delivery signed with either
/// is accepted, one signed with neither is not.
#[api_test]
async fn a_delivery_signed_with_any_listed_secret_is_accepted_and_with_neither_refused() {
    let (new, old) = (WebhookSecrets::generate(), WebhookSecrets::generate());
    let both = WebhookSecrets::parse(&format!("{} {}", new.expose(), old.expose())).unwrap();
    let app = TestApp::spawn_with(Settings {
        webhook_secrets: Some(both),
        ..Settings::default()
    })
    .await;

    let by_old = deliver(&app, &old, "evt_old", "unknown.type", &json!({})).await;
    let by_new = deliver(&app, &new, "evt_new", "unknown.type", &json!({})).await;
    let stranger = WebhookSecrets::generate();
    let by_neither = deliver(&app, &stranger, "evt_x", "unknown.type", &json!({})).await;

    assert_eq!(by_old.json()["outcome"], "ignored");
    assert_eq!(by_new.json()["outcome"], "ignored");
    by_neither.assert_problem(401, "webhook-signature-invalid");
    assert_eq!(event_count(&app).await, 2);
}

/// The event id is the primary key of the processed events: bounded, so it always fits the index
/// (a 20 000-character id would not).
#[api_test]
async fn a_webhook_id_over_255_bytes_is_refused_with_400() {
    let (app, secret) = spawn().await;
    let data = json!({});
    let too_long: String = (0..625)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();

    let refused = deliver(&app, &secret, &too_long, "unknown.type", &data).await;
    refused.assert_problem(400, "invalid-request");
    assert_eq!(event_count(&app).await, 0);
    let longest = "e".repeat(255);
    let accepted = deliver(&app, &secret, &longest, "unknown.type", &data).await;
    assert_eq!(accepted.status, 200);
}

async fn spawn() -> (TestApp, WebhookSecrets) {
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(Settings {
        webhook_secrets: Some(secret.clone()),
        ..Settings::default()
    })
    .await;
    (app, secret)
}

fn envelope(kind: &str, data: &Value) -> Vec<u8> {
    serde_json::to_vec(&json!({ "type": kind, "timestamp": chrono::Utc::now(), "data": data }))
        .unwrap()
}

/// Delivers an event signed now with `secret`.
async fn deliver(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: &Value,
) -> TestResponse {
    let body = envelope(kind, data);
    let now = chrono::Utc::now().timestamp();
    post(
        app,
        id,
        now,
        Some(&secret.sign(id, now, &body).unwrap()),
        body,
    )
    .await
}

async fn post(
    app: &TestApp,
    id: &str,
    timestamp: i64,
    signature: Option<&str>,
    body: Vec<u8>,
) -> TestResponse {
    let mut request = app
        .client()
        .post(app.url("/v1/webhooks/processor"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp)
        .body(body);
    if let Some(signature) = signature {
        request = request.header("webhook-signature", signature);
    }
    app.send(request).await
}

async fn event_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM processed_events")
        .fetch_one(&app.db)
        .await
        .unwrap()
}
