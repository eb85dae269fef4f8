//! The README's example, served: `DATABASE_URL=postgres://… cargo run -p idempotency --example
//! shop`, then `curl -X POST -H 'Idempotency-Key: k1' localhost:3000/orders` twice. The database
//! needs idempay's migrations (the keys' table and `idempotency_complete`).

use std::time::Duration;

use axum::extract::FromRef;
use axum::http::request::Parts;
use axum::routing::post;
use axum::{Router, middleware};
use idempotency::{Error, Idempotency, Owners, Policy};

#[derive(Clone)]
struct Shop {
    idempotency: Idempotency,
}

impl FromRef<Shop> for Idempotency {
    fn from_ref(shop: &Shop) -> Self {
        shop.idempotency.clone()
    }
}

/// Whose keys a request uses: every key is scoped to its owner (an account, a tenant).
impl Owners for Shop {
    type Rejection = Error; // or the service's own error type, with `From<idempotency::Error>`

    async fn owner(&self, _parts: &mut Parts) -> Result<String, Error> {
        Ok("shop".to_owned()) // a service with accounts authenticates here
    }
}

fn app(pool: sqlx::PgPool) -> Router {
    let policy = Policy {
        key_ttl: Duration::from_secs(24 * 60 * 60), // how long a completed key replays
        lease: Duration::from_secs(30),             // how long a silent holder blocks a retry
        recovery_window: Duration::from_secs(12 * 60 * 60), // see "recovery points" below
    };
    let shop = Shop {
        idempotency: Idempotency::new(pool, policy),
    };
    Router::new()
        .route("/orders", post(|| async { "ordered" }))
        .route_layer(middleware::from_fn_with_state(
            shop.clone(),
            idempotency::guard::<Shop>,
        ))
        .with_state(shop)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DATABASE_URL")?;
    let pool = sqlx::PgPool::connect(&url).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app(pool)).await?;
    Ok(())
}
