//! The database goes away under load: stopped, paused, or too busy to hand out a connection.
//! Requests fail fast with a 503 problem and `Retry-After`, nothing hangs, readiness turns red, the
//! service recovers by itself, and every key sent meanwhile is retried to exactly one payment.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use idempay_test_macros::api_test;
use sqlx::{Connection, PgConnection, PgPool};

use crate::support::helpers::{TestApp, new_key, payment, retry_while_in_flight};
use crate::support::instance::{Instance, free_port};
use crate::support::invariants::assert_exactly_once;
use crate::support::stream::{PaymentStream, Sent};

/// The request timeout of the instances under test: a paused database holds its connections open
/// without a word, and only this bounds how long a client waits.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1500);
/// The latency bucket of the service's histogram every answer must fall into, as the service
/// measures it: the request timeout and the same room as the client's [`SLACK`]. (Half a second
/// of room, with a timeout of 2 s, was as little as 0.3 s more than a loaded run took.)
const SERVER_BOUND: &str = "2.5";
/// What a client may see beyond the request timeout, the README's promise. The service writes its
/// 503 at the timeout; past it, the client waits only for that small answer to be written and read
/// across loopback, and for two processes to be scheduled on two cores the whole suite shares:
/// milliseconds, and under load a few hundred. One second covers that with room, and is less than
/// the request timeout: an answer that waited for anything else (a statement, a lock, a second
/// timeout) is caught.
const SLACK: Duration = Duration::from_secs(1);
/// Clients sending new payments side by side, each at most one request per `PACE`.
const CLIENTS: usize = 4;
const PACE: Duration = Duration::from_millis(40);

const SETTINGS: [(&str, &str); 3] = [
    ("IDEMPAY_REQUEST_TIMEOUT", "1500ms"),
    // Under the request timeout: a request that waits for a connection is answered 503 first.
    ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
    // Keys stranded in progress by the outage are taken over soon after (start-up requires at
    // least three acquire timeouts).
    ("IDEMPAY_LEASE", "3s"),
];

/// What the database suffers.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// SIGINT, PostgreSQL's fast shutdown (as in a restart or a failover): the server closes
    /// every connection and the container exits; then it starts again.
    Stop,
    /// `docker pause`: the server freezes; connections stay open and nothing answers.
    Pause,
}

impl Outage {
    /// The docker command that begins it.
    fn begin(self) -> &'static [&'static str] {
        match self {
            // `docker stop` sends SIGTERM, a smart shutdown, which waits for the pool to
            // disconnect; `docker wait` below waits for the exit.
            Self::Stop => &["kill", "--signal", "SIGINT"],
            Self::Pause => &["pause"],
        }
    }

    /// The docker command that ends it.
    fn end(self) -> &'static [&'static str] {
        match self {
            Self::Stop => &["start"],
            Self::Pause => &["unpause"],
        }
    }
}

#[api_test]
async fn a_stopped_database_is_answered_with_503_and_every_key_is_retried_to_one_payment() {
    survive(Outage::Stop).await;
}

#[api_test]
async fn a_paused_database_is_answered_with_503_and_every_key_is_retried_to_one_payment() {
    survive(Outage::Pause).await;
}

/// Streams new payments at an instance while its database suffers `outage`, then checks how every
/// request was answered and retries every key.
async fn survive(outage: Outage) {
    let postgres = OwnPostgres::start().await;
    let instance = Instance::start(&postgres.url(), &SETTINGS).await;
    let api_key = Instance::create_account(&postgres.url()).await;
    let instance = Arc::new(instance);

    let stream = PaymentStream::start(&instance, &api_key, CLIENTS, PACE);

    tokio::time::sleep(Duration::from_secs(1)).await;
    postgres.docker(outage.begin()).await;
    let outage_began = Instant::now();
    tokio::time::sleep(REQUEST_TIMEOUT + Duration::from_secs(1)).await;
    let ready = instance.get("/readyz").await;
    ready.assert_problem(503, "service-unavailable");
    assert!(ready.header("retry-after").is_some());
    postgres.docker(outage.end()).await;
    let outage_lasted = outage_began.elapsed();

    // The pool reconnects by itself: no restart, no operator.
    let recovery = Instant::now();
    while instance.get("/readyz").await.status != 200 {
        assert!(
            recovery.elapsed() < Duration::from_secs(30),
            "{outage:?}: never ready again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered_after = recovery.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sent = stream.stop().await;

    let created = sent.iter().filter(|s| s.answer.status == 201).count();
    let refused: Vec<&Sent> = sent.iter().filter(|s| s.answer.status != 201).collect();
    let slowest = sent.iter().map(Sent::elapsed).max().unwrap_or_default();
    eprintln!(
        "outage {outage:?}: {} payments sent by {CLIENTS} clients, {created} answered 201, {} \
         answered 503; outage {outage_lasted:.1?}, ready again {recovered_after:.1?} after it \
         ended; slowest answer {slowest:.2?}",
        sent.len(),
        refused.len(),
    );
    assert!(!refused.is_empty(), "{outage:?}: the outage was felt");
    assert!(created > 0, "{outage:?}: payments went through around it");
    assert!(
        slowest < REQUEST_TIMEOUT + SLACK,
        "{outage:?}: nothing hangs, yet one answer took {slowest:?}"
    );
    let (within, all) = answered_within(&instance, SERVER_BOUND).await;
    assert_eq!(
        all,
        sent.len() as f64,
        "{outage:?}: the service's histogram counts every payment sent"
    );
    assert_eq!(
        within, all,
        "{outage:?}: the service answered every payment within {SERVER_BOUND} s"
    );
    // A 503 says the database is away; a charge already sent when it went (the key reserved, the
    // processor's own statements failing) is answered as what it is, an outcome not known yet.
    // Only a request in flight when the outage began or ended can reserve its key and then lose
    // its charge (in between, no key is reserved), and each client has one request in flight at
    // a time: at most two such answers per client.
    let mut unknown = 0;
    for failed in &refused {
        let problem = failed.answer.json();
        if problem["type"] == "/problems/processor-outcome-unknown" {
            failed
                .answer
                .assert_problem(503, "processor-outcome-unknown");
            unknown += 1;
        } else {
            failed.answer.assert_problem(503, "service-unavailable");
        }
        assert!(failed.answer.header("retry-after").is_some());
    }
    eprintln!("outage {outage:?}: {unknown} of the 503s say the charge's outcome is unknown");
    assert!(
        unknown <= 2 * CLIENTS,
        "{outage:?}: {unknown} charges of unknown outcome, more than two for each of {CLIENTS} \
         clients"
    );

    // Every key, retried as its client would, ends with exactly one payment; a key that was
    // answered 201 is replayed with the very answer its client received.
    for s in &sent {
        let body = payment(s.amount);
        let retry = retry_while_in_flight(|| instance.post_payment(&api_key, &s.key, &body)).await;
        assert_eq!(retry.status, 201, "{outage:?}: {}", s.key);
        if s.answer.status == 201 {
            assert!(retry.replayed());
            assert_eq!(retry.body, s.answer.body, "{outage:?}: {}", s.key);
        }
    }
    let db = PgPool::connect(&postgres.url()).await.expect("a pool");
    let payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(
        payments,
        sent.len() as i64,
        "{outage:?}: one payment per key"
    );
    assert_exactly_once(&db).await;
    db.close().await;
}

/// How many payments the service answered within `bound` seconds, and how many it answered, from
/// its own latency histogram at `/metrics`. Both series must be there: a series missing is a
/// failure, not a zero.
async fn answered_within(instance: &Instance, bound: &str) -> (f64, f64) {
    let metrics = instance.metrics().await;
    let series = r#"idempay_http_request_duration_seconds"#;
    let labels = r#"method="POST",route="/v1/payments""#;
    let value = |name: String| {
        metrics
            .value(&name)
            .unwrap_or_else(|| panic!("no series {name} at /metrics:\n{}", metrics.text()))
    };
    (
        value(format!(r#"{series}_bucket{{{labels},le="{bound}"}}"#)),
        value(format!("{series}_count{{{labels}}}")),
    )
}

/// Another session holds the key table locked, as a stuck transaction would: the requests that
/// got the pool's only connections wait on the lock, every other one waits for a connection.
/// All are answered 503 within the request timeout, and each key is then retried to one payment.
#[api_test]
async fn an_exhausted_pool_answers_503_at_once_and_recovers() {
    let app = TestApp::spawn().await;
    let instance = Instance::start(
        &app.database_url(),
        &[
            ("IDEMPAY_DATABASE_MAX_CONNECTIONS", "2"),
            // Still under the request timeout; 500 ms once failed the start-up's own connection
            // on a loaded run (the process exited before it was ready).
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
            ("IDEMPAY_REQUEST_TIMEOUT", "1500ms"),
        ],
    )
    .await;
    let mut blocker = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();

    let keys: Vec<String> = (0..8).map(|_| new_key()).collect();
    let body = payment(4200);
    let started = Instant::now();
    let answers = join_all(
        keys.iter()
            .map(|key| instance.post_payment(&app.api_key, key, &body)),
    )
    .await;
    let took = started.elapsed();
    for answer in &answers {
        answer.assert_problem(503, "service-unavailable");
        assert!(answer.header("retry-after").is_some());
    }
    assert!(took < REQUEST_TIMEOUT + SLACK, "answered within {took:?}");
    eprintln!(
        "pool of 2 behind a locked table: {} requests answered 503 within {took:.2?}",
        answers.len()
    );

    blocker.rollback().await.unwrap();
    for key in &keys {
        let retry = retry_while_in_flight(|| instance.post_payment(&app.api_key, key, &body)).await;
        assert_eq!(retry.status, 201);
    }
    assert_eq!(app.payment_count().await, keys.len() as i64);
    assert_exactly_once(&app.db).await;
}

/// The database ends the sessions a new key's statements run on (the lot's, at idempay and at
/// its embedded processor), as `pg_terminate_backend` does, while several of them are at rest.
/// Each service meets it on one statement, which closes every connection at rest with its own:
/// the first payment after it may be refused with a 503, and every later one is made on fresh
/// connections. (A pool that closes only the connection that failed hands the next dead one to
/// the next request, and so on for each connection it holds, as sqlx's does.) One refusal stays
/// allowed here, unlike after a restart (restart.rs): the server did not restart, so its start
/// time, which retires the connections from before a restart without a round trip, says nothing,
/// and only a ping per statement would tell a session ended alone before its first statement.
#[api_test]
async fn sessions_the_database_ended_are_met_once_and_the_next_payments_go_through() {
    let app = TestApp::spawn().await;
    let instance = Instance::start(&app.database_url(), &[]).await;
    // Payments side by side, so that both services leave several connections at rest.
    let keys: Vec<String> = (0..6).map(|_| new_key()).collect();
    let body = payment(500);
    for answer in join_all(
        keys.iter()
            .map(|key| instance.post_payment(&app.api_key, key, &body)),
    )
    .await
    {
        assert_eq!(answer.status, 201);
    }

    let mut admin = PgConnection::connect(&app.database_url()).await.unwrap();
    let ended: i64 = sqlx::query_scalar(
        "WITH others AS MATERIALIZED (
             SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND application_name = 'idempay (lot)'
         )
         SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM others",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(ended >= 4, "sessions ended: {ended}");

    let mut answers = Vec::new();
    for amount in 600..604 {
        let key = new_key();
        let answer = instance
            .post_payment(&app.api_key, &key, &payment(amount))
            .await;
        answers.push((key, amount, answer));
    }
    let (first, later) = answers.split_first().unwrap();
    if first.2.status != 201 {
        first.2.assert_problem(503, "service-unavailable");
    }
    for (key, _, answer) in later {
        assert_eq!(
            answer.status,
            201,
            "{key} after {ended} sessions ended: {}",
            String::from_utf8_lossy(&answer.body)
        );
    }
    // The refused one, if any, is retried to its payment like any other.
    let (key, amount, _) = first;
    let body = payment(*amount);
    let retry = retry_while_in_flight(|| instance.post_payment(&app.api_key, key, &body)).await;
    assert_eq!(retry.status, 201);
    let counted: i64 = sqlx::query_scalar("SELECT count(*) FROM payments")
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(counted, 10);
    assert_exactly_once(&app.db).await;
}

/// A PostgreSQL container of this test's own, so that stopping or pausing it touches no other
/// test. It shares the host's network and listens on a port of 127.0.0.1 fixed when it starts, as
/// the suite's shared server does: no userland proxy in between, and the same port across a stop
/// and a start.
pub(super) struct OwnPostgres {
    id: String,
    port: u16,
}

impl OwnPostgres {
    /// Starts the container on a port nobody listened on a moment ago. The port is free when it is
    /// chosen, not promised: another test's listener or an outgoing connection may take it before
    /// PostgreSQL binds it, and PostgreSQL then exits ("could not bind"). A container that exited
    /// before accepting a connection is removed and started again on another port.
    pub(super) async fn start() -> Self {
        let image = idempay::dev::postgres::ensure_image()
            .await
            .expect("a PostgreSQL image");
        let mut exits = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let id = docker(&[
                "run",
                "--detach",
                "--label",
                "org.testcontainers.managed-by=testcontainers",
                "--network",
                "host",
                "--env",
                "POSTGRES_PASSWORD=postgres",
                &image,
                "-c",
                "fsync=off",
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("port={port}"),
            ])
            .await;
            let postgres = Self {
                id: id.trim().to_owned(),
                port,
            };
            match postgres.until_connectable().await {
                Ok(()) => return postgres,
                Err(exited) => exits.push(exited),
            }
        }
        panic!("PostgreSQL exited three times before accepting connections:\n{exits:#?}");
    }

    pub(super) fn url(&self) -> String {
        format!(
            "postgres://postgres:postgres@127.0.0.1:{}/postgres",
            self.port
        )
    }

    /// Runs a docker command on this container; after a kill, waits until it has exited, after a
    /// start, until it accepts connections.
    pub(super) async fn docker(&self, command: &[&str]) {
        let args: Vec<&str> = command.iter().copied().chain([self.id.as_str()]).collect();
        if command.first() == Some(&"pause") {
            self.pause(&args).await;
        } else {
            docker(&args).await;
        }
        match command.first() {
            Some(&"kill") => {
                docker(&["wait", &self.id]).await;
            }
            Some(&"start") => self.wait_until_connectable().await,
            _ => {}
        }
    }

    /// `docker pause` asks the kernel's cgroup freezer to stop every process of the container;
    /// on a loaded machine a process busy in the kernel can keep the freezer from settling, and
    /// runc then gives up ("unable to freeze") and leaves the container running. Nothing was
    /// paused, so asking again is safe; the outage begins when a pause succeeds.
    async fn pause(&self, args: &[&str]) {
        for _ in 0..10 {
            let output = tokio::process::Command::new("docker")
                .args(args)
                .output()
                .await
                .expect("docker runs");
            if output.status.success() {
                return;
            }
            eprintln!(
                "docker pause refused, asking again: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        panic!("docker pause failed 10 times");
    }

    /// Waits until the server answers a query; panics after a minute with its log.
    async fn wait_until_connectable(&self) {
        if let Err(exited) = self.until_connectable().await {
            panic!("PostgreSQL exited before accepting connections: {exited}");
        }
    }

    /// Waits until the server answers a query, or its container has exited (its log is the
    /// error); panics with the log after a minute of neither.
    async fn until_connectable(&self) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if let Ok(mut connection) = PgConnection::connect(&self.url()).await {
                if sqlx::query("SELECT 1")
                    .execute(&mut connection)
                    .await
                    .is_ok()
                {
                    return Ok(());
                }
            }
            let running = docker(&["inspect", "--format", "{{.State.Running}}", &self.id]).await;
            if running.trim() == "false" {
                return Err(self.log().await);
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "PostgreSQL never accepted connections on port {}; its log:\n{}",
                self.port,
                self.log().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last lines the container printed (PostgreSQL logs to stderr).
    async fn log(&self) -> String {
        let output = tokio::process::Command::new("docker")
            .args(["logs", "--tail", "20", &self.id])
            .output()
            .await
            .expect("docker runs");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "--force", "--volumes", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs the docker CLI and returns what it printed.
async fn docker(args: &[&str]) -> String {
    let output = tokio::process::Command::new("docker")
        .args(args)
        .output()
        .await
        .expect("docker runs");
    assert!(output.status.success(), "docker {args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8")
}
