//! Small checks and look-ups the black-box tests lean on: an answer's status with its body in the
//! failure, an answer's id, requests to send by hand, what a test reads from the database or
//! changes there behind the service's back, and whether a server still listens.

use serde_json::{Value, json};
use sqlx::PgPool;

use crate::support::helpers::{TestApp, payment};

/// A keyed `POST url` with `body`, to send as the test needs: from a task of its own, or to an
/// instance that may die before it answers.
pub fn keyed_post(url: &str, api_key: &str, key: &str, body: &Value) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(url)
        .bearer_auth(api_key)
        .header("idempotency-key", key)
        .json(body)
}

/// The one number a `SELECT count(*) …` query answers.
pub async fn count(db: &PgPool, query: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(query))
        .fetch_one(db)
        .await
        .unwrap()
}

/// Runs `statement` with its one parameter `$1` bound to `value`: how a test changes a row behind
/// the service's back.
pub async fn execute(db: &PgPool, statement: &str, value: &str) {
    sqlx::query(sqlx::AssertSqlSafe(statement))
        .bind(value)
        .execute(db)
        .await
        .unwrap();
}

/// A payment of `amount` to authorize only, captured later by its own request.
pub fn manual(amount: i64) -> Value {
    let mut body = payment(amount);
    body["capture_method"] = json!("manual");
    body
}

/// The status of the only key of idempay's in the app's database.
pub async fn key_status(app: &TestApp) -> String {
    sqlx::query_scalar("SELECT status FROM idempotency_keys WHERE scope NOT LIKE 'processor:%'")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Whether a TCP connection to `address` is refused: nothing listens there any more.
pub async fn refuses_connections(address: std::net::SocketAddr) -> bool {
    matches!(
        tokio::net::TcpStream::connect(address).await,
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused
    )
}
