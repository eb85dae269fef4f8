//! The fan-out's cost in the payment's own statement, measured with the most endpoints an account
//! may have: payments of an account with none and of one with 16, made in turn in one run, and
//! what each wrote. Printed, not asserted on time (the numbers are in `src/webhooks/README.md`);
//! what is asserted is what each payment wrote: its event, and a delivery per endpoint.

use std::time::{Duration, Instant};

use ::service::shared_settings::SharedArgs;
use idempay::config::Settings;
use idempay::webhooks::endpoints::MAX_ENDPOINTS;
use idempay_test_macros::api_test;
use serde_json::json;
use sqlx::PgPool;

use super::{local, post_endpoint};
use crate::support::helpers::{TestApp, new_key, payment};

/// Payments per account.
const PAYMENTS: usize = 60;

/// What one payment cost: its time, and the WAL it wrote (every write of its transaction).
#[derive(Default)]
struct Cost {
    took: Vec<Duration>,
    wal: Vec<i64>,
}

impl Cost {
    fn median_ms(&self) -> f64 {
        let mut took = self.took.clone();
        took.sort();
        took[took.len() / 2].as_secs_f64() * 1000.0
    }

    fn median_wal(&self) -> i64 {
        let mut wal = self.wal.clone();
        wal.sort_unstable();
        wal[wal.len() / 2]
    }
}

async fn wal_position(db: &PgPool) -> String {
    sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
        .fetch_one(db)
        .await
        .unwrap()
}

async fn wal_since(db: &PgPool, since: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::text::pg_lsn)::bigint",
    )
    .bind(since)
    .fetch_one(db)
    .await
    .unwrap()
}

/// The account's deliveries and the bytes of their rows (body and all).
async fn deliveries(db: &PgPool, account: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*), COALESCE(sum(pg_column_size(delivery.*)), 0)::bigint
         FROM webhook_deliveries AS delivery WHERE account_id = $1",
    )
    .bind(account)
    .fetch_one(db)
    .await
    .unwrap()
}

#[api_test]
async fn the_fan_out_to_16_endpoints_measured_against_none() {
    // No job runs while it measures: no delivery is attempted, nothing expires.
    let local = local("1s");
    let settings = Settings {
        webhook_poll_interval: Duration::from_secs(86_400),
        shared: SharedArgs {
            expiry_interval: Duration::from_secs(86_400),
            ..local.shared
        },
        recovery_interval: Duration::from_secs(86_400),
        ..local
    };
    let app = TestApp::spawn_with(settings).await;
    let (fanned, fanned_key) = app.create_account("sixteen endpoints").await;
    for n in 0..MAX_ENDPOINTS {
        let created = post_endpoint(
            &app,
            &fanned_key,
            &new_key(),
            &json!({ "url": format!("http://127.0.0.1:9/hooks/{n}"), "enabled_events": ["*"] }),
        )
        .await;
        assert_eq!(created.status, 201);
    }
    // Warm both paths once, then alternate, so that both see the same machine.
    for api_key in [&app.api_key, &fanned_key] {
        let warm = app
            .post_payment_as(api_key, &new_key(), &payment(100))
            .await;
        assert_eq!(warm.status, 201);
    }
    let before = [
        deliveries(&app.db, &app.account_id).await,
        deliveries(&app.db, &fanned).await,
    ];
    let mut costs = [Cost::default(), Cost::default()];
    for _ in 0..PAYMENTS {
        for (n, api_key) in [&app.api_key, &fanned_key].into_iter().enumerate() {
            let position = wal_position(&app.db).await;
            let started = Instant::now();
            let created = app
                .post_payment_as(api_key, &new_key(), &payment(1000))
                .await;
            costs[n].took.push(started.elapsed());
            costs[n].wal.push(wal_since(&app.db, &position).await);
            assert_eq!(created.status, 201);
        }
    }
    let after = [
        deliveries(&app.db, &app.account_id).await,
        deliveries(&app.db, &fanned).await,
    ];
    let per_payment = |n: usize| {
        let rows = (after[n].0 - before[n].0) / PAYMENTS as i64;
        let bytes = (after[n].1 - before[n].1) / PAYMENTS as i64;
        (rows, bytes)
    };
    assert_eq!(per_payment(0).0, 0, "no endpoint, no delivery");
    assert_eq!(per_payment(1).0, MAX_ENDPOINTS, "a delivery per endpoint");
    for (n, endpoints) in [0, MAX_ENDPOINTS].into_iter().enumerate() {
        let (rows, bytes) = per_payment(n);
        println!(
            "fan-out: {endpoints:>2} endpoints: {PAYMENTS} payments, median {:.1} ms each, \
             {} delivery rows ({bytes} bytes of rows) and {} bytes of WAL (median) per payment",
            costs[n].median_ms(),
            rows,
            costs[n].median_wal(),
        );
    }
}
