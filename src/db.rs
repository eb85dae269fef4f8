//! The connection pool, the lot of connections the key lifecycle's single statements run on, the
//! schema migrations, and their distribution on Citus ([`citus`]).

pub mod citus;

pub use citus::distribute;
pub use idempotency::engine::{Engine, KnownEngine, engine};

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use futures_util::FutureExt;
pub use idempotency::connections::{Lent, Lot, Server};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use service::settings::{at_least_one, declared_defaults, positive};

/// The connection pool's bounds: a request never waits long for a connection.
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolLimits {
    /// Connections of the pool. Slow work holds none, so a few serve many requests; but a commit
    /// holds its connection while it waits for the disk, and commits that wait together share one
    /// flush, so the default is chosen from `make bench-pools` with durable commits (see
    /// bench/README.md). The lot a new key's statements run on (`db::Lot`) has as many again,
    /// opened as needed.
    #[arg(
        long = "database-max-connections",
        env = "IDEMPAY_DATABASE_MAX_CONNECTIONS",
        default_value_t = DEFAULT_MAX_CONNECTIONS,
        value_parser = at_least_one("IDEMPAY_DATABASE_MAX_CONNECTIONS")
    )]
    pub max_connections: u32,

    /// How long a request waits for a free connection before it is answered with 503.
    #[arg(long = "database-acquire-timeout", env = "IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", default_value = "5s", value_parser = positive("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT"))]
    pub acquire_timeout: Duration,
}

/// The pool's size unless set: with durable commits, 16 served new keys at c=16 and c=64 at least
/// as fast as 8 or 32 did in every run of `make bench-pools` (bench/README.md).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;

impl Default for PoolLimits {
    fn default() -> Self {
        declared_defaults()
    }
}

/// Refuses at start a lease the pool could not renew in time: the mechanism's rule
/// ([`idempotency::Policy::check_lease`]), worded with the settings that set it.
pub fn check_lease(lease: Duration, pool: &PoolLimits) -> Result<(), String> {
    let policy = idempotency::Policy {
        lease,
        ..idempotency::Policy::default()
    };
    policy.check_lease(pool.acquire_timeout).map_err(|short| {
        format!(
            "IDEMPAY_LEASE ({}) must be at least 3 × IDEMPAY_DATABASE_ACQUIRE_TIMEOUT ({}) = {}: \
             the lease is renewed every third of its length, and a renewal may wait that long for \
             a connection. Lengthen the lease or shorten the acquire timeout.",
            humantime::format_duration(short.lease),
            humantime::format_duration(short.acquire_timeout),
            humantime::format_duration(short.needed),
        )
    })
}

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
