//! No way around the address guard through a proxy: `idempay serve` started with every proxy
//! variable pointing at a listener of the test's sends nothing to it. reqwest reads these
//! variables by default, and through a proxy the proxy resolves the endpoint's name, so the
//! public-only resolver is never asked.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idempay_test_macros::api_test;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::{Receiver, attempts_recorded, endpoint_for_all, local, wait_for, write_event};
use crate::processor::{API_KEY, TestProcessor};
use crate::support::helpers::{TestApp, new_key, payment};
use crate::support::instance::Instance;

/// A would-be proxy on 127.0.0.1: it keeps the first line of every request it gets and answers
/// 502, as a proxy that cannot reach the target would.
struct Proxy {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = vec![0; 4096];
                    let read = stream.read(&mut head).await.unwrap_or(0);
                    let text = String::from_utf8_lossy(&head[..read]);
                    let line = text.lines().next().unwrap_or("(a connection, no request)");
                    seen.lock().unwrap().push(line.to_owned());
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                        )
                        .await;
                });
            }
        });
        Self { url, requests }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    /// Every variable reqwest (hyper-util) reads, in both cases, pointing here; `NO_PROXY` empty,
    /// so that no exception (127.0.0.1 included) applies.
    fn env(&self) -> Vec<(&'static str, &str)> {
        let mut env = vec![("NO_PROXY", ""), ("no_proxy", "")];
        for name in [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            env.push((name, self.url.as_str()));
        }
        env
    }
}

/// Both outgoing clients go straight to their destination: a payment's charge reaches the
/// processor and its event the merchant's receiver, and the proxy every variable names sees
/// nothing.
#[api_test]
async fn the_processor_and_delivery_clients_ignore_proxy_variables() {
    let app = TestApp::spawn_with(local("1h")).await;
    let processor = TestProcessor::spawn().await;
    let receiver = Receiver::start(0).await;
    endpoint_for_all(&app, &receiver.url).await;
    // The in-process service stops delivering, so only the instance below can.
    app.stop();
    let proxy = Proxy::start().await;
    let mut env = proxy.env();
    env.extend([
        ("IDEMPAY_PROCESSOR_URL", processor.address.as_str()),
        ("IDEMPAY_PROCESSOR_API_KEY", API_KEY),
        ("IDEMPAY_WEBHOOK_ALLOW_PRIVATE", "true"),
    ]);
    let instance = Instance::start(&app.database_url(), &env).await;

    let paid = instance
        .post_payment(&app.api_key, &new_key(), &payment(4200))
        .await;

    assert_eq!(
        paid.status,
        201,
        "{}; the proxy got {:?}",
        String::from_utf8_lossy(&paid.body),
        proxy.requests()
    );
    assert_eq!(
        processor.count("processor_charges").await,
        1,
        "charged at the processor"
    );
    wait_for(
        "the receiver gets the payment's event",
        Duration::from_secs(20),
        || async { !receiver.deliveries().is_empty() },
    )
    .await;
    assert_eq!(
        proxy.requests(),
        Vec::<String>::new(),
        "the proxy got nothing"
    );
}

/// The attack this guards against: an endpoint by a name that resolves to loopback, delivered by an
/// instance that allows only public addresses and has a proxy in its environment. The attempt is
/// refused by the public-only resolver, and neither the proxy nor the address behind the name
/// gets anything (through the proxy, the attempt was sent and the proxy's 502 recorded).
#[api_test]
async fn a_proxy_in_the_environment_does_not_carry_a_delivery_past_the_address_guard() {
    let registering = TestApp::spawn_with(local("1h")).await;
    let receiver = Receiver::start(0).await;
    let (endpoint, _) = endpoint_for_all(
        &registering,
        &receiver.url.replace("127.0.0.1", "localhost"),
    )
    .await;
    registering.stop();
    let proxy = Proxy::start().await;
    let _sending = Instance::start(&registering.database_url(), &proxy.env()).await;

    write_event(
        &registering.db,
        &registering.account_id,
        "payment.succeeded",
    )
    .await;
    attempts_recorded(&registering.db, 1, "the attempt is recorded").await;

    assert_eq!(
        proxy.requests(),
        Vec::<String>::new(),
        "the proxy got nothing"
    );
    assert!(receiver.deliveries().is_empty(), "nothing reached loopback");
    let (to, status, error): (String, Option<i16>, Option<String>) = sqlx::query_as(
        "SELECT d.endpoint_id, a.status_code, a.error
         FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id",
    )
    .fetch_one(&registering.db)
    .await
    .unwrap();
    assert_eq!(to, endpoint);
    let error = error.unwrap_or_default();
    assert_eq!(status, None, "no answer came back: {error}");
    assert!(error.contains("no public address"), "{error}");
}
