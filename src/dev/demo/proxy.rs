//! A lossy proxy on loopback: it forwards each connection's request to the server, then, by
//! chance, throws the server's answer away (the connection drops after the server executed the
//! request) or resets the connection before forwarding anything. It is the network a payment
//! client must survive, made repeatable.
//!
//! It handles one request per connection, as a client with fresh connections sends them, and reads
//! responses by their `Content-Length`, which every answer of the API carries.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How often each fault happens, as probabilities from 0 to 1.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    /// The server answers but the answer never reaches the client.
    pub lost_responses: f64,
    /// The connection is reset before the request reaches the server.
    pub resets: f64,
}

/// What the proxy did, counted.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub forwarded: AtomicU64,
    pub lost_responses: AtomicU64,
    pub resets: AtomicU64,
}

/// A running proxy; dropping it stops accepting connections.
pub struct LossyProxy {
    address: SocketAddr,
    stats: Arc<ProxyStats>,
    stop: CancellationToken,
}

#[derive(Clone, Copy)]
enum Fate {
    Forward,
    LoseResponse,
    Reset,
}

impl LossyProxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr, faults: Faults) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let stats = Arc::new(ProxyStats::default());
        let stop = CancellationToken::new();
        let (accepting, counted) = (stop.clone(), stats.clone());
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    () = accepting.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                let fate = {
                    let mut rng = rand::rng();
                    if rng.random_bool(faults.resets.clamp(0.0, 1.0)) {
                        Fate::Reset
                    } else if rng.random_bool(faults.lost_responses.clamp(0.0, 1.0)) {
                        Fate::LoseResponse
                    } else {
                        Fate::Forward
                    }
                };
                let stats = counted.clone();
                tokio::spawn(async move {
                    if let Err(error) = relay(client, upstream, fate, &stats).await {
                        tracing::debug!(%error, "proxy connection ended early");
                    }
                });
            }
        });
        Ok(Self {
            address,
            stats,
            stop,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    fate: Fate,
    stats: &ProxyStats,
) -> std::io::Result<()> {
    if let Fate::Reset = fate {
        // Take the first bytes of the request, then cut the connection with a reset.
        let mut first = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(1), client.read(&mut first)).await;
        stats.resets.fetch_add(1, Ordering::Relaxed);
        return reset(client);
    }
    let mut server = TcpStream::connect(upstream).await?;
    let (mut from_client, mut to_client) = client.split();
    let (mut from_server, mut to_server) = server.split();
    // The request goes on to the server until the client stops sending (some clients half-close
    // after the request); the exchange ends with the server's complete answer.
    let forward = async {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
        std::future::pending::<()>().await
    };
    let response = tokio::select! {
        () = forward => unreachable!("forwarding never completes on its own"),
        response = read_response(&mut from_server) => response?,
    };
    match fate {
        Fate::LoseResponse => {
            stats.lost_responses.fetch_add(1, Ordering::Relaxed);
            reset(client)
        }
        _ => {
            stats.forwarded.fetch_add(1, Ordering::Relaxed);
            to_client.write_all(&response).await?;
            to_client.shutdown().await
        }
    }
}

/// Closes with a TCP reset rather than an orderly close, as a dropped connection looks.
fn reset(stream: TcpStream) -> std::io::Result<()> {
    socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO))?;
    drop(stream);
    Ok(())
}

/// Reads one HTTP response: its head, then `Content-Length` bytes of body.
async fn read_response(from_server: &mut (impl AsyncReadExt + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut response = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&response, b"\r\n\r\n") {
            let length = content_length(&response[..end]);
            if response.len() >= end + 4 + length {
                response.truncate(end + 4 + length);
                return Ok(response);
            }
        }
        let read = from_server.read(&mut chunk).await?;
        if read == 0 {
            return Ok(response);
        }
        response.extend_from_slice(&chunk[..read]);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

fn content_length(head: &[u8]) -> usize {
    String::from_utf8_lossy(head)
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_content_length_is_read_from_the_head() {
        let head = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\nContent-Length: 42";
        assert_eq!(content_length(head), 42);
        assert_eq!(content_length(b"HTTP/1.1 204 No Content"), 0);
    }

    async fn upstream() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app =
            axum::Router::new().route("/", axum::routing::post(|body: String| async move { body }));
        tokio::spawn(async move { axum::serve(listener, app).await });
        address
    }

    #[tokio::test]
    async fn without_faults_every_answer_comes_through() {
        let proxy = LossyProxy::start(
            upstream().await,
            Faults {
                lost_responses: 0.0,
                resets: 0.0,
            },
        )
        .await
        .unwrap();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        for _ in 0..5 {
            let answer = client
                .post(format!("http://{}/", proxy.address()))
                .body("ping")
                .send()
                .await
                .unwrap();
            assert_eq!(answer.text().await.unwrap(), "ping");
        }
        assert_eq!(proxy.stats().forwarded.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn lost_answers_and_resets_reach_the_client_as_errors() {
        for faults in [
            Faults {
                lost_responses: 1.0,
                resets: 0.0,
            },
            Faults {
                lost_responses: 0.0,
                resets: 1.0,
            },
        ] {
            let proxy = LossyProxy::start(upstream().await, faults).await.unwrap();
            let sent = reqwest::Client::new()
                .post(format!("http://{}/", proxy.address()))
                .body("ping")
                .send()
                .await;
            assert!(sent.is_err(), "{faults:?}");
        }
    }

    #[tokio::test]
    async fn a_response_is_read_to_the_end_of_its_body_and_no_further() {
        let bytes = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello, and more".to_vec();
        let response = read_response(&mut bytes.as_slice()).await.unwrap();
        assert!(response.ends_with(b"\r\n\r\nhello"));
    }
}
