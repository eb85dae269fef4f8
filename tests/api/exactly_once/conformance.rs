//! The mechanism against the IETF draft "The Idempotency-Key HTTP Header Field" (httpapi WG,
//! draft 07), case by case, through `idempay fixture`: the conformance suite's fixture routes
//! behind `idempotency::IdempotencyLayer`, with handlers that know nothing of keys. The fixture's
//! counter says how many times its handlers really ran. Each test cites the draft's section it
//! checks.

use std::process::Stdio;
use std::time::Duration;

use idempay_test_macros::api_test;
use idempotency::Policy;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::process::Command;

use crate::support::helpers::{TestResponse, bare_database, new_key, wait_until};
use crate::support::instance::{ANSWER_WITHIN, free_port};

/// The fixture as `idempay fixture` serves it, on a fresh database and a free loopback port.
struct Fixture {
    base: String,
    client: reqwest::Client,
    db: PgPool,
}

impl Fixture {
    async fn spawn() -> Self {
        Self::spawn_with(Policy {
            key_ttl: Duration::from_secs(24 * 60 * 60),
            lease: Duration::from_secs(30),
            recovery_window: Duration::from_secs(12 * 60 * 60),
        })
        .await
    }

    async fn spawn_with(policy: Policy) -> Self {
        let url = bare_database().await;
        let pool = idempay::db::pool(&url).expect("pool");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("address"));
        let router = idempay::dev::fixture::router(pool, policy);
        tokio::spawn(async move { axum::serve(listener, router).await });
        Self {
            base,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            db: PgPool::connect(&url).await.expect("assertion pool"),
        }
    }

    /// A POST of `body` as `content_type`, with `key` as the `Idempotency-Key` when there is one.
    async fn post(
        &self,
        path: &str,
        key: Option<&str>,
        content_type: &str,
        body: &[u8],
    ) -> TestResponse {
        let mut request = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body.to_vec());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        read(request.send().await.expect("the fixture answers")).await
    }

    async fn echo(&self, key: &str, body: &str) -> TestResponse {
        self.post("/echo", Some(key), "text/plain", body.as_bytes())
            .await
    }

    /// How many times the fixture's handlers ran, read with `key` on the GET (ignored).
    async fn count_with(&self, key: Option<&str>) -> u64 {
        let mut request = self.client.get(format!("{}/counter", self.base));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = read(request.send().await.expect("the fixture answers")).await;
        assert_eq!(response.status, 200);
        assert!(!response.replayed());
        response.json()["count"].as_u64().expect("a count")
    }

    async fn count(&self) -> u64 {
        self.count_with(None).await
    }

    async fn keys(&self, status: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM idempotency_keys WHERE status::text = $1 AND scope LIKE 'acct_fixture:%'",
        )
        .bind(status)
        .fetch_one(&self.db)
        .await
        .expect("count keys")
    }
}

async fn read(response: reqwest::Response) -> TestResponse {
    TestResponse {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body: response.bytes().await.expect("a body").to_vec(),
    }
}

#[api_test]
async fn a_fresh_key_executes_the_handler_exactly_once() {
    // draft §2.6: "First time request … the resource server MUST process the request normally".
    let fixture = Fixture::spawn().await;

    let first = fixture.echo(&new_key(), "hello").await;

    assert_eq!(first.status, 201);
    assert_eq!(first.body, b"hello");
    assert_eq!(first.header("content-type"), Some("text/plain"));
    assert!(!first.replayed());
    assert_eq!(fixture.count().await, 1);
}

#[api_test]
async fn a_retry_with_the_same_key_replays_the_first_response_byte_for_byte() {
    // draft §2.6: a duplicate request "SHOULD" get the result of the first, which "was already
    // processed"; the response keeps its own media type, whatever it is.
    let fixture = Fixture::spawn().await;
    let key = new_key();
    let body: Vec<u8> = (0..=255).collect();

    let first = fixture
        .post("/echo", Some(&key), "application/x-any; v=1", &body)
        .await;
    let retry = fixture
        .post("/echo", Some(&key), "application/x-any; v=1", &body)
        .await;

    assert_eq!(first.status, 201);
    assert_eq!(retry.status, first.status);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.body, body);
    assert_eq!(retry.header("content-type"), Some("application/x-any; v=1"));
    assert!(retry.replayed());
    assert_eq!(fixture.count().await, 1);
}

#[api_test]
async fn the_same_key_with_another_payload_is_422_and_leaves_the_first_result_intact() {
    // draft §2.7: "If there is an attempt to reuse an idempotency key with a different request
    // payload, the resource server MUST reply with a HTTP 4xx status code", 422 in its example;
    // the key's record stays, so the corrected retry is still answered with the first result.
    let fixture = Fixture::spawn().await;
    let key = new_key();
    let first = fixture.echo(&key, "payload-a").await;

    let changed = fixture.echo(&key, "payload-b").await;
    changed.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(fixture.count().await, 1);

    let corrected = fixture.echo(&key, "payload-a").await;
    assert_eq!(corrected.status, 201);
    assert_eq!(corrected.body, first.body);
    assert!(corrected.replayed());
    assert_eq!(fixture.count().await, 1);
}

#[api_test]
async fn a_duplicate_sent_while_the_first_is_in_flight_is_409() {
    // draft §2.7: "If the request is retried, while the original request is still being
    // processed, the resource server MUST reply with an HTTP 409 status code".
    let fixture = Fixture::spawn().await;
    let key = new_key();
    let first = {
        let (client, base, key) = (fixture.client.clone(), fixture.base.clone(), key.clone());
        tokio::spawn(async move {
            let request = client
                .post(format!("{base}/slow?ms=3000"))
                .header("idempotency-key", key)
                .header("content-type", "text/plain")
                .body("slow");
            read(request.send().await.expect("the fixture answers")).await
        })
    };
    wait_until("the first request holds its key", || async {
        fixture.keys("in_progress").await == 1
    })
    .await;

    let duplicate = fixture
        .post("/slow?ms=3000", Some(&key), "text/plain", b"slow")
        .await;

    duplicate.assert_problem(409, "idempotency-key-in-use");
    assert!(duplicate.header("retry-after").is_some());
    let first = first.await.expect("the first request");
    assert_eq!(first.status, 200);
    assert_eq!(first.body, b"slept:3000");
    assert_eq!(fixture.count().await, 1);
}

#[api_test]
async fn a_request_without_a_key_is_400_problem_json_and_runs_nothing() {
    // draft §2.7: "If the Idempotency-Key request header is missing for a documented idempotent
    // operation requiring this header, the resource server MUST reply with an HTTP 400 status
    // code", in a problem document.
    let fixture = Fixture::spawn().await;

    let missing = fixture.post("/echo", None, "text/plain", b"no key").await;

    missing.assert_problem(400, "invalid-idempotency-key");
    assert_eq!(fixture.count().await, 0);
    assert_eq!(
        fixture.keys("in_progress").await + fixture.keys("completed").await,
        0
    );
}

#[api_test]
async fn a_key_sent_as_a_quoted_sf_string_is_the_same_key_as_the_bare_one() {
    // draft §2.1: the header is an Item Structured Header whose value "MUST be a String": the
    // quoted form `"k"` is the key `k`.
    let fixture = Fixture::spawn().await;
    let key = new_key();

    let quoted = fixture.echo(&format!("\"{key}\""), "quoted").await;
    let quoted_again = fixture.echo(&format!("\"{key}\""), "quoted").await;
    let bare = fixture.echo(&key, "quoted").await;

    assert_eq!(quoted.status, 201);
    assert!(quoted_again.replayed());
    assert!(bare.replayed());
    assert_eq!(bare.body, quoted.body);
    assert_eq!(fixture.count().await, 1);
}

#[api_test]
async fn a_key_on_a_get_is_ignored() {
    // draft §1: the header makes "non-idempotent HTTP methods such as POST or PATCH"
    // fault-tolerant; a GET is idempotent already, and each one runs.
    let fixture = Fixture::spawn().await;
    let key = new_key();

    assert_eq!(fixture.count_with(Some(&key)).await, 0);
    fixture.echo(&new_key(), "x").await;

    assert_eq!(
        fixture.count_with(Some(&key)).await,
        1,
        "not a replay of the first GET"
    );
    assert_eq!(fixture.keys("completed").await, 1, "only the POST's key");
}

#[api_test]
async fn two_keys_execute_the_same_request_twice() {
    // draft §2.2: a key identifies one request; "a new idempotency key" is a new one, even with
    // the same payload.
    let fixture = Fixture::spawn().await;

    let first = fixture.echo(&new_key(), "same").await;
    let second = fixture.echo(&new_key(), "same").await;

    assert_eq!((first.status, second.status), (201, 201));
    assert!(!first.replayed() && !second.replayed());
    assert_eq!(fixture.count().await, 2);
}

#[api_test]
async fn an_expired_key_executes_again() {
    // draft §2.3: the resource "MAY enforce time based idempotency keys expiry policy"; once
    // a key expired, a request with it is a new one.
    let fixture = Fixture::spawn_with(Policy {
        key_ttl: Duration::from_secs(1),
        lease: Duration::from_secs(30),
        recovery_window: Duration::from_secs(12 * 60 * 60),
    })
    .await;
    let key = new_key();
    fixture.echo(&key, "again").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let again = fixture.echo(&key, "again").await;

    assert_eq!(again.status, 201);
    assert!(!again.replayed());
    assert_eq!(fixture.count().await, 2);
}

#[api_test]
async fn a_5xx_from_the_handler_is_passed_through_stored_nowhere_and_the_retry_runs_again() {
    // draft §2.7 leaves failures of the resource open; as Stripe does, a 5xx is a fault, not a
    // result: the key is released and the retry executes. A 4xx is a result, replayed.
    let fixture = Fixture::spawn().await;
    let key = new_key();

    let failed = fixture
        .post("/status/503", Some(&key), "text/plain", b"")
        .await;
    let retried = fixture
        .post("/status/503", Some(&key), "text/plain", b"")
        .await;

    for answer in [&failed, &retried] {
        assert_eq!(answer.status, 503);
        assert_eq!(answer.body, b"status:503");
        assert!(!answer.replayed());
    }
    assert_eq!(fixture.count().await, 2);
    assert_eq!(
        fixture.keys("in_progress").await + fixture.keys("completed").await,
        0
    );

    let key = new_key();
    let refused = fixture
        .post("/status/404", Some(&key), "text/plain", b"")
        .await;
    let replayed = fixture
        .post("/status/404", Some(&key), "text/plain", b"")
        .await;
    assert_eq!((refused.status, replayed.status), (404, 404));
    assert_eq!(replayed.body, b"status:404");
    assert!(replayed.replayed());
    assert_eq!(fixture.count().await, 3);
}

#[api_test]
async fn a_json_body_keeps_its_canonical_fingerprint_and_other_bytes_their_media_type() {
    // draft §2.4: the fingerprint is the resource's choice; JSON is compared as a document (key
    // order and whitespace do not matter), any other body as its bytes and its Content-Type.
    let fixture = Fixture::spawn().await;
    let key = new_key();
    let first = fixture
        .post(
            "/echo",
            Some(&key),
            "application/json",
            br#"{"a":1,"b":[2]}"#,
        )
        .await;
    let reordered = fixture
        .post(
            "/echo",
            Some(&key),
            "application/json",
            br#"{ "b": [2], "a": 1 }"#,
        )
        .await;
    assert!(reordered.replayed());
    assert_eq!(reordered.body, first.body);

    let key = new_key();
    fixture
        .post("/echo", Some(&key), "text/plain", b"same bytes")
        .await;
    let retyped = fixture
        .post("/echo", Some(&key), "text/csv", b"same bytes")
        .await;
    retyped.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(fixture.count().await, 2);
}

#[api_test]
async fn a_fixture_parameter_out_of_bounds_is_400_problem_json_and_leaves_the_key_free() {
    // draft §2.7 asks for clear errors; a refusal before the handler acted is no result.
    let fixture = Fixture::spawn().await;
    let key = new_key();
    for path in [
        "/slow?ms=60001",
        "/large?bytes=-1",
        "/status/700",
        "/status/101",
    ] {
        let refused = fixture.post(path, Some(&key), "text/plain", b"").await;
        refused.assert_problem(400, "invalid-request");
    }
    assert_eq!(fixture.count().await, 0);
    assert_eq!(
        fixture.keys("in_progress").await + fixture.keys("completed").await,
        0
    );

    let large = fixture
        .post("/large?bytes=100000", Some(&key), "text/plain", b"")
        .await;
    assert_eq!(large.status, 200);
    assert_eq!(large.body, vec![b'x'; 100_000]);
    assert_eq!(
        large.header("content-type"),
        Some("application/octet-stream")
    );
}

#[api_test]
async fn idempay_fixture_serves_the_contract_on_its_listen_address_with_the_key_ttl_it_is_given() {
    // The command a runner is pointed at, as a process of its own, set from its environment.
    let url = bare_database().await;
    let port = free_port();
    let mut process = Command::new(env!("CARGO_BIN_EXE_idempay"))
        .arg("fixture")
        .env("DATABASE_URL", &url)
        .env("IDEMPAY_FIXTURE_LISTEN", format!("127.0.0.1:{port}"))
        .env("IDEMPAY_KEY_TTL", "90s")
        .env("RUST_LOG", "off")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("idempay fixture starts");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .timeout(ANSWER_WITHIN)
        .build()
        .expect("client");
    // Up to 30 s: on a loaded machine a debug build starts slowly.
    for attempt in 0.. {
        if let Ok(Some(status)) = process.try_wait() {
            panic!("idempay fixture exited before it was ready: {status}");
        }
        if client.get(format!("{base}/counter")).send().await.is_ok() {
            break;
        }
        assert!(attempt < 600, "idempay fixture never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let echo = || {
        client
            .post(format!("{base}/echo"))
            .header("idempotency-key", "k-process-1")
            .body("from a process")
    };

    let first = read(echo().send().await.expect("an answer")).await;
    let retry = read(echo().send().await.expect("an answer")).await;
    let reset = client
        .post(format!("{base}/reset"))
        .send()
        .await
        .expect("an answer");
    let counter = read(
        client
            .get(format!("{base}/counter"))
            .send()
            .await
            .expect("an answer"),
    )
    .await;

    assert_eq!(first.status, 201);
    assert_eq!(
        first.header("content-type"),
        Some("application/octet-stream")
    );
    assert!(retry.replayed());
    assert_eq!(reset.status(), 204, "the reset takes no key");
    assert_eq!(counter.json(), serde_json::json!({ "count": 0 }));
    let db = PgPool::connect(&url).await.expect("assertion pool");
    let lives: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM expires_at - completed_at)::float8 FROM idempotency_keys \
         WHERE scope = 'acct_fixture:POST /echo'",
    )
    .fetch_one(&db)
    .await
    .expect("the key's row");
    assert!(
        (lives - 90.0).abs() < 1.0,
        "the key lives IDEMPAY_KEY_TTL: {lives} s"
    );
}
