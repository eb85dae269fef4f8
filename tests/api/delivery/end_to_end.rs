//! From the change to the merchant: the events a payment and its refund write reach the endpoint
//! as the feed serves them, and an event whose change committed is delivered even when the
//! process that committed it dies before it could send anything.

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::{Value, json};

use super::{Receiver, endpoint_for_all, local, wait_for};
use crate::support::helpers::{TestApp, new_key, payment};

#[api_test(citus)]
async fn a_payment_and_its_refund_reach_the_endpoint_signed_as_the_feed_serves_them() {
    let app = TestApp::spawn_with(local("100ms,100ms")).await;
    let receiver = Receiver::start(0).await;
    let (_, secret) = endpoint_for_all(&app, &receiver.url).await;

    let paid = app.post_payment(&new_key(), &payment(5000)).await;
    assert_eq!(paid.status, 201);
    let payment_id = paid.json()["id"].as_str().unwrap().to_owned();
    let refunded = app
        .post_refund(&payment_id, &new_key(), &json!({ "amount": 1500 }))
        .await;
    assert_eq!(refunded.status, 201);

    wait_for(
        "the three events reach the endpoint",
        Duration::from_secs(20),
        || async { receiver.deliveries().len() >= 3 },
    )
    .await;
    let verifier = standardwebhooks::Webhook::new(&secret).unwrap();
    let mut received = Vec::new();
    for (headers, body) in receiver.deliveries() {
        verifier
            .verify(&body, &headers)
            .expect("signed with the endpoint's secret");
        let event: Value = serde_json::from_slice(&body).unwrap();
        let id = event["id"].as_str().unwrap().to_owned();
        assert_eq!(
            headers["webhook-id"],
            id.as_str(),
            "webhook-id is the event id"
        );
        // The endpoint receives the very bytes the feed serves.
        let served = app.get(&format!("/v1/events/{id}")).await;
        assert_eq!(served.status, 200);
        assert_eq!(served.body, body.to_vec(), "{id}: the feed's bytes");
        received.push(event["type"].as_str().unwrap().to_owned());
    }
    received.sort();
    assert_eq!(
        received,
        ["payment.refunded", "payment.succeeded", "refund.created"]
    );
}

/// A process that commits a payment and dies at once, before its delivery loop could send the
/// event: the event is in the outbox with its change, and the next instance delivers it.
#[cfg(feature = "failpoints")]
#[api_test]
async fn an_event_committed_by_a_process_that_died_at_once_is_delivered_after_the_restart() {
    use std::os::unix::process::ExitStatusExt;

    use crate::support::helpers::died_before_answering;
    use crate::support::instance::Instance;

    let app = TestApp::spawn_with(local("100ms,100ms")).await;
    let receiver = Receiver::start(0).await;
    let (endpoint, _) = endpoint_for_all(&app, &receiver.url).await;
    // The in-process service stops delivering, so only the instances below can.
    app.stop();

    let env = [
        ("IDEMPAY_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("IDEMPAY_WEBHOOK_RETRY_SCHEDULE", "100ms,100ms"),
        ("IDEMPAY_LEASE", "3s"),
        ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
    ];
    let crashing_env = [env.as_slice(), &[("IDEMPAY_FAILPOINT", "after-commit")]].concat();
    let mut crashing = Instance::start(&app.database_url(), &crashing_env).await;
    let key = new_key();
    let sent = crashing
        .payment_request(&app.api_key, &key, &payment(4200))
        .send()
        .await;
    let exit = died_before_answering(sent, &mut crashing).await;
    assert_eq!(
        exit.signal(),
        Some(6),
        "it aborted at its failpoint: {exit}"
    );

    // The crash hit the window between the commit and any delivery: the payment, its event and
    // the event's delivery are committed, and nothing was sent.
    let (event, attempts): (String, i32) = sqlx::query_as(
        "SELECT e.id, d.attempts FROM events e JOIN webhook_deliveries d ON d.event_id = e.id
         WHERE e.type = 'payment.succeeded' AND d.endpoint_id = $1",
    )
    .bind(&endpoint)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(attempts, 0, "no attempt was made before the crash");
    assert!(receiver.deliveries().is_empty());

    let _restarted = Instance::start(&app.database_url(), &env).await;
    wait_for(
        "the restarted instance delivers the event",
        Duration::from_secs(20),
        || async { !receiver.deliveries().is_empty() },
    )
    .await;
    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries[0].0["webhook-id"], event.as_str());
}
