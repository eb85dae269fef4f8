//! Changing an endpoint instead of deleting it: its fields updated once per key, each change
//! audited as a `webhook_endpoint.updated` event, re-enabling that starts its failure streak
//! afresh, and a rolled secret whose predecessor keeps signing, beside it, for the overlap only.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::{Value, json};
use service::outbox::{Rejection, WebhookSecrets};

use super::{Receiver, endpoint_for, endpoint_for_all, local, wait_for, write_event};
use crate::support::helpers::{TestApp, TestResponse, new_key};

/// What the endpoints with a receiver subscribe to: not `webhook_endpoint.updated`, whose own
/// deliveries would mix with the ones each test counts.
const PAYMENTS: &[&str] = &["payment.succeeded"];

/// `POST path` under a new key with `body`, as the app's account.
async fn post(app: &TestApp, path: &str, body: &Value) -> TestResponse {
    app.post_keyed(path, &new_key(), body).await
}

/// The `webhook_endpoint.updated` events of the app's account, oldest first, as the feed has them.
async fn updates(app: &TestApp) -> Vec<Value> {
    let bodies: Vec<Vec<u8>> = sqlx::query_scalar(
        "SELECT body FROM events WHERE account_id = $1 AND type = 'webhook_endpoint.updated'
         ORDER BY seq",
    )
    .bind(&app.account_id)
    .fetch_all(&app.db)
    .await
    .unwrap();
    bodies
        .iter()
        .map(|body| serde_json::from_slice(body).unwrap())
        .collect()
}

/// Waits for the receiver's next delivery and returns its headers and body.
async fn next_delivery(receiver: &Receiver, seen: usize) -> (axum::http::HeaderMap, Vec<u8>) {
    wait_for(
        "the event reaches the receiver",
        Duration::from_secs(20),
        || async { receiver.count() > seen },
    )
    .await;
    let (headers, body) = receiver.deliveries()[seen].clone();
    (headers, body.to_vec())
}

/// What a receiver that holds only `secret` makes of a delivery.
fn verified_by(
    secret: &str,
    headers: &axum::http::HeaderMap,
    body: &[u8],
) -> Result<(), Rejection> {
    WebhookSecrets::parse(secret)
        .unwrap()
        .verify(headers, body)
        .map(|_| ())
}

#[api_test]
async fn during_a_roll_s_overlap_both_secrets_verify_a_delivery_and_after_it_only_the_new_one() {
    let app = TestApp::spawn_with(local("1s")).await;
    let receiver = Receiver::start(0).await;
    let (id, old) = endpoint_for(&app, &receiver.url, PAYMENTS).await;
    let path = format!("/v1/webhook_endpoints/{id}/roll_secret");

    let key = new_key();
    let rolled = app
        .post_keyed(&path, &key, &json!({ "expires_in": 3600 }))
        .await;
    let replayed = app
        .post_keyed(&path, &key, &json!({ "expires_in": 3600 }))
        .await;
    rolled.assert_status(200);
    assert!(replayed.replayed());
    assert_eq!(
        rolled.body, replayed.body,
        "one roll per key, its secret shown again"
    );
    let endpoint = rolled.json();
    let new = endpoint["secret"].as_str().unwrap().to_owned();
    assert!(new.starts_with("whsec_") && new != old, "{new}");
    let rolled_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(endpoint["secret_rolled_at"].clone()).unwrap();
    let expires_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(endpoint["previous_secret_expires_at"].clone()).unwrap();
    assert_eq!(expires_at - rolled_at, chrono::Duration::seconds(3600));
    let read = app.get(&format!("/v1/webhook_endpoints/{id}")).await;
    assert!(
        !String::from_utf8_lossy(&read.body).contains("whsec_"),
        "GET shows no secret"
    );

    // During the overlap: two signatures, the new secret's first, and either receiver verifies.
    write_event(&app.db, &app.account_id, "payment.succeeded").await;
    let (headers, body) = next_delivery(&receiver, 0).await;
    let signatures = headers["webhook-signature"].to_str().unwrap();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    assert!(signatures.split(' ').all(|entry| entry.starts_with("v1,")));
    assert_eq!(verified_by(&new, &headers, &body), Ok(()), "the new secret");
    assert_eq!(verified_by(&old, &headers, &body), Ok(()), "the old secret");

    // The overlap ends (its expiry brought to now rather than waited for).
    sqlx::query(
        "UPDATE webhook_endpoints SET previous_secret_expires_at = now() - interval '1 second'
         WHERE id = $1",
    )
    .bind(&id)
    .execute(&app.db)
    .await
    .unwrap();
    write_event(&app.db, &app.account_id, "payment.succeeded").await;
    let (headers, body) = next_delivery(&receiver, 1).await;
    assert_eq!(verified_by(&new, &headers, &body), Ok(()), "the new secret");
    assert_eq!(
        verified_by(&old, &headers, &body),
        Err(Rejection::BadSignature),
        "the old secret no longer signs"
    );

    // Audited without either secret: what the roll replaced, the endpoint as it left it.
    let audit = updates(&app).await;
    assert_eq!(
        audit.len(),
        1,
        "one event for one roll, however often replayed"
    );
    let text = audit[0].to_string();
    assert!(
        !text.contains(&new) && !text.contains(&old) && !text.contains("whsec_"),
        "{text}"
    );
    assert_eq!(audit[0]["data"]["object"]["id"], id.as_str());
    assert_eq!(
        audit[0]["data"]["previous_attributes"],
        json!({ "secret_rolled_at": null, "previous_secret_expires_at": null })
    );
}

#[api_test]
async fn a_roll_with_no_overlap_signs_with_the_new_secret_alone_and_a_second_roll_drops_the_first_s_old_secret()
 {
    let app = TestApp::spawn_with(local("1s")).await;
    let receiver = Receiver::start(0).await;
    let (id, first) = endpoint_for(&app, &receiver.url, PAYMENTS).await;
    let path = format!("/v1/webhook_endpoints/{id}/roll_secret");

    let second = post(&app, &path, &json!({})).await;
    second.assert_status(200);
    let second_secret = second.json()["secret"].as_str().unwrap().to_owned();
    assert!(
        second.json()["previous_secret_expires_at"].is_string(),
        "a day by default"
    );
    // `0.0` is the integer 0 to JSON Schema, as the description has it.
    let third = post(&app, &path, &json!({ "expires_in": 0.0 })).await;
    third.assert_status(200);
    let third_secret = third.json()["secret"].as_str().unwrap().to_owned();
    assert_eq!(third.json()["previous_secret_expires_at"], Value::Null);

    write_event(&app.db, &app.account_id, "payment.succeeded").await;
    let (headers, body) = next_delivery(&receiver, 0).await;
    let signatures = headers["webhook-signature"].to_str().unwrap();
    assert_eq!(signatures.split(' ').count(), 1, "{signatures}");
    assert_eq!(verified_by(&third_secret, &headers, &body), Ok(()));
    for earlier in [&first, &second_secret] {
        assert_eq!(
            verified_by(earlier, &headers, &body),
            Err(Rejection::BadSignature)
        );
    }

    for bad in [
        json!({ "expires_in": 604_801 }),
        json!({ "expires_in": -1 }),
        json!({ "expires_in": 1.5 }),
        json!({ "expires_in": "60" }),
        json!({ "expiry": 1 }),
    ] {
        post(&app, &path, &bad)
            .await
            .assert_problem(400, "invalid-request");
    }
    let (_, stranger) = app.create_account("stranger").await;
    app.send(app.keyed_post_as(&stranger, &path, &new_key(), &json!({})))
        .await
        .assert_problem(404, "not-found");
    assert_eq!(
        updates(&app).await.len(),
        2,
        "two rolls, two events; refusals none"
    );
}

#[api_test]
async fn an_update_changes_only_the_fields_given_once_per_key_and_is_audited() {
    let app = TestApp::spawn_with(local("1s")).await;
    let (id, secret) = endpoint_for(&app, "http://127.0.0.1:9/hooks", &["payment.succeeded"]).await;
    let path = format!("/v1/webhook_endpoints/{id}");
    let change = json!({ "url": "http://127.0.0.1:10/hooks", "description": "Orders" });

    let key = new_key();
    let updated = app.post_keyed(&path, &key, &change).await;
    let replayed = app.post_keyed(&path, &key, &change).await;
    updated.assert_status(200);
    assert!(replayed.replayed());
    assert_eq!(updated.body, replayed.body);
    let endpoint = updated.json();
    assert_eq!(endpoint["url"], "http://127.0.0.1:10/hooks");
    assert_eq!(endpoint["description"], "Orders");
    assert_eq!(
        endpoint["enabled_events"],
        json!(["payment.succeeded"]),
        "unchanged"
    );
    assert_eq!(endpoint["status"], "enabled", "unchanged");
    assert!(endpoint.get("secret").is_none(), "{endpoint}");
    assert_eq!(app.get(&path).await.json(), endpoint);
    let inspected = app.get(&format!("/v1/idempotency_keys/{key}")).await.json();
    assert_eq!(
        inspected["uses"][0]["route"],
        "POST /v1/webhook_endpoints/{id}"
    );
    assert_eq!(inspected["uses"][0]["response_status"], 200);

    // A change that changes nothing answers the endpoint and writes no event.
    let same = post(&app, &path, &json!({ "description": "Orders" })).await;
    same.assert_status(200);
    let audit = updates(&app).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        audit[0]["data"]["previous_attributes"],
        json!({ "url": "http://127.0.0.1:9/hooks", "description": null })
    );
    assert_eq!(
        audit[0]["data"]["object"]["url"],
        "http://127.0.0.1:10/hooks"
    );
    assert!(!audit[0].to_string().contains(&secret));

    post(
        &app,
        &path,
        &json!({ "description": "", "enabled_events": ["*"] }),
    )
    .await
    .assert_status(200);
    let endpoint = app.get(&path).await.json();
    assert_eq!(
        endpoint["description"],
        Value::Null,
        "an empty description removes it"
    );
    assert_eq!(endpoint["enabled_events"], json!(["*"]));

    for (bad, param) in [
        (
            json!({ "enabled_events": ["charge.succeeded"] }),
            "/enabled_events",
        ),
        (json!({ "enabled_events": [] }), "/enabled_events"),
        (json!({ "url": "ftp://example.com/" }), "/url"),
        (json!({ "status": "paused" }), "/status"),
        (json!({ "description": "x".repeat(1001) }), "/description"),
        (
            json!({ "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" }),
            "",
        ),
    ] {
        let problem = post(&app, &path, &bad)
            .await
            .assert_problem(400, "invalid-request");
        if !param.is_empty() {
            assert_eq!(problem["param"], param, "{bad}: {problem}");
        }
    }
    let (_, stranger) = app.create_account("stranger").await;
    app.send(app.keyed_post_as(&stranger, &path, &new_key(), &json!({ "description": "x" })))
        .await
        .assert_problem(404, "not-found");
    assert_eq!(
        app.get(&path).await.json(),
        endpoint,
        "nothing changed by a refusal"
    );
    assert_eq!(updates(&app).await.len(), 2);
}

/// Without `IDEMPAY_WEBHOOK_ALLOW_PRIVATE`, an update may not point an endpoint into the network
/// idempay runs in, any more than a registration may.
#[api_test]
async fn an_update_to_a_private_url_is_refused_unless_private_addresses_are_allowed() {
    let app = TestApp::spawn_with(Settings::default()).await;
    let (id, _) = endpoint_for_all(&app, "http://93.184.216.34/hooks").await;
    let path = format!("/v1/webhook_endpoints/{id}");
    for private in [
        "http://127.0.0.1:8080/hooks",
        "http://169.254.169.254/",
        "http://[::1]/",
    ] {
        let problem = post(&app, &path, &json!({ "url": private }))
            .await
            .assert_problem(400, "invalid-request");
        assert_eq!(problem["param"], "/url", "{problem}");
    }
    assert_eq!(
        app.get(&path).await.json()["url"],
        "http://93.184.216.34/hooks"
    );
    assert!(updates(&app).await.is_empty());
}

/// A merchant's `disabled` gives up the pending deliveries; `enabled` sends the events from then
/// on, and a delivery created before it, given up afterwards (an attempt still in flight when the
/// endpoint was disabled), does not disable it again: its failure streak starts at re-enabling.
#[api_test]
async fn re_enabling_a_disabled_endpoint_starts_its_failure_streak_afresh() {
    // One retry, 30 s after a failure: never reached below, where the schedule is spent at once.
    let app = TestApp::spawn_with(local("30s")).await;
    let receiver = Receiver::start(1).await;
    let (id, _) = endpoint_for(&app, &receiver.url, PAYMENTS).await;
    let path = format!("/v1/webhook_endpoints/{id}");

    let before = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    wait_for("the first attempt", Duration::from_secs(20), || async {
        receiver.count() == 1
    })
    .await;
    let disabled = post(&app, &path, &json!({ "status": "disabled" })).await;
    assert_eq!(disabled.json()["status"], "disabled");
    let given_up: bool = sqlx::query_scalar(
        "SELECT failed_at IS NOT NULL FROM webhook_deliveries WHERE event_id = $1",
    )
    .bind(&before)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert!(
        given_up,
        "a disabled endpoint's pending deliveries are given up"
    );

    let enabled = post(&app, &path, &json!({ "status": "enabled" })).await;
    assert_eq!(enabled.json()["status"], "enabled");
    // The delivery created before re-enabling comes back for its last attempt, which fails (to
    // a port where nothing listens) and is given up, as an attempt in flight across the
    // disabling and re-enabling would be.
    sqlx::query(
        "UPDATE webhook_deliveries
         SET failed_at = NULL, next_attempt_at = now(), attempts = 1,
             url = 'http://127.0.0.1:9/hooks'
         WHERE event_id = $1",
    )
    .bind(&before)
    .execute(&app.db)
    .await
    .unwrap();
    wait_for(
        "the old delivery is given up",
        Duration::from_secs(20),
        || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT failed_at IS NOT NULL FROM webhook_deliveries WHERE event_id = $1",
            )
            .bind(&before)
            .fetch_one(&app.db)
            .await
            .unwrap()
        },
    )
    .await;
    assert_eq!(
        app.get(&path).await.json()["status"],
        "enabled",
        "not disabled by it"
    );

    let after = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    wait_for("the new event arrives", Duration::from_secs(20), || async {
        receiver.webhook_ids().contains(&after)
    })
    .await;
    let audit = updates(&app).await;
    let statuses: Vec<&Value> = audit
        .iter()
        .map(|event| &event["data"]["previous_attributes"]["status"])
        .collect();
    assert_eq!(statuses, [&json!("enabled"), &json!("disabled")]);
}

/// A new URL takes the deliveries still being retried, not only the events that follow.
#[api_test]
async fn a_new_url_receives_the_deliveries_still_being_retried() {
    let app = TestApp::spawn_with(local("1s")).await;
    let receiver = Receiver::start(0).await;
    // Nothing listens on the discard port: the first attempt fails, and the next is a second on.
    let (id, secret) = endpoint_for(&app, "http://127.0.0.1:9/hooks", PAYMENTS).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    super::attempts_recorded(&app.db, 1, "the first attempt, refused").await;

    let moved = post(
        &app,
        &format!("/v1/webhook_endpoints/{id}"),
        &json!({ "url": receiver.url }),
    )
    .await;
    moved.assert_status(200);
    let (headers, body) = next_delivery(&receiver, 0).await;
    assert_eq!(headers["webhook-id"], event.as_str());
    assert_eq!(verified_by(&secret, &headers, &body), Ok(()));
}
