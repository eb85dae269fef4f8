//! What costs a database round trip, counted on the wire: an `idempay serve` process reaches
//! PostgreSQL through a proxy of the test's own that counts every byte and every statement the
//! instance sends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idempay_test_macros::api_test;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::helpers::{TestApp, new_key, payment};
use crate::support::instance::Instance;

/// A replay of a key this instance saw completed, and the API key that authenticates it, are
/// answered from memory: not a byte goes to the database. The same holds for another payload under
/// that key (422). The first request, which executes, shows that the counting works.
#[api_test]
async fn replays_and_warm_api_keys_are_answered_without_a_database_query() {
    let app = TestApp::spawn().await;
    let proxy = CountingProxy::start(&app.database_url()).await;
    // The expiry job and the webhook delivery loop run once at start, then not again during the
    // test.
    let instance = Instance::start(
        &proxy.url,
        &[
            ("IDEMPAY_EXPIRY_INTERVAL", "1h"),
            ("IDEMPAY_WEBHOOK_POLL_INTERVAL", "1h"),
        ],
    )
    .await;
    // The account cache is off until the instance listens for API key changes.
    instance.listening_for_key_changes().await;
    proxy.wait_until_quiet().await;

    let key = new_key();
    let before = proxy.sent();
    let first = instance
        .post_payment(&app.api_key, &key, &payment(4200))
        .await;
    assert_eq!(first.status, 201);
    // sqlx takes each connection back in a task of its own, after the answer, and pings it then
    // (a Sync message): that belongs to the first request, so it is awaited before counting.
    proxy.wait_until_quiet().await;
    let executed = proxy.sent() - before;
    assert!(
        executed.statements >= 2,
        "the counting works: a new key costs statements, {executed:?}"
    );

    let before = proxy.sent();
    for _ in 0..20 {
        let replay = instance
            .post_payment(&app.api_key, &key, &payment(4200))
            .await;
        assert!(replay.replayed(), "{replay:?}");
        assert_eq!(replay.body, first.body);
    }
    instance
        .post_payment(&app.api_key, &key, &payment(1))
        .await
        .assert_problem(422, "idempotency-key-mismatch");
    let replays = proxy.sent() - before;

    assert_eq!(
        replays,
        Sent::default(),
        "20 replays and a mismatch of a cached key, authenticated by a warm API key, sent this to \
         the database"
    );
}

/// What the instance sent to PostgreSQL: bytes, and the statements among them (simple queries and
/// executions of prepared ones).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sent {
    bytes: u64,
    statements: u64,
}

impl std::ops::Sub for Sent {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            bytes: self.bytes - earlier.bytes,
            statements: self.statements - earlier.statements,
        }
    }
}

#[derive(Default)]
struct Counters {
    bytes: AtomicU64,
    statements: AtomicU64,
}

/// A TCP proxy to the test's PostgreSQL that counts what clients send it.
struct CountingProxy {
    /// The connection string of the test's database, through the proxy, without TLS so that the
    /// messages can be read.
    url: String,
    counters: Arc<Counters>,
}

impl CountingProxy {
    async fn start(database_url: &str) -> Self {
        // postgres://user:password@host:port/database
        let (credentials, rest) = database_url.split_once('@').expect("a URL with a host");
        let (upstream, database) = rest.split_once('/').expect("a URL with a database");
        let upstream: SocketAddr = upstream.parse().expect("host:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!(
            "{credentials}@{}/{database}?sslmode=disable",
            listener.local_addr().expect("address")
        );
        let counters = Arc::new(Counters::default());
        let counting = Arc::clone(&counters);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counters = Arc::clone(&counting);
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, counters).await;
                    }
                });
            }
        });
        Self { url, counters }
    }

    fn sent(&self) -> Sent {
        Sent {
            bytes: self.counters.bytes.load(Ordering::SeqCst),
            statements: self.counters.statements.load(Ordering::SeqCst),
        }
    }

    /// Waits until nothing has been sent for a second: what the instance does as it starts (its
    /// readiness checks, the expiry job's first run) is over.
    async fn wait_until_quiet(&self) {
        let started = Instant::now();
        let mut last = self.sent();
        let mut unchanged_since = Instant::now();
        while unchanged_since.elapsed() < Duration::from_secs(1) {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the instance never stops talking to the database: {last:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.sent();
            if now != last {
                last = now;
                unchanged_since = Instant::now();
            }
        }
    }
}

/// Relays one connection both ways, counting the client's bytes and its statements.
async fn relay(client: TcpStream, server: TcpStream, counters: Arc<Counters>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upstream = async move {
        let mut messages = Messages::default();
        let mut chunk = vec![0; 64 * 1024];
        loop {
            let read = match client_read.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            counters.bytes.fetch_add(read as u64, Ordering::SeqCst);
            let statements = messages.statements_in(&chunk[..read]);
            counters.statements.fetch_add(statements, Ordering::SeqCst);
            if server_write.write_all(&chunk[..read]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Reads the frontend messages of PostgreSQL's protocol off a client's stream: first untyped ones
/// (an `SSLRequest`, the startup message), then a type byte and a length each.
#[derive(Default)]
struct Messages {
    pending: Vec<u8>,
    started: bool,
}

impl Messages {
    /// The statements among the messages `bytes` complete: `Query` (`Q`) and `Execute` (`E`).
    fn statements_in(&mut self, bytes: &[u8]) -> u64 {
        self.pending.extend_from_slice(bytes);
        let mut statements = 0;
        loop {
            let (header, typed) = if self.started { (5, true) } else { (8, false) };
            if self.pending.len() < header {
                break;
            }
            let at = usize::from(typed);
            let length = u32::from_be_bytes(self.pending[at..at + 4].try_into().unwrap()) as usize;
            let whole = at + length;
            if self.pending.len() < whole {
                break;
            }
            if typed {
                statements += u64::from(matches!(self.pending[0], b'Q' | b'E'));
            } else {
                let code = u32::from_be_bytes(self.pending[4..8].try_into().unwrap());
                // SSLRequest and GSSENCRequest come before the startup message.
                self.started = !matches!(code, 80_877_103 | 80_877_104);
            }
            self.pending.drain(..whole);
        }
        statements
    }
}
