//! The database restarts while an instance holds connections to it at rest. Once `/readyz` says
//! the instance is ready again, the very next payments go through: none of them is sent on a
//! connection the old server ended.

use std::time::{Duration, Instant};

use futures::future::join_all;
use idempay_test_macros::api_test;
use sqlx::{Connection, PgConnection, PgPool};

use super::outage::OwnPostgres;
use crate::support::helpers::{new_key, payment};
use crate::support::instance::Instance;
use crate::support::invariants::assert_exactly_once;

/// Payments sent side by side, before the restart (so that the pool and both lots, idempay's and
/// its embedded processor's, leave several connections at rest) and right after it.
const PAYMENTS: usize = 10;

/// PostgreSQL's fast shutdown (SIGINT) ends every session with 57P01 ("terminating connection due
/// to administrator command"), which sits unread on each connection at rest until its next
/// statement. Before the fix, the first payments after `/readyz` turned 200 took such connections
/// from idempay's lot and its processor's and were answered 503.
#[api_test]
async fn after_a_database_restart_the_first_payments_once_ready_all_go_through() {
    let postgres = OwnPostgres::start().await;
    let instance = Instance::start(&postgres.url(), &[]).await;
    let api_key = Instance::create_account(&postgres.url()).await;

    let before = send_payments(&instance, &api_key, 100).await;
    for (key, answer) in &before {
        assert_eq!(answer.status, 201, "{key} before the restart");
    }
    // The window the test aims at: sessions of the lots at rest on the server about to stop.
    let at_rest = lot_sessions_at_rest(&postgres.url()).await;
    assert!(
        at_rest >= 2,
        "the lots hold connections at rest before the restart: {at_rest}"
    );

    postgres.docker(&["kill", "--signal", "SIGINT"]).await;
    postgres.docker(&["start"]).await;
    let recovery = Instant::now();
    while instance.get("/readyz").await.status != 200 {
        assert!(
            recovery.elapsed() < Duration::from_secs(30),
            "never ready again after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let after = send_payments(&instance, &api_key, 200).await;
    let refused: Vec<String> = after
        .iter()
        .filter(|(_, answer)| answer.status != 201)
        .map(|(key, answer)| {
            format!(
                "{key}: {} {}",
                answer.status,
                String::from_utf8_lossy(&answer.body)
            )
        })
        .collect();
    eprintln!(
        "restart: {at_rest} lot sessions at rest before it; {} of {PAYMENTS} payments right after \
         /readyz turned 200 refused",
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "every payment after /readyz turned 200 goes through; refused:\n{}",
        refused.join("\n")
    );

    let db = PgPool::connect(&postgres.url()).await.expect("a pool");
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(payments, 2 * PAYMENTS as i64, "one payment per key");
    assert_exactly_once(&db).await;
    db.close().await;
}

/// [`PAYMENTS`] new payments side by side, each with a key of its own, amounts from `first`.
async fn send_payments(
    instance: &Instance,
    api_key: &str,
    first: i64,
) -> Vec<(String, crate::support::helpers::TestResponse)> {
    let keys: Vec<String> = (0..PAYMENTS).map(|_| new_key()).collect();
    let answers = join_all(keys.iter().zip(first..).map(|(key, amount)| {
        let body = payment(amount);
        async move { instance.post_payment(api_key, key, &body).await }
    }))
    .await;
    keys.into_iter().zip(answers).collect()
}

/// How many sessions of the lots (idempay's and its processor's, named `idempay (lot)` after the pool's `idempay`) are idle
/// on the server now.
async fn lot_sessions_at_rest(database_url: &str) -> i64 {
    let mut admin = PgConnection::connect(database_url).await.unwrap();
    let count = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = 'idempay (lot)' AND state = 'idle'",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    admin.close().await.ok();
    count
}
