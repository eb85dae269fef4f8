//! A database that makes a statement wait past the session's lock timeout: the request is answered
//! 503 with `Retry-After` by that timeout, long before the request timeout, and a retry with the
//! same key makes the payment once the lock is gone.

use std::time::{Duration, Instant};

use idempay::config::Settings;
use idempay_test_macros::api_test;

use crate::support::helpers::{TestApp, new_key, payment};

/// The session's `lock_timeout` (`src/db.rs`): a constant, not a setting.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

#[api_test]
async fn a_statement_past_the_lock_timeout_is_answered_503_and_the_key_is_retried_to_one_payment() {
    // A request timeout far beyond the lock timeout: a 503 before it is the lock timeout's.
    let request_timeout = Duration::from_secs(40);
    let app = TestApp::spawn_with(Settings {
        request_timeout,
        ..Settings::default()
    })
    .await;
    // The account is looked up once, before the table is locked.
    assert_eq!(
        app.post_payment(&new_key(), &payment(100)).await.status,
        201
    );

    let mut locker = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let key = new_key();
    let asked = Instant::now();
    let refused = app.post_payment(&key, &payment(4200)).await;
    let took = asked.elapsed();

    refused.assert_problem(503, "service-unavailable");
    assert!(refused.header("retry-after").is_some(), "{refused:?}");
    assert!(
        took >= LOCK_TIMEOUT - Duration::from_millis(500) && took < request_timeout / 2,
        "answered after {took:?}: by the lock timeout of {LOCK_TIMEOUT:?}, not the request \
         timeout of {request_timeout:?}"
    );
    locker.rollback().await.unwrap();

    let retried = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(retried.status, 201, "{retried:?}");
    assert!(!retried.replayed());
    assert_eq!(app.payment_count().await, 2);
    assert_eq!(
        app.post_payment(&key, &payment(4200)).await.body,
        retried.body
    );
}
