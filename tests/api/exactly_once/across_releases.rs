//! Keys in flight across releases: what a key keeps across requests (its recovery state, its
//! fingerprint, its stored response) is read by a later release in every version an earlier one
//! wrote, from the golden fixtures in `tests/fixtures/` (each exactly as the release that wrote
//! it stored it); and a key in a version this release does not read (a later release wrote it,
//! during a rolling deploy or after a rollback) is left alone: not replayed, not refused as
//! another payload, not taken over, released or resent, and reported.
//!
//! Each key is inserted as the earlier release left it, then a retry or the recovery job of this
//! release meets it, with a processor that succeeds.

use idempay::config::Settings;
use idempay_test_macros::api_test;
use idempotency::Fingerprint;
use serde_json::{Value, json};

use super::two_hops::{assert_ledgers_agree, idempay_and_processor, instance_env};
use crate::processor;
use crate::support::checks::execute;
use crate::support::helpers::{TestApp, TestResponse, new_key, send, wait_until};
use crate::support::instance::{Instance, LogFile};

const CHARGE_V1: &str =
    include_str!("../../fixtures/recovery_states/payment.charge_requested/v1.json");
const CHARGE_V2: &str =
    include_str!("../../fixtures/recovery_states/payment.charge_requested/v2.json");
const REFUND_V1: &str =
    include_str!("../../fixtures/recovery_states/refund.refund_requested/v1.json");
const STORED_RESPONSE_V1: &str = include_str!("../../fixtures/stored_responses/v1.json");

/// The payment the charge fixtures record, as its client sends it.
fn the_fixtures_payment() -> Value {
    json!({
        "amount": 4200, "currency": "eur", "order": "cmd_9182", "description": "Two espressos",
        "payment_method": "pm_card_visa", "metadata": { "order_id": "6735", "channel": "web" },
    })
}

/// A fixture, its account replaced by the test's (the account the key belongs to).
fn fixture_for(app: &TestApp, fixture: &str) -> Value {
    let mut state: Value = serde_json::from_str(fixture).unwrap();
    state["account"] = json!(app.account_id);
    state
}

/// Inserts the key an earlier release left suspended at `point` with `state`: its request to
/// `target` (fingerprinted as the releases before versions did, over the path, with no version
/// recorded), its lease ended, its call sent with `downstream_key` and its outcome unknown.
async fn suspended_by_an_earlier_release(
    app: &TestApp,
    route: &str,
    target: &str,
    key: &str,
    body: &Value,
    point: &str,
    state: &Value,
) -> String {
    let downstream_key = format!("idk_{}", new_key().replace('-', ""));
    sqlx::query(
        "INSERT INTO idempotency_keys
             (account_id, scope, idem_key, request_hash, status, lock_token, locked_until,
              expires_at, recovery_point, recovery_state, downstream_key)
         VALUES ($1, $1 || ':POST ' || $2, $3, $4, 'in_progress', gen_random_uuid(),
                 now() - interval '1 second', now() + interval '1 day', $5, $6, $7)",
    )
    .bind(&app.account_id)
    .bind(route)
    .bind(key)
    .bind(Fingerprint::of_request(target, body).as_bytes().as_slice())
    .bind(point)
    .bind(state)
    .bind(&downstream_key)
    .execute(&app.db)
    .await
    .unwrap();
    downstream_key
}

/// The fixtures' payment, its key left suspended at its charge by an earlier release with `state`;
/// the downstream key its call was sent with.
async fn a_payment_suspended_by_an_earlier_release(
    app: &TestApp,
    key: &str,
    state: &Value,
) -> String {
    suspended_by_an_earlier_release(
        app,
        "/v1/payments",
        "/v1/payments",
        key,
        &the_fixtures_payment(),
        "payment.charge_requested",
        state,
    )
    .await
}

/// The processor's charges (or refunds) made under `downstream_key`.
async fn made_under(app: &TestApp, table: &str, downstream_key: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {table} WHERE idempotency_key = $1"
    )))
    .bind(downstream_key)
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// A payment suspended by the release before versions (its recovery state exactly as that release
/// wrote it: the API's request nested, no version), and a processor that succeeds: the client's
/// retry, on this release, charges once under the key's downstream key and records the payment
/// under the id the state chose; the ledgers agree.
#[api_test(citus)]
async fn a_charge_suspended_by_the_release_before_versions_is_resumed_by_a_retry() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    let key = new_key();
    let body = the_fixtures_payment();
    let state = fixture_for(&app, CHARGE_V1);
    let downstream = a_payment_suspended_by_an_earlier_release(&app, &key, &state).await;

    let resumed = app.post_payment(&key, &body).await;

    resumed.assert_status(201);
    assert_eq!(resumed.json()["id"], state["payment"]);
    assert_eq!(resumed.json()["metadata"]["order_id"], "6735");
    let charges = made_under(&app, "processor_charges", &downstream).await;
    assert_eq!(
        charges.len(),
        1,
        "one charge, under the key's downstream key"
    );
    assert_eq!(resumed.json()["charge"], charges[0].as_str());
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// A refund suspended by the release before versions (its state exactly as that release wrote
/// it), resumed by the client's retry on this release: one refund at the processor under the
/// key's downstream key, recorded under the id the state chose.
#[api_test]
async fn a_refund_suspended_by_the_release_before_versions_is_resumed_by_a_retry() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    let paid = app.post_payment(&new_key(), &the_fixtures_payment()).await;
    assert_eq!(paid.status, 201);
    let payment = paid.id();
    let mut state = fixture_for(&app, REFUND_V1);
    state["payment"] = json!(payment);
    state["charge"] = paid.json()["charge"].clone();
    let body = json!({ "amount": 1200, "reason": "requested_by_customer",
                       "metadata": { "ticket": "T-1" } });
    let key = new_key();
    let target = format!("/v1/payments/{payment}/refunds");
    let downstream = suspended_by_an_earlier_release(
        &app,
        "/v1/payments/{id}/refunds",
        &target,
        &key,
        &body,
        "refund.refund_requested",
        &state,
    )
    .await;

    let resumed = app.post_refund(&payment, &key, &body).await;

    resumed.assert_status(201);
    assert_eq!(resumed.json()["id"], state["refund"]);
    assert_eq!(resumed.json()["amount"], 1200);
    assert_eq!(
        made_under(&app, "processor_refunds", &downstream)
            .await
            .len(),
        1
    );
    assert_eq!(
        app.get_payment(&payment).await.json()["amount_refunded"],
        1200
    );
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// The newest version of a payment's state, as this release writes it, left suspended with no
/// client coming back: the recovery job of an `idempay serve` records the payment under the
/// state's id, and the client's later retry replays it.
#[api_test]
async fn a_charge_suspended_in_the_newest_version_is_resumed_by_the_recovery_job() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    let key = new_key();
    let body = the_fixtures_payment();
    let state = fixture_for(&app, CHARGE_V2);
    a_payment_suspended_by_an_earlier_release(&app, &key, &state).await;
    let recovering = instance_env(&processor, &[("IDEMPAY_RECOVERY_INTERVAL", "300ms")]);
    let instance = Instance::start(&app.database_url(), &recovering).await;

    wait_until("the recovery job records the payment", || async {
        app.payment_count().await == 1
    })
    .await;

    let replay = instance.post_payment(&app.api_key, &key, &body).await;
    assert_eq!(replay.status, 201);
    assert!(replay.replayed());
    assert_eq!(replay.json()["id"], state["payment"]);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// The key row's columns that anything taking it over, holding, releasing or resuming it would
/// change.
async fn key_row(app: &TestApp, key: &str) -> Value {
    sqlx::query_scalar(
        "SELECT to_jsonb(k) FROM (
             SELECT status, lock_token, locked_until, takeovers, recoveries, recover_after,
                    recovery_point, recovery_state, downstream_key, request_hash, held_at,
                    response_code, expires_at
             FROM idempotency_keys WHERE idem_key = $1) k",
    )
    .bind(key)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// A payment suspended by a later release at `key`, its state in a version this release does not
/// read (99, with a field version 2 does not have); the key's id.
async fn suspended_by_a_later_release(app: &TestApp, key: &str) -> i64 {
    let mut state = fixture_for(app, CHARGE_V2);
    state["version"] = json!(99);
    state["capture"] = json!("later");
    a_payment_suspended_by_an_earlier_release(app, key, &state).await;
    sqlx::query_scalar("SELECT id FROM idempotency_keys WHERE idem_key = $1")
        .bind(key)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// A payment suspended by a later release, its state in a version this release does not read
/// (during a rolling deploy, or after a rollback): the client's retry is answered 503 with
/// `Retry-After`, and the recovery job of an `idempay serve` passes it by at every run, reporting
/// it once (a warning with the key's id and the version, the outcome `unknown_format`) and staying
/// ready; nothing is charged and the key is unchanged, for a release that reads it. (On the code
/// before versions, the retry took the key over and failed on the state: a 500, the key's lease
/// and takeovers changed, and the recovery job tried it again at every run.)
#[api_test(citus)]
async fn a_state_of_a_version_this_release_does_not_read_is_left_alone_and_reported() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    let key = new_key();
    let key_id = suspended_by_a_later_release(&app, &key).await;
    let before = key_row(&app, &key).await;

    let retry = app.post_payment(&key, &the_fixtures_payment()).await;

    retry.assert_problem(503, "service-unavailable");
    assert!(retry.header("retry-after").is_some());
    assert_eq!(
        key_row(&app, &key).await,
        before,
        "the retry changed nothing"
    );

    let (logs, file) = LogFile::create();
    let recovering = instance_env(&processor, &[("IDEMPAY_RECOVERY_INTERVAL", "200ms")]);
    let instance = Instance::start_logging_to(file, &app.database_url(), &recovering).await;
    let reported = r#"idempay_idempotency_outcomes_total{outcome="unknown_format"}"#;
    wait_until(
        "the recovery job reports the key it leaves alone",
        || async { instance.metrics().await.value(reported) == Some(1.0) },
    )
    .await;
    // A second such key, reported by a later run of the job: a run that met the first again.
    let another = new_key();
    let another_id = suspended_by_a_later_release(&app, &another).await;
    wait_until("a later run reports the second key", || async {
        instance.metrics().await.value(reported) == Some(2.0)
    })
    .await;

    let logged = logs.read();
    let warnings: Vec<&str> = logged
        .lines()
        .filter(|line| line.contains("left alone"))
        .collect();
    assert_eq!(warnings.len(), 2, "each key reported once: {warnings:?}");
    for (line, id) in warnings.iter().zip([key_id, another_id]) {
        assert!(line.contains(&format!("key_id={id}")), "{line}");
        assert!(line.contains("99"), "the version: {line}");
    }
    assert_eq!(instance.get("/readyz").await.status, 200);
    assert_eq!(key_row(&app, &key).await, before, "the job changed nothing");
    assert_eq!(app.charge_count().await, 0, "nothing charged");
    assert_eq!(app.payment_count().await, 0);
}

/// A completed key as the release before versions stored it: its fingerprint over the path alone,
/// no version recorded, and the stored response of the fixture.
async fn completed_by_an_earlier_release(app: &TestApp, key: &str, body: &Value) -> Value {
    let stored: Value = serde_json::from_str(STORED_RESPONSE_V1).unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys
             (account_id, scope, idem_key, request_hash, status, expires_at, completed_at,
              response_code, response_headers, response_body)
         VALUES ($1, $1 || ':POST /v1/payments', $2, $3, 'completed', now() + interval '1 day',
                 now(), $4, $5, convert_to($6, 'UTF8'))",
    )
    .bind(&app.account_id)
    .bind(key)
    .bind(
        Fingerprint::of_request("/v1/payments", body)
            .as_bytes()
            .as_slice(),
    )
    .bind(i16::try_from(stored["response_code"].as_i64().unwrap()).unwrap())
    .bind(&stored["response_headers"])
    .bind(stored["response_body"].as_str().unwrap())
    .execute(&app.db)
    .await
    .unwrap();
    stored
}

/// `POST /v1/payments?source=checkout` with `key` and `body`.
async fn pay_with_a_query(app: &TestApp, key: &str, body: &Value) -> TestResponse {
    send(
        app.client()
            .post(app.url("/v1/payments?source=checkout"))
            .bearer_auth(&app.api_key)
            .header("idempotency-key", key)
            .json(body),
    )
    .await
}

/// A key made before fingerprints had versions is compared under version 1, the one it was made
/// with: the retry of its request, sent with a query (which version 2, this release's, hashes too),
/// replays the stored response of the fixture byte for byte, with its headers. Compared under the
/// current version it would be a 422.
#[api_test(citus)]
async fn a_key_made_before_fingerprint_versions_is_compared_under_its_version_and_replays() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let body = the_fixtures_payment();
    let stored = completed_by_an_earlier_release(&app, &key, &body).await;

    let retry = pay_with_a_query(&app, &key, &body).await;

    retry.assert_status(201);
    assert!(retry.replayed());
    assert_eq!(
        retry.body,
        stored["response_body"].as_str().unwrap().as_bytes()
    );
    assert_eq!(
        retry.header("location"),
        stored["response_headers"]["location"].as_str()
    );
    assert_eq!(retry.header("content-type"), Some("application/json"));
    // Another body under the key is still another payload.
    let other = json!({ "amount": 9900, "currency": "eur" });
    pay_with_a_query(&app, &key, &other)
        .await
        .assert_problem(422, "idempotency-key-mismatch");
    // A key this release makes records its version, and a retry with the query replays it.
    let fresh = new_key();
    let paid = pay_with_a_query(&app, &fresh, &body).await;
    assert_eq!(paid.status, 201);
    let version: Option<i16> =
        sqlx::query_scalar("SELECT fingerprint_version FROM idempotency_keys WHERE idem_key = $1")
            .bind(&fresh)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(version, Some(2));
    let again = pay_with_a_query(&app, &fresh, &body).await;
    assert!(again.replayed());
    assert_eq!(again.body, paid.body);
}

/// A key whose fingerprint, or stored response, is in a version this release does not read (a
/// later release made it) is neither refused as another payload nor replayed as something else:
/// 503 with `Retry-After`, the key unchanged.
#[api_test]
async fn a_fingerprint_or_response_of_a_later_version_is_neither_a_mismatch_nor_a_replay() {
    let app = TestApp::spawn().await;
    let body = the_fixtures_payment();
    for column in ["fingerprint_version", "response_version"] {
        let key = new_key();
        completed_by_an_earlier_release(&app, &key, &body).await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE idempotency_keys SET {column} = 7 WHERE idem_key = $1"
        )))
        .bind(&key)
        .execute(&app.db)
        .await
        .unwrap();
        let before = key_row(&app, &key).await;

        let answer = app.post_payment(&key, &body).await;
        answer.assert_problem(503, "service-unavailable");
        assert!(answer.header("retry-after").is_some(), "{column}");
        assert_eq!(key_row(&app, &key).await, before, "{column}");
    }
    // Another body under a fingerprint it cannot compute: this release cannot tell it from a
    // retry, so it does not call it another payload either.
    let key = new_key();
    completed_by_an_earlier_release(&app, &key, &body).await;
    execute(
        &app.db,
        "UPDATE idempotency_keys SET fingerprint_version = 7 WHERE idem_key = $1",
        &key,
    )
    .await;
    for sent in [&body, &json!({ "amount": 9900, "currency": "eur" })] {
        app.post_payment(&key, sent)
            .await
            .assert_problem(503, "service-unavailable");
    }
}
