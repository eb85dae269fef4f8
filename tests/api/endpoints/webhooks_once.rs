//! Webhook intake, exactly once: each event applied once however often, however simultaneously
//! and however late it arrives, and nothing left by an intake that dies before its commit.

use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use futures::future::join_all;
use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::{Value, json};
use service::outbox::WebhookSecrets;

use super::webhooks::{deliver, disputes, envelope, event_count, event_outcomes};
use crate::support::helpers::{TestApp, wait_until};
use crate::support::instance::Instance;

/// Makes every processed event record due for the expiry job, as the event TTL's end would, and
/// waits until the job deleted them.
async fn expire_event_ids(app: &TestApp) {
    sqlx::query("UPDATE processed_events SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .unwrap();
    wait_until("the processed event id expires", || async {
        event_count(app).await == 0
    })
    .await;
}

/// Settings that accept webhooks signed with `secret`, and whose expiry job runs every 100 ms.
fn expiring_every_100ms(secret: &WebhookSecrets) -> Settings {
    Settings {
        shared: SharedArgs {
            expiry_interval: Duration::from_millis(100),
            webhook_secrets: Some(secret.clone()),
            ..SharedArgs::default()
        },
        ..Settings::default()
    }
}

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
    let mut barrier = idempotency::connections::begin(&app.db).await.unwrap();
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

/// Senders retry for longer than a key lives (Standard Webhooks about 28 hours, Stripe 3 days):
/// an event id is remembered for the event TTL, not the key TTL, then expires.
#[api_test]
async fn processed_event_ids_are_kept_for_the_event_ttl_then_expire() {
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(Settings {
        key_ttl: Duration::from_secs(1),
        ..expiring_every_100ms(&secret)
    })
    .await;
    // Acknowledged means recorded: the record commits with the answer.
    let answer = deliver(&app, &secret, "evt_x", "payment.failed", &json!({})).await;
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
    expire_event_ids(&app).await;
}

/// A dispute is keyed by the processor's dispute id: its event redelivered after the event id was
/// forgotten finds the dispute recorded, and applies nothing.
#[api_test]
async fn a_dispute_redelivered_after_its_event_id_expired_changes_nothing() {
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(expiring_every_100ms(&secret)).await;
    let paid = app.paid(5000).await;
    let data = json!({ "payment": paid, "dispute": "dp_late", "amount": 1500 });
    let first = deliver(&app, &secret, "evt_1", "dispute.created", &data).await;
    assert_eq!(first.json()["outcome"], "applied");
    expire_event_ids(&app).await;

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

/// An intake that dies before its commit leaves nothing: not the dispute, not the merchant's
/// `payment.disputed` event, not the record that the event was processed; the processor's
/// redelivery then applies it once, with one event.
#[cfg(feature = "failpoints")]
#[api_test]
async fn an_intake_that_dies_before_its_commit_leaves_nothing_and_its_redelivery_applies_once() {
    use std::os::unix::process::ExitStatusExt;

    use crate::support::helpers::died_before_answering;
    use crate::support::instance::LogFile;

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
    let exit = died_before_answering(sent, &mut crashing).await;
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
