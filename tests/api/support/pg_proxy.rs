//! A TCP proxy between a service and PostgreSQL that holds back the server's answer to one chosen
//! statement until the test lets it through: the window between a client sending `BEGIN` and
//! reading its answer, where a future dropped once left a pooled connection inside a transaction
//! nobody would end (tests/api/resilience/cancellation.rs).
//!
//! It reads only the frames of the frontend's side of the protocol, to find the statement's text
//! in a simple query (`Q`) or a parse message (`P`); every byte goes through unchanged.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy, listening on a port of 127.0.0.1; it stops accepting when dropped.
pub struct PgProxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    accepting: tokio::task::JoinHandle<()>,
}

type Matcher = Box<dyn Fn(&str) -> bool + Send>;

struct Shared {
    /// Which statement's answer is to be held, once; `None` once matched.
    armed: Mutex<Option<Matcher>>,
    /// True from the moment the armed statement is sent until [`PgProxy::release`].
    holding: watch::Sender<bool>,
    /// The statements the held connection sent after the held one, in order (the borrowers that
    /// came after it, and whether they ran inside its transaction).
    held_connection_sent: Mutex<Vec<String>>,
    /// How long every chunk of the server's bytes waits before it goes on, in milliseconds.
    delay_ms: AtomicU64,
    /// What the server said that no healthy run says, by what: counted in its bytes.
    said: Mutex<Said>,
}

/// Counts of what PostgreSQL said to the service through the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Said {
    /// The notice of a `BEGIN` sent on a connection already inside a transaction (25001).
    pub already_in_transaction: u64,
    /// A statement refused because its transaction had failed before (25P02).
    pub in_failed_transaction: u64,
}

const ALREADY: &[u8] = b"there is already a transaction in progress";
const FAILED: &[u8] = b"current transaction is aborted";

impl PgProxy {
    /// A proxy to the server of `database_url` (a `postgres://…@host:port/…` URL).
    pub async fn to(database_url: &str) -> Self {
        let target = host_port(database_url);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let shared = Arc::new(Shared {
            armed: Mutex::new(None),
            holding: watch::channel(false).0,
            held_connection_sent: Mutex::new(Vec::new()),
            delay_ms: AtomicU64::new(0),
            said: Mutex::new(Said::default()),
        });
        let accepting = tokio::spawn({
            let shared = Arc::clone(&shared);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let shared = Arc::clone(&shared);
                    let target = target.clone();
                    tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(&target).await {
                            pipe(client, server, shared).await;
                        }
                    });
                }
            }
        });
        Self {
            address,
            shared,
            accepting,
        }
    }

    /// `database_url` with the proxy in place of the server.
    pub fn url(&self, database_url: &str) -> String {
        database_url.replacen(&host_port(database_url), &self.address.to_string(), 1)
    }

    /// Holds back the answer to the next `BEGIN`, on whichever connection sends it, until
    /// [`Self::release`].
    pub fn hold_answer_to_begin(&self) {
        self.hold_answer_to(|sql: &str| sql.trim().eq_ignore_ascii_case("BEGIN"));
    }

    /// Holds back the answer to the next statement `matches`, on whichever connection sends it
    /// (prepared there now, or run again by name), until [`Self::release`].
    pub fn hold_answer_to(&self, matches: impl Fn(&str) -> bool + Send + 'static) {
        *self.shared.armed.lock().unwrap() = Some(Box::new(matches));
    }

    /// Whether an answer is held right now.
    pub fn is_holding(&self) -> bool {
        *self.shared.holding.borrow()
    }

    /// Lets the held answer, and everything after it, through.
    pub fn release(&self) {
        self.shared.holding.send_replace(false);
    }

    /// Delays every answer of the server by `delay` from now on, as a slow link would.
    pub fn delay_answers(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(millis, Ordering::Release);
    }

    /// What the server said so far that no healthy run says.
    pub fn said(&self) -> Said {
        *self.shared.said.lock().unwrap()
    }

    /// What the held connection sent after the held statement.
    pub fn sent_after_held(&self) -> Vec<String> {
        self.shared.held_connection_sent.lock().unwrap().clone()
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        self.release();
        self.accepting.abort();
    }
}

/// The `host:port` of a `postgres://user:password@host:port/database` URL.
fn host_port(database_url: &str) -> String {
    let after_at = database_url.rsplit_once('@').expect("a URL with a user").1;
    after_at.split('/').next().expect("host:port").to_owned()
}

async fn pipe(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // Whether this connection is the one whose answers are held.
    let held_here = Arc::new(AtomicBool::new(false));
    let upstream = frontend(
        client_read,
        server_write,
        Arc::clone(&shared),
        Arc::clone(&held_here),
    );
    let downstream = backend(server_read, client_write, shared, held_here);
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}

/// The frontend's bytes to the server, frame by frame, arming the hold when the statement comes.
async fn frontend(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    held_here: Arc<AtomicBool>,
) {
    // The startup phase: untyped frames (an SSL or GSS request, then the startup message).
    loop {
        let Some(frame) = read_frame(&mut from, false).await else {
            return;
        };
        let code = u32::from_be_bytes(frame[4..8].try_into().unwrap());
        if to.write_all(&frame).await.is_err() {
            return;
        }
        // 80877103: SSLRequest, 80877104: GSSENCRequest; the server answers 'N' and the startup
        // message follows.
        if code != 80_877_103 && code != 80_877_104 {
            break;
        }
    }
    // The texts of the statements this connection prepared, by name: sqlx prepares a statement
    // once per connection, then sends only a bind naming it, and the hold must know it then too.
    let mut prepared: HashMap<String, String> = HashMap::new();
    while let Some(frame) = read_frame(&mut from, true).await {
        let sent = statement(&frame);
        if let (Some(sql), Some(name)) = (&sent, parsed_name(&frame)) {
            prepared.insert(name, sql.clone());
        }
        if let Some(sql) = &sent {
            if held_here.load(Ordering::Acquire) {
                shared
                    .held_connection_sent
                    .lock()
                    .unwrap()
                    .push(sql.clone());
            }
        }
        let executed =
            sent.or_else(|| bound_name(&frame).and_then(|name| prepared.get(&name).cloned()));
        if let Some(sql) = executed {
            let mut armed = shared.armed.lock().unwrap();
            if armed.as_ref().is_some_and(|matches| matches(&sql)) {
                *armed = None;
                held_here.store(true, Ordering::Release);
                shared.holding.send_replace(true);
            }
        }
        if to.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// The server's bytes to the frontend, waiting while this connection's answers are held.
async fn backend(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: Arc<Shared>,
    held_here: Arc<AtomicBool>,
) {
    let mut holding = shared.holding.subscribe();
    let mut buffer = vec![0; 64 * 1024];
    // The end of the chunk before, so that a sentence split between two reads is found once.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        tail.extend_from_slice(&buffer[..read]);
        {
            let mut said = shared.said.lock().unwrap();
            said.already_in_transaction += occurrences(&tail, ALREADY);
            said.in_failed_transaction += occurrences(&tail, FAILED);
        }
        let keep = ALREADY.len().max(FAILED.len()) - 1;
        tail.drain(..tail.len().saturating_sub(keep));
        let delay = shared.delay_ms.load(Ordering::Acquire);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if held_here.load(Ordering::Acquire) && holding.wait_for(|held| !*held).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

/// How often `needle` occurs in `haystack`.
fn occurrences(haystack: &[u8], needle: &[u8]) -> u64 {
    haystack
        .windows(needle.len())
        .filter(|window| *window == needle)
        .count() as u64
}

/// One frame: a type byte (after the startup phase), a length that counts itself, the body.
async fn read_frame(from: &mut OwnedReadHalf, typed: bool) -> Option<Vec<u8>> {
    let mut frame = vec![0; if typed { 5 } else { 4 }];
    from.read_exact(&mut frame).await.ok()?;
    let length = u32::from_be_bytes(frame[frame.len() - 4..].try_into().unwrap()) as usize;
    let start = frame.len();
    frame.resize(start + length.checked_sub(4)?, 0);
    from.read_exact(&mut frame[start..]).await.ok()?;
    Some(frame)
}

/// The statement text of a simple query (`Q`) or a parse message (`P`, after the statement's name).
fn statement(frame: &[u8]) -> Option<String> {
    let body = &frame[5..];
    let text = match frame[0] {
        b'Q' => body,
        b'P' => &body[body.iter().position(|&byte| byte == 0)? + 1..],
        _ => return None,
    };
    let end = text.iter().position(|&byte| byte == 0)?;
    Some(String::from_utf8_lossy(&text[..end]).into_owned())
}

/// The name a parse message (`P`) gives its statement, when it names one.
fn parsed_name(frame: &[u8]) -> Option<String> {
    if frame[0] != b'P' {
        return None;
    }
    let body = &frame[5..];
    let name = &body[..body.iter().position(|&byte| byte == 0)?];
    (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
}

/// The prepared statement a bind message (`B`: a portal's name, then the statement's) runs, when it
/// names one.
fn bound_name(frame: &[u8]) -> Option<String> {
    if frame[0] != b'B' {
        return None;
    }
    let body = &frame[5..];
    let statement = &body[body.iter().position(|&byte| byte == 0)? + 1..];
    let name = &statement[..statement.iter().position(|&byte| byte == 0)?];
    (!name.is_empty()).then(|| String::from_utf8_lossy(name).into_owned())
}
