//! What an operator reads when the processor misbehaves (here it fails every call), and how it logs it: a suspended key named as such in the
//! inspection, the keys' gauges by route and recovery point (back to 0 once resolved), the calls
//! to the processor counted by outcome, key outcomes counted once per request, a problem detail
//! that carries no internal error, and the processor's own probes and metrics.
//!
//! The metrics are read from an `idempay serve` process of their own: the test process's recorder
//! is shared by every test running in it.

use ::processor::Fraction;
use idempay::config::Settings;
use idempay_test_macros::api_test;

use crate::exactly_once::two_hops::{faulty, idempay_and_processor, instance_env};
use crate::processor::{API_KEY, TestProcessor};
use crate::support::helpers::{TestApp, new_key, payment, wait_until};
use crate::support::instance::{Instance, LogFile, Metrics};

/// Sets the processor's faults as an operator's demo does.
async fn set_faults(processor: &TestProcessor, lose_answers: f64, fail: f64) {
    let answer = processor
        .send(
            processor
                .http()
                .put(format!("{}/v1/test/faults", processor.address))
                .bearer_auth(API_KEY)
                .json(&serde_json::json!({ "lose_answers": lose_answers, "fail": fail })),
        )
        .await;
    assert_eq!(answer.status, 200);
}

/// idempay (in the test process) and a processor of its own that fails every call.
async fn with_a_failing_processor() -> (TestApp, TestProcessor) {
    idempay_and_processor(
        Settings::default(),
        faulty(|s| s.faults.fail = Fraction::ALWAYS),
    )
    .await
}

/// Asserts the instance counted at least one charge call to the processor that ended `outcome`.
fn assert_charge_calls(metrics: &Metrics, outcome: &str) {
    let series =
        format!(r#"idempay_processor_calls_total{{operation="charge",outcome="{outcome}"}}"#);
    assert!(
        metrics.value(&series).is_some_and(|calls| calls >= 1.0),
        "{}",
        metrics.text()
    );
}

#[api_test]
async fn a_suspended_key_is_named_so_gauged_by_route_and_point_and_drops_to_zero_once_resolved() {
    let (app, processor) = with_a_failing_processor().await;
    let (logs, log_file) = LogFile::create();
    let instance = Instance::start_logging_to(
        log_file,
        &app.database_url(),
        &instance_env(
            &processor,
            &[
                ("IDEMPAY_RECOVERY_INTERVAL", "1h"),
                ("RUST_LOG", "info"),
                ("IDEMPAY_LOG_FORMAT", "json"),
            ],
        ),
    )
    .await;
    let key = new_key();
    let body = payment(4200);
    let unknown = instance.post_payment(&app.api_key, &key, &body).await;
    unknown.assert_status(503);

    let inspected = app.get(&format!("/v1/idempotency_keys/{key}")).await.json();
    let used = &inspected["uses"][0];
    assert_eq!(used["state"], "suspended", "{inspected}");
    let point = used["recovery_point"].as_str().expect("a recovery point");
    assert!(used["downstream_key"].is_string(), "{inspected}");
    assert!(used["recovery_attempts"].is_i64(), "{inspected}");
    assert!(used["next_recovery_at"].is_string(), "{inspected}");

    let suspended = format!(
        r#"idempay_idempotency_keys{{state="suspended",route="/v1/payments",recovery_point="{point}"}}"#
    );
    let metrics = instance.metrics().await;
    assert_eq!(metrics.value(&suspended), Some(1.0), "{}", metrics.text());
    assert!(
        metrics
            .value(r#"idempay_idempotency_oldest_suspended_seconds{route="/v1/payments"}"#)
            .is_some(),
        "{}",
        metrics.text()
    );
    // Counted once, by how the request ended: suspended, never executed.
    let outcome = |outcome: &str| {
        format!(r#"idempay_idempotency_outcomes_total{{route="/v1/payments",outcome="{outcome}"}}"#)
    };
    assert_eq!(metrics.value(&outcome("suspended")), Some(1.0));
    assert_eq!(metrics.value(&outcome("executed")), None);
    assert_charge_calls(&metrics, "unknown");

    // The expected 503 is a warning in the request's span, never an error; the failed calls are
    // logged with their downstream key, outcome and cause.
    let logs = logs.read();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    assert!(!lines.iter().any(|line| line["level"] == "ERROR"), "{logs}");
    assert!(
        lines.iter().any(|line| line["level"] == "WARN"
            && line["fields"]["status"] == 503
            && line["span"]["path"] == "/v1/payments"),
        "{logs}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line["fields"]["outcome"] == "unknown"
                && line["fields"]["downstream_key"] == used["downstream_key"]
                && line["fields"]["cause"].is_string()),
        "{logs}"
    );

    // The processor answers again: the retry resumes the key, and the gauge drops to 0.
    set_faults(&processor, 0.0, 0.0).await;
    let paid = instance.post_payment(&app.api_key, &key, &body).await;
    paid.assert_status(201);
    let metrics = instance.metrics().await;
    assert_eq!(metrics.value(&suspended), Some(0.0), "{}", metrics.text());
    assert_charge_calls(&metrics, "succeeded");
}

#[api_test]
async fn calls_the_processor_refuses_or_fails_are_counted_and_the_problem_names_no_address() {
    let (app, processor) = with_a_failing_processor().await;
    let instance = Instance::start(
        &app.database_url(),
        &instance_env(&processor, &[("IDEMPAY_RECOVERY_INTERVAL", "1h")]),
    )
    .await;
    let failed = instance
        .post_payment(&app.api_key, &new_key(), &payment(4200))
        .await;
    assert!(
        failed.status >= 500,
        "{}",
        String::from_utf8_lossy(&failed.body)
    );
    let metrics = instance.metrics().await;
    let calls = |outcome: &str| {
        metrics.value(&format!(
            r#"idempay_processor_calls_total{{operation="charge",outcome="{outcome}"}}"#
        ))
    };
    assert!(
        calls("unknown").or(calls("declined")).is_some(),
        "{}",
        metrics.text()
    );

    // A processor that is gone: the connection is refused, nothing was sent. A new key each try:
    // a request that met the processor while it stopped ends with an unknown outcome, and its key
    // then stays suspended whatever the later tries meet.
    processor.stop();
    let refused = std::sync::Mutex::new(None);
    wait_until("the processor refuses connections", || async {
        let answer = instance
            .post_payment(&app.api_key, &new_key(), &payment(4300))
            .await;
        let unavailable = answer.status == 503
            && answer.json()["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("/processor-unavailable"));
        if unavailable {
            *refused.lock().unwrap() = Some(answer);
        }
        unavailable
    })
    .await;
    let refused = refused.into_inner().unwrap().expect("a refused request");
    let detail = refused.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        !detail.contains("http://") && !detail.contains("127.0.0.1") && !detail.contains("tcp"),
        "the detail carries no internal error: {detail}"
    );
    let metrics = instance.metrics().await;
    assert_charge_calls(&metrics, "not_sent");
}

#[api_test]
async fn the_processor_serves_its_probes_and_its_metrics() {
    let processor = TestProcessor::spawn().await;
    let charged = processor
        .charge(
            &new_key(),
            &serde_json::json!({ "amount": 100, "currency": "eur", "payment_method": "pm_card_visa" }),
        )
        .await;
    assert!(
        charged.status < 500,
        "{}",
        String::from_utf8_lossy(&charged.body)
    );
    assert_eq!(processor.get("/healthz").await.status, 200);
    assert_eq!(processor.get("/readyz").await.status, 200);
    let metrics = processor.get("/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.contains("processor_idempotency_outcomes_total"),
        "{text}"
    );
}
