//! Hostile input against the live server, over raw TCP so that bytes no HTTP client would send can
//! be sent: junk, repeated and oversized headers, keys with control characters and invalid UTF-8,
//! bodies that are not UTF-8, nested 10 000 deep, with numbers no integer holds or fields given
//! twice, wrong content types, truncated and chunked bodies, random methods and paths, unsigned and
//! badly signed webhooks.
//!
//! The requests come from a seeded generator, so a failure reproduces: the seed is printed, and
//! `HOSTILE_SEED=<seed>` runs the same requests again (`HOSTILE_DEBUG=1` also prints every request
//! left unanswered). The server must never answer 5xx, every
//! error it produces must be a problem document, and it must still take payments exactly once
//! afterwards.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use idempay::config::Settings;
use idempay::webhooks::WebhookSecret;
use libtest_mimic::Trial;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, TestResponse, new_key, payment};
use crate::invariants::assert_exactly_once;
use crate::trials;

pub fn trials() -> Vec<Trial> {
    trials![hostile;
        a_bounded_storm_of_hostile_requests_gets_no_5xx_and_leaves_payments_exactly_once,
        bodies_with_duplicate_fields_never_make_two_payments_for_one_key,
    ]
}

/// How many hostile requests the storm sends, and how many are in flight at once.
const STORM: usize = 500;
const IN_FLIGHT: usize = 16;
/// How long a request that should be answered may take before it counts as a hang.
const PATIENCE: Duration = Duration::from_secs(5);
/// How long to wait on a request the server may rightly never answer (a body that never comes).
const STALL_PATIENCE: Duration = Duration::from_secs(1);
/// The seed used unless `HOSTILE_SEED` gives another.
const DEFAULT_SEED: u64 = 0x1de3_7a9e;

/// Statuses hyper itself answers, with an empty body, to bytes that are not a valid HTTP request.
const TRANSPORT_STATUSES: [u16; 5] = [400, 413, 414, 431, 505];

fn seed() -> u64 {
    std::env::var("HOSTILE_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

async fn a_bounded_storm_of_hostile_requests_gets_no_5xx_and_leaves_payments_exactly_once() {
    let started = Instant::now();
    let seed = seed();
    eprintln!("hostile: seed {seed} (HOSTILE_SEED={seed} reproduces this run)");
    let secret = WebhookSecret::generate();
    let app = TestApp::spawn_with(Settings {
        slow_charge: Duration::from_millis(50),
        webhook_secret: Some(secret.clone()),
        ..Settings::default()
    })
    .await;
    let (_, other_api_key) = app.create_account("another merchant").await;
    let paid = vec![app.paid(5000).await, app.paid(100).await];
    let target = Target {
        address: address(&app),
        api_key: app.api_key.clone(),
        other_api_key,
        paid,
        keys: (0..12).map(|_| new_key()).collect(),
        secret,
    };

    let mut rng = StdRng::seed_from_u64(seed);
    let requests: Vec<Hostile> = (0..STORM).map(|_| target.hostile(&mut rng)).collect();
    let target = &target;
    let exchanges: Vec<(Hostile, Outcome, Duration)> = futures::stream::iter(requests)
        .map(|request| async move {
            let sent = Instant::now();
            let outcome = exchange(target.address, &request).await;
            (request, outcome, sent.elapsed())
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;

    let mut summary = Summary::default();
    let mut failures = Vec::new();
    for (request, outcome, elapsed) in &exchanges {
        summary.count(request, outcome, *elapsed);
        if std::env::var("HOSTILE_DEBUG").is_ok() && !matches!(outcome, Outcome::Answered(_)) {
            eprintln!("DEBUG {}: {outcome:?}\n  {request}", request.kind);
        }
        if let Err(failure) = judge(request, outcome, &[&target.api_key, &target.other_api_key]) {
            failures.push(format!(
                "{}: {failure}\n  request: {}",
                request.kind, request
            ));
        }
    }
    eprintln!("{summary}");
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {STORM} hostile requests were mishandled:\n{}",
        failures.len(),
        failures
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        summary.statuses.get(&201).is_some_and(|count| *count > 0)
            && summary.statuses.keys().any(|status| *status >= 400),
        "the storm reached both the payments and the refusals: {summary}"
    );

    // The server still takes a payment, replays it and charges it once.
    let key = new_key();
    let created = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(created.status, 201, "after the storm");
    let replay = app.post_payment(&key, &payment(4200)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, created.body);
    assert_exactly_once(&app.db).await;
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the storm is bounded in time: {:?}",
        started.elapsed()
    );
}

/// Bodies that give a field twice, in every spelling, sent with the same keys as valid bodies,
/// many at once: a duplicate is refused before the key is reserved, and a key never names two
/// payments whatever the order of arrival.
async fn bodies_with_duplicate_fields_never_make_two_payments_for_one_key() {
    let seed = seed() ^ 0xd0b1e;
    eprintln!("hostile: duplicate fields, seed {seed}");
    let app =
        TestApp::spawn_with(crate::helpers::with_slow_charge(Duration::from_millis(30))).await;
    let address = address(&app);
    let mut rng = StdRng::seed_from_u64(seed);
    let keys: Vec<String> = (0..16).map(|_| new_key()).collect();
    // Every key gets one amount for its valid bodies, so valid copies are the same request.
    let amounts: HashMap<&String, i64> = keys
        .iter()
        .map(|key| (key, rng.random_range(1..=99_999_999)))
        .collect();
    let mut requests = Vec::new();
    for key in &keys {
        for _ in 0..8 {
            let amount = amounts[key];
            let (body, duplicated) = if rng.random_bool(0.6) {
                (duplicate_fields(&mut rng, amount), true)
            } else {
                (reordered_payment(&mut rng, amount), false)
            };
            let mut request = Hostile::new("duplicate-fields")
                .post("/v1/payments")
                .bearer(&app.api_key)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(body);
            request.key = Some((key.clone(), duplicated));
            requests.push(request);
        }
    }
    let exchanges: Vec<(Hostile, Outcome)> = futures::stream::iter(requests)
        .map(|request| async move {
            let outcome = exchange(address, &request).await;
            (request, outcome)
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;

    let mut created: HashMap<String, Vec<RawResponse>> = HashMap::new();
    for (request, outcome) in &exchanges {
        let Outcome::Answered(response) = outcome else {
            panic!("no answer to {request}: {outcome:?}");
        };
        let (key, duplicated) = request.key.clone().unwrap();
        if duplicated {
            assert_eq!(response.status, 400, "{request}\n{response:?}");
            let problem: Value = serde_json::from_slice(&response.body).unwrap();
            assert_eq!(problem["type"], "/problems/invalid-request", "{request}");
        } else {
            assert!(
                [201, 409].contains(&response.status),
                "{request}\n{response:?}"
            );
            if response.status == 201 {
                created.entry(key).or_default().push(response.clone());
            }
        }
    }
    for (key, answers) in &created {
        assert!(
            answers.iter().all(|answer| answer.body == answers[0].body),
            "{key}: one payment, one answer"
        );
        let executed = answers
            .iter()
            .filter(|answer| answer.header("idempotent-replayed") != Some("true"))
            .count();
        assert_eq!(executed, 1, "{key}: executed once");
    }
    let per_key: Vec<(String, i64)> = sqlx::query_as(
        "SELECT idempotency_key, count(*) FROM payments GROUP BY idempotency_key HAVING count(*) > 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(per_key.is_empty(), "keys with two payments: {per_key:?}");
    let payments = app.payment_count().await;
    assert!(
        payments <= keys.len() as i64,
        "{payments} payments for {} keys",
        keys.len()
    );
    assert_eq!(payments, created.len() as i64);
    // A key whose every body was refused was never reserved: it is still free.
    for key in keys.iter().filter(|key| !created.contains_key(*key)) {
        let fresh = app.post_payment(key, &payment(amounts[key])).await;
        assert_eq!(fresh.status, 201, "{key} was not burned by refused bodies");
        assert!(!fresh.replayed());
    }
    assert_exactly_once(&app.db).await;
}

fn address(app: &TestApp) -> SocketAddr {
    app.address
        .trim_start_matches("http://")
        .parse()
        .expect("the app listens on an IP address")
}

/// What the storm aims at: the server, two accounts' keys, payments to refund, a few keys that
/// several requests share (so replays, mismatches and 409s happen), and the webhook secret.
struct Target {
    address: SocketAddr,
    api_key: String,
    other_api_key: String,
    paid: Vec<String>,
    keys: Vec<String>,
    secret: WebhookSecret,
}

/// One request as bytes, with what may rightly happen to it.
#[derive(Clone, Debug)]
struct Hostile {
    kind: &'static str,
    method: String,
    target: String,
    headers: Vec<(Vec<u8>, Vec<u8>)>,
    body: Option<Vec<u8>>,
    /// Bytes sent as they are, instead of a request assembled from the parts above.
    raw: Option<Vec<u8>>,
    /// Declare this Content-Length instead of the body's length.
    declared_length: Option<usize>,
    /// Send the body with `Transfer-Encoding: chunked`, in pieces of this size.
    chunked: Option<usize>,
    /// The server may never answer (it waits for bytes that never come), or drop the connection
    /// without an answer (the request is over its limits).
    may_go_unanswered: bool,
    /// For the duplicate-fields test: the key, and whether the body gives a field twice.
    key: Option<(String, bool)>,
}

impl Hostile {
    fn new(kind: &'static str) -> Self {
        Self {
            kind,
            method: "GET".to_owned(),
            target: "/".to_owned(),
            headers: Vec::new(),
            body: None,
            raw: None,
            declared_length: None,
            chunked: None,
            may_go_unanswered: false,
            key: None,
        }
    }

    fn request(mut self, method: &str, target: &str) -> Self {
        method.clone_into(&mut self.method);
        target.clone_into(&mut self.target);
        self
    }

    fn post(self, target: &str) -> Self {
        self.request("POST", target)
    }

    fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.as_ref().to_vec(), value.as_ref().to_vec()));
        self
    }

    fn bearer(self, api_key: &str) -> Self {
        self.header("authorization", format!("Bearer {api_key}"))
    }

    fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    fn json(self, body: impl Into<Vec<u8>>) -> Self {
        self.header("content-type", "application/json").body(body)
    }

    /// A HEAD request: its answer has a head and no body.
    fn is_head(&self) -> bool {
        self.raw.is_none() && self.method == "HEAD"
    }

    fn unanswerable(mut self) -> Self {
        self.may_go_unanswered = true;
        self
    }

    /// The bytes on the wire.
    fn bytes(&self) -> Vec<u8> {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        out.extend_from_slice(b"host: 127.0.0.1\r\nconnection: close\r\n");
        for (name, value) in &self.headers {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        let body = self.body.clone().unwrap_or_default();
        match self.chunked {
            Some(size) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                for piece in body.chunks(size.max(1)) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
            None => {
                if self.body.is_some() || self.declared_length.is_some() {
                    let length = self.declared_length.unwrap_or(body.len());
                    out.extend_from_slice(format!("content-length: {length}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&body);
            }
        }
        out
    }
}

impl std::fmt::Display for Hostile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.bytes();
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            .escape_debug()
            .to_string();
        write!(f, "{} bytes: {shown}", bytes.len())?;
        if bytes.len() > 300 {
            f.write_str("…")?;
        }
        Ok(())
    }
}

/// An answer as read off the socket.
#[derive(Clone)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// The whole response, for searching it for secrets.
    raw: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }
}

impl std::fmt::Debug for RawResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}",
            self.status,
            String::from_utf8_lossy(&self.body[..self.body.len().min(400)])
        )
    }
}

#[derive(Debug)]
enum Outcome {
    Answered(RawResponse),
    /// Nothing came back within the patience given.
    NoAnswer,
    /// The connection ended, or was reset, before a whole answer came.
    Dropped(String),
    /// What came back is not an HTTP/1.1 response.
    Garbled(String),
}

/// Sends one request on its own connection and reads its answer.
async fn exchange(address: SocketAddr, request: &Hostile) -> Outcome {
    let patience = if request.may_go_unanswered {
        STALL_PATIENCE
    } else {
        PATIENCE
    };
    let bytes = request.bytes();
    let bodiless = request.is_head();
    let read = async {
        let mut stream = TcpStream::connect(address)
            .await
            .expect("the server accepts connections");
        // The server may answer and close before it has read everything (a header block over its
        // limit): what it answered is still read below.
        let _ = stream.write_all(&bytes).await;
        let mut received = Vec::new();
        let mut chunk = vec![0; 16 * 1024];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) => return (received, None),
                Ok(n) => {
                    received.extend_from_slice(&chunk[..n]);
                    if complete(&received, bodiless) {
                        return (received, None);
                    }
                }
                Err(error) => return (received, Some(error.to_string())),
            }
        }
    };
    match tokio::time::timeout(patience, read).await {
        Err(_) => Outcome::NoAnswer,
        Ok((received, error)) => match parse(&received, bodiless) {
            Ok(response) => Outcome::Answered(response),
            Err(_) if received.is_empty() => {
                Outcome::Dropped(error.unwrap_or_else(|| "closed".to_owned()))
            }
            Err(why) => Outcome::Garbled(format!(
                "{why}: {}",
                String::from_utf8_lossy(&received[..received.len().min(200)])
            )),
        },
    }
}

fn head_end(received: &[u8]) -> Option<usize> {
    received
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .map(|at| at + 4)
}

/// Whether `received` holds a whole response (by its Content-Length or its last chunk).
fn complete(received: &[u8], bodiless: bool) -> bool {
    let Some(end) = head_end(received) else {
        return false;
    };
    if bodiless {
        return true;
    }
    let Ok(response) = parse_head(&received[..end]) else {
        return false;
    };
    if let Some(length) = response
        .header("content-length")
        .and_then(|length| length.parse::<usize>().ok())
    {
        return received.len() >= end + length;
    }
    if response
        .header("transfer-encoding")
        .is_some_and(|encoding| encoding.contains("chunked"))
    {
        return received.ends_with(b"0\r\n\r\n");
    }
    false
}

fn parse_head(head: &[u8]) -> Result<RawResponse, String> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    if !matches!(parts.next(), Some("HTTP/1.1" | "HTTP/1.0")) {
        return Err(format!("no HTTP/1 status line: {status_line:?}"));
    }
    let status = parts
        .next()
        .and_then(|status| status.parse().ok())
        .ok_or_else(|| format!("no status in {status_line:?}"))?;
    let headers = lines
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            (name.to_owned(), value.trim().as_bytes().to_vec())
        })
        .collect();
    Ok(RawResponse {
        status,
        headers,
        body: Vec::new(),
        raw: Vec::new(),
    })
}

fn parse(received: &[u8], bodiless: bool) -> Result<RawResponse, String> {
    let end = head_end(received).ok_or("no end of the header block")?;
    let mut response = parse_head(&received[..end])?;
    let rest = &received[end..];
    response.body = if bodiless {
        Vec::new()
    } else if response
        .header("transfer-encoding")
        .is_some_and(|encoding| encoding.contains("chunked"))
    {
        dechunk(rest)?
    } else {
        match response
            .header("content-length")
            .and_then(|length| length.parse::<usize>().ok())
        {
            Some(length) if rest.len() >= length => rest[..length].to_vec(),
            Some(length) => return Err(format!("{} of {length} body bytes", rest.len())),
            None => rest.to_vec(),
        }
    };
    response.raw = received.to_vec();
    Ok(response)
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|window| window == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| format!("a bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        if rest.len() < size + 2 {
            return Err("a truncated chunk".to_owned());
        }
        body.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// What an answer to `request` must be: never 5xx; an error with a body is a problem document of
/// its own status; an error without one comes from hyper refusing malformed HTTP; no answer only
/// when none can be owed; no secret echoed.
fn judge(request: &Hostile, outcome: &Outcome, secrets: &[&str]) -> Result<(), String> {
    let response = match outcome {
        Outcome::Answered(response) => response,
        Outcome::NoAnswer | Outcome::Dropped(_) if request.may_go_unanswered => return Ok(()),
        Outcome::NoAnswer => return Err("no answer: the server hangs".to_owned()),
        Outcome::Dropped(why) => return Err(format!("dropped without an answer: {why}")),
        Outcome::Garbled(what) => return Err(format!("garbled answer: {what}")),
    };
    if response.status >= 500 {
        return Err(format!("a 5xx answer: {response:?}"));
    }
    for secret in secrets {
        if contains(&response.raw, secret.as_bytes()) {
            return Err(format!("the answer contains an API key: {response:?}"));
        }
    }
    let is_head = request.is_head();
    if response.status >= 400 && !is_head {
        if response.body.is_empty() {
            if !TRANSPORT_STATUSES.contains(&response.status) {
                return Err(format!(
                    "an empty {} that hyper does not send",
                    response.status
                ));
            }
        } else {
            if response.header("content-type") != Some("application/problem+json") {
                return Err(format!(
                    "an error that is no problem document ({:?}): {response:?}",
                    response.header("content-type")
                ));
            }
            let problem: Value = serde_json::from_slice(&response.body)
                .map_err(|error| format!("a problem document that is no JSON: {error}"))?;
            if problem["status"] != response.status
                || !problem["type"]
                    .as_str()
                    .is_some_and(|kind| kind.starts_with("/problems/"))
            {
                return Err(format!("a malformed problem document: {problem}"));
            }
        }
    }
    if (200..300).contains(&response.status)
        && request.target.starts_with("/v1/")
        && !is_head
        && response.header("content-type") != Some("application/json")
    {
        return Err(format!(
            "a success that is not JSON ({:?})",
            response.header("content-type")
        ));
    }
    contract(request, response)
}

/// Checks an answer the server produced (it has a content type) against the API description.
fn contract(request: &Hostile, response: &RawResponse) -> Result<(), String> {
    // Methods are case-sensitive; the description's lookup is not.
    if request.raw.is_some()
        || request.method == "HEAD"
        || !request.method.bytes().all(|b| b.is_ascii_uppercase())
        || !request.target.starts_with('/')
        || response.header("content-type").is_none()
    {
        return Ok(());
    }
    let Ok(method) = reqwest::Method::from_bytes(request.method.as_bytes()) else {
        return Ok(());
    };
    let path = request.target.split(['?', '#']).next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    let checked = TestResponse {
        status: response.status,
        headers,
        body: response.body.clone(),
    };
    let check = std::panic::AssertUnwindSafe(|| crate::contract::check(&method, path, &checked));
    std::panic::catch_unwind(check).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!("against the API description: {message}")
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Counts per status, per kind of request, and of requests left unanswered.
#[derive(Default)]
struct Summary {
    statuses: BTreeMap<u16, usize>,
    kinds: BTreeMap<&'static str, BTreeMap<String, usize>>,
    /// The longest wait for an answer, per kind of request.
    slowest: BTreeMap<&'static str, Duration>,
    unanswered: usize,
    dropped: usize,
    total: usize,
}

impl Summary {
    fn count(&mut self, request: &Hostile, outcome: &Outcome, elapsed: Duration) {
        self.total += 1;
        if matches!(outcome, Outcome::Answered(_)) {
            let slowest = self.slowest.entry(request.kind).or_default();
            *slowest = elapsed.max(*slowest);
        }
        let label = match outcome {
            Outcome::Answered(response) => {
                *self.statuses.entry(response.status).or_default() += 1;
                response.status.to_string()
            }
            Outcome::NoAnswer => {
                self.unanswered += 1;
                "no answer".to_owned()
            }
            Outcome::Dropped(_) => {
                self.dropped += 1;
                "dropped".to_owned()
            }
            Outcome::Garbled(_) => "garbled".to_owned(),
        };
        *self
            .kinds
            .entry(request.kind)
            .or_default()
            .entry(label)
            .or_default() += 1;
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(status, count)| format!("{status}×{count}"))
            .collect();
        writeln!(
            f,
            "hostile: {} requests; statuses {}; {} unanswered (a body that never came), {} dropped",
            self.total,
            statuses.join(" "),
            self.unanswered,
            self.dropped,
        )?;
        for (kind, outcomes) in &self.kinds {
            let outcomes: Vec<String> = outcomes
                .iter()
                .map(|(outcome, count)| format!("{outcome}×{count}"))
                .collect();
            let slowest = self.slowest.get(kind).copied().unwrap_or_default();
            writeln!(
                f,
                "  {kind:<20} {} (slowest answer {} ms)",
                outcomes.join(" "),
                slowest.as_millis()
            )?;
        }
        Ok(())
    }
}

// The generator.

const METHODS: [&str; 12] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "post", "FOO", "GET\t",
    "BREW",
];

impl Target {
    fn hostile(&self, rng: &mut StdRng) -> Hostile {
        match rng.random_range(0..19) {
            0 | 1 => self.valid_payment(rng),
            2 => self.junk_headers(rng),
            3 => self.oversized_headers(rng),
            4 => self.giant_key(rng),
            5 => self.control_key(rng),
            6 => self.invalid_utf8_body(rng),
            7 => self.deep_nesting(rng),
            8 => self.huge_numbers(rng),
            9 => {
                let amount = rng.random_range(1..=99_999_999);
                let body = duplicate_fields(rng, amount);
                self.payment_with(rng, "duplicate-fields", body)
            }
            10 => self.wrong_content_type(rng),
            11 => self.truncated_body(rng),
            12 => self.chunked_body(rng),
            13 => self.random_route(rng),
            14 => self.refund(rng),
            15 => self.webhook(rng),
            16 => self.auth(rng),
            17 => self.broken_http(rng),
            _ => self.list_query(rng),
        }
    }

    fn key(&self, rng: &mut StdRng) -> String {
        if rng.random_bool(0.5) {
            self.keys.choose(rng).unwrap().clone()
        } else {
            new_key()
        }
    }

    fn api_key(&self, rng: &mut StdRng) -> &str {
        if rng.random_bool(0.8) {
            &self.api_key
        } else {
            &self.other_api_key
        }
    }

    /// A payment with a valid key and `body`, from one of the two accounts.
    fn payment_with(
        &self,
        rng: &mut StdRng,
        kind: &'static str,
        body: impl Into<Vec<u8>>,
    ) -> Hostile {
        Hostile::new(kind)
            .post("/v1/payments")
            .bearer(self.api_key(rng))
            .header("idempotency-key", self.key(rng))
            .json(body)
    }

    fn valid_payment(&self, rng: &mut StdRng) -> Hostile {
        let method = ["pm_card_visa", "pm_card_chargeDeclined", "pm_card_slow"]
            .choose(rng)
            .unwrap();
        let amount = [1, 4200, 99_999_999].choose(rng).unwrap();
        let body = format!(r#"{{"amount":{amount},"currency":"eur","payment_method":"{method}"}}"#);
        self.payment_with(rng, "valid-payment", body)
    }

    fn junk_headers(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "junk-headers";
        for _ in 0..rng.random_range(1..30) {
            let name: String = (0..rng.random_range(1..20))
                .map(|_| {
                    *b"abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~"
                        .choose(rng)
                        .unwrap() as char
                })
                .collect();
            let value: Vec<u8> = (0..rng.random_range(0..200))
                .map(|_| rng.random_range(0x20..0x7f))
                .collect();
            request = request.header(name, value);
        }
        match rng.random_range(0..6) {
            0 => request.header("content-type", "text/plain"),
            1 => request.header("authorization", "Bearer sk_nope"),
            2 => request.header("idempotency-key", new_key()),
            3 => request.header("content-length", "3"),
            4 => request.header("host", "evil.example"),
            _ => request.header("idempotency-key", ""),
        }
    }

    fn oversized_headers(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "oversized-headers";
        match rng.random_range(0..4) {
            0 => {
                for i in 0..rng.random_range(90..400) {
                    request = request.header(format!("x-junk-{i}"), "1");
                }
            }
            1 => request = request.header("x-junk", "j".repeat(8 * 1024)),
            2 => {
                let size = *[100 * 1024, 600 * 1024].choose(rng).unwrap();
                request = request.header("x-junk", "j".repeat(size));
            }
            _ => {
                for _ in 0..rng.random_range(2..20) {
                    request = request.header("authorization", format!("Bearer {}", self.api_key));
                }
                return request;
            }
        }
        // Over its limits hyper may close before reading everything, and the reset can swallow
        // its answer.
        request.unanswerable()
    }

    fn giant_key(&self, rng: &mut StdRng) -> Hostile {
        let size = *[256, 1024, 100 * 1024].choose(rng).unwrap();
        let key = "k".repeat(size);
        Hostile::new("giant-key")
            .post("/v1/payments")
            .bearer(&self.api_key)
            .header("idempotency-key", key)
            .json(payment(4200).to_string())
    }

    fn control_key(&self, rng: &mut StdRng) -> Hostile {
        let keys: [&[u8]; 12] = [
            b"key\x01",
            b"\x7fkey",
            b"k\tey",
            b"key\x1b[31m",
            b"cl\xc3\xa9",
            b"\xff\xfe",
            b"\xc3\x28",
            b"\xed\xa0\x80",
            b"key\x00",
            b" padded ",
            b"\"quoted\"",
            b"\"bad\\escape\"",
        ];
        Hostile::new("control-key")
            .post("/v1/payments")
            .bearer(&self.api_key)
            .header("idempotency-key", *keys.choose(rng).unwrap())
            .json(payment(4200).to_string())
    }

    fn invalid_utf8_body(&self, rng: &mut StdRng) -> Hostile {
        let bodies: [&[u8]; 5] = [
            b"{\"amount\":100,\"currency\":\"eur\",\"order\":\"\xff\xfe\"}",
            b"{\"amount\":100,\"currency\":\"e\xc3\x28r\"}",
            b"{\"amount\":100,\"currency\":\"eur\",\"description\":\"\xed\xa0\x80\"}",
            b"\xef\xbb\xbf{\"amount\":100,\"currency\":\"eur\"}",
            b"{\"amount\":100,\"currency\":\"eur\",\"order\":\"\\ud800\"}",
        ];
        let body = *bodies.choose(rng).unwrap();
        self.payment_with(rng, "invalid-utf8-body", body)
    }

    fn deep_nesting(&self, rng: &mut StdRng) -> Hostile {
        let depth = *[200, 10_000, 30_000].choose(rng).unwrap();
        let body = match rng.random_range(0..4) {
            0 => "[".repeat(depth),
            1 => format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
            2 => format!(
                r#"{{"amount":100,"currency":"eur","order":{}1{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            ),
            _ => format!("{}1{}", r#"{"a":"#.repeat(depth / 5), "}".repeat(depth / 5)),
        };
        self.payment_with(rng, "deep-nesting", body)
    }

    fn huge_numbers(&self, rng: &mut StdRng) -> Hostile {
        let amount = *[
            "1e400",
            "-1e400",
            "99999999999999999999999",
            "-99999999999999999999999",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-0",
            "0",
            "1.5",
            "1.0",
            "1e2",
            "0x10",
            "NaN",
            "Infinity",
            "00100",
            "1_000",
            "\"100\"",
            "true",
            "null",
        ]
        .choose(rng)
        .unwrap();
        let body = format!(r#"{{"amount":{amount},"currency":"eur"}}"#);
        self.payment_with(rng, "huge-numbers", body)
    }

    fn wrong_content_type(&self, rng: &mut StdRng) -> Hostile {
        let content_type: &[u8] = [
            b"text/plain".as_slice(),
            b"application/jsonx",
            b"application/json; charset=utf-16",
            b"application/problem+json",
            b"application/vnd.idempay+json",
            b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded",
            b"",
            b"json",
            b"application/json\xff",
            b"APPLICATION/JSON",
            b"application/json, text/plain",
        ]
        .choose(rng)
        .unwrap();
        Hostile::new("wrong-content-type")
            .post("/v1/payments")
            .bearer(&self.api_key)
            .header("idempotency-key", self.key(rng))
            .header("content-type", content_type)
            .body(payment(4200).to_string())
    }

    fn truncated_body(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "truncated-body";
        let sent = request.body.as_ref().map_or(0, Vec::len);
        let declared = sent + rng.random_range(1..10_000);
        request.body = request.body.map(|body| body[..body.len() / 2].to_vec());
        request.declared_length = Some(declared);
        if rng.random_bool(0.2) {
            request.headers.retain(|(name, _)| name != b"authorization");
        }
        request.unanswerable()
    }

    fn chunked_body(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "chunked-body";
        request.chunked = Some(rng.random_range(1..20));
        match rng.random_range(0..5) {
            0 | 1 => request,
            2 => {
                // Both framings: a request-smuggling shape hyper must refuse or resolve.
                request.chunked = None;
                let body = request.body.take().unwrap_or_default();
                let mut raw = Vec::new();
                raw.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                raw.extend_from_slice(&body);
                raw.extend_from_slice(b"\r\n0\r\n\r\n");
                request.header("transfer-encoding", "chunked").body(raw)
            }
            3 => {
                request.chunked = None;
                let sizes = ["zz", "ffffffffffffffffffff", "-1", "5;ext=\"x\"", ""];
                let raw = format!("{}\r\nhello\r\n0\r\n\r\n", sizes.choose(rng).unwrap());
                request.body = None;
                let mut raw_request = request.header("transfer-encoding", "chunked");
                raw_request.raw = Some({
                    let mut bytes = raw_request.bytes();
                    bytes.extend_from_slice(raw.as_bytes());
                    bytes
                });
                raw_request
            }
            _ => {
                // The last chunk never comes.
                request.chunked = None;
                let body = request.body.take().unwrap_or_default();
                let mut raw = request.header("transfer-encoding", "chunked");
                raw.raw = Some({
                    let mut bytes = raw.bytes();
                    bytes.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                    bytes.extend_from_slice(&body);
                    bytes.extend_from_slice(b"\r\n");
                    bytes
                });
                raw.unanswerable()
            }
        }
    }

    fn junk_segment(&self, rng: &mut StdRng) -> String {
        let junk = [
            "x".to_owned(),
            "pay_".to_owned(),
            "pay_000000000000000000000000".to_owned(),
            "pay_%00".to_owned(),
            "%ff%fe".to_owned(),
            "..".to_owned(),
            "%2e%2e%2fetc%2fpasswd".to_owned(),
            "'%3B--".to_owned(),
            "p".repeat(5000),
            "%F0%9F%92%B3".to_owned(),
            self.paid.choose(rng).unwrap().clone(),
            self.paid.choose(rng).unwrap().to_uppercase(),
        ];
        junk.choose(rng).unwrap().clone()
    }

    fn random_route(&self, rng: &mut StdRng) -> Hostile {
        let segment = self.junk_segment(rng);
        let paths = [
            format!("/v1/payments/{segment}"),
            format!("/v1/payments/{segment}/refunds"),
            "/v1/payments/x/refunds".to_owned(),
            format!("/v1/refunds/{segment}"),
            format!("/v1/payments/{segment}/refunds/{segment}"),
            "/v1/payments/".to_owned(),
            "//v1/payments".to_owned(),
            "/v1/payments?".to_owned(),
            "/V1/PAYMENTS".to_owned(),
            "/v1/webhooks/processor".to_owned(),
            "/problems/invalid-request".to_owned(),
            format!("/problems/{segment}"),
            "/openapi.json".to_owned(),
            "/docs/".to_owned(),
            "/healthz".to_owned(),
            "/readyz".to_owned(),
            "*".to_owned(),
            "http://evil.example/v1/payments".to_owned(),
        ];
        let method = METHODS.choose(rng).unwrap();
        let path = paths.choose(rng).unwrap();
        let mut request = Hostile::new("random-route").request(method, path);
        if rng.random_bool(0.7) {
            request = request.bearer(self.api_key(rng));
        }
        if rng.random_bool(0.5) {
            request = request
                .header("idempotency-key", self.key(rng))
                .json(payment(rng.random_range(1..10_000)).to_string());
        }
        request
    }

    fn refund(&self, rng: &mut StdRng) -> Hostile {
        let segment = if rng.random_bool(0.6) {
            self.paid.choose(rng).unwrap().clone()
        } else {
            self.junk_segment(rng)
        };
        let body = *[
            "{}",
            "",
            "null",
            r#"{"amount":1}"#,
            r#"{"amount":1e400}"#,
            r#"{"amount":-1}"#,
            r#"{"amount":9223372036854775807}"#,
            r#"{"amount":1,"amount":2}"#,
            r#"{"reason":"\u0000"}"#,
            r#"{"amount":1,"reason":"requested_by_customer","extra":1}"#,
            "[]",
            "\"\"",
        ]
        .choose(rng)
        .unwrap();
        Hostile::new("refund")
            .post(&format!("/v1/payments/{segment}/refunds"))
            .bearer(self.api_key(rng))
            .header("idempotency-key", self.key(rng))
            .json(body)
    }

    fn webhook(&self, rng: &mut StdRng) -> Hostile {
        let now = chrono::Utc::now().timestamp();
        let paid = self.paid.choose(rng).unwrap();
        let envelope = |kind: &str, data: &str| {
            format!(r#"{{"type":"{kind}","timestamp":"2026-01-01T00:00:00Z","data":{data}}}"#)
        };
        let body: Vec<u8> = match rng.random_range(0..10) {
            0 => envelope(
                "dispute.created",
                &format!(r#"{{"payment":"{paid}","amount":1}}"#),
            ),
            1 => envelope(
                "dispute.created",
                &format!(r#"{{"payment":"{paid}","amount":1e400}}"#),
            ),
            2 => envelope(
                "dispute.created",
                &format!(r#"{{"payment":"{paid}","amount":-5}}"#),
            ),
            3 => envelope("payment.failed", r#"{"payment":"pay_%00"}"#),
            4 => envelope("refund.failed", r#"{"refund":"re_\u0000"}"#),
            5 => envelope("x".repeat(101).as_str(), "{}"),
            6 => "[".repeat(10_000),
            7 => return self.signed_webhook(b"{\"type\":\"\xff\",\"timestamp\":1,\"data\":{}}"),
            8 => envelope(
                "payment.succeeded",
                &format!(r#"{{"payment":"{paid}","payment":"pay_x"}}"#),
            ),
            _ => envelope("unknown.type", "null"),
        }
        .into_bytes();
        let id = format!("evt_{}", rng.random_range(0..1_000_000u32));
        let request = Hostile::new("webhook")
            .post("/v1/webhooks/processor")
            .header("webhook-id", &id)
            .json(body.clone());
        match rng.random_range(0..6) {
            0 => request,
            1 => request
                .header("webhook-timestamp", now.to_string())
                .header("webhook-signature", "v1,AAAA"),
            2 => request
                .header("webhook-timestamp", (now - 3600).to_string())
                .header(
                    "webhook-signature",
                    self.secret.sign(&id, now - 3600, &body),
                ),
            3 => request
                .header("webhook-timestamp", "99999999999999999999")
                .header("webhook-signature", "v1,!!!! v2,x v1,"),
            _ => request
                .header("webhook-timestamp", now.to_string())
                .header("webhook-signature", self.secret.sign(&id, now, &body)),
        }
    }

    /// A webhook correctly signed now.
    fn signed_webhook(&self, body: &[u8]) -> Hostile {
        let now = chrono::Utc::now().timestamp();
        let id = new_key();
        Hostile::new("webhook")
            .post("/v1/webhooks/processor")
            .header("webhook-id", &id)
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", self.secret.sign(&id, now, body))
            .json(body)
    }

    fn auth(&self, rng: &mut StdRng) -> Hostile {
        let random: String = (0..40)
            .map(|_| {
                *b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                    .choose(rng)
                    .unwrap() as char
            })
            .collect();
        let authorizations: Vec<Vec<u8>> = vec![
            format!("Bearer {}", self.api_key).into_bytes(),
            format!("Bearer {}", self.other_api_key).into_bytes(),
            format!("bearer {}", self.api_key).into_bytes(),
            format!("Bearer  {}", self.api_key).into_bytes(),
            format!("Bearer {} ", self.api_key).into_bytes(),
            format!("Bearer {}x", self.api_key).into_bytes(),
            format!("Bearer sk_{random}").into_bytes(),
            format!("Basic {}", self.api_key).into_bytes(),
            self.api_key.clone().into_bytes(),
            b"Bearer".to_vec(),
            b"Bearer sk_\xff\xfe".to_vec(),
            format!("Bearer {}", "s".repeat(10_000)).into_bytes(),
        ];
        let authorization = authorizations.choose(rng).unwrap();
        let request = Hostile::new("auth").header("authorization", authorization);
        if rng.random_bool(0.5) {
            request.request("GET", "/v1/payments")
        } else {
            request
                .post("/v1/payments")
                .header("idempotency-key", new_key())
                .json(payment(100).to_string())
        }
    }

    fn broken_http(&self, rng: &mut StdRng) -> Hostile {
        let mut garbage: Vec<u8> = (0..rng.random_range(1..300))
            .map(|_| rng.random())
            .collect();
        garbage.extend_from_slice(b"\r\n\r\n");
        let raws: Vec<Vec<u8>> = vec![
            garbage,
            b"GET / HTTP/9.9\r\nhost: x\r\n\r\n".to_vec(),
            b"GET /healthz HTTP/1.0\r\n\r\n".to_vec(),
            b"GET /healthz\r\n\r\n".to_vec(),
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            b"GET /v1/payments HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n".to_vec(),
            b"GET /v1/payments HTTP/1.1\r\nhost: x\r\n : empty name\r\n\r\n".to_vec(),
            b"GET /v1/pay ments HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            b"GET /v1/payments HTTP/1.1\nhost: x\n\n".to_vec(),
            b"POST /v1/payments HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n".to_vec(),
            b"POST /v1/payments HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab".to_vec(),
            b"POST /v1/payments HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999999\r\n\r\n".to_vec(),
            b"\r\n\r\n\r\n".to_vec(),
        ];
        let mut request = Hostile::new("broken-http");
        request.raw = Some(raws.choose(rng).unwrap().clone());
        // Malformed HTTP is answered by hyper with 400, or the connection is just closed.
        request.unanswerable()
    }

    fn list_query(&self, rng: &mut StdRng) -> Hostile {
        let queries = [
            "limit=1e400",
            "limit=-1",
            "limit=99999999999999999999",
            "limit=1&limit=2",
            "starting_after=%00",
            "starting_after=%ff",
            "ending_before=pay_000000000000000000000000",
            "starting_after=pay_%27",
            "limit=",
            "=&&=",
            "%%%",
        ];
        let query = queries.choose(rng).unwrap();
        let path = if rng.random_bool(0.5) {
            format!("/v1/payments?{query}")
        } else {
            format!(
                "/v1/payments/{}/refunds?{query}",
                self.paid.choose(rng).unwrap()
            )
        };
        Hostile::new("list-query")
            .request("GET", &path)
            .bearer(self.api_key(rng))
    }
}

/// A payment body of `amount` that gives a field twice, spelled in one of several ways.
fn duplicate_fields(rng: &mut StdRng, amount: i64) -> String {
    let other = amount % 99_999_999 + 1;
    let bodies = [
        format!(r#"{{"amount":{amount},"amount":{other},"currency":"eur"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","amount":{amount}}}"#),
        format!(r#"{{"amount":{amount},"\u0061mount":{other},"currency":"eur"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","currency":"usd"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","curr\u0065ncy":"eur"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","order":"a","order":"b"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","order":null,"order":"b"}}"#),
        format!(
            r#"{{"amount":{amount},"currency":"eur","payment_method":"pm_card_visa","payment_method":"pm_card_slow"}}"#
        ),
        format!(r#"{{ "amount" : {amount} , "amount" : {amount} , "currency" : "eur" }}"#),
    ];
    bodies.choose(rng).unwrap().clone()
}

/// A valid payment body of `amount`, its members in a random order and spacing, sometimes with the
/// slow card: every such body is the same request.
fn reordered_payment(rng: &mut StdRng, amount: i64) -> String {
    let mut members = [
        format!(r#""amount":{amount}"#),
        r#""currency":"eur""#.to_owned(),
        r#""payment_method":"pm_card_slow""#.to_owned(),
    ];
    let swap = rng.random_range(0..3);
    members.swap(0, swap);
    let spacing = [",", " , ", ",\n\t"].choose(rng).unwrap();
    format!("{{{}}}", members.join(spacing))
}
