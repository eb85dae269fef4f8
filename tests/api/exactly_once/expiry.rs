//! Keys expire: the background job deletes them in batches, leaves live ones alone, and an expired
//! key is new again.

use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use idempay::config::Settings;
use idempay::db::Engine;
use idempay_test_macros::api_test;
use idempotency::Idempotency;

use crate::support::checks::count;
use crate::support::helpers::{
    TestApp, bare_database, new_key, one_connection_planning_for_empty, payment, wait_until,
};

#[api_test(citus)]
async fn an_expired_key_is_deleted_by_the_job_and_can_be_used_again() {
    let app = TestApp::spawn_with(keys_living_one_second(Duration::from_millis(200))).await;
    let key = new_key();
    let first = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(first.status, 201);

    wait_until("the job deletes the expired key", || async {
        app.key_count().await == 0
    })
    .await;
    let again = app.post_payment(&key, &payment(4200)).await;

    assert_eq!(again.status, 201);
    assert!(!again.replayed(), "an expired key is a new request");
    assert_ne!(again.json()["id"], first.json()["id"]);
    assert_eq!(app.payment_count().await, 2);
}

#[api_test(citus)]
async fn an_expired_key_not_yet_deleted_is_new_again() {
    // The job does not run: the key expires but its row stays.
    let app = TestApp::spawn_with(keys_living_one_second(Duration::from_secs(3600))).await;
    let key = new_key();
    let first = app.post_payment(&key, &payment(4200)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Even with another payload: the old key's binding has expired.
    let again = app.post_payment(&key, &payment(100)).await;

    again.assert_status(201);
    assert!(!again.replayed());
    assert_ne!(again.json()["id"], first.json()["id"]);
    assert_eq!(app.key_count().await, 1);
    assert_eq!(app.payment_count().await, 2);
}

/// Replays of a completed key are served from memory after the first, but never past the key's
/// `expires_at`: then the same request is new again, as the expiry policy says.
#[api_test]
async fn a_replay_kept_in_memory_ends_when_its_key_expires() {
    // The job does not run: the key expires but its row stays.
    let app = TestApp::spawn_with(keys_living_one_second(Duration::from_secs(3600))).await;
    let key = new_key();
    let first = app.post_payment(&key, &payment(4200)).await;
    for _ in 0..3 {
        let replay = app.post_payment(&key, &payment(4200)).await;
        assert!(replay.replayed());
        assert_eq!(replay.body, first.body);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let again = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(again.status, 201);
    assert!(!again.replayed(), "the key expired: the request runs again");
    assert_ne!(again.json()["id"], first.json()["id"]);
    assert_eq!(app.payment_count().await, 2);
}

#[api_test(citus)]
async fn the_job_drains_expired_keys_in_batches_and_leaves_live_ones() {
    let app = TestApp::spawn_with(expiring_every(Duration::from_millis(200))).await;
    // More than one batch of expired keys, some live ones, and an expired key whose request is
    // still running: it keeps its row until its lease ends.
    expired_keys(&app, 2500).await;
    sqlx::raw_sql(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status, response_code,
                                       response_headers, response_body, expires_at)
         SELECT 'acct_x', 'acct_x:POST /v1/payments', 'live-' || i, sha256(i::text::bytea), 'completed',
                201, '{}', '\\x7b7d', now() + interval '1 hour'
         FROM generate_series(1, 10) AS i;
         INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status, lock_token,
                                       locked_until, expires_at)
         VALUES ('acct_x', 'acct_x:POST /v1/payments', 'running', sha256('r'), 'in_progress',
                 gen_random_uuid(), now() + interval '1 hour', now() - interval '1 minute');",
    )
    .execute(&app.db)
    .await
    .unwrap();

    wait_until("the job drains every expired key", || async {
        let expired = count(
            &app.db,
            "SELECT count(*) FROM idempotency_keys WHERE idem_key LIKE 'expired-%'",
        )
        .await;
        expired == 0
    })
    .await;

    let left: Vec<String> =
        sqlx::query_scalar("SELECT idem_key FROM idempotency_keys WHERE scope NOT LIKE 'processor:%' ORDER BY idem_key")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(left.len(), 11, "{left:?}");
    assert!(
        left.iter()
            .all(|key| key.starts_with("live-") || key == "running"),
        "{left:?}"
    );
}

/// Keys that live one second, and the expiry job every `expiry_interval`.
fn keys_living_one_second(expiry_interval: Duration) -> Settings {
    Settings {
        key_ttl: Duration::from_secs(1),
        ..expiring_every(expiry_interval)
    }
}

/// The expiry job every `expiry_interval`.
fn expiring_every(expiry_interval: Duration) -> Settings {
    Settings {
        shared: SharedArgs {
            expiry_interval,
            ..SharedArgs::default()
        },
        ..Settings::default()
    }
}

/// A backlog of `keys` completed keys, expired a minute ago, of an account of no consequence.
async fn expired_keys(app: &TestApp, keys: i32) {
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status, response_code,
                                       response_headers, response_body, expires_at)
         SELECT 'acct_x', 'acct_x:POST /v1/payments', 'expired-' || i, sha256(i::text::bytea), 'completed',
                201, '{}', '\\x7b7d', now() - interval '1 minute'
         FROM generate_series(1, $1) AS i",
    )
    .bind(keys)
    .execute(&app.db)
    .await
    .unwrap();
}

/// Each delete of the job takes at most 1,000 rows, so no statement holds many locks for long:
/// 2,500 expired keys go in three statements. Every delete statement on the table records how many
/// rows it took, through a statement trigger of the test's own.
#[api_test]
async fn the_job_deletes_at_most_1000_keys_per_statement() {
    let app = TestApp::spawn_with(expiring_every(Duration::from_millis(200))).await;
    sqlx::raw_sql(
        "CREATE TABLE deletes (id bigserial PRIMARY KEY, rows bigint NOT NULL);
         CREATE FUNCTION count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO deletes (rows) SELECT count(*) FROM deleted; RETURN NULL; END $$;
         CREATE TRIGGER count_deleted AFTER DELETE ON idempotency_keys
         REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION count_deleted();",
    )
    .execute(&app.db)
    .await
    .unwrap();
    expired_keys(&app, 2500).await;

    wait_until("the job drains every expired key", || async {
        app.key_count().await == 0
    })
    .await;

    let deletes: Vec<i64> =
        sqlx::query_scalar("SELECT rows FROM deletes WHERE rows > 0 ORDER BY id")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(deletes.iter().sum::<i64>(), 2500, "{deletes:?}");
    assert!(
        deletes.iter().all(|&rows| rows <= 1000),
        "a delete took more than 1,000 rows: {deletes:?}"
    );
    assert_eq!(deletes.len(), 3, "full batches: {deletes:?}");
}

/// The bound holds whatever plan the statement got. Here the plan is made while the tables'
/// statistics say they are empty (analyzed empty, autovacuum off so nothing corrects them), on a
/// connection that keeps it; then a backlog of 2,500 expired rows appears at once. Locked in
/// `IN (SELECT … LIMIT 1000 FOR UPDATE SKIP LOCKED)`, that plan ran the sub-select again for every
/// row it compared, and the first statement deleted the whole backlog (in seconds, not
/// milliseconds): the keys' batch and the processed events' batch each take 1,000 rows now.
#[api_test]
async fn a_batch_planned_while_the_table_was_empty_still_deletes_at_most_1000_rows() {
    // No server: the batches below are the only ones.
    let database_url = bare_database().await;
    let pool =
        one_connection_planning_for_empty(&database_url, &["idempotency_keys", "processed_events"])
            .await;
    let expire_keys = || Idempotency::expire_batch(&pool, Engine::Postgres);
    let expire_events = || idempay::webhooks::expire_batch(&pool);
    assert_eq!(expire_keys().await.unwrap(), 0, "nothing to expire yet");
    assert_eq!(expire_events().await.unwrap(), 0, "nothing to expire yet");

    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status, response_code,
                                       response_headers, response_body, expires_at)
         SELECT 'acct_x', 'acct_x:POST /v1/payments', 'expired-' || i, sha256(i::text::bytea), 'completed',
                201, '{}', '\\x7b7d', now() - interval '1 minute'
         FROM generate_series(1, 2500) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO processed_events (id, type, outcome, expires_at)
         SELECT 'evt_' || i, 'charge.succeeded', 'applied', now() - interval '1 minute'
         FROM generate_series(1, 2500) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();

    let mut keys = Vec::new();
    let mut events = Vec::new();
    for _ in 0..3 {
        keys.push(expire_keys().await.unwrap());
        events.push(expire_events().await.unwrap());
    }
    assert_eq!(keys, [1000, 1000, 500], "the keys' batches");
    assert_eq!(events, [1000, 1000, 500], "the processed events' batches");
}
