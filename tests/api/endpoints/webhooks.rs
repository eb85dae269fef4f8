//! Webhook intake, what its tests share (`webhooks_*.rs` here, `events.rs`, `disputes.rs`):
//! envelopes, signed deliveries, and the processed events and disputes as recorded.

use serde_json::{Value, json};
use service::outbox::WebhookSecrets;

use crate::support::helpers::{TestApp, TestResponse};

pub(super) fn envelope(kind: &str, data: &Value) -> Vec<u8> {
    envelope_at(kind, data, chrono::Utc::now())
}

/// An envelope whose event was created `at`.
fn envelope_at(kind: &str, data: &Value, at: chrono::DateTime<chrono::Utc>) -> Vec<u8> {
    serde_json::to_vec(&json!({ "type": kind, "timestamp": at, "data": data })).unwrap()
}

/// Delivers an event created now, signed now with `secret`.
pub(super) async fn deliver(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: &Value,
) -> TestResponse {
    deliver_at(app, secret, id, kind, data, chrono::Utc::now()).await
}

/// Delivers now, signed now, an event created `at`: a redelivery of an older event.
pub(super) async fn deliver_at(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: &Value,
    at: chrono::DateTime<chrono::Utc>,
) -> TestResponse {
    let body = envelope_at(kind, data, at);
    let now = chrono::Utc::now().timestamp();
    post(
        app,
        id,
        now,
        Some(&secret.sign(id, now, &body).unwrap()),
        body,
    )
    .await
}

pub(super) async fn post(
    app: &TestApp,
    id: &str,
    timestamp: i64,
    signature: Option<&str>,
    body: Vec<u8>,
) -> TestResponse {
    let mut request = app
        .client()
        .post(app.url("/v1/webhooks/processor"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp)
        .body(body);
    if let Some(signature) = signature {
        request = request.header("webhook-signature", signature);
    }
    app.send(request).await
}

pub(super) async fn event_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM processed_events")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// The recorded disputes: (id, amount, status), by id.
pub(super) async fn disputes(app: &TestApp) -> Vec<(String, i64, String)> {
    sqlx::query_as("SELECT id, amount, status FROM disputes ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The recorded outcome of every processed event, by event id.
pub(super) async fn event_outcomes(app: &TestApp) -> Vec<String> {
    sqlx::query_scalar("SELECT outcome FROM processed_events ORDER BY id")
        .fetch_all(&app.db)
        .await
        .unwrap()
}
