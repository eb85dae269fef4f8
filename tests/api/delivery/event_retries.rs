//! `POST /v1/events/{id}/retry`: one more delivery of an event to an endpoint, once per key,
//! delivered by the loop like any other with the event's id as `webhook-id`.

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::{Value, json};

use super::{Receiver, endpoint_for_all, local, settled, wait_for, write_event};
use crate::support::helpers::{TestApp, TestResponse, new_key};

/// `POST /v1/events/{event}/retry` as `api_key`.
pub(super) async fn post_retry(
    app: &TestApp,
    api_key: &str,
    event: &str,
    key: &str,
    body: &Value,
) -> TestResponse {
    let path = format!("/v1/events/{event}/retry");
    app.send(app.keyed_post_as(api_key, &path, key, body)).await
}

/// `POST /v1/events/{event}/retry` to `endpoint` under `key`, as the app's account.
pub(super) async fn retry_under(
    app: &TestApp,
    event: &str,
    key: &str,
    endpoint: &str,
) -> TestResponse {
    let body = json!({ "endpoint": endpoint });
    post_retry(app, &app.api_key, event, key, &body).await
}

/// The deliveries of `event` to `endpoint`: (queued by a retry, count).
async fn deliveries(app: &TestApp, event: &str, endpoint: &str) -> Vec<(bool, i64)> {
    sqlx::query_as(
        "SELECT retry, count(*) FROM webhook_deliveries
         WHERE event_id = $1 AND endpoint_id = $2 GROUP BY retry ORDER BY retry",
    )
    .bind(event)
    .bind(endpoint)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

#[api_test(citus)]
async fn a_retried_event_reaches_the_endpoint_again_with_its_id_and_a_replay_queues_nothing_more() {
    let app = TestApp::spawn_with(local("100ms,100ms")).await;
    let receiver = Receiver::start(0).await;
    let (endpoint, secret) = endpoint_for_all(&app, &receiver.url).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    wait_for(
        "the event is delivered",
        Duration::from_secs(20),
        || async { receiver.deliveries().len() == 1 },
    )
    .await;
    // Received is not yet recorded as acknowledged, and a retry is refused until it is.
    settled(&app, &event, None).await;

    let key = new_key();
    let retried = retry_under(&app, &event, &key, &endpoint).await;
    assert_eq!(retried.status, 202, "{:?}", retried.json());
    let delivery = retried.json();
    assert_eq!(delivery["object"], "webhook_delivery");
    assert_eq!(delivery["event"], event.as_str());
    assert_eq!(delivery["endpoint"], endpoint.as_str());
    assert_eq!(delivery["url"], receiver.url.as_str());
    assert!(delivery["created_at"].is_string());
    assert!(!retried.replayed());

    wait_for(
        "the event arrives again",
        Duration::from_secs(20),
        || async { receiver.deliveries().len() == 2 },
    )
    .await;
    let verifier = standardwebhooks::Webhook::new(&secret).unwrap();
    let received = receiver.deliveries();
    for (headers, body) in &received {
        verifier
            .verify(body, headers)
            .expect("signed with the endpoint's secret");
        assert_eq!(
            headers["webhook-id"],
            event.as_str(),
            "the event's id, both times"
        );
    }
    assert_eq!(received[0].1, received[1].1, "the same bytes both times");

    // The same key again: the same answer, and no other delivery.
    let replay = retry_under(&app, &event, &key, &endpoint).await;
    assert_eq!(replay.status, 202);
    assert!(replay.replayed());
    assert_eq!(replay.body, retried.body);
    assert_eq!(
        deliveries(&app, &event, &endpoint).await,
        [(false, 1), (true, 1)],
        "the fan-out's delivery and the one retry"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.arrivals()[&event], 2);

    // Its attempts are listed with the event's.
    let attempts = app
        .get(&format!("/v1/events/{event}/attempts"))
        .await
        .json();
    assert_eq!(attempts["data"].as_array().unwrap().len(), 2, "{attempts}");

    // Another key asks for one more.
    let again = retry_under(&app, &event, &new_key(), &endpoint).await;
    assert_eq!(again.status, 202);
    assert_eq!(
        deliveries(&app, &event, &endpoint).await,
        [(false, 1), (true, 2)]
    );
}

#[api_test(citus)]
async fn a_retry_of_an_unknown_or_another_account_s_event_or_endpoint_is_404_and_queues_nothing() {
    let app = TestApp::spawn_with(local("100ms,100ms")).await;
    let receiver = Receiver::start(0).await;
    let (endpoint, _) = endpoint_for_all(&app, &receiver.url).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    let (other, other_key) = app.create_account("other merchant").await;
    let (theirs, _) = super::endpoint_as(&app, &other_key, &receiver.url, &["*"]).await;
    let their_event = write_event(&app.db, &other, "payment.succeeded").await;

    let key = new_key();
    for (event, endpoint) in [
        ("evt_000000000000000000000000", endpoint.as_str()),
        (their_event.as_str(), endpoint.as_str()),
        (event.as_str(), "we_000000000000000000000000"),
        (event.as_str(), theirs.as_str()),
        ("pay_nothing", endpoint.as_str()),
    ] {
        retry_under(&app, event, &key, endpoint)
            .await
            .assert_problem(404, "not-found");
    }
    // A body that names no endpoint is refused before the key is reserved.
    for body in [
        json!({}),
        json!({ "endpoint": "ch_1" }),
        json!({ "endpoint": endpoint, "x": 1 }),
    ] {
        post_retry(&app, &app.api_key, &event, &new_key(), &body)
            .await
            .assert_problem(400, "invalid-request");
    }
    let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries WHERE retry")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(queued, 0);
    // Nothing was kept of the refused requests: the key serves a good one, once the event's own
    // delivery was acknowledged (a retry is refused while one is pending).
    settled(&app, &event, None).await;
    let retried = retry_under(&app, &event, &key, &endpoint).await;
    assert_eq!(retried.status, 202);
    assert!(!retried.replayed());
}

#[api_test(citus)]
async fn a_retry_to_a_disabled_endpoint_is_refused_with_409_and_queues_nothing() {
    let app = TestApp::spawn_with(local("100ms,100ms")).await;
    let receiver = Receiver::start(0).await;
    let (endpoint, _) = endpoint_for_all(&app, &receiver.url).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    // Disabled as the delivery loop disables an endpoint that acknowledged nothing for the whole
    // schedule.
    sqlx::query("UPDATE webhook_endpoints SET status = 'disabled' WHERE id = $1")
        .bind(&endpoint)
        .execute(&app.db)
        .await
        .unwrap();

    let key = new_key();
    let problem = retry_under(&app, &event, &key, &endpoint)
        .await
        .assert_problem(409, "webhook-endpoint-disabled");
    assert!(
        problem["detail"].as_str().unwrap().contains(&endpoint),
        "{problem}"
    );
    assert_eq!(deliveries(&app, &event, &endpoint).await, [(false, 1)]);
    // Not stored: the same key asks again, and is refused again, not replayed.
    let again = retry_under(&app, &event, &key, &endpoint).await;
    again.assert_problem(409, "webhook-endpoint-disabled");
    assert!(!again.replayed());
}
