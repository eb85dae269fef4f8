//! `idempay webhook listen`: a receiver of a merchant endpoint's events on the developer's machine,
//! as `stripe listen` is. It does what the delivery contract asks of every receiver (verify the
//! signature, deduplicate on `webhook-id`, answer 2xx at once) and prints what it sees, one line
//! per delivery; `--fail-first N` answers 500 to the first N, to watch them redelivered.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use tokio::net::TcpListener;

use service::outbox::{Rejection, WebhookSecrets};
use service::server::shutdown_signal;

/// What the receiver remembers: the event ids it acknowledged, and how many deliveries it still
/// fails on purpose.
struct Receiver {
    secrets: WebhookSecrets,
    state: Mutex<Seen>,
}

struct Seen {
    ids: HashSet<String>,
    to_fail: usize,
}

/// Serves on 127.0.0.1:`port` (any free port for 0; the first line printed says which) until
/// Ctrl-C.
pub async fn run(port: u16, secrets: WebhookSecrets, fail_first: usize) -> anyhow::Result<()> {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
    println!("listening on http://{}/", listener.local_addr()?);
    let receiver = Arc::new(Receiver {
        secrets,
        state: Mutex::new(Seen {
            ids: HashSet::new(),
            to_fail: fail_first,
        }),
    });
    let app = Router::new().fallback(receive).with_state(receiver);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    Ok(())
}

/// One delivery: refused unless signed with the secret; failed on purpose while `--fail-first`
/// lasts; otherwise acknowledged, and printed unless its event was seen already.
async fn receive(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let id = match receiver.secrets.verify(&headers, &body) {
        Ok(id) => id,
        Err(rejection) => {
            let status = match rejection {
                Rejection::BadSignature => StatusCode::UNAUTHORIZED,
                _ => StatusCode::BAD_REQUEST,
            };
            println!("refused: {rejection} (answered {})", status.as_u16());
            return status;
        }
    };
    let mut seen = receiver
        .state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.to_fail > 0 {
        seen.to_fail -= 1;
        println!(
            "failed on purpose: {id} (answered 500; {} more to fail)",
            seen.to_fail
        );
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    if !seen.ids.insert(id.clone()) {
        println!("duplicate: {id} (already received; answered 200)");
        return StatusCode::OK;
    }
    let kind = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|event| event.get("type")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| "(no type)".to_owned());
    println!("received: {id} {kind}");
    StatusCode::OK
}
