//! One merchant cannot stall another: deliveries are claimed fairly across endpoints, with at most
//! 5 sends in flight to one endpoint, so an endpoint that accepts connections and never answers
//! holds its own sends until their timeout, not every account's.

use std::time::{Duration, Instant};

use idempay::config::Settings;
use idempay_test_macros::api_test;
use tokio::net::TcpListener;

use super::{Receiver, endpoint_as, endpoint_for_all, wait_for};
use crate::support::helpers::{TestApp, new_key, payment};

/// How many deliveries are due to the endpoint that never answers.
const STALLED: i64 = 2_000;

/// How many of `endpoint`'s deliveries were sent at least once.
async fn sent_to(app: &TestApp, endpoint: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND attempts > 0",
    )
    .bind(endpoint)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// A listener that accepts every connection and holds it, answering nothing: each send to it
/// lasts the whole delivery timeout (10 s by default).
async fn silent_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((connection, _)) = listener.accept().await {
            held.push(connection);
        }
    });
    url
}

/// Account A's endpoint never answers and has 2,000 deliveries due; account B's answers at once.
/// B's payment's event reaches B within 5 s. The default settings but for private addresses (the
/// endpoints are on this machine). A's deliveries are written straight into the outbox, as 2,000
/// events' fan-out would queue them (the same columns; no event rows, which delivery never reads):
/// 2,000 payments would take the test most of a minute before it measures anything.
///
/// Before the fair claim, one loop claimed the 50 oldest due rows of every endpoint together and
/// waited for the whole batch: A's 2,000 are older than B's, so each batch of A's waited out the
/// 10 s timeout, and B's event came after all of them (about 400 s; 40 s was measured without it).
#[api_test]
async fn an_endpoint_that_never_answers_does_not_delay_another_account_s_event() {
    let app = TestApp::spawn_with(Settings {
        webhook_allow_private: true,
        ..Settings::default()
    })
    .await;
    let silent = silent_endpoint().await;
    let (stalled, _) = endpoint_for_all(&app, &silent).await;
    sqlx::query(
        "INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id,
                                         created_at, next_attempt_at)
         SELECT $1, 'evt_' || lpad(n::text, 24, '0'), $2, convert_to('{}', 'UTF8'), $3,
                now() - interval '1 minute', now() - interval '1 minute'
         FROM generate_series(1, $4::bigint) AS n",
    )
    .bind(&app.account_id)
    .bind(&silent)
    .bind(&stalled)
    .bind(STALLED)
    .execute(&app.db)
    .await
    .unwrap();
    // A's sends are in flight, held by its endpoint.
    wait_for(
        "the loop sends to the endpoint that never answers",
        Duration::from_secs(10),
        || async { sent_to(&app, &stalled).await >= 5 },
    )
    .await;

    let (_, b_key) = app.create_account("Merchant B").await;
    let receiver = Receiver::start(0).await;
    endpoint_as(&app, &b_key, &receiver.url, &["*"]).await;
    let paid = app
        .post_payment_as(&b_key, &new_key(), &payment(4200))
        .await;
    paid.assert_status(201);
    let paid_at = Instant::now();
    wait_for(
        "B's event reaches B's endpoint",
        Duration::from_secs(5),
        || async { !receiver.deliveries().is_empty() },
    )
    .await;
    let latency = paid_at.elapsed();
    println!(
        "fairness: B's event arrived {latency:?} after its payment, with {STALLED} deliveries due \
         to A's endpoint that never answers"
    );

    let sent_to_a = sent_to(&app, &stalled).await;
    assert!(sent_to_a <= 5, "{sent_to_a} sends to A's endpoint at once");

    // The lag of A's endpoint is on a line of its own.
    let scraped = app.send(app.client().get(app.url("/metrics"))).await;
    let metrics = String::from_utf8_lossy(&scraped.body);
    let line = format!(
        "idempay_webhook_oldest_due_seconds{{sender=\"endpoints\",endpoint=\"{stalled}\"}}"
    );
    let age: f64 = metrics
        .lines()
        .find_map(|row| row.strip_prefix(&line))
        .unwrap_or_else(|| panic!("no {line} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap();
    assert!(age >= 59.0, "A's oldest due delivery waited {age} s");
    assert!(
        metrics.contains("idempay_webhook_deliveries_in_flight{sender=\"endpoints\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("idempay_webhook_endpoints{status=\"enabled\"}"),
        "{metrics}"
    );
}

/// The bound across endpoints: twelve endpoints that never answer, ten deliveries due to each
/// (room for 60 sends at 5 per endpoint), and the deliverer keeps 50 in flight in all
/// (`delivery::BATCH`), never more, at most 5 to any one. Each send holds its
/// own connection (none is answered, so none is reused), so the connections the endpoints accepted
/// before the first send's 10 s timeout are the sends in flight.
#[api_test]
async fn the_sends_in_flight_across_all_endpoints_stay_within_the_deliverer_s_bound() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const ENDPOINTS: usize = 12;
    let app = TestApp::spawn_with(Settings {
        webhook_allow_private: true,
        ..Settings::default()
    })
    .await;
    let accepted: Arc<Vec<AtomicUsize>> =
        Arc::new((0..ENDPOINTS).map(|_| AtomicUsize::new(0)).collect());
    for endpoint in 0..ENDPOINTS {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let counts = Arc::clone(&accepted);
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                counts[endpoint].fetch_add(1, Ordering::SeqCst);
                held.push(connection);
            }
        });
        let (id, _) = endpoint_for_all(&app, &url).await;
        sqlx::query(
            "INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id,
                                             created_at, next_attempt_at)
             SELECT $1, 'evt_' || $3 || '_' || lpad(n::text, 20, '0'), $2,
                    convert_to('{}', 'UTF8'), $3, now(), now()
             FROM generate_series(1, 10) AS n",
        )
        .bind(&app.account_id)
        .bind(&url)
        .bind(&id)
        .execute(&app.db)
        .await
        .unwrap();
    }
    let total = || {
        accepted
            .iter()
            .map(|n| n.load(Ordering::SeqCst))
            .sum::<usize>()
    };

    wait_for(
        "the deliverer fills its bound",
        Duration::from_secs(8),
        || async { total() >= 50 },
    )
    .await;
    // A moment more, still well within the first sends' timeout: nothing ends, nothing is added.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let per_endpoint: Vec<usize> = accepted.iter().map(|n| n.load(Ordering::SeqCst)).collect();
    assert_eq!(
        total(),
        50,
        "sends in flight across endpoints: {per_endpoint:?}"
    );
    assert!(
        per_endpoint.iter().all(|&sends| sends <= 5),
        "at most 5 to one endpoint: {per_endpoint:?}"
    );
}
