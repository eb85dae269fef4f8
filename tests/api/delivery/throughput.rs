//! The delivery loop's throughput with 1, 10 and 100 endpoints (`make bench-delivery`, which
//! starts the database as production runs it and runs this ignored test against it): one loop
//! delivers the same number of due rows spread over that many loopback endpoints answering 200 at
//! once, and each line says how many deliveries a second, and its ratio to the 1-endpoint line. The
//! fair claim bounds each endpoint to 5 sends in flight, so one endpoint has the fewest sends at
//! once; this says what that costs, and that many endpoints cost the claim little.

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idempay_test_macros::api_test;
use service::outbox::delivery::{Deliverer, Sender};
use service::outbox::{RetrySchedule, WebhookSecret};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// An endpoint on a free port of 127.0.0.1 answering 200 at once; its URL.
async fn answering() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let app = Router::new().route("/hooks", post(|| async { StatusCode::OK }));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// Delivers `rows` due rows spread over `endpoints` endpoints with one loop; deliveries a second.
async fn deliveries_per_second(pool: &PgPool, endpoints: usize, rows: i64) -> f64 {
    sqlx::query("TRUNCATE webhook_attempts, webhook_deliveries, webhook_endpoints")
        .execute(pool)
        .await
        .unwrap();
    let (account, _) = idempay::accounts::create(pool, &format!("bench {endpoints}"))
        .await
        .unwrap();
    let account = account.id().to_string();
    let mut ids = Vec::new();
    let mut urls = Vec::new();
    let mut secrets = Vec::new();
    for n in 0..endpoints {
        ids.push(format!("we_{n:024}"));
        urls.push(answering().await);
        secrets.push(WebhookSecret::generate().expose().to_string());
    }
    sqlx::query(
        "INSERT INTO webhook_endpoints (account_id, id, url, secret, enabled_events)
         SELECT $1, id, url, secret, ARRAY['*'] FROM unnest($2::text[], $3::text[], $4::text[])
             AS endpoint(id, url, secret)",
    )
    .bind(&account)
    .bind(&ids)
    .bind(&urls)
    .bind(&secrets)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id)
         SELECT $1, 'evt_' || lpad(n::text, 24, '0'), endpoint.url,
                convert_to('{\"type\":\"payment.succeeded\"}', 'UTF8'), endpoint.id
         FROM generate_series(0, $2::bigint - 1) AS n
         JOIN webhook_endpoints AS endpoint
           ON endpoint.account_id = $1 AND endpoint.id = 'we_' || lpad((n % $3)::text, 24, '0')",
    )
    .bind(&account)
    .bind(rows)
    .bind(i64::try_from(endpoints).unwrap())
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE webhook_deliveries")
        .execute(pool)
        .await
        .unwrap();

    let stop = CancellationToken::new();
    let started = Instant::now();
    let deliverer = Deliverer::new(
        idempay::SERVICE,
        pool.clone(),
        Sender::Endpoints {
            allow_private: true,
        },
        RetrySchedule::default(),
        Duration::from_secs(10),
    )
    .unwrap()
    .spawn(stop.clone());
    loop {
        let delivered: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NOT NULL",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if delivered == rows {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{delivered} of {rows} delivered in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    deliverer.await.unwrap();
    #[allow(clippy::cast_precision_loss)]
    let rate = rows as f64 / elapsed.as_secs_f64();
    rate
}

/// Run by `make bench-delivery` (bench/delivery.sh, with `--ignored`) against
/// `IDEMPAY_BENCH_DATABASE_URL`, the database it started as production runs it; ignored by the
/// suite, and refused without that database rather than passing with nothing measured.
#[api_test(bench)]
async fn delivery_throughput_with_1_10_and_100_endpoints() {
    let url = std::env::var("IDEMPAY_BENCH_DATABASE_URL").expect(
        "IDEMPAY_BENCH_DATABASE_URL: the bench's database (make bench-delivery starts one)",
    );
    let rows: i64 = std::env::var("BENCH_DELIVERIES")
        .ok()
        .and_then(|rows| rows.parse().ok())
        .unwrap_or(6_000);
    let pool = idempay::db::pool(&url).unwrap();
    idempay::db::migrate(&pool).await.unwrap();
    let mut one = None;
    for endpoints in [1, 10, 100] {
        let rate = deliveries_per_second(&pool, endpoints, rows).await;
        let base = *one.get_or_insert(rate);
        println!(
            "bench-delivery: {endpoints:>3} endpoint(s): {rows} deliveries, {rate:>7.0}/s, \
             {:.2}x the 1-endpoint line",
            rate / base
        );
    }
}
