//! The processor's webhooks: written to the outbox with the change, delivered signed per Standard
//! Webhooks (checked with the `standardwebhooks` crate, and by idempay's own intake), retried with
//! the same `webhook-id` until a 2xx, and sent once per attempt however many loops run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::{Value, json};
use service::outbox::delivery::{self, Deliverer};
use service::outbox::{RetrySchedule, WebhookSecrets};

use super::{TestProcessor, charge, settings};
use crate::delivery::{Receiver, serve_hooks};
use crate::support::helpers::{TestApp, new_key, one_connection_planning_for_empty, wait_until};

/// Waits until the processor's one delivery has its `column` (`delivered_at`, `failed_at`) set;
/// `what` says what that means.
async fn until_the_delivery_has(processor: &TestProcessor, what: &str, column: &str) {
    let query = format!("SELECT {column} IS NOT NULL FROM webhook_deliveries");
    wait_until(what, || async {
        sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(query.as_str()))
            .fetch_one(&processor.db)
            .await
            .unwrap()
    })
    .await;
}

/// A processor that delivers its events to `url`, signed with `secret`, retrying fast.
async fn delivering_to(url: &str, secret: &WebhookSecrets) -> TestProcessor {
    let mut settings = settings();
    settings.webhook_url = Some(url.to_owned());
    settings.shared.webhook_secrets = Some(secret.clone());
    settings.shared.webhook_retry_schedule =
        RetrySchedule::parse("50ms,100ms,200ms,200ms,200ms,200ms").unwrap();
    settings.shared.webhook_delivery_timeout = Duration::from_secs(2);
    TestProcessor::spawn_with(settings).await
}

#[api_test]
async fn each_change_is_delivered_once_signed_per_standard_webhooks() {
    let receiver = Receiver::start(0).await;
    let secret = WebhookSecrets::generate();
    let processor = delivering_to(&receiver.url, &secret).await;

    let paid = processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await
        .json();
    let id = paid["id"].as_str().unwrap();
    let declined = processor
        .charge(&new_key(), &charge(700, "pm_card_chargeDeclined"))
        .await
        .json();
    let refund = processor
        .post(
            &format!("/v1/charges/{id}/refunds"),
            Some(&new_key()),
            &json!({ "amount": 1200 }),
        )
        .await
        .json();
    let dispute = processor
        .post(
            &format!("/v1/charges/{id}/disputes"),
            None,
            &json!({ "amount": 300 }),
        )
        .await
        .json();
    wait_until("four events are delivered", || async {
        receiver.count() >= 4
    })
    .await;

    let verifier = standardwebhooks::Webhook::new(&secret.expose()).unwrap();
    let mut events: Vec<Value> = Vec::new();
    for (headers, body) in receiver.deliveries() {
        verifier
            .verify(&body, &headers)
            .expect("the signature verifies with the standardwebhooks crate");
        let event: Value = serde_json::from_slice(&body).unwrap();
        assert!(headers["webhook-id"].to_str().unwrap().starts_with("evt_"));
        assert!(chrono::DateTime::parse_from_rfc3339(event["timestamp"].as_str().unwrap()).is_ok());
        events.push(json!({ "type": event["type"], "data": event["data"] }));
    }
    let expected = [
        json!({ "type": "charge.succeeded", "data": { "charge": id, "amount": 5000, "currency": "eur" } }),
        json!({ "type": "charge.declined", "data": { "charge": declined["charge"], "amount": 700, "currency": "eur" } }),
        json!({ "type": "charge.refunded", "data": { "charge": id, "refund": refund["id"], "amount": 1200 } }),
        json!({ "type": "charge.dispute.created", "data": { "charge": id, "dispute": dispute["id"], "amount": 300 } }),
    ];
    for event in &expected {
        assert!(events.contains(event), "{event} not in {events:?}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.count(), 4, "each delivered once");
}

/// Given two secrets (the new one first, during a rotation), the processor signs with the first:
/// the crate verifies its deliveries with it alone, not with the second.
#[api_test]
async fn the_processor_signs_its_events_with_the_first_listed_secret() {
    let receiver = Receiver::start(0).await;
    let (first, second) = (WebhookSecrets::generate(), WebhookSecrets::generate());
    let both = WebhookSecrets::parse(&format!("{} {}", first.expose(), second.expose())).unwrap();
    let processor = delivering_to(&receiver.url, &both).await;

    processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await;
    wait_until("the event is delivered", || async { receiver.count() >= 1 }).await;

    let (headers, body) = receiver.deliveries().remove(0);
    let with =
        |secrets: &WebhookSecrets| standardwebhooks::Webhook::new(&secrets.expose()).unwrap();
    with(&first)
        .verify(&body, &headers)
        .expect("signed with the first secret");
    assert!(with(&second).verify(&body, &headers).is_err());
}

#[api_test]
async fn a_delivery_is_retried_with_the_same_webhook_id_until_answered_2xx() {
    let receiver = Receiver::start(3).await;
    let secret = WebhookSecrets::generate();
    let processor = delivering_to(&receiver.url, &secret).await;

    processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await;
    until_the_delivery_has(&processor, "the fourth attempt succeeds", "delivered_at").await;

    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 4);
    let ids: Vec<&str> = deliveries
        .iter()
        .map(|(headers, _)| headers["webhook-id"].to_str().unwrap())
        .collect();
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert!(deliveries.iter().all(|(_, body)| *body == deliveries[0].1));
    let (attempts, status): (i32, Option<i16>) =
        sqlx::query_as("SELECT attempts, last_status FROM webhook_deliveries")
            .fetch_one(&processor.db)
            .await
            .unwrap();
    assert_eq!((attempts, status), (4, Some(200)));
}

#[api_test]
async fn an_unreachable_receiver_is_retried_and_the_charge_is_unaffected() {
    let url = format!(
        "http://127.0.0.1:{}/hooks",
        crate::support::instance::free_port()
    );
    let processor = delivering_to(&url, &WebhookSecrets::generate()).await;

    let paid = processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await;

    assert_eq!(paid.status, 201);
    wait_until("a few attempts fail", || async {
        sqlx::query_scalar::<_, i32>("SELECT attempts FROM webhook_deliveries")
            .fetch_one(&processor.db)
            .await
            .unwrap()
            >= 3
    })
    .await;
    let (delivered, error): (bool, Option<String>) =
        sqlx::query_as("SELECT delivered_at IS NOT NULL, last_error FROM webhook_deliveries")
            .fetch_one(&processor.db)
            .await
            .unwrap();
    assert!(!delivered);
    assert!(error.is_some_and(|error| !error.is_empty()));
}

/// The processor's deliveries follow the same schedule as idempay's: after its last delay, the
/// delivery is given up.
#[api_test]
async fn the_processor_gives_a_delivery_up_when_the_schedule_runs_out() {
    let url = format!(
        "http://127.0.0.1:{}/hooks",
        crate::support::instance::free_port()
    );
    let processor = delivering_to(&url, &WebhookSecrets::generate()).await;

    processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await;
    until_the_delivery_has(&processor, "the delivery is given up", "failed_at").await;
    let (attempts, recorded): (i32, i64) = sqlx::query_as(
        "SELECT attempts, (SELECT count(*) FROM webhook_attempts) FROM webhook_deliveries",
    )
    .fetch_one(&processor.db)
    .await
    .unwrap();
    // The first attempt and one per delay of `delivering_to`'s schedule.
    assert_eq!((attempts, recorded), (7, 7));
}

/// Puts `count` deliveries to `url` in the processor's outbox by hand, each a `charge.succeeded`
/// of its own event id, due now.
async fn fill_outbox(processor: &TestProcessor, url: &str, count: u32) {
    let mut conn = processor.db.acquire().await.unwrap();
    for n in 0..count {
        let body =
            delivery::envelope("charge.succeeded", chrono::Utc::now(), &json!({ "n": n })).unwrap();
        delivery::enqueue(&mut conn, "processor", &delivery::event_id(), url, &body)
            .await
            .unwrap();
    }
}

#[api_test]
async fn two_delivery_loops_send_each_attempt_once() {
    let receiver = Receiver::start(0).await;
    let secret = WebhookSecrets::generate();
    // No loop of the processor's own: its outbox is filled by hand, for two loops to race on.
    let processor = TestProcessor::spawn().await;
    fill_outbox(&processor, &receiver.url, 60).await;
    let schedule = RetrySchedule::parse("50ms,100ms,200ms,400ms,800ms,1s").unwrap();
    let loops: Vec<Deliverer> = (0..2)
        .map(|_| {
            Deliverer::processor(
                ::processor::SERVICE,
                idempay::db::pool(&processor.database_url()).unwrap(),
                &secret,
                schedule.clone(),
                Duration::from_secs(5),
            )
            .unwrap()
        })
        .collect();

    // Both loops claim at once, again and again, until the outbox is drained (one URL: at most
    // PER_ENDPOINT a claim).
    for _ in 0..15 {
        let (a, b) = tokio::join!(loops[0].deliver_due(), loops[1].deliver_due());
        a.unwrap();
        b.unwrap();
    }

    let mut ids = receiver.webhook_ids();
    assert_eq!(ids.len(), 60, "one attempt each");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 60);
    let undelivered: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NULL OR attempts <> 1",
    )
    .fetch_one(&processor.db)
    .await
    .unwrap();
    assert_eq!(undelivered, 0);
}

/// A delivery loop claims at most [`delivery::PER_ENDPOINT`] rows of one endpoint a batch even when its statement was
/// planned while the outbox was empty, on a connection that keeps that plan: a loop polls a quiet
/// outbox every second, and from the sixth run of a prepared statement on PostgreSQL may keep a
/// generic plan of it, made without the parameters' values.
/// Locked in `IN (SELECT … LIMIT $2 FOR UPDATE SKIP LOCKED)`, that plan ran the sub-select again
/// for every row it compared, and the first batch claimed all 120 rows (tried; after one empty
/// poll it did not); locked once in `ARRAY(…)`, the batches are 5 each, each row sent once.
#[api_test]
async fn a_delivery_batch_planned_while_the_outbox_was_empty_still_claims_at_most_5_rows_of_an_endpoint()
 {
    let receiver = Receiver::start(0).await;
    // No loop of the processor's own: its outbox is filled by hand.
    let processor = TestProcessor::spawn().await;
    let pool =
        one_connection_planning_for_empty(&processor.database_url(), &["webhook_deliveries"]).await;
    let deliverer = Deliverer::processor(
        ::processor::SERVICE,
        pool,
        &WebhookSecrets::generate(),
        RetrySchedule::parse("1h").unwrap(),
        Duration::from_secs(5),
    )
    .unwrap();
    // Six polls of the empty outbox: five custom plans, then the generic one.
    for _ in 0..6 {
        assert_eq!(deliverer.deliver_due().await.unwrap(), 0, "nothing due yet");
    }

    fill_outbox(&processor, &receiver.url, 120).await;

    // One URL: one endpoint, of which a batch takes at most PER_ENDPOINT.
    let mut batches = Vec::new();
    for _ in 0..25 {
        batches.push(deliverer.deliver_due().await.unwrap());
    }
    assert_eq!(
        batches,
        [[5; 24].as_slice(), &[0]].concat(),
        "the delivery loop's batches"
    );
    assert_eq!(delivery::BATCH, 50);
    assert_eq!(delivery::PER_ENDPOINT, 5);
    let mut ids = receiver.webhook_ids();
    assert_eq!(ids.len(), 120);
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 120, "each row sent once");
}

#[api_test]
async fn a_delivery_verifies_at_idempay_s_own_intake() {
    let secret = WebhookSecrets::generate();
    let idempay = TestApp::spawn_with(Settings {
        shared: SharedArgs {
            webhook_secrets: Some(secret.clone()),
            ..SharedArgs::default()
        },
        ..Settings::default()
    })
    .await;
    let processor = delivering_to(&idempay.url("/v1/webhooks/processor"), &secret).await;

    processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await;
    let attempt = || async {
        sqlx::query_as::<_, (String, i32, Option<i16>, bool)>(
            "SELECT event_id, attempts, last_status, delivered_at IS NOT NULL
             FROM webhook_deliveries",
        )
        .fetch_one(&processor.db)
        .await
        .unwrap()
    };
    wait_until("idempay answers the event", || async {
        attempt().await.2.is_some()
    })
    .await;

    // A charge made directly at the processor, which no payment records (yet): the signature
    // verifies (no 401), and the event is acknowledged and parked until a payment records it.
    let (event, _, status, acknowledged) = attempt().await;
    assert_eq!((status, acknowledged), (Some(200), true));
    let recorded: Option<String> =
        sqlx::query_scalar("SELECT outcome FROM processed_events WHERE id = $1")
            .bind(&event)
            .fetch_optional(&idempay.db)
            .await
            .unwrap();
    assert_eq!(recorded.as_deref(), Some("parked"));
}

/// A receiver that answers `status` with `Retry-After: 1` to the first delivery, then 200: the
/// processor comes back about a second later, as asked, though its schedule's next attempt is an
/// hour away; that early attempt did not use up the schedule. Before, the outbox read no
/// `Retry-After`, and the second attempt was due after the hour.
#[api_test]
async fn a_receiver_s_retry_after_brings_the_next_attempt_forward() {
    for status in [StatusCode::CONFLICT, StatusCode::SERVICE_UNAVAILABLE] {
        let answered = Arc::new(AtomicUsize::new(0));
        let counted = answered.clone();
        let app = Router::new().route(
            "/hooks",
            post(move || {
                let counted = counted.clone();
                async move {
                    if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                        (status, [("retry-after", "1")]).into_response()
                    } else {
                        StatusCode::OK.into_response()
                    }
                }
            }),
        );
        let url = serve_hooks(app).await;
        let mut settings = settings();
        settings.webhook_url = Some(url);
        settings.shared.webhook_secrets = Some(WebhookSecrets::generate());
        settings.shared.webhook_retry_schedule = RetrySchedule::parse("1h,1h").unwrap();
        let processor = TestProcessor::spawn_with(settings).await;

        processor
            .charge(&new_key(), &charge(5000, "pm_card_visa"))
            .await;
        until_the_delivery_has(
            &processor,
            "the second attempt is acknowledged",
            "delivered_at",
        )
        .await;
        let (attempts, early, statuses): (i32, i32, Vec<i16>) = sqlx::query_as(
            "SELECT d.attempts, d.early_attempts,
                    (SELECT array_agg(status_code ORDER BY attempt) FROM webhook_attempts)
             FROM webhook_deliveries d",
        )
        .fetch_one(&processor.db)
        .await
        .unwrap();
        assert_eq!(
            (attempts, early, statuses),
            (2, 1, vec![i16::try_from(status.as_u16()).unwrap(), 200]),
            "{status}"
        );
        assert_eq!(answered.load(Ordering::SeqCst), 2);
    }
}
