//! The accept loop: every connection is served by hyper's HTTP/1.1 or HTTP/2 (with prior
//! knowledge) and bounded in time and size, so slow or idle clients cannot hold connections and
//! tasks for ever.
//!
//! - A connection must deliver the headers of its first request within the header read timeout,
//!   or it is closed without an answer; over HTTP/1.1 the same holds for every later request,
//!   including the wait of an idle keep-alive connection. A client that sends its headers one byte
//!   at a time (slowloris), or nothing at all, is cut off.
//! - Headers are limited to [`MAX_HEADER_BYTES`]: larger ones are refused with 431.
//! - Bodies are bounded by each service's router: a size limit ([`MAX_BODY_BYTES`]) and, in
//!   idempay's (`http::router`), a read timeout.
//! - On shutdown the loop stops accepting, idle connections are closed, in-flight requests finish.

use std::future::Future;
use std::io;
use std::time::Duration;

use axum::Router;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// The request line and headers of a request may take at most this many bytes (the HTTP/1.1 read
/// buffer); over HTTP/2, the decoded header list. An honest request here carries an API key, an
/// idempotency key of at most 255 characters and a few standard headers, well under 1 KiB; a
/// browser reading `/docs` adds its cookies. 32 KiB is what nginx accepts by default (4 buffers of
/// 8 KiB), so no client that works behind common proxies sends more. Larger headers are answered
/// 431 and the connection is closed.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Request bodies above this size are refused with 413, by the router of either service.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// HTTP/2 connections are pinged this often when nothing else arrives, so a peer that vanished
/// without closing its connection is noticed.
const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// A ping not acknowledged within this time closes the HTTP/2 connection.
const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests one HTTP/2 connection may have in flight at once; hyper's default, stated here.
const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 200;

/// After an accept error that is not about one connection (EMFILE: out of file descriptors), the
/// loop waits this long before accepting again, so that connections can close meanwhile and the
/// error is not logged in a tight loop. Clients wait in the listen backlog meanwhile.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and waits for
/// the open connections to finish their in-flight requests. Accept errors never end it.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let builder = builder(header_read_timeout);
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) if is_about_one_connection(&error) => {
                    tracing::debug!(%error, "a connection failed before it was accepted");
                    continue;
                }
                Err(error) => {
                    tracing::error!(%error, retry_in = ?ACCEPT_RETRY_DELAY, "cannot accept connections");
                    tokio::select! {
                        biased;
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(ACCEPT_RETRY_DELAY) => continue,
                    }
                }
            },
        };
        serve_connection(
            &builder,
            &graceful,
            stream,
            router.clone(),
            header_read_timeout,
        );
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// HTTP/1.1 and HTTP/2 with the limits above.
fn builder(header_read_timeout: Duration) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_concurrent_streams(HTTP2_MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(HTTP2_KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(HTTP2_KEEP_ALIVE_TIMEOUT);
    builder
}

/// Lets a handler end its connection without answering, as a network that loses an answer does:
/// every request carries one in its extensions. After [`Hangup::now`] the connection is dropped,
/// whatever it was doing, so a handler that hangs up must then never answer (await
/// `std::future::pending()`), or its answer could be written before the drop. The simulated
/// processor uses it to lose answers on purpose (`IDEMPAY_PROCESSOR_LOSE_ANSWERS`).
#[derive(Clone, Debug)]
pub struct Hangup(CancellationToken);

impl Hangup {
    /// Closes the connection with no response on it.
    pub fn now(&self) {
        self.0.cancel();
    }
}

/// Serves one connection in a task of its own.
///
/// hyper's header read timeout starts once the protocol is known, and only for HTTP/1.1; before
/// that, the connection waits for the bytes that tell HTTP/2's preface from an HTTP/1.1 request
/// without any timeout. So the first request must arrive within the header read timeout of the
/// accept, whatever the protocol, or the connection is dropped.
fn serve_connection(
    builder: &Builder<TokioExecutor>,
    graceful: &GracefulShutdown,
    stream: TcpStream,
    router: Router,
    header_read_timeout: Duration,
) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "cannot set TCP_NODELAY");
    }
    let first_request = CancellationToken::new();
    let arrived = first_request.clone();
    let hangup = CancellationToken::new();
    let handle = Hangup(hangup.clone());
    let service = router.map_request(move |mut request: Request<Incoming>| {
        arrived.cancel();
        request.extensions_mut().insert(handle.clone());
        request
    });
    let connection = builder
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
        .into_owned();
    let connection = graceful.watch(connection);
    tokio::spawn(async move {
        let no_request_in_time = async {
            tokio::select! {
                () = first_request.cancelled() => std::future::pending().await,
                () = tokio::time::sleep(header_read_timeout) => {}
            }
        };
        tokio::select! {
            served = connection => {
                if let Err(error) = served {
                    tracing::debug!(%error, "connection ended with an error");
                }
            }
            () = no_request_in_time => {
                tracing::debug!(timeout = ?header_read_timeout, "no request within the header read timeout: connection closed");
            }
            () = hangup.cancelled() => {
                tracing::debug!("a handler hung up: connection closed without an answer");
            }
        }
    });
}

/// Accept errors that concern one connection only (it was reset while queued); any other error,
/// such as running out of file descriptors, concerns the listener.
fn is_about_one_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

/// How a failed request is logged (tower_http's `on_failure`): a 500 is a fault of ours, an ERROR;
/// any other 5xx is an answer the service chose (503 for an outcome not yet known, a processor
/// that refused, an injected fault), a WARN; an error of the transport, an ERROR. Called inside
/// the request's span, so the line carries its id, account and key.
pub fn log_failure(
    class: tower_http::classify::ServerErrorsFailureClass,
    latency: Duration,
    _span: &tracing::Span,
) {
    use tower_http::classify::ServerErrorsFailureClass;
    let latency = format!("{} ms", latency.as_millis());
    match class {
        ServerErrorsFailureClass::StatusCode(status) if status.as_u16() == 500 => {
            tracing::error!(status = status.as_u16(), latency, "request failed");
        }
        ServerErrorsFailureClass::StatusCode(status) => {
            tracing::warn!(
                status = status.as_u16(),
                latency,
                "request answered a server error"
            );
        }
        ServerErrorsFailureClass::Error(error) => {
            tracing::error!(error, latency, "request failed");
        }
    }
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
