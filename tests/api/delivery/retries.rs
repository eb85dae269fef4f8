//! Delivery: signed with the endpoint's secret under the event's id, retried on the schedule,
//! recorded attempt by attempt, given up when the schedule runs out, sent once per attempt however
//! many instances run, and never to a private address without the setting.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::Value;

use super::{
    FAN_OUT, Receiver, attempts_recorded, endpoint_for_all, local, serve_hooks, wait_for,
    write_event,
};
use crate::support::helpers::{TestApp, one_storm_at_a_time};
use crate::support::instance::{Instance, Metrics};

async fn delivered(app: &TestApp, event: &str) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT delivered_at IS NOT NULL FROM webhook_deliveries WHERE event_id = $1",
    )
    .bind(event)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Waits, at most `within`, until the delivery of `event` is given up; `what` says which one.
async fn until_given_up(app: &TestApp, event: &str, what: &str, within: Duration) {
    wait_for(what, within, || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT failed_at IS NOT NULL FROM webhook_deliveries WHERE event_id = $1",
        )
        .bind(event)
        .fetch_one(&app.db)
        .await
        .unwrap()
    })
    .await;
}

#[api_test(citus)]
async fn an_endpoint_that_fails_three_deliveries_gets_the_fourth_with_the_same_id_and_its_own_signature()
 {
    let app = TestApp::spawn_with(local("100ms,100ms,100ms,100ms")).await;
    let receiver = Receiver::start(3).await;
    let (endpoint, secret) = endpoint_for_all(&app, &receiver.url).await;

    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    wait_for(
        "the fourth attempt is acknowledged",
        Duration::from_secs(20),
        || delivered(&app, &event),
    )
    .await;

    let deliveries = receiver.deliveries();
    assert_eq!(deliveries.len(), 4);
    let verifier = standardwebhooks::Webhook::new(&secret).unwrap();
    for (headers, body) in &deliveries {
        assert_eq!(headers["webhook-id"], event.as_str());
        verifier
            .verify(body, headers)
            .expect("signed with the secret given at creation");
        let sent: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(
            (sent["id"].as_str(), sent["type"].as_str()),
            (Some(event.as_str()), Some("payment.succeeded"))
        );
    }

    let attempts = app.get(&format!("/v1/events/{event}/attempts")).await;
    assert_eq!(attempts.status, 200);
    let attempts = attempts.json();
    let listed: Vec<(i64, Option<i64>, &str)> = attempts["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|attempt| {
            (
                attempt["attempt"].as_i64().unwrap(),
                attempt["status_code"].as_i64(),
                attempt["endpoint"].as_str().unwrap(),
            )
        })
        .collect();
    let endpoint = endpoint.as_str();
    assert_eq!(
        listed,
        [
            (1, Some(500), endpoint),
            (2, Some(500), endpoint),
            (3, Some(500), endpoint),
            (4, Some(200), endpoint),
        ]
    );
    assert_eq!(attempts["has_more"], false);

    // Another account's event is not found, its attempts with it.
    let (_, stranger) = app.create_account("stranger").await;
    app.send(
        app.client()
            .get(app.url(&format!("/v1/events/{event}/attempts")))
            .bearer_auth(&stranger),
    )
    .await
    .assert_problem(404, "not-found");

    let metrics = Metrics::new(app.get("/metrics").await.body);
    for outcome in ["retried", "delivered"] {
        let series = format!(
            "idempay_webhook_deliveries_total{{sender=\"endpoints\",outcome=\"{outcome}\"}}"
        );
        assert!(metrics.value(&series).is_some_and(|n| n >= 1.0), "{series}");
    }
    assert!(
        metrics
            .value("idempay_webhook_oldest_pending_seconds")
            .is_some()
    );
}

#[api_test]
async fn when_the_schedule_runs_out_the_delivery_fails_and_the_endpoint_is_disabled() {
    let app = TestApp::spawn_with(local("100ms,100ms")).await;
    let receiver = Receiver::start(usize::MAX).await;
    let (endpoint, _) = endpoint_for_all(&app, &receiver.url).await;

    let event = write_event(&app.db, &app.account_id, "refund.created").await;
    until_given_up(
        &app,
        &event,
        "the delivery is given up",
        Duration::from_secs(20),
    )
    .await;

    let (attempts, recorded, delivered): (i32, i64, bool) = sqlx::query_as(
        "SELECT d.attempts, (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id),
                d.delivered_at IS NOT NULL
         FROM webhook_deliveries d WHERE d.event_id = $1",
    )
    .bind(&event)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (attempts, recorded, delivered),
        (3, 3, false),
        "the first and two retries"
    );
    assert_eq!(receiver.deliveries().len(), 3);
    let read = app.get(&format!("/v1/webhook_endpoints/{endpoint}")).await;
    assert_eq!(read.json()["status"], "disabled");

    // A disabled endpoint is sent nothing more.
    let later = write_event(&app.db, &app.account_id, "refund.created").await;
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries WHERE event_id = $1")
            .bind(&later)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(queued, 0);
}

/// Three `idempay serve` processes deliver 500 events to one endpoint that always answers 2xx:
/// each event arrives exactly once, and each delivery was attempted once. The three share the
/// work: each instance's metrics count deliveries of its own, and they add up to the 500 (one
/// instance delivering everything would prove nothing about the others).
#[api_test]
async fn three_instances_deliver_every_event_once() {
    let _alone = one_storm_at_a_time().await;
    const EVENTS: i64 = 500;
    let app = TestApp::spawn_with(local("100ms")).await;
    let receiver = Receiver::start(0).await;
    endpoint_for_all(&app, &receiver.url).await;
    // Only the three processes deliver.
    app.stop();
    let env = [
        ("IDEMPAY_WEBHOOK_ALLOW_PRIVATE", "true"),
        ("IDEMPAY_WEBHOOK_RETRY_SCHEDULE", "100ms"),
        // Each polls soon after the events appear: none is a second late to a backlog the others
        // could drain in that second.
        ("IDEMPAY_WEBHOOK_POLL_INTERVAL", "100ms"),
    ];
    let database_url = app.database_url();
    let instances =
        futures::future::join_all((0..3).map(|_| Instance::start(&database_url, &env))).await;

    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH event AS (
             INSERT INTO events (id, account_id, type, body)
             SELECT 'evt_' || lpad(n::text, 24, '0'), $1, 'payment.succeeded',
                    convert_to(json_build_object('id', 'evt_' || lpad(n::text, 24, '0'),
                        'object', 'event', 'type', 'payment.succeeded', 'created_at', now(),
                        'data', json_build_object('object', json_build_object('id', n)))::text,
                        'UTF8')
             FROM generate_series(1, $2) n
             RETURNING id, account_id, type, body
         ) {FAN_OUT}",
    )))
    .bind(&app.account_id)
    .bind(EVENTS)
    .execute(&app.db)
    .await
    .unwrap();
    wait_for(
        "every event is delivered",
        Duration::from_secs(120),
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NOT NULL",
            )
            .fetch_one(&app.db)
            .await
            .unwrap()
                == EVENTS
        },
    )
    .await;

    let arrivals = receiver.arrivals();
    assert_eq!(arrivals.len(), 500, "every event arrived");
    assert!(arrivals.values().all(|&n| n == 1), "each exactly once");
    let (deliveries, attempted_once, attempts): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE attempts = 1),
                (SELECT count(*) FROM webhook_attempts)
         FROM webhook_deliveries",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (deliveries, attempted_once, attempts),
        (EVENTS, EVENTS, EVENTS)
    );
    let mut delivered_by = Vec::new();
    for instance in &instances {
        delivered_by.push(
            instance
                .metrics()
                .await
                .value(
                    r#"idempay_webhook_deliveries_total{sender="endpoints",outcome="delivered"}"#,
                )
                .unwrap_or(0.0),
        );
    }
    eprintln!("delivery: the three instances delivered {delivered_by:?} of {EVENTS} events");
    assert_eq!(
        delivered_by.iter().sum::<f64>(),
        EVENTS as f64,
        "the instances' counts add up to the events: {delivered_by:?}"
    );
    assert!(
        delivered_by.iter().all(|delivered| *delivered > 0.0),
        "every instance delivered some of the events: {delivered_by:?}"
    );
}

/// An endpoint that was registered while private addresses were allowed (or whose name now
/// resolves to one) is not sent to by an instance that does not allow them: the attempt fails
/// and says why.
#[api_test]
async fn a_delivery_to_a_private_address_is_refused_at_sending_time() {
    let registering = TestApp::spawn_with(local("1h")).await;
    let receiver = Receiver::start(0).await;
    let by_address = endpoint_for_all(&registering, &receiver.url).await;
    let by_name = endpoint_for_all(
        &registering,
        &receiver.url.replace("127.0.0.1", "localhost"),
    )
    .await;
    // 6to4 wrapping 127.0.0.1: refused when sending as when registering.
    let by_6to4 = endpoint_for_all(&registering, "http://[2002:7f00:1::]:18080/").await;
    registering.stop();
    let sending = registering.another_instance(Settings::default()).await;

    let event = write_event(&sending.db, &sending.account_id, "payment.succeeded").await;
    attempts_recorded(&sending.db, 3, "the three attempts are recorded").await;

    assert!(receiver.deliveries().is_empty(), "nothing was sent");
    let attempts = sending
        .get(&format!("/v1/events/{event}/attempts"))
        .await
        .json();
    for (endpoint, needle) in [
        (&by_address.0, "not a public address"),
        (&by_name.0, "no public address"),
        (&by_6to4.0, "not a public address"),
    ] {
        let attempt = attempts["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|attempt| attempt["endpoint"] == endpoint.as_str())
            .unwrap();
        assert_eq!(attempt["status_code"], Value::Null);
        let error = attempt["error"].as_str().unwrap();
        assert!(error.contains(needle), "{endpoint}: {error}");
    }
}

/// Registers an endpoint for every event served by `hooks`, writes an event and waits for the one
/// attempt to deliver it: the event's id and its attempts as the API lists them.
async fn one_attempt_at(app: &TestApp, hooks: axum::Router) -> (String, Value) {
    let url = serve_hooks(hooks).await;
    endpoint_for_all(app, &url).await;
    let event = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    attempts_recorded(&app.db, 1, "the attempt is recorded").await;
    let attempts = app
        .get(&format!("/v1/events/{event}/attempts"))
        .await
        .json();
    (event, attempts)
}

/// A redirect could lead anywhere, a private address included: it is not followed, and counts as
/// a failed attempt.
#[api_test]
async fn a_redirect_is_a_failed_attempt_and_is_not_followed() {
    let app = TestApp::spawn_with(local("1h")).await;
    let target = Receiver::start(0).await;
    let location = target.url.clone();
    let redirecting = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move || {
            let location = location.clone();
            async move {
                (
                    axum::http::StatusCode::TEMPORARY_REDIRECT,
                    [(axum::http::header::LOCATION, location)],
                )
            }
        }),
    );
    let (event, attempts) = one_attempt_at(&app, redirecting).await;
    assert_eq!(attempts["data"][0]["status_code"], 307);
    assert!(!delivered(&app, &event).await);
    assert!(
        target.deliveries().is_empty(),
        "the redirect was not followed"
    );
}

/// An endpoint slower than the delivery timeout has failed the attempt, with no status.
#[api_test]
async fn an_answer_later_than_the_delivery_timeout_is_a_failed_attempt() {
    let mut settings = local("1h");
    settings.shared.webhook_delivery_timeout = Duration::from_millis(300);
    let app = TestApp::spawn_with(settings).await;
    let slow = axum::Router::new().route(
        "/hooks",
        axum::routing::post(|| async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            axum::http::StatusCode::OK
        }),
    );
    let (event, attempts) = one_attempt_at(&app, slow).await;
    let attempt = &attempts["data"][0];
    assert_eq!(attempt["status_code"], Value::Null);
    assert!(attempt["latency_ms"].as_i64().unwrap() < 3000, "{attempt}");
    assert!(
        attempt["error"].as_str().unwrap().contains("timed out"),
        "{attempt}"
    );
    assert!(!delivered(&app, &event).await);
}

/// An endpoint is disabled only when it acknowledged nothing since the event it gave up on: one
/// that acknowledged a later event keeps receiving, though that one delivery was given up.
#[api_test]
async fn an_endpoint_that_acknowledged_a_later_event_stays_enabled_when_one_delivery_fails() {
    let app = TestApp::spawn_with(local("200ms,200ms")).await;
    let (endpoint, second) =
        one_delivery_given_up_after_a_later_one_acknowledged(&app, false).await;
    assert!(delivered(&app, &second).await);
    let read = app.get(&format!("/v1/webhook_endpoints/{endpoint}")).await;
    assert_eq!(read.json()["status"], "enabled");
}

/// The later acknowledgment counts even once retention pruned its delivery, which it does when a
/// delivery outlives the schedule's span on a machine too busy to send on time: the endpoint's row
/// keeps when it last acknowledged. (Before it did, this endpoint was disabled.)
#[api_test]
async fn an_acknowledgment_whose_delivery_was_pruned_still_keeps_the_endpoint_enabled() {
    let app = TestApp::spawn_with(local("200ms,200ms")).await;
    let (endpoint, _) = one_delivery_given_up_after_a_later_one_acknowledged(&app, true).await;
    let read = app.get(&format!("/v1/webhook_endpoints/{endpoint}")).await;
    assert_eq!(read.json()["status"], "enabled");
}

/// An endpoint that refuses one event, written first, and acknowledges a second written after it;
/// returns the endpoint and the second event once the first's delivery is given up. The refusals
/// wait until the second is acknowledged (and, with `prune`, its delivery and attempts deleted as
/// retention deletes them), so the give-up surely comes after.
async fn one_delivery_given_up_after_a_later_one_acknowledged(
    app: &TestApp,
    prune: bool,
) -> (String, String) {
    let refused = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (done, refusals_may_go) = tokio::sync::watch::channel(false);
    let refusing = refused.clone();
    let picky = axum::Router::new().route(
        "/hooks",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let refused = refusing.lock().unwrap().clone();
            let mut refusals_may_go = refusals_may_go.clone();
            async move {
                if headers["webhook-id"] == refused.as_str() {
                    refusals_may_go.wait_for(|go| *go).await.ok();
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let url = serve_hooks(picky).await;
    let (endpoint, _) = endpoint_for_all(app, &url).await;

    // The first event is refused; it is written before the second, which is acknowledged.
    let first = format!("evt_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
    *refused.lock().unwrap() = first.clone();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH event AS (
             INSERT INTO events (id, account_id, type, body)
             VALUES ($1, $2, 'payment.succeeded', $3)
             RETURNING id, account_id, type, body
         ) {FAN_OUT}",
    )))
    .bind(&first)
    .bind(&app.account_id)
    .bind(format!(r#"{{"id":"{first}","object":"event","type":"payment.succeeded"}}"#).into_bytes())
    .execute(&app.db)
    .await
    .unwrap();
    let second = write_event(&app.db, &app.account_id, "payment.succeeded").await;
    wait_for(
        "the second delivery is acknowledged",
        Duration::from_secs(30),
        || async { delivered(app, &second).await },
    )
    .await;
    if prune {
        // As retention deletes them: the attempts, then the delivery, which must have been there.
        sqlx::query(
            "DELETE FROM webhook_attempts WHERE delivery_id IN
                 (SELECT id FROM webhook_deliveries WHERE event_id = $1)",
        )
        .bind(&second)
        .execute(&app.db)
        .await
        .unwrap();
        let pruned = sqlx::query("DELETE FROM webhook_deliveries WHERE event_id = $1")
            .bind(&second)
            .execute(&app.db)
            .await
            .unwrap()
            .rows_affected();
        assert_eq!(pruned, 1, "the acknowledged delivery was pruned");
    }
    done.send(true).unwrap();

    until_given_up(
        app,
        &first,
        "the first delivery is given up",
        Duration::from_secs(30),
    )
    .await;
    (endpoint, second)
}
