//! What an operator sees: the metrics at `/metrics` and the request logs. Each test runs an
//! instance as a process of its own, so its metrics count only this test's requests.

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::Value;

use crate::support::helpers::{TestApp, new_key, payment, send, slow_payment};
use crate::support::instance::{Instance, Metrics};

#[api_test]
async fn metrics_count_requests_by_route_and_every_idempotency_outcome() {
    let app = TestApp::spawn().await;
    let instance = Instance::start(
        &app.database_url(),
        &[
            ("IDEMPAY_SLOW_CHARGE", "1500ms"),
            ("IDEMPAY_EXPIRY_INTERVAL", "100ms"),
        ],
    )
    .await;
    let key = new_key();
    let first = instance
        .post_payment(&app.api_key, &key, &payment(4200))
        .await;
    assert_eq!(first.status, 201);
    // Twice: the second replay is served from memory, and counted all the same.
    for _ in 0..2 {
        assert!(
            instance
                .post_payment(&app.api_key, &key, &payment(4200))
                .await
                .replayed()
        );
    }
    let other_body = instance.post_payment(&app.api_key, &key, &payment(1)).await;
    other_body.assert_problem(422, "idempotency-key-mismatch");

    let slow_key = new_key();
    let slow = slow_payment(100);
    let in_flight = tokio::spawn(send(instance.payment_request(
        &app.api_key,
        &slow_key,
        &slow,
    )));
    app.wait_for_keys(2).await;
    instance
        .post_payment(&app.api_key, &slow_key, &slow)
        .await
        .assert_problem(409, "idempotency-key-in-use");
    assert_eq!(in_flight.await.unwrap().status, 201);

    let id = first.json()["id"].as_str().unwrap().to_owned();
    let fetched = send(
        reqwest::Client::new()
            .get(format!("{}/v1/payments/{id}", instance.address))
            .bearer_auth(&app.api_key),
    )
    .await;
    assert_eq!(fetched.status, 200);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let scraped = instance.get("/metrics").await;
    assert_eq!(scraped.status, 200);
    assert!(
        scraped
            .header("content-type")
            .is_some_and(|kind| kind.starts_with("text/plain"))
    );
    let metrics = Metrics::new(scraped.body);
    let text = metrics.text();
    let value = |series: &str| -> f64 {
        metrics
            .value(series)
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
    };
    for (outcome, count) in [
        ("executed", 2.0),
        ("replayed", 2.0),
        ("mismatch", 1.0),
        ("conflict_in_flight", 1.0),
    ] {
        assert_eq!(
            value(&format!(
                r#"idempay_idempotency_outcomes_total{{outcome="{outcome}"}}"#
            )),
            count,
            "{outcome}"
        );
    }
    // Routes are labelled by their template, never by a path that holds an id.
    assert_eq!(
        value(r#"idempay_http_requests_total{method="POST",route="/v1/payments",status="201"}"#),
        4.0
    );
    assert_eq!(
        value(
            r#"idempay_http_requests_total{method="GET",route="/v1/payments/{id}",status="200"}"#
        ),
        1.0
    );
    assert!(!text.contains(&id), "no series per payment");
    assert_eq!(
        value(r#"idempay_http_request_duration_seconds_count{method="POST",route="/v1/payments"}"#),
        6.0
    );
    assert!(value(r#"idempay_expiry_run_duration_seconds_count"#) >= 1.0);
    assert!(value(r#"idempay_db_pool_connections{state="idle"}"#) >= 0.0);
    assert!(!text.contains(&app.api_key));
}

#[api_test]
async fn every_request_is_logged_with_its_id_account_scope_and_outcome_but_never_the_api_key() {
    let app = TestApp::spawn().await;
    let log_path = std::env::temp_dir().join(format!("idempay-{}.log", new_key()));
    let log = std::fs::File::create(&log_path).unwrap();
    let instance = Instance::start_logging_to(
        log,
        &app.database_url(),
        &[("RUST_LOG", "info"), ("IDEMPAY_LOG_FORMAT", "json")],
    )
    .await;
    let key = new_key();
    let created = instance
        .post_payment(&app.api_key, &key, &payment(4200))
        .await;
    let replayed = instance
        .post_payment(&app.api_key, &key, &payment(4200))
        .await;
    assert!(replayed.replayed());
    drop(instance);

    let logs = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).ok();
    assert!(!logs.contains(&app.api_key), "the API key is never logged");
    let responses: Vec<Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["message"] == "finished processing request")
        .filter(|line| line["span"]["path"] == "/v1/payments")
        .collect();
    let outcomes: Vec<&Value> = responses
        .iter()
        .map(|line| &line["span"]["key_outcome"])
        .collect();
    assert_eq!(outcomes, ["executed", "replayed"], "{logs}");
    for (line, answer) in responses.iter().zip([&created, &replayed]) {
        let span = &line["span"];
        assert_eq!(span["account"], app.account_id.as_str());
        assert_eq!(
            span["scope"],
            format!("{}:POST /v1/payments", app.account_id)
        );
        assert_eq!(
            span["request_id"].as_str(),
            answer.header("x-request-id"),
            "the logged id is the one the client got"
        );
    }
}

/// The two outcomes of a request that executes but does not complete are counted too:
/// `suspended` when the work fails after its charge (here the database refuses the payment's
/// insert) and the key is kept for the retry to resume, `lease_lost` when another request took the
/// key over while the work ran.
#[api_test]
async fn suspended_and_lease_lost_outcomes_are_counted() {
    let app = TestApp::spawn().await;
    // Long enough for the takeover below to land while the charge runs, even on a loaded machine.
    let instance = Instance::start(&app.database_url(), &[("IDEMPAY_SLOW_CHARGE", "3s")]).await;
    let outcome = |metrics: &Metrics, outcome: &str| {
        metrics
            .value(&format!(
                r#"idempay_idempotency_outcomes_total{{outcome="{outcome}"}}"#
            ))
            .unwrap_or(0.0)
    };
    let before = instance.metrics().await;
    assert_eq!(outcome(&before, "suspended"), 0.0);
    assert_eq!(outcome(&before, "lease_lost"), 0.0);

    app.refuse_payments().await;
    let failed = instance
        .post_payment(&app.api_key, &new_key(), &payment(4200))
        .await;
    assert_eq!(failed.status, 500, "{failed:?}");
    assert_eq!(app.key_count().await, 1, "the key was kept");
    sqlx::raw_sql(
        "DROP TRIGGER refuse_payment ON payments; \
         DELETE FROM idempotency_keys WHERE scope NOT LIKE 'processor:%'",
    )
    .execute(&app.db)
    .await
    .unwrap();

    let slow = tokio::spawn(send(instance.payment_request(
        &app.api_key,
        &new_key(),
        &slow_payment(100),
    )));
    app.wait_for_keys(1).await;
    // Another request takes the key over while the first is charging.
    app.take_over_the_key_in_progress().await;
    assert_eq!(slow.await.unwrap().status, 409, "the loser's answer");
    assert_eq!(app.payment_count().await, 0);

    // Each outcome is counted before its request is answered, once, by how the request ended:
    // neither ran its work to completion, so neither counts `executed`.
    let metrics = instance.metrics().await;
    for (name, count) in [("suspended", 1.0), ("lease_lost", 1.0), ("executed", 0.0)] {
        assert_eq!(
            outcome(&metrics, name),
            count,
            "{name} in:\n{}",
            metrics.text()
        );
    }
}

/// WARN is for what an operator must look at. A known event that changes nothing where its object
/// stands (the processor's `charge.succeeded` of a payment since refunded, not a WARN "matched no
/// payment") is logged at DEBUG with its reason; an event idempay cannot read (data its type
/// cannot apply) is still a WARN; and a type this release does not know, refused for a release
/// that knows it, is a WARN once per type, however often it is delivered again.
#[api_test]
async fn an_event_with_no_effect_where_its_payment_stands_is_debug_and_an_unknown_type_a_warning() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000).await;
    let refunded = app
        .post_refund(&paid, &new_key(), &serde_json::json!({}))
        .await;
    assert_eq!(refunded.status, 201, "{refunded:?}");
    let charge = app.get_payment(&paid).await.json()["charge"]
        .as_str()
        .unwrap()
        .to_owned();
    let secret = service::outbox::WebhookSecrets::generate();
    let (log, file) = crate::support::instance::LogFile::create();
    let exposed = secret.expose();
    let instance = Instance::start_logging_to(
        file,
        &app.database_url(),
        &[
            ("RUST_LOG", "idempay=debug"),
            ("IDEMPAY_LOG_FORMAT", "json"),
            ("IDEMPAY_WEBHOOK_SECRET", exposed.as_str()),
        ],
    )
    .await;
    let url = format!("{}/v1/webhooks/processor", instance.address);
    let data = serde_json::json!({ "charge": charge });

    let mut answers = Vec::new();
    for (id, kind, data) in [
        ("evt_late", "charge.succeeded", data.clone()),
        (
            "evt_bad",
            "charge.failed",
            serde_json::json!({ "charge": 7 }),
        ),
        ("evt_new", "charge.updated", data.clone()),
        ("evt_new", "charge.updated", data.clone()),
    ] {
        let (status, body) = idempay::webhooks::send(&url, &secret, id, kind, data)
            .await
            .unwrap();
        answers.push((status, body));
    }
    drop(instance);

    for (status, body) in &answers[..2] {
        assert_eq!(*status, 200, "{body}");
        assert!(body.contains("\"ignored\""), "{body}");
    }
    for (status, body) in &answers[2..] {
        assert_eq!(*status, 503, "{body}");
        assert!(body.contains("webhook-event-type-unknown"), "{body}");
    }
    let logs = log.read();
    let lines: Vec<Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .collect();
    let without_effect: Vec<(String, String)> = lines
        .iter()
        .filter(|line| line["fields"]["message"] == "webhook event acknowledged without effect")
        .map(|line| {
            (
                line["level"].as_str().unwrap_or_default().to_owned(),
                line["fields"]["reason"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(without_effect.len(), 2, "{logs}");
    assert_eq!(without_effect[0].0, "DEBUG", "{without_effect:?}");
    assert!(
        without_effect[0]
            .1
            .starts_with("charge.succeeded changes nothing"),
        "{without_effect:?}"
    );
    assert_eq!(without_effect[1].0, "WARN", "{without_effect:?}");
    assert!(
        without_effect[1].1.contains("malformed charge.failed data"),
        "{without_effect:?}"
    );
    let unknown: Vec<&str> = lines
        .iter()
        .filter(|line| {
            line["fields"]["message"]
                .as_str()
                .is_some_and(|message| message.contains("an event type this release does not know"))
        })
        .map(|line| line["level"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        unknown,
        ["WARN", "DEBUG"],
        "once a WARN, then DEBUG: {logs}"
    );
}
