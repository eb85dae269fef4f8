//! Real server processes under faults: one killed with SIGKILL in the middle of a charge, and
//! three serving a storm of retries on one database. The invariants are checked after each.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use idempay_test_macros::api_test;

use crate::support::helpers::{
    TestApp, TestResponse, new_key, payment, retry_while_in_flight, slow_payment,
};
use crate::support::instance::Instance;
use crate::support::invariants::assert_exactly_once;

/// Kills an instance at `failpoint` during a payment, then retries on a healthy one until the key
/// is free; returns the retry's answer, with the invariants checked.
#[cfg(feature = "failpoints")]
async fn crash_at(failpoint: &str) -> (TestApp, TestResponse) {
    let app = TestApp::spawn().await;
    let mut crashing = Instance::start(
        &app.database_url(),
        &[("IDEMPAY_FAILPOINT", failpoint), ("IDEMPAY_LEASE", "1s")],
    )
    .await;
    let key = new_key();
    let body = payment(4200);
    let request = crashing
        .payment_request(&app.api_key, &key, &body)
        .send()
        .await;
    assert!(request.is_err(), "the process died before it answered");
    let exit = crashing.child.wait().await.unwrap();
    assert!(!exit.success(), "{failpoint}: aborted");

    let retry = retry_while_in_flight(|| app.post_payment(&key, &body)).await;
    assert_eq!(retry.status, 201, "{failpoint}");
    assert_eq!(app.payment_count().await, 1, "{failpoint}");
    assert_exactly_once(&app.db).await;
    (app, retry)
}

#[cfg(feature = "failpoints")]
#[api_test]
async fn a_crash_right_after_the_reservation_is_taken_over_and_charged_once() {
    let (_, retry) = crash_at("after-reserve").await;
    assert!(
        !retry.replayed(),
        "nothing had been charged: the retry executes"
    );
}

#[cfg(feature = "failpoints")]
#[api_test]
async fn a_crash_between_the_charge_and_its_commit_leaves_nothing_and_is_charged_once() {
    let (_, retry) = crash_at("before-commit").await;
    assert!(
        !retry.replayed(),
        "the uncommitted charge was rolled back: the retry executes"
    );
}

#[cfg(feature = "failpoints")]
#[api_test]
async fn a_crash_after_the_commit_is_answered_by_a_replay() {
    let (_, retry) = crash_at("after-commit").await;
    assert!(
        retry.replayed(),
        "the charge committed: the retry gets its stored response"
    );
}

#[api_test]
async fn a_killed_instance_leaves_its_key_to_a_retry_that_takes_over_once() {
    let app = TestApp::spawn().await;
    let mut doomed = Instance::start(
        &app.database_url(),
        // The lease outlasts the early retry below even on a loaded machine.
        &[("IDEMPAY_LEASE", "5s"), ("IDEMPAY_SLOW_CHARGE", "30s")],
    )
    .await;
    let key = new_key();
    let slow = slow_payment(100);
    let request = doomed.payment_request(&app.api_key, &key, &slow).send();
    let in_flight = tokio::spawn(request);
    app.wait_for_keys(1).await;

    doomed.child.kill().await.expect("SIGKILL");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance never answered"
    );

    // The lease is still running: the retry is told to wait.
    let early = app.post_payment(&key, &slow).await;
    early.assert_problem(409, "idempotency-key-in-use");
    assert_eq!(app.payment_count().await, 0);

    // Once the lease has run out, a retry takes the key over and charges exactly once.
    let survivor = Instance::start(&app.database_url(), &[("IDEMPAY_SLOW_CHARGE", "100ms")]).await;
    let taken_over =
        retry_while_in_flight(|| survivor.post_payment(&app.api_key, &key, &slow)).await;
    assert_eq!(taken_over.status, 201);
    assert!(!taken_over.replayed(), "the takeover executed the charge");
    let replay = survivor.post_payment(&app.api_key, &key, &slow).await;
    assert!(replay.replayed());
    let took_over = survivor
        .metrics()
        .await
        .value(r#"idempay_idempotency_outcomes_total{outcome="takeover"}"#);
    assert_eq!(took_over, Some(1.0), "the takeover is counted");
    assert_eq!(replay.body, taken_over.body);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test]
async fn three_instances_under_a_retry_storm_make_one_payment_per_key() {
    const KEYS: usize = 200;
    const COPIES: usize = 5;
    let app = TestApp::spawn().await;
    let instances = three_instances(&app, &[("IDEMPAY_EXPIRY_INTERVAL", "100ms")]).await;
    let keys: Vec<String> = (0..KEYS).map(|_| new_key()).collect();
    let body = payment(4200);

    // Every key sent COPIES times, the copies spread over the three instances, 50 at a time.
    let sends: Vec<(usize, &String)> = (0..COPIES)
        .flat_map(|copy| {
            keys.iter()
                .enumerate()
                .map(move |(i, key)| ((i + copy) % 3, key))
        })
        .collect();
    let mut answers: HashMap<&String, Vec<TestResponse>> = HashMap::new();
    for batch in sends.chunks(50) {
        let responses =
            join_all(batch.iter().map(|(instance, key)| {
                instances[*instance].post_payment(&app.api_key, key, &body)
            }))
            .await;
        for ((_, key), response) in batch.iter().zip(responses) {
            answers.entry(key).or_default().push(response);
        }
    }

    assert_eq!(app.payment_count().await, KEYS as i64);
    for (key, responses) in &answers {
        // 503: an instance was too loaded to answer in time and asked for a retry. Never more.
        assert!(
            responses
                .iter()
                .all(|r| matches!(r.status, 201 | 409 | 503)),
            "{key}"
        );
        let created: Vec<_> = responses.iter().filter(|r| r.status == 201).collect();
        assert!(
            created.iter().all(|r| r.body == created[0].body),
            "{key}: one answer"
        );
        assert_eq!(
            created.iter().filter(|r| !r.replayed()).count(),
            1,
            "{key}: executed once"
        );
    }
    assert_exactly_once(&app.db).await;
}

/// The expiry job runs on every instance. Three of them, their jobs every 50 ms, meet a backlog of
/// expired keys that appears at once: between them they delete every expired key exactly once (the
/// deletions their metrics count add up to the backlog), leave every live key, and never deadlock.
#[api_test]
async fn three_instances_drain_expired_keys_together_each_row_once_without_deadlocks() {
    const EXPIRED: i64 = 30_000;
    const LIVE: i64 = 1_000;
    let app = TestApp::spawn().await;
    let instances = three_instances(&app, &[("IDEMPAY_EXPIRY_INTERVAL", "50ms")]).await;
    let deadlocks = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    let deadlocks_before = deadlocks().await;

    // One statement, so the whole backlog appears at once for the three jobs.
    sqlx::query(
        "INSERT INTO idempotency_keys
             (scope, idem_key, request_hash, status, response_code, response_headers,
              response_body, expires_at)
         SELECT 'acct_seeded:POST /v1/payments', 'k' || i, sha256(i::text::bytea), 'completed',
                201, '{}'::jsonb, '{}'::bytea,
                CASE WHEN i <= $1 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
         FROM generate_series(1, $1 + $2) AS i",
    )
    .bind(EXPIRED)
    .bind(LIVE)
    .execute(&app.db)
    .await
    .unwrap();
    for _ in 0..600 {
        if app.key_count().await == LIVE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE expires_at > now()")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(app.key_count().await, LIVE, "every expired key deleted");
    assert_eq!(live, LIVE, "every live key left");

    // A run counts its deletions when it ends: wait for the runs in progress to end.
    let mut shares = Vec::new();
    for _ in 0..100 {
        shares = deleted_by_each(&instances).await;
        if shares.iter().sum::<i64>() >= EXPIRED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("expiry on three instances: {EXPIRED} expired keys deleted as {shares:?}");
    assert_eq!(shares.iter().sum::<i64>(), EXPIRED, "each row deleted once");
    assert_eq!(deadlocks().await, deadlocks_before, "no deadlock");
}

/// The expired keys each instance's job has deleted, from its metrics.
async fn deleted_by_each(instances: &[Instance]) -> Vec<i64> {
    let mut shares = Vec::new();
    for instance in instances {
        let deleted = instance
            .metrics()
            .await
            .value(r#"idempay_expiry_deleted_rows_total{table="idempotency_keys"}"#)
            .unwrap_or_default();
        shares.push(deleted as i64);
    }
    shares
}

/// Three `idempay serve` processes on the database of `app`, as three replicas.
async fn three_instances(app: &TestApp, env: &[(&str, &str)]) -> [Instance; 3] {
    [
        Instance::start(&app.database_url(), env).await,
        Instance::start(&app.database_url(), env).await,
        Instance::start(&app.database_url(), env).await,
    ]
}
