//! The bounds on `POST /v1/events/{id}/retry`: no retry while a delivery of the event to the
//! endpoint is pending, at most 5 of one event to one endpoint; and the retention never deletes an
//! event a retry is queueing a delivery of.

use std::time::Duration;

use idempay::db::Engine;
use idempay::webhooks::retention::prune_events;
use idempay_test_macros::api_test;
use serde_json::json;

use super::event_retries::retry_under;
use super::{Receiver, endpoint_for_all, local, settled, wait_for, write_event};
use crate::support::helpers::{TestApp, TestResponse, new_key};

/// `POST /v1/events/{event}/retry` to `endpoint` under a new key.
async fn retry_to(app: &TestApp, event: &str, endpoint: &str) -> TestResponse {
    retry_under(app, event, &new_key(), endpoint).await
}

#[api_test]
async fn a_retry_is_refused_while_a_delivery_is_pending_and_after_five_to_one_endpoint() {
    // Retried after an hour: the failing endpoint's delivery stays pending for the whole test.
    let app = TestApp::spawn_with(local("1h")).await;
    let healthy = Receiver::start(0).await;
    let (endpoint, _) = endpoint_for_all(&app, &healthy.url).await;
    let failing = Receiver::start(usize::MAX).await;
    let (stuck, _) = endpoint_for_all(&app, &failing.url).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;

    // The delivery to the failing endpoint is pending: another is refused, and the key released.
    let key = new_key();
    let pending = retry_under(&app, &event, &key, &stuck).await;
    let body = pending.assert_problem(409, "webhook-retry-pending");
    assert!(
        body["detail"].as_str().unwrap().contains("still pending"),
        "{body}"
    );

    // To the healthy endpoint: five retries, each once the one before was acknowledged. (Asking
    // again at once while one is pending is the stuck endpoint's case above: the healthy receiver
    // acknowledged a retry before a second ask, once, in a clean-clone CI.)
    settled(&app, &event, Some(&endpoint)).await;
    for n in 1..=5 {
        let queued = retry_to(&app, &event, &endpoint).await;
        assert_eq!(queued.status, 202, "retry {n}: {:?}", queued.json());
        settled(&app, &event, Some(&endpoint)).await;
    }
    let body = retry_to(&app, &event, &endpoint)
        .await
        .assert_problem(409, "webhook-retry-limit");
    assert!(
        body["detail"].as_str().unwrap().contains("5 times"),
        "{body}"
    );
    assert_eq!(
        healthy.arrivals()[&event],
        6,
        "its delivery and five retries"
    );

    // The key of a refused retry was released: it can be used again (and is refused again).
    let reused = retry_under(&app, &event, &key, &stuck).await;
    assert_eq!(reused.status, 409);

    let scraped = app.send(app.client().get(app.url("/metrics"))).await;
    let metrics = String::from_utf8_lossy(&scraped.body);
    for result in ["queued", "pending", "limit"] {
        assert!(
            metrics.contains(&format!(
                "idempay_webhook_manual_retries_total{{result=\"{result}\"}}"
            )),
            "{result}: {metrics}"
        );
    }
}

/// A retry holds its event from the moment it reads it until it commits, and the retention skips
/// an event so held: the retry is stopped, deterministically, between its read of the event and its
/// insert of the delivery (the test holds the endpoint's row, which the retry locks in between),
/// and the retention runs then. Without the event's lock, the retention deleted the event there
/// (no delivery of it was pending yet), the retry queued its delivery anyway, and the event it
/// sent answered 404 at `GET /v1/events/{id}`.
#[api_test]
async fn the_retention_never_deletes_an_event_a_retry_is_queueing_a_delivery_of() {
    let app = TestApp::spawn_with(local("1h")).await;
    let receiver = Receiver::start(0).await;
    let (endpoint, _) = endpoint_for_all(&app, &receiver.url).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    settled(&app, &event, None).await;
    // Past its retention.
    sqlx::query("UPDATE events SET created_at = now() - interval '2 days' WHERE id = $1")
        .bind(&event)
        .execute(&app.db)
        .await
        .unwrap();

    let mut held = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE")
        .bind(&endpoint)
        .execute(&mut *held)
        .await
        .unwrap();
    let retry = tokio::spawn(
        app.client()
            .post(app.url(&format!("/v1/events/{event}/retry")))
            .bearer_auth(&app.api_key)
            .header("idempotency-key", new_key())
            .json(&json!({ "endpoint": endpoint }))
            .send(),
    );
    wait_for(
        "the retry waits on the endpoint's row",
        Duration::from_secs(10),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%FROM webhook_endpoints%FOR SHARE%'",
            )
            .fetch_one(&app.db)
            .await
            .unwrap();
            waiting == 1
        },
    )
    .await;

    let deleted = prune_events(&app.db, Engine::Postgres, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(deleted, 0, "the event a retry holds is kept");
    held.rollback().await.unwrap();

    let retried = retry.await.unwrap().unwrap();
    assert_eq!(retried.status(), 202);
    // Read around the contract's check: the event written here has a stand-in payload.
    let read = app
        .client()
        .get(app.url(&format!("/v1/events/{event}")))
        .bearer_auth(&app.api_key)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200, "the event its delivery names");
    // While its delivery is pending, the retention keeps it too; after, it goes.
    settled(&app, &event, None).await;
    let deleted = prune_events(&app.db, Engine::Postgres, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
}
