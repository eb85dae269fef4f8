//! A raw HTTP/1.1 client over TCP, for what no HTTP client would send: hostile bytes, requests sent
//! a byte at a time or stalled halfway, connections left idle. It sends bytes as they are and
//! parses what comes back, whatever it is.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::helpers::TestApp;

/// The address `app` listens on, to connect to it directly.
pub fn socket_address(app: &TestApp) -> SocketAddr {
    app.address
        .trim_start_matches("http://")
        .parse()
        .expect("the app listens on an IP address")
}

/// Opens a connection to `address`.
pub async fn connect(address: SocketAddr) -> TcpStream {
    TcpStream::connect(address)
        .await
        .expect("the server accepts connections")
}

/// An answer as read off the socket.
#[derive(Clone)]
pub struct RawResponse {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// The whole response, for searching it for secrets.
    pub raw: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(header, _)| header.eq_ignore_ascii_case(name))
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    /// The `type` of the problem document this answer must be.
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{self:?}"
        );
        let problem: Value = serde_json::from_slice(&self.body).expect("a JSON problem");
        assert_eq!(problem["status"], self.status, "{problem}");
        problem["type"].as_str().unwrap_or_default().to_owned()
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

/// What became of a request sent with [`exchange`].
#[derive(Debug)]
pub enum Outcome {
    Answered(RawResponse),
    /// Nothing came back within the patience given.
    NoAnswer,
    /// The connection ended, or was reset, before a whole answer came.
    Dropped(String),
    /// What came back is not an HTTP/1.1 response.
    Garbled(String),
}

/// Sends `request` on a connection of its own and reads one answer: until it is whole, or the
/// connection ends, for at most `patience`. `bodiless`: the request is a HEAD, whose answer has
/// no body.
pub async fn exchange(
    address: SocketAddr,
    request: &[u8],
    bodiless: bool,
    patience: Duration,
) -> Outcome {
    let read = async {
        let mut stream = connect(address).await;
        // The server may answer and close before it has read everything (a header block over its
        // limit): what it answered is still read below.
        let _ = stream.write_all(request).await;
        read_while(&mut stream, |received| !complete(received, bodiless)).await
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

/// Sends a whole request at once and reads the answer until the server closes the connection,
/// waiting at most `within`.
pub async fn exchange_until_closed(
    address: SocketAddr,
    request: &[u8],
    within: Duration,
) -> RawResponse {
    let mut stream = connect(address).await;
    // The server may refuse and close before it has read everything: its answer is still read.
    let _ = stream.write_all(request).await;
    parse_or_panic(&read_until_closed(&mut stream, within).await)
}

/// Everything the server sends until it closes the connection (or resets it); panics if it has
/// not within `within`.
pub async fn read_until_closed(reader: &mut (impl AsyncRead + Unpin), within: Duration) -> Vec<u8> {
    tokio::time::timeout(within, read_while(reader, |_| true))
        .await
        .expect("the server closes the connection")
        .0
}

/// Reads while `more` says what has come so far is not enough, and the connection is open;
/// returns what came, and the error that ended the connection, if one did.
async fn read_while(
    reader: &mut (impl AsyncRead + Unpin),
    more: impl Fn(&[u8]) -> bool,
) -> (Vec<u8>, Option<String>) {
    let mut received = Vec::new();
    let mut chunk = vec![0; 16 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return (received, None),
            Ok(n) => {
                received.extend_from_slice(&chunk[..n]);
                if !more(&received) {
                    return (received, None);
                }
            }
            Err(error) => return (received, Some(error.to_string())),
        }
    }
}

/// The response in `received`, which must be one.
pub fn parse_or_panic(received: &[u8]) -> RawResponse {
    parse(received, false).unwrap_or_else(|why| {
        panic!(
            "no HTTP response ({why}): {:?}",
            String::from_utf8_lossy(received)
        )
    })
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

/// The response in `received`: its head, and its body by its Content-Length or its chunks.
pub fn parse(received: &[u8], bodiless: bool) -> Result<RawResponse, String> {
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
