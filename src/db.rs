//! The connection pool and the schema migrations.

use std::str::FromStr;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::PoolLimits;

/// Limits every session sets, so a stuck query or a forgotten transaction cannot hold a pool
/// connection (and the locks it took) for long. Every statement of the service takes milliseconds.
const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "10s"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "30s"),
];

/// A pool with the default limits; see [`pool_with`].
pub fn pool(database_url: &str) -> Result<PgPool, sqlx::Error> {
    pool_with(database_url, PoolLimits::default())
}

/// Connects lazily: the service starts even while the database is still coming up, and
/// `/readyz` tells when it is reachable. A request that waits longer than the acquire timeout for
/// a connection fails fast with 503 instead of hanging.
pub fn pool_with(database_url: &str, limits: PoolLimits) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(database_url)?.options(SESSION_LIMITS);
    Ok(PgPoolOptions::new()
        .max_connections(limits.max_connections)
        .acquire_timeout(limits.acquire_timeout)
        // A ping before every acquire would add a round trip to every statement outside a
        // transaction (`make bench` measured it). A connection that died meanwhile fails its
        // query instead, which is answered 503 like any outage and retried with the same key.
        .test_before_acquire(false)
        .connect_lazy_with(options))
}

/// Applies the migrations under `migrations/` that have not run yet.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("./migrations").run(pool).await
}
