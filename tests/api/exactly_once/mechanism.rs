//! The idempotency mechanism on its own, with units of work that HTTP cannot provoke: one that
//! panics, one that fails, one that succeeds afterwards with the same key, and one that must go on
//! while its lease's renewal waits.

use std::time::Duration;

use axum::http::StatusCode;
use idempay::accounts::Account;
use idempay::http::error::{ApiError, ProblemKind};
use idempay_test_macros::api_test;
use idempotency::{
    Fingerprints, Idempotency, IdempotencyKey, KeyedRequest, Policy, Resumers, Scope, StateVersion,
    StoredResponse, Target,
};
use serde_json::json;
use sqlx::PgPool;
use tokio::sync::oneshot;

use crate::support::checks::count;
use crate::support::harness::EXPECTED_PANIC;
use crate::support::helpers::{TestApp, bare_database, one_connection_planning_for_empty};
use crate::support::instance::ANSWER_WITHIN;

const POLICY: Policy = Policy {
    key_ttl: Duration::from_secs(60),
    lease: Duration::from_secs(30),
    recovery_window: Duration::from_secs(12 * 60 * 60),
};

#[api_test]
async fn a_panicking_unit_of_work_releases_the_key_for_a_retry() {
    let (app, idempotency, account) = mechanism_on_a_fresh_database().await;
    let panicked: Result<_, ApiError> = idempotency
        .run(keyed(&account, "/v1/things"), |_lease| async {
            std::panic::panic_any(EXPECTED_PANIC)
        })
        .await;

    let Err(error) = panicked else {
        panic!("a panic is not a success")
    };
    assert_eq!(error.into_problem().kind(), ProblemKind::Internal);
    assert_eq!(app.key_count().await, 0, "the key was released");

    let retried = idempotency
        .run(keyed(&account, "/v1/things"), complete_with_201)
        .await
        .unwrap();
    assert_eq!(retried.status(), StatusCode::CREATED);
    assert_eq!(app.key_count().await, 1);
}

#[api_test]
async fn a_failing_unit_of_work_stores_nothing_and_passes_its_error_on() {
    let (app, idempotency, account) = mechanism_on_a_fresh_database().await;
    let request = keyed(&account, "/v1/things");

    let failed = idempotency
        .run(request, |_lease| async {
            Err(ApiError::Internal(anyhow::anyhow!(
                "the processor timed out"
            )))
        })
        .await;

    assert!(matches!(failed, Err(ApiError::Internal(_))));
    assert_eq!(app.key_count().await, 0);
}

#[api_test(citus)]
async fn the_same_key_on_another_route_is_a_separate_key() {
    let (app, idempotency, account) = mechanism_on_a_fresh_database().await;

    for route in ["/v1/things", "/v1/other-things"] {
        let response = idempotency
            .run(keyed(&account, route), complete_with_201)
            .await
            .unwrap();
        assert!(
            response.headers().get("idempotent-replayed").is_none(),
            "{route}"
        );
    }
    assert_eq!(app.key_count().await, 2);
}

/// The heartbeat runs beside the work, never in its way: while a renewal waits for the key's row
/// (locked by another transaction here; the test pool sets no lock timeout, so it waits as long as
/// the row is held), the work is still polled and goes on. Progress is shown by events, in order:
/// the work receives a message sent after the renewal began to wait, and answers it while the row
/// is still locked, so no renewal can have finished in between.
#[api_test]
async fn the_work_goes_on_while_a_renewal_of_its_lease_waits_for_the_key_row() {
    let (app, _, account) = mechanism_on_a_fresh_database().await;
    // Renewed every second, so the first renewal comes soon.
    let policy = Policy {
        key_ttl: Duration::from_secs(60),
        lease: Duration::from_secs(3),
        recovery_window: Duration::from_secs(12 * 60 * 60),
    };
    let idempotency = Idempotency::new(app.db.clone(), policy);
    let (reserved_tx, reserved) = oneshot::channel();
    let (go_tx, go) = oneshot::channel::<()>();
    let (went_tx, went) = oneshot::channel();
    let request = keyed(&account, "/v1/things");
    let running = tokio::spawn(async move {
        idempotency
            .run(request, move |lease| async move {
                reserved_tx.send(()).unwrap();
                go.await.unwrap();
                went_tx.send(()).unwrap();
                complete_with_201(lease).await
            })
            .await
    });
    reserved
        .await
        .expect("the key is reserved and the work starts");

    let mut holder = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("SELECT id FROM idempotency_keys WHERE status = 'in_progress' FOR UPDATE")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    app.until_a_statement_waits(
        "a renewal waits for the locked key row",
        "%UPDATE idempotency_keys%locked_until%",
    )
    .await;

    go_tx.send(()).unwrap();
    tokio::time::timeout(ANSWER_WITHIN, went)
        .await
        .expect("the work went on while its renewal waited for the row")
        .unwrap();

    // The row is released: the work completes its key, which it never stopped holding.
    holder.rollback().await.unwrap();
    let response = tokio::time::timeout(ANSWER_WITHIN, running)
        .await
        .expect("the work completes once the row is free")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(app.key_count().await, 1);
}

/// The recovery job's claim takes at most 20 keys a batch (each is a call to another system) even
/// when its statement was planned while no key was recoverable, on a connection that keeps that
/// plan. Locked in `IN (SELECT … LIMIT 20 FOR UPDATE SKIP LOCKED)`, such a plan joined every key to
/// a sub-select run again for each of them, and the first batch claimed all 50 (tried on this
/// schema); locked once in `ARRAY(…)`, the batches are 20, 20 and 10.
#[api_test]
async fn a_recovery_batch_planned_while_no_key_was_recoverable_still_claims_at_most_20_keys() {
    const POINT: &str = "stale-plan-test";
    // No server, so no recovery job but the batches below (a server's would not know POINT).
    let database_url = bare_database().await;
    let db = PgPool::connect(&database_url).await.unwrap();
    let (account, _) = idempay::accounts::create(&db, "recovery").await.unwrap();
    let pool = one_connection_planning_for_empty(&database_url, &["idempotency_keys"]).await;
    let idempotency = Idempotency::new(pool, POLICY).resuming(Resumers::default().on(
        POINT,
        &[StateVersion::FIRST],
        complete_with_201,
    ));
    assert_eq!(
        idempotency
            .recover_batch(Duration::from_secs(1))
            .await
            .unwrap(),
        0
    );

    // 50 keys whose request stopped at POINT and whose lease is dead.
    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status, lock_token,
                                       locked_until, expires_at, recovery_point, recovery_state,
                                       downstream_key)
         SELECT $1, $1 || ':POST /v1/things', 'suspended-' || i, sha256(i::text::bytea),
                'in_progress', gen_random_uuid(), now() - interval '1 minute',
                now() + interval '1 day', $2, '{}', 'downstream-' || i
         FROM generate_series(1, 50) AS i",
    )
    .bind(account.id().as_str())
    .bind(POINT)
    .execute(&db)
    .await
    .unwrap();

    let mut batches = Vec::new();
    for _ in 0..3 {
        batches.push(
            idempotency
                .recover_batch(Duration::from_secs(1))
                .await
                .unwrap(),
        );
    }
    assert_eq!(batches, [20, 20, 10], "the recovery job's batches");
    let completed = count(
        &db,
        "SELECT count(*) FROM idempotency_keys WHERE status = 'completed' AND response_code = 201",
    )
    .await;
    assert_eq!(completed, 50, "every claimed key was resumed and completed");
}

/// A recovery point that no resumer of the mechanism knows would leave its key suspended with no
/// one to resume it: it is refused before anything is recorded, whether the work records it
/// (`Lease::record_recovery_point`) or the reservation does (`KeyedRequest::starting_at`), and the
/// key is released. A point a resumer knows is recorded.
#[api_test]
async fn a_recovery_point_no_resumer_knows_is_refused_before_anything_is_recorded() {
    let (app, _, account) = mechanism_on_a_fresh_database().await;
    let idempotency = Idempotency::new(app.db.clone(), POLICY).resuming(Resumers::default().on(
        "thing.known",
        &[StateVersion::FIRST],
        complete_with_201,
    ));
    let refused = |error: idempotency::Error| match error {
        idempotency::Error::Internal(error) => error.to_string(),
        other => panic!("not an internal error: {other}"),
    };

    let recorded = idempotency
        .run(keyed(&account, "/v1/things"), |mut lease| async move {
            lease
                .record_recovery_point("thing.unknown", json!({}))
                .await?;
            Ok::<_, idempotency::Error>(lease.lost())
        })
        .await;
    assert_eq!(
        refused(recorded.unwrap_err()),
        "no resumer for the recovery point `thing.unknown`: register one with \
         Idempotency::resuming before recording it"
    );
    assert_eq!(app.key_count().await, 0, "released, no point recorded");

    let reserved = idempotency
        .run(
            keyed(&account, "/v1/things").starting_at("thing.unknown", || Ok(json!({}))),
            |lease| async move { Ok::<_, idempotency::Error>(lease.lost()) },
        )
        .await;
    assert!(
        refused(reserved.unwrap_err()).contains("`thing.unknown`"),
        "the reservation refuses it too"
    );
    assert_eq!(app.key_count().await, 0, "nothing was reserved");

    let known = idempotency
        .run(keyed(&account, "/v1/things"), |mut lease| async move {
            let point = lease
                .record_recovery_point("thing.known", json!({}))
                .await?
                .expect("the lease is held");
            assert!(point.downstream_key.starts_with("idk_"), "{point:?}");
            complete_with_201(lease)
                .await
                .map_err(|error| idempotency::Error::Internal(anyhow::anyhow!("{error}")))
        })
        .await
        .unwrap();
    assert_eq!(known.status(), StatusCode::CREATED);
    let point: Option<String> = sqlx::query_scalar("SELECT recovery_point FROM idempotency_keys")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(point.as_deref(), Some("thing.known"));
}

/// The mechanism on its own, on a fresh database with one account.
async fn mechanism_on_a_fresh_database() -> (TestApp, Idempotency, Account) {
    let app = TestApp::spawn().await;
    let idempotency = Idempotency::new(app.db.clone(), POLICY);
    let (account, _) = idempay::accounts::create(&app.db, "mechanism")
        .await
        .unwrap();
    (app, idempotency, account)
}

/// The same key and payload for `route`, in `account`.
fn keyed(account: &Account, route: &str) -> KeyedRequest {
    KeyedRequest::new(
        Scope::new(account.id().as_str(), &axum::http::Method::POST, route),
        IdempotencyKey::parse(b"the-key").unwrap(),
        Fingerprints::of_request(Target::same(route), &json!({ "thing": 1 })),
    )
}

async fn complete_with_201(lease: idempotency::Lease) -> Result<idempotency::Completion, ApiError> {
    let tx = lease.begin().await?;
    let response = StoredResponse::json(StatusCode::CREATED, &json!({ "ok": true }))
        .map_err(anyhow::Error::from)?;
    Ok(lease.complete(tx, response).await?)
}
