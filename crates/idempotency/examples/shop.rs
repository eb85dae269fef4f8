//! A service adopting the mechanism, as the crate's README shows it: `DATABASE_URL=postgres://…
//! cargo run -p idempotency --example shop` (it creates the keys' table where it is missing), then
//! `curl -X POST -H 'Idempotency-Key: k1' localhost:3000/orders` twice: one order is placed, and
//! the second answer is the first's, replayed (`Idempotent-Replayed: true`). `SHOP_LISTEN` moves it
//! off 127.0.0.1:3000; `SHOP_KEY_TTL_SECS` shortens how long a key lives (24 h), after which the
//! layer's expiry job deletes it and the key places a new order. Integration tests run it so
//! against PostgreSQL (tests/api/tools/adoption.rs at the workspace's root).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::routing::post;
use idempotency::{Error, Idempotency, IdempotencyLayer, Owners, Policy};

/// Whose keys a request uses: every key is scoped to its owner (an account, a tenant).
#[derive(Clone)]
struct Shop;

impl Owners for Shop {
    type Rejection = Error; // or the service's own error type: any `IntoResponse`

    async fn owner(&self, _parts: &mut Parts) -> Result<String, Error> {
        Ok("shop".to_owned()) // a service with accounts authenticates here
    }
}

/// The effect: each order placed takes the next number. Behind the layer, once per key.
async fn place_order(State(orders): State<Arc<AtomicU64>>) -> (StatusCode, String) {
    let number = orders.fetch_add(1, Ordering::Relaxed) + 1;
    (StatusCode::CREATED, format!("order {number}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    idempotency::migrate(&pool).await?; // the keys' table, where it is missing
    let key_ttl = match std::env::var("SHOP_KEY_TTL_SECS") {
        Ok(seconds) => Duration::from_secs(seconds.parse()?),
        Err(_) => Policy::default().key_ttl, // 24 h
    };
    let policy = Policy {
        key_ttl,
        ..Policy::default()
    };
    // The layer also deletes expired keys, every min(key TTL, 60 s), while the routes are served.
    let app = Router::new()
        .route("/orders", post(place_order))
        .route_layer(IdempotencyLayer::new(Idempotency::new(pool, policy), Shop))
        .with_state(Arc::<AtomicU64>::default());
    let listen = std::env::var("SHOP_LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    axum::serve(tokio::net::TcpListener::bind(listen).await?, app).await?;
    Ok(())
}
