//! Each account's requests per second are limited (`IDEMPAY_RATE_LIMIT`), before anything of a
//! request runs: a throttled request uses nothing, its idempotency key included.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;

use crate::support::helpers::{TestApp, TestResponse, new_key, payment};

async fn list(app: &TestApp, api_key: &str) -> TestResponse {
    app.send(
        app.client()
            .get(app.url("/v1/payments"))
            .bearer_auth(api_key),
    )
    .await
}

#[api_test]
async fn a_request_over_the_rate_limit_gets_429_without_using_its_key_and_its_retry_runs() {
    let app = TestApp::spawn_with(Settings {
        rate_limit: 2,
        ..Settings::default()
    })
    .await;
    let (_, other_account) = app.create_account("another merchant").await;

    // Requests at once, more than the burst of 2, then a payment: refused unless half a second
    // (one request's worth at 2 a second) went by since the burst. Tried again with a fresh key
    // if it did, on a machine that slow.
    let mut throttled = None;
    for _ in 0..10 {
        let burst = futures::future::join_all((0..4).map(|_| list(&app, &app.api_key))).await;
        assert!(
            burst
                .iter()
                .all(|answer| [200, 429].contains(&answer.status))
        );
        let key = new_key();
        let answer = app.post_payment(&key, &payment(4200)).await;
        if answer.status == 429 {
            throttled = Some((key, answer));
            break;
        }
        assert_eq!(answer.status, 201, "{answer:?}");
    }
    let (key, answer) = throttled.expect("a payment right after a burst is throttled");

    answer.assert_problem(429, "rate-limited");
    let retry_after: u64 = answer
        .header("retry-after")
        .and_then(|seconds| seconds.parse().ok())
        .expect("Retry-After in whole seconds");
    assert!((1..=2).contains(&retry_after), "Retry-After: {retry_after}");
    let reserved: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE idem_key = $1")
            .bind(&key)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(reserved, 0, "the throttled request reserved its key");
    assert_eq!(
        list(&app, &other_account).await.status,
        200,
        "another account is throttled by this one's requests"
    );

    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let retried = app.post_payment(&key, &payment(4200)).await;

    assert_eq!(retried.status, 201, "{retried:?}");
    assert!(
        !retried.replayed(),
        "the retry runs as the key's first request"
    );
    let throttled = app.get("/metrics").await;
    assert!(
        String::from_utf8_lossy(&throttled.body).contains("idempay_rate_limited_requests_total"),
        "throttled requests are counted"
    );
}
