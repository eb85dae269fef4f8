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

use crate::support::helpers::{TestApp, new_key, payment, send};
use crate::support::instance::Instance;

/// A replay of a key this instance saw completed, and the API key that authenticates it, are
/// answered from memory: not a byte goes to the database, whether the retry resends the first
/// request's bytes or writes the same payload anew. The same holds for another payload under
/// that key (422). The first request, which executes, shows that the counting works.
#[api_test]
async fn replays_and_warm_api_keys_are_answered_without_a_database_query() {
    let app = TestApp::spawn().await;
    let (proxy, instance) = counted_instance(&app).await;

    let key = new_key();
    let before = proxy.sent();
    let first = instance
        .post_payment(&app.api_key, &key, &payment(4200))
        .await;
    assert_eq!(first.status, 201);
    // Whatever the first request sends after its answer belongs to it: awaited before counting.
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
    // The same payment written anew (another key order, whitespace, `42e2`): not the bytes the
    // cache knows the key by, so its body is made canonical here, and it is the same request.
    let rewritten = send(
        instance
            .payment_request(&app.api_key, &key, &payment(4200))
            .body(r#"{"order":"cmd_9182",  "currency":"eur", "amount":42e2}"#),
    )
    .await;
    assert!(rewritten.replayed(), "{rewritten:?}");
    assert_eq!(rewritten.body, first.body);
    instance
        .post_payment(&app.api_key, &key, &payment(1))
        .await
        .assert_problem(422, "idempotency-key-mismatch");
    let replays = proxy.sent() - before;

    assert_eq!(
        replays,
        Sent::default(),
        "21 replays and a mismatch of a cached key, authenticated by a warm API key, sent this to \
         the database"
    );
}

/// A new key costs the processor two statements, and idempay two on the lot and one look: its
/// reservation, then the one statement that writes the effect and completes the key (the instance
/// embeds the processor, so both services talk to PostgreSQL through the proxy), each taken back
/// without sqlx's release ping (a `Sync` message with no statement before it, which was one round
/// trip more for each statement); and, once the payment committed, the look for the processor's
/// events parked about its charge (`downstream::call::record`: the processor's outbox often
/// delivers them before the recording commits). That look goes through the pool, which asks the
/// connection it takes back whether it is outside a transaction (the release check, one simple
/// query: `db::pool_with`), pings it, and may first prepare the statement on it: one statement and
/// at most two exchanges more than the look's own.
#[api_test]
async fn a_new_key_costs_each_service_two_statements_and_no_ping() {
    let app = TestApp::spawn().await;
    let (proxy, instance) = counted_instance(&app).await;
    // The first keys prepare the statements on the connections they use.
    pay_new_keys(&app, &instance, 2).await;
    proxy.wait_until_quiet().await;

    let before = proxy.sent();
    pay_new_keys(&app, &instance, 5).await;
    // A ping would come after the answer, from a task of its own: wait for it before counting.
    proxy.wait_until_quiet().await;
    let sent = proxy.sent() - before;
    assert_eq!(
        sent.statements,
        5 * 6,
        "five new keys, each two statements, the look for parked events and the pool's release \
         check of its connection at idempay, and two at the processor: {sent:?}"
    );
    assert!(
        sent.exchanges <= sent.statements + 5 * 2,
        "every exchange with PostgreSQL is a statement, but for the pool's ping (and preparation) \
         after each look for parked events: {sent:?}"
    );
}

/// The commits of a new key, and which of them wait for the disk (PostgreSQL's
/// `synchronous_commit`, on as production runs it): idempay's reservation records the recovery
/// point and the downstream key the call sends, so it waits, as does the payment with its
/// completion; the processor's reservation records none and commits without waiting, carried to
/// disk by its charge's commit, which waits. Three waits per payment where the straightforward
/// design (the bench's limit) has four. Counted on the wire: each statement outside a transaction
/// that writes is a commit, and it waits unless it turned `synchronous_commit` off for itself.
#[api_test]
async fn a_new_payment_waits_for_the_disk_three_times_once_at_the_processor() {
    let app = TestApp::spawn().await;
    let (proxy, instance) = counted_instance(&app).await;
    pay_new_keys(&app, &instance, 2).await;
    proxy.wait_until_quiet().await;

    let before = proxy.commits().len();
    pay_new_keys(&app, &instance, 5).await;
    proxy.wait_until_quiet().await;
    let commits = proxy.commits().split_off(before);
    let count = |processor: bool, waits: bool| {
        commits
            .iter()
            .filter(|commit| commit.processor == processor && commit.waits == waits)
            .count()
    };

    assert_eq!(
        (count(false, true), count(false, false)),
        (5 * 2, 0),
        "idempay: each payment's reservation and completion wait for the disk: {commits:?}"
    );
    assert_eq!(
        (count(true, true), count(true, false)),
        (5, 5),
        "the processor: each charge's reservation commits without waiting, its charge waits: \
         {commits:?}"
    );
}

/// Pays `count` payments, each under a new key, one after the other.
async fn pay_new_keys(app: &TestApp, instance: &Instance, count: usize) {
    for _ in 0..count {
        let paid = instance
            .post_payment(&app.api_key, &new_key(), &payment(4200))
            .await;
        assert_eq!(paid.status, 201, "{paid:?}");
    }
}

/// An `idempay serve` process that reaches the test's database through a counting proxy, once it
/// has gone quiet: what it sends from then on is the requests' own.
async fn counted_instance(app: &TestApp) -> (CountingProxy, Instance) {
    let proxy = CountingProxy::start(&app.database_url()).await;
    // The expiry and recovery jobs and the webhook delivery loop run once at start, then not
    // again during the test (the recovery job's default 10 s once added its claim to a slow run's
    // count).
    let instance = Instance::start(
        &proxy.url,
        &[
            ("IDEMPAY_EXPIRY_INTERVAL", "1h"),
            ("IDEMPAY_RECOVERY_INTERVAL", "1h"),
            ("IDEMPAY_WEBHOOK_POLL_INTERVAL", "1h"),
        ],
    )
    .await;
    // The account cache is off until the instance listens for API key changes.
    instance.listening_for_key_changes().await;
    proxy.wait_until_quiet().await;
    (proxy, instance)
}

/// What the instance sent to PostgreSQL: bytes, the statements among them (simple queries and
/// executions of prepared ones), and the exchanges (each `Sync` or simple query asks for an answer:
/// one round trip).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sent {
    bytes: u64,
    statements: u64,
    exchanges: u64,
}

impl std::ops::Sub for Sent {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            bytes: self.bytes - earlier.bytes,
            statements: self.statements - earlier.statements,
            exchanges: self.exchanges - earlier.exchanges,
        }
    }
}

#[derive(Default)]
struct Counters {
    bytes: AtomicU64,
    statements: AtomicU64,
    exchanges: AtomicU64,
    commits: std::sync::Mutex<Vec<Commit>>,
}

/// A commit an instance asked for: of a statement outside a transaction that writes, or a `COMMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Commit {
    /// Whether it is the processor's (its scope, its tables), not idempay's.
    processor: bool,
    /// Whether it waits for its WAL to reach the disk: unless its statement set
    /// `synchronous_commit` to `off` for its own transaction.
    waits: bool,
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

    /// Every commit counted so far, in the order the instance asked for them.
    fn commits(&self) -> Vec<Commit> {
        self.counters.commits.lock().unwrap().clone()
    }

    fn sent(&self) -> Sent {
        Sent {
            bytes: self.counters.bytes.load(Ordering::SeqCst),
            statements: self.counters.statements.load(Ordering::SeqCst),
            exchanges: self.counters.exchanges.load(Ordering::SeqCst),
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
            let (statements, exchanges) = messages.count(&chunk[..read]);
            counters
                .commits
                .lock()
                .unwrap()
                .append(&mut messages.commits);
            counters.statements.fetch_add(statements, Ordering::SeqCst);
            counters.exchanges.fetch_add(exchanges, Ordering::SeqCst);
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
    /// The text of each prepared statement of the connection, by name.
    prepared: std::collections::HashMap<String, String>,
    /// The statement bound last and its parameters (`None` for SQL NULL), for the next `Execute`.
    bound: Option<(String, Vec<Option<Vec<u8>>>)>,
    /// Inside `BEGIN` … `COMMIT`, and whether a statement there was the processor's.
    transaction: Option<bool>,
    /// The commits the messages read so far asked for, not yet taken.
    commits: Vec<Commit>,
}

impl Messages {
    /// The statements among the messages `bytes` complete, `Query` (`Q`) and `Execute` (`E`), and
    /// the exchanges, `Query` and `Sync` (`S`).
    fn count(&mut self, bytes: &[u8]) -> (u64, u64) {
        self.pending.extend_from_slice(bytes);
        let (mut statements, mut exchanges) = (0, 0);
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
                exchanges += u64::from(matches!(self.pending[0], b'Q' | b'S'));
                let body = self.pending[5..whole].to_vec();
                self.read_commits(self.pending[0], &body);
            } else {
                let code = u32::from_be_bytes(self.pending[4..8].try_into().unwrap());
                // SSLRequest and GSSENCRequest come before the startup message.
                self.started = !matches!(code, 80_877_103 | 80_877_104);
            }
            self.pending.drain(..whole);
        }
        (statements, exchanges)
    }
}

impl Messages {
    /// Follows statements to their commits: `Parse` names a statement's text, `Bind` its
    /// parameters, `Execute` runs it; a simple `Query` is `BEGIN`, `COMMIT` or a statement.
    fn read_commits(&mut self, kind: u8, body: &[u8]) {
        let mut reader = Reader(body);
        match kind {
            b'P' => {
                let name = reader.text();
                let text = reader.text();
                self.prepared.insert(name, text);
            }
            b'B' => {
                let _portal = reader.text();
                let text = self
                    .prepared
                    .get(&reader.text())
                    .cloned()
                    .unwrap_or_default();
                let formats = reader.int16();
                for _ in 0..formats {
                    reader.int16();
                }
                let parameters = (0..reader.int16()).map(|_| reader.value()).collect();
                self.bound = Some((text, parameters));
            }
            b'E' => {
                if let Some((text, parameters)) = self.bound.take() {
                    self.executed(&text, &parameters);
                }
            }
            b'Q' => {
                let text = reader.text();
                match text.trim().to_ascii_uppercase().as_str() {
                    "BEGIN" => self.transaction = Some(false),
                    "COMMIT" => {
                        if let Some(processor) = self.transaction.take() {
                            self.commits.push(Commit {
                                processor,
                                waits: true,
                            });
                        }
                    }
                    "ROLLBACK" => self.transaction = None,
                    _ => self.executed(&text, &[]),
                }
            }
            _ => {}
        }
    }

    fn executed(&mut self, text: &str, parameters: &[Option<Vec<u8>>]) {
        let upper = text.to_ascii_uppercase();
        let writes = [
            "INSERT INTO",
            "UPDATE ",
            "DELETE FROM",
            "IDEMPOTENCY_COMPLETE(",
        ]
        .iter()
        .any(|write| upper.contains(write));
        let processor = upper.contains("PROCESSOR_")
            || parameters
                .iter()
                .flatten()
                .any(|value| value.as_slice() == b"processor" || value.starts_with(b"processor:"));
        match &mut self.transaction {
            Some(of_processor) => *of_processor |= processor,
            None if writes => self.commits.push(Commit {
                processor,
                waits: !turns_synchronous_commit_off(text, parameters),
            }),
            None => {}
        }
    }
}

/// Whether the statement sets `synchronous_commit` for its own transaction (`set_config(…, true)`)
/// from a parameter bound to `off`: its commit then does not wait for the disk.
fn turns_synchronous_commit_off(text: &str, parameters: &[Option<Vec<u8>>]) -> bool {
    let Some((_, after)) = text.split_once("set_config('synchronous_commit',") else {
        return false;
    };
    let Some((_, after)) = after.split_once('$') else {
        return false;
    };
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse::<usize>()
        .ok()
        .and_then(|number| parameters.get(number.checked_sub(1)?))
        .is_some_and(|value| value.as_deref() == Some(b"off".as_slice()))
}

/// Reads the fields of one message's body.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    /// A NUL-terminated string.
    fn text(&mut self) -> String {
        let end = self
            .0
            .iter()
            .position(|&byte| byte == 0)
            .unwrap_or(self.0.len());
        let text = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = &self.0[(end + 1).min(self.0.len())..];
        text
    }

    fn int16(&mut self) -> i16 {
        let value = i16::from_be_bytes(self.0[..2].try_into().unwrap());
        self.0 = &self.0[2..];
        value
    }

    /// A parameter: its length (-1 for NULL), then its bytes.
    fn value(&mut self) -> Option<Vec<u8>> {
        let length = i32::from_be_bytes(self.0[..4].try_into().unwrap());
        self.0 = &self.0[4..];
        let length = usize::try_from(length).ok()?;
        let value = self.0[..length].to_vec();
        self.0 = &self.0[length..];
        Some(value)
    }
}
