//! The connection pool, the lot of connections the key lifecycle's single statements run on, the
//! schema migrations, and their distribution on Citus ([`citus`]).

pub mod citus;

pub use citus::distribute;
pub use idempotency::engine::{Engine, KnownEngine, engine};

use std::str::FromStr;
use std::sync::Arc;

use futures_util::FutureExt;
pub use idempotency::connections::{Lent, Lot, Server};
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
///
/// Every new connection asks which server it reached ([`Server::meet`]); once one reaches a
/// server started after the one before (a restart, a failover), the connections at rest from
/// before are retired as they come up, never handed to a request ([`Server::predates`]).
pub fn pool_with(database_url: &str, limits: PoolLimits) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(database_url)?.options(SESSION_LIMITS);
    let server = Server::at(&options);
    let met = Arc::clone(&server);
    Ok(PgPoolOptions::new()
        .max_connections(limits.max_connections)
        .acquire_timeout(limits.acquire_timeout)
        // A ping before every acquire would add a round trip to every statement outside a
        // transaction (`make bench` measured it). A connection that died meanwhile fails its
        // query instead, which is answered 503 like any outage and retried with the same key.
        .test_before_acquire(false)
        .after_connect(move |connection, _| {
            let server = Arc::clone(&met);
            async move { server.meet(connection).await.map(drop) }.boxed()
        })
        // No round trip: a comparison of when the connection was opened with when this process
        // first met the server it now reaches. Refused, sqlx closes it and takes another.
        .before_acquire(move |_, meta| {
            let current = !server.predates(meta.age);
            async move { Ok(current) }.boxed()
        })
        .connect_lazy_with(options))
}
/// Applies the migrations under `migrations/` that have not run yet.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("./migrations").run(pool).await
}
