//! Webhook intake, what it refuses before applying anything: bad, missing or too many signatures,
//! stale timestamps, no secret configured, a body that is no envelope, an oversized id; and the
//! secrets listed during a rotation.

use ::service::shared_settings::SharedArgs;
use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::json;
use service::outbox::{MAX_SIGNATURES, WebhookSecrets};

use super::webhooks::{deliver, envelope, event_count, post};
use crate::support::helpers::TestApp;

#[api_test]
async fn a_bad_or_missing_signature_is_refused_with_401() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
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
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let body = envelope(
        "dispute.created",
        &json!({ "payment": paid, "amount": 100 }),
    );
    // Ten seconds past the tolerance: timestamps are whole seconds, and a loaded machine may take
    // a second or more between signing here and checking there (at +301 s that crossing made the
    // delivery 300 s away, in tolerance). The exact boundary is unit-tested in service::outbox::signature.
    for offset in [-310, 310, -3600] {
        let then = chrono::Utc::now().timestamp() + offset;
        let signature = secret.sign("evt_old", then, &body).unwrap();
        let answer = post(&app, "evt_old", then, Some(&signature), body.clone()).await;
        answer.assert_problem(400, "webhook-timestamp-out-of-range");
    }
    assert_eq!(event_count(&app).await, 0);
}

#[api_test]
async fn without_a_secret_webhooks_are_refused_with_503() {
    let app = TestApp::spawn().await;
    let secret = WebhookSecrets::generate();
    let answer = deliver(&app, &secret, "evt_1", "customer.created", &json!({})).await;
    answer.assert_problem(503, "service-unavailable");
}

#[api_test]
async fn a_signed_body_that_is_no_envelope_is_refused_with_400() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
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

/// The MAC is computed once per secret whatever the header holds, and a header with more entries
/// than any sender sends is refused before it is computed at all: even with the right signature
/// among them.
#[api_test]
async fn a_signature_header_over_the_cap_is_refused_with_400_even_with_the_right_signature_in_it() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let body = envelope("payment.failed", &json!({}));
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
        shared: SharedArgs {
            webhook_secrets: Some(both),
            ..SharedArgs::default()
        },
        ..Settings::default()
    })
    .await;

    let by_old = deliver(&app, &old, "evt_old", "payment.failed", &json!({})).await;
    let by_new = deliver(&app, &new, "evt_new", "payment.failed", &json!({})).await;
    let stranger = WebhookSecrets::generate();
    let by_neither = deliver(&app, &stranger, "evt_x", "payment.failed", &json!({})).await;

    assert_eq!(by_old.json()["outcome"], "ignored");
    assert_eq!(by_new.json()["outcome"], "ignored");
    by_neither.assert_problem(401, "webhook-signature-invalid");
    assert_eq!(event_count(&app).await, 2);
}

/// The event id is the primary key of the processed events: bounded, so it always fits the index
/// (a 20 000-character id would not).
#[api_test]
async fn a_webhook_id_over_255_bytes_is_refused_with_400() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let data = json!({});
    let too_long: String = (0..625)
        .map(|_| uuid::Uuid::new_v4().simple().to_string())
        .collect();

    let refused = deliver(&app, &secret, &too_long, "payment.failed", &data).await;
    refused.assert_problem(400, "invalid-request");
    assert_eq!(event_count(&app).await, 0);
    let longest = "e".repeat(255);
    let accepted = deliver(&app, &secret, &longest, "payment.failed", &data).await;
    assert_eq!(accepted.status, 200);
}
