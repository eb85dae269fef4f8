//! The bounds of a suspended key: a key whose call to the processor has no known outcome is
//! resumed with its downstream key only within the recovery window (`IDEMPAY_RECOVERY_WINDOW`,
//! shorter than the processor remembers keys), the recovery job waiting longer between each of
//! its tries; past the window it is held for an operator, never resumed by itself. And a
//! suspended key does not expire with its `expires_at`: its retry resumes it.
//!
//! In each scenario the processor answers 503 to every call (nothing charged, outcome unknown to
//! idempay), then is replaced by a healthy one on the same port, so that a resume would charge:
//! a charge that appears proves a resume, and none proves there was none.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;

use super::two_hops::{
    assert_ledgers_agree, failing, idempay_and_processor, key_column, key_row, linked_to,
    reconcile_said, replace_processor,
};
use crate::processor::{self, TestProcessor};
use crate::support::helpers::{TestApp, bare_database, new_key, payment, wait_until};
use crate::support::instance::{Instance, free_port};

/// A payment answered 503 `processor-outcome-unknown` by a processor that fails every call, its key
/// suspended at its recovery point.
async fn suspended(app: &TestApp, key: &str) {
    let unknown = app.post_payment(key, &payment(4200)).await;
    unknown.assert_problem(503, "processor-outcome-unknown");
    let (status, point, _) = key_row(app, key).await.expect("the key is kept");
    assert_eq!(
        (status.as_str(), point.as_deref()),
        ("in_progress", Some("payment.charge_requested"))
    );
}

/// Replaces the failing processor by a healthy one on the same port and database.
async fn heal(app: &TestApp, failing: TestProcessor) -> TestProcessor {
    replace_processor(app, failing, processor::settings()).await
}

#[api_test]
async fn a_key_suspended_past_the_recovery_window_is_held_for_an_operator_and_never_resumed() {
    const WINDOW: Duration = Duration::from_secs(2);
    let (app, failing) = idempay_and_processor(
        Settings {
            recovery_window: WINDOW,
            ..Settings::default()
        },
        failing(),
    )
    .await;
    let key = new_key();
    suspended(&app, &key).await;
    // Within the window, a retry resumes the key (and meets the failing processor again).
    let resumed = app.post_payment(&key, &payment(4200)).await;
    resumed.assert_problem(503, "processor-outcome-unknown");
    assert_eq!(key_column::<i32>(&app, &key, "takeovers").await, 1);

    let processor = heal(&app, failing).await;
    tokio::time::sleep(WINDOW + Duration::from_millis(200)).await;
    let held = app.post_payment(&key, &payment(4200)).await;

    held.assert_problem(409, "idempotency-key-held");
    assert_eq!(held.header("retry-after"), None, "no retry settles it");
    assert_eq!(app.charge_count().await, 0, "never resumed by itself");
    let (status, point, _) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(
        (status.as_str(), point.as_deref()),
        ("held", Some("payment.charge_requested"))
    );
    // The operator's views: the key's inspection and the metrics.
    let inspected = app.get(&format!("/v1/idempotency_keys/{key}")).await.json();
    assert_eq!(inspected["uses"][0]["state"], "held");
    assert!(inspected["uses"][0]["held_at"].is_string(), "{inspected}");
    let metrics = String::from_utf8(app.get("/metrics").await.body).unwrap();
    assert!(
        metrics.lines().any(
            |line| line.starts_with("idempay_idempotency_outcomes_total{")
                && line.contains(r#"outcome="held"}"#)
        ),
        "{metrics}"
    );
    // `idempay reconcile` names it, and exits 1 until an operator settles it.
    let stdout = reconcile_said(&app, &processor, 1).await;
    assert!(
        stdout.contains(&format!(
            "key {key:?} ({}:POST /v1/payments) held for an operator since",
            app.account_id
        )),
        "{stdout}"
    );
    // Every later retry is answered the same, and still nothing is charged.
    let again = app.post_payment(&key, &payment(4200)).await;
    again.assert_problem(409, "idempotency-key-held");
    assert_eq!(app.charge_count().await, 0);
    assert_eq!(processor.count("processor_charges").await, 0);
}

/// The recovery job, with no client retry: it tries the key while the window lasts, each wait
/// twice the one before (from its 100 ms interval: 100, 200, 400 ms … so at most 7 tries in the
/// window's 8 s, where a try every tick would be about 80), then holds it, and tries it no more.
/// A loaded machine only delays tries, which lowers the count: the window leaves the instance's
/// start and its first two tries (0.3 s alone) more than 7 s.
#[api_test]
async fn the_recovery_job_backs_off_between_its_tries_then_holds_the_key_past_the_window() {
    const WINDOW: Duration = Duration::from_secs(8);
    let (app, failing) = idempay_and_processor(Settings::default(), failing()).await;
    let key = new_key();
    suspended(&app, &key).await;
    let _recovering = app
        .another_instance(Settings {
            recovery_interval: Duration::from_millis(100),
            recovery_window: WINDOW,
            ..linked_to(&failing.address, Settings::default())
        })
        .await;

    wait_until("the recovery job holds the key", || async {
        key_row(&app, &key)
            .await
            .is_some_and(|(status, _, _)| status == "held")
    })
    .await;

    let tries = key_column::<i32>(&app, &key, "recoveries").await;
    eprintln!("the recovery job tried the key {tries} times within the window");
    assert!(
        (2..=7).contains(&tries),
        "tried at growing intervals, not every tick: {tries}"
    );
    let processor = heal(&app, failing).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(key_column::<i32>(&app, &key, "recoveries").await, tries);
    assert_eq!(processor.count("processor_charges").await, 0);
    app.post_payment(&key, &payment(4200))
        .await
        .assert_problem(409, "idempotency-key-held");
}

/// A suspended key outlives its `expires_at`: it is still shown, and its retry resumes it and
/// records the payment (on the code before, every retry was 409 `idempotency-key-in-use` and the
/// key's inspection a 404). The result then lives a whole key TTL from its completion.
#[api_test]
async fn a_suspended_key_past_its_expires_at_is_shown_and_resumed_by_its_retry() {
    const KEY_TTL: Duration = Duration::from_secs(1);
    let (app, failing) = idempay_and_processor(
        Settings {
            key_ttl: KEY_TTL,
            ..Settings::default()
        },
        failing(),
    )
    .await;
    let key = new_key();
    suspended(&app, &key).await;
    tokio::time::sleep(KEY_TTL + Duration::from_millis(300)).await;
    let expired: bool =
        sqlx::query_scalar("SELECT bool_and(expires_at < now()) FROM idempotency_keys")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(expired, "the key's expires_at has passed");

    let inspected = app.get(&format!("/v1/idempotency_keys/{key}")).await;
    inspected.assert_status(200);
    assert_eq!(inspected.json()["uses"][0]["state"], "suspended");

    let processor = heal(&app, failing).await;
    let paid = app.post_payment(&key, &payment(4200)).await;

    paid.assert_status(201);
    assert!(!paid.replayed());
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// `idempay serve` on a database where keys wait at recovery points no unit of work of this build
/// resumes (one removed or renamed since): it refuses to start, right after migrating, naming each
/// point with its number of suspended keys (a completed key, one at a known point, or a held one,
/// counts for nothing) and what to do. Once those keys are resumed, it starts, the held key still
/// there: nothing resumes a held key, so none blocks a start (on the code before, the held key
/// counted, and no recovery job would ever take it away).
#[api_test]
async fn serve_refuses_to_start_while_keys_wait_at_a_recovery_point_no_unit_of_work_resumes() {
    let database_url = bare_database().await;
    let db = sqlx::PgPool::connect(&database_url).await.unwrap();
    let (account, _) = idempay::accounts::create(&db, "retired units")
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status, lock_token,
                                       locked_until, held_at, expires_at, recovery_point,
                                       recovery_state, downstream_key, response_code,
                                       response_headers, response_body)
         SELECT $1, $1 || ':POST /v1/things', 'key-' || i, sha256(i::text::bytea), status,
                CASE WHEN status = 'in_progress' THEN gen_random_uuid() END,
                CASE WHEN status = 'in_progress' THEN now() - interval '1 minute' END,
                CASE WHEN status = 'held' THEN now() END,
                now() + interval '1 day', point, '{}', 'downstream-' || i,
                CASE WHEN status = 'completed' THEN 201 END,
                CASE WHEN status = 'completed' THEN '{}'::jsonb END,
                CASE WHEN status = 'completed' THEN ''::bytea END
         FROM (VALUES (1, 'in_progress', 'payment.installment_requested'),
                      (2, 'in_progress', 'payment.installment_requested'),
                      (3, 'completed', 'payment.installment_requested'),
                      (4, 'held', 'refund.retired_point'),
                      (5, 'in_progress', 'payment.charge_requested'))
              AS keys (i, status, point)",
    )
    .bind(account.id().as_str())
    .execute(&db)
    .await
    .unwrap();

    let port = free_port();
    let serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempay"))
        .arg("serve")
        .env("DATABASE_URL", &database_url)
        .env("IDEMPAY_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "off")
        .kill_on_drop(true)
        .output();
    let refused = tokio::time::timeout(Duration::from_secs(60), serve)
        .await
        .expect("serve refuses to start instead of serving")
        .unwrap();

    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "error: refusing to start: suspended keys wait at recovery points that no unit of \
             work of this build resumes: `payment.installment_requested` (2 keys). Run the version \
             that recorded them"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("app.rs `resumers`"), "what to do: {stderr}");
    assert!(stderr.contains("`idempay keys settle`"), "{stderr}");
    assert!(!stderr.contains("payment.charge_requested"), "{stderr}");
    assert!(!stderr.contains("refund.retired_point"), "held: {stderr}");

    // Resumed by the release that recorded them: the instance starts, beside the held key.
    sqlx::query(
        "DELETE FROM idempotency_keys
         WHERE status = 'in_progress' AND recovery_point = 'payment.installment_requested'",
    )
    .execute(&db)
    .await
    .unwrap();
    let started = Instance::start(&database_url, &[]).await;
    assert_eq!(started.get("/readyz").await.status, 200);
}
