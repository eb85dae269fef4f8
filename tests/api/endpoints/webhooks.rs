//! Webhook intake: signed deliveries, each event applied exactly once however often it arrives.

use std::time::Duration;

use futures::future::join_all;
use idempay::config::Settings;
use idempay::webhooks::{MAX_SIGNATURES, WebhookSecrets};
use idempay_test_macros::api_test;
use serde_json::{Value, json};

use crate::support::helpers::{TestApp, TestResponse, new_key, wait_until};
use crate::support::instance::{Instance, idempay};

#[api_test(citus)]
async fn a_dispute_is_applied_once_and_its_redelivery_is_a_duplicate() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let data = json!({ "payment": paid, "dispute": "dp_1", "amount": 1500 });

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
        &json!({ "payment": paid, "dispute": "dp_2", "amount": 100 }),
    )
    .await;
    assert_eq!(another.json()["outcome"], "applied");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1600);
}

#[api_test(citus)]
async fn ten_simultaneous_redeliveries_apply_the_effect_once() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let data = json!({ "payment": paid, "dispute": "dp_storm", "amount": 100 });
    // The barrier: the test records the event's id in a transaction it holds open. Each delivery
    // inserts the id first, and waits on the test's uncommitted row; the test then rolls it back,
    // and the deliveries meet each other's inserts instead.
    let mut barrier = app.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO processed_events (id, type, outcome, expires_at)
         VALUES ('evt_storm', 'dispute.created', 'applied', now() + interval '1 day')",
    )
    .execute(&mut *barrier)
    .await
    .unwrap();

    let (answers, together) = tokio::join!(
        join_all((0..10).map(|_| deliver(&app, &secret, "evt_storm", "dispute.created", &data))),
        async {
            // They overlap: many wait at the barrier at once. Sent one after another, one would.
            let together = app
                .until_statements_wait_together(
                    "redeliveries wait at the event's id together",
                    "%INSERT INTO processed_events%",
                    5,
                )
                .await;
            barrier.rollback().await.unwrap();
            together
        }
    );
    eprintln!("redeliveries: {together} of 10 waited at the event's id at once");

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
    // delivery 300 s away, in tolerance). The exact boundary is unit-tested in signature.rs.
    for offset in [-310, 310, -3600] {
        let then = chrono::Utc::now().timestamp() + offset;
        let signature = secret.sign("evt_old", then, &body).unwrap();
        let answer = post(&app, "evt_old", then, Some(&signature), body.clone()).await;
        answer.assert_problem(400, "webhook-timestamp-out-of-range");
    }
    assert_eq!(event_count(&app).await, 0);
}

#[api_test(citus)]
async fn unknown_types_and_unknown_payments_are_acknowledged_and_recorded() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let cases = [
        ("evt_a", "customer.created", json!({ "customer": "cus_1" })),
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
    assert_eq!(outcomes, ["ignored", "ignored", "ignored"]);
    let again = deliver(&app, &secret, "evt_a", "customer.created", &cases[0].2).await;
    assert_eq!(again.json()["outcome"], "duplicate");
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

/// Senders retry for longer than a key lives (Standard Webhooks about 28 hours, Stripe 3 days):
/// an event id is remembered for the event TTL, not the key TTL, then expires.
#[api_test]
async fn processed_event_ids_are_kept_for_the_event_ttl_then_expire() {
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(Settings {
        key_ttl: Duration::from_secs(1),
        expiry_interval: Duration::from_millis(100),
        webhook_secrets: Some(secret.clone()),
        ..Settings::default()
    })
    .await;
    // Acknowledged means recorded: the record commits with the answer.
    let answer = deliver(&app, &secret, "evt_x", "customer.created", &json!({})).await;
    assert_eq!(answer.json()["outcome"], "ignored");

    let kept_for_days: bool = sqlx::query_scalar(
        "SELECT expires_at - received_at = interval '7 days' FROM processed_events",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(
        kept_for_days,
        "the event TTL (7 days by default), not the key TTL"
    );
    age_events(&app).await;
    wait_until("the processed event id expires", || async {
        event_count(&app).await == 0
    })
    .await;
}

/// A dispute is keyed by the processor's dispute id: its event redelivered after the event id was
/// forgotten finds the dispute recorded, and applies nothing.
#[api_test]
async fn a_dispute_redelivered_after_its_event_id_expired_changes_nothing() {
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(Settings {
        expiry_interval: Duration::from_millis(100),
        webhook_secrets: Some(secret.clone()),
        ..Settings::default()
    })
    .await;
    let paid = app.paid(5000).await;
    let data = json!({ "payment": paid, "dispute": "dp_late", "amount": 1500 });
    let first = deliver(&app, &secret, "evt_1", "dispute.created", &data).await;
    assert_eq!(first.json()["outcome"], "applied");
    age_events(&app).await;
    wait_until("the processed event id expires", || async {
        event_count(&app).await == 0
    })
    .await;

    let late = deliver(&app, &secret, "evt_1", "dispute.created", &data).await;

    assert_eq!(late.status, 200);
    assert_eq!(
        late.json(),
        json!({ "event": "evt_1", "outcome": "duplicate" })
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1500);
    assert_eq!(disputes(&app).await.len(), 1);
}

/// The processor's form (by charge) and idempay's own (by payment) name the same dispute by its
/// id: whichever arrives second, under whatever event id, is a duplicate.
#[api_test]
async fn the_same_dispute_under_two_event_ids_counts_once() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let charge = app.get_payment(&paid).await.json()["charge"].clone();

    let first = deliver(
        &app,
        &secret,
        "evt_a",
        "charge.dispute.created",
        &json!({ "charge": charge, "dispute": "dp_once", "amount": 700 }),
    )
    .await;
    let second = deliver(
        &app,
        &secret,
        "evt_b",
        "dispute.created",
        &json!({ "payment": paid, "dispute": "dp_once", "amount": 700 }),
    )
    .await;

    assert_eq!(first.json()["outcome"], "applied");
    assert_eq!(second.json()["outcome"], "duplicate");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 700);
    assert_eq!(
        disputes(&app).await,
        [("dp_once".to_owned(), 700, "open".to_owned())]
    );
    assert_eq!(event_outcomes(&app).await, ["applied", "duplicate"]);
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

#[api_test]
async fn without_a_secret_webhooks_are_refused_with_503() {
    let app = TestApp::spawn().await;
    let secret = WebhookSecrets::generate();
    let answer = deliver(&app, &secret, "evt_1", "customer.created", &json!({})).await;
    answer.assert_problem(503, "service-unavailable");
}

#[api_test]
async fn the_send_command_delivers_what_the_service_accepts() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let url = app.url("/v1/webhooks/processor");
    let data = json!({ "payment": paid, "dispute": "dp_cli", "amount": 250 });

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

/// The data the dev banner used to show for a dispute (no dispute id) was acknowledged `ignored`
/// and the command exited 0, the event id spent. Now it is refused before it is sent, saying why,
/// and the same id with the data the intake needs is then applied; an event the service
/// acknowledges `ignored` all the same (a payment that does not exist) fails the command.
#[api_test]
async fn the_send_command_refuses_data_that_cannot_apply_before_sending_and_fails_on_ignored() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let url = app.url("/v1/webhooks/processor");
    let exposed = secret.expose();
    let env = [("IDEMPAY_WEBHOOK_SECRET", exposed.as_str())];
    let send = |data: String| {
        let url = url.clone();
        async move {
            let args = [
                "webhook",
                "send",
                "--url",
                &url,
                "--id",
                "evt_demo_1",
                "--type",
                "dispute.created",
                "--data",
                &data,
            ];
            idempay(&args, &env).await
        }
    };

    let old_banner = send(format!(r#"{{"payment": "{paid}", "amount": 500}}"#)).await;
    let banner = send(format!(
        r#"{{"payment": "{paid}", "dispute": "dp_demo1", "amount": 500}}"#
    ))
    .await;
    let nowhere = idempay(
        &[
            "webhook",
            "send",
            "--url",
            &url,
            "--type",
            "dispute.created",
            "--data",
            r#"{"payment": "pay_U5PgTqA02dYsv3cLANIGkqIs", "dispute": "dp_x", "amount": 5}"#,
        ],
        &env,
    )
    .await;

    let stderr = String::from_utf8_lossy(&old_banner.stderr);
    assert!(!old_banner.status.success(), "{old_banner:?}");
    assert!(
        stderr.contains("not sent") && stderr.contains("missing field `dispute`"),
        "{stderr}"
    );
    assert!(banner.status.success(), "{banner:?}");
    assert!(
        String::from_utf8_lossy(&banner.stdout).contains("\"applied\""),
        "{banner:?}"
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 500);
    assert!(!nowhere.status.success(), "{nowhere:?}");
    let stderr = String::from_utf8_lossy(&nowhere.stderr);
    assert!(stderr.contains("`ignored`"), "{stderr}");
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

/// The MAC is computed once per secret whatever the header holds, and a header with more entries
/// than any sender sends is refused before it is computed at all: even with the right signature
/// among them.
#[api_test]
async fn a_signature_header_over_the_cap_is_refused_with_400_even_with_the_right_signature_in_it() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
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
    let (app, secret) = TestApp::spawn_with_webhooks().await;
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

fn envelope(kind: &str, data: &Value) -> Vec<u8> {
    envelope_at(kind, data, chrono::Utc::now())
}

/// An envelope whose event was created `at`.
fn envelope_at(kind: &str, data: &Value, at: chrono::DateTime<chrono::Utc>) -> Vec<u8> {
    serde_json::to_vec(&json!({ "type": kind, "timestamp": at, "data": data })).unwrap()
}

/// Delivers an event created now, signed now with `secret`.
pub(super) async fn deliver(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: &Value,
) -> TestResponse {
    deliver_at(app, secret, id, kind, data, chrono::Utc::now()).await
}

/// Delivers now, signed now, an event created `at`: a redelivery of an older event.
pub(super) async fn deliver_at(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: &Value,
    at: chrono::DateTime<chrono::Utc>,
) -> TestResponse {
    let body = envelope_at(kind, data, at);
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

/// Makes every processed event record due for the expiry job, as the event TTL's end would.
async fn age_events(app: &TestApp) {
    sqlx::query("UPDATE processed_events SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .unwrap();
}

/// The recorded disputes: (id, amount, status), by id.
async fn disputes(app: &TestApp) -> Vec<(String, i64, String)> {
    sqlx::query_as("SELECT id, amount, status FROM disputes ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The recorded outcome of every processed event, by event id.
async fn event_outcomes(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT outcome FROM processed_events ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// An intake that dies before its commit leaves nothing: not the dispute, not the merchant's
/// `payment.disputed` event, not the record that the event was processed; the processor's
/// redelivery then applies it once, with one event.
#[cfg(feature = "failpoints")]
#[api_test]
async fn an_intake_that_dies_before_its_commit_leaves_nothing_and_its_redelivery_applies_once() {
    use std::os::unix::process::ExitStatusExt;

    use crate::support::instance::{ANSWER_WITHIN, LogFile};

    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let (logs, log_file) = LogFile::create();
    let secrets = secret.expose();
    let mut crashing = Instance::start_logging_to(
        log_file,
        &app.database_url(),
        &[
            ("IDEMPAY_FAILPOINT", "webhook-before-commit"),
            ("IDEMPAY_WEBHOOK_SECRET", secrets.as_str()),
        ],
    )
    .await;
    let data = json!({ "payment": paid, "dispute": "dp_crash", "amount": 1200 });
    let body = envelope("dispute.created", &data);
    let now = chrono::Utc::now().timestamp();
    let sent = reqwest::Client::new()
        .post(format!("{}/v1/webhooks/processor", crashing.address))
        .header("content-type", "application/json")
        .header("webhook-id", "evt_crash")
        .header("webhook-timestamp", now)
        .header(
            "webhook-signature",
            secret.sign("evt_crash", now, &body).unwrap(),
        )
        .body(body)
        .send()
        .await;
    assert!(sent.is_err(), "the process died before it answered");
    let exit = tokio::time::timeout(ANSWER_WITHIN, crashing.child.wait())
        .await
        .expect("the process exits")
        .unwrap();
    let logs = logs.read();
    assert_eq!(
        exit.signal(),
        Some(6),
        "it aborted ({exit}); its logs:\n{logs}"
    );
    assert_eq!(
        logs.lines().last(),
        Some("failpoint webhook-before-commit: aborting"),
        "it died at the intake's commit, after applying the event"
    );

    let events = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM events WHERE type = 'payment.disputed'")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    assert_eq!(event_count(&app).await, 0, "not recorded as processed");
    assert!(disputes(&app).await.is_empty(), "no dispute");
    assert_eq!(events().await, 0, "no event for the merchant");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 0);

    let redelivered = deliver(&app, &secret, "evt_crash", "dispute.created", &data).await;
    assert_eq!(redelivered.json()["outcome"], "applied");
    assert_eq!(disputes(&app).await.len(), 1);
    assert_eq!(events().await, 1);
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1200);
}
