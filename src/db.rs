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
use futures_util::future::BoxFuture;
pub use idempotency::connections::{Lent, Lot, Server};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

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

/// The `application_name` of the pool's connections when the database URL sets none: what the
/// gauge of backends idle in a transaction looks for in `pg_stat_activity` (the lot's connections
/// name themselves after it, [`Lot::beside`]).
pub const APPLICATION_NAME: &str = "idempay";

/// Connections the pool's release check closed rather than lend again, by reason.
pub const CONNECTIONS_DISCARDED: &str = "idempay_db_connections_discarded_total";

/// Backends of this service idle inside a transaction that has been open for longer than
/// [`IDLE_IN_TRANSACTION_AFTER`], read from `pg_stat_activity` at each scrape. The transaction's
/// age, not the idle spell's: a stray transaction on a connection reused every few seconds is
/// idle only briefly each time, and is the one that does harm (its `idle_in_transaction_session_
/// timeout` never fires).
pub const IDLE_IN_TRANSACTION: &str = "idempay_db_backends_idle_in_transaction";

/// How long a backend may sit idle in a transaction before [`IDLE_IN_TRANSACTION`] counts it. The
/// service's transactions take milliseconds and never wait on anything outside the database.
pub const IDLE_IN_TRANSACTION_AFTER: Duration = Duration::from_secs(5);

/// Describes the pool's series, for the recorder.
pub fn describe() {
    metrics::describe_counter!(
        CONNECTIONS_DISCARDED,
        "Connections the pool closed on their return instead of lending them again, by reason \
         (in_transaction, aborted_transaction): a request dropped mid-transaction left them so."
    );
    metrics::describe_gauge!(
        IDLE_IN_TRANSACTION,
        "Backends of this service (the pool's and the lot's) idle inside a transaction open for \
         more than 5 s, from pg_stat_activity: each holds its locks and its snapshot."
    );
    // Both reasons exported from the start at 0: a scraper sees the series before the first
    // discard, so the first one is an increase (a series born at 1 increases by nothing).
    for reason in [Discarded::InTransaction, Discarded::AbortedTransaction] {
        metrics::counter!(CONNECTIONS_DISCARDED, "reason" => reason.as_str()).absolute(0);
    }
}

/// Reads [`IDLE_IN_TRANSACTION`], for a scrape ([`crate::http::metrics::Readings`]).
pub fn read_idle_in_transaction(pool: &PgPool) -> BoxFuture<'_, ()> {
    async move {
        let name = pool
            .connect_options()
            .get_application_name()
            .unwrap_or(APPLICATION_NAME)
            .to_owned();
        let after = IDLE_IN_TRANSACTION_AFTER.as_secs_f64();
        let idle = sqlx::query_scalar!(
            r#"SELECT count(*) AS "backends!" FROM pg_stat_activity
               WHERE datname = current_database()
                 AND (application_name = $1 OR application_name = $1 || ' (lot)')
                 AND state IN ('idle in transaction', 'idle in transaction (aborted)')
                 AND xact_start < now() - make_interval(secs => $2)"#,
            name,
            after,
        )
        .fetch_one(pool)
        .await;
        match idle {
            #[allow(clippy::cast_precision_loss, reason = "a count of backends")]
            Ok(backends) => metrics::gauge!(IDLE_IN_TRANSACTION).set(backends as f64),
            Err(error) => tracing::warn!(%error, "backends idle in a transaction not read"),
        }
    }
    .boxed()
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
    let mut options = PgConnectOptions::from_str(database_url)?.options(SESSION_LIMITS);
    if options.get_application_name().is_none() {
        options = options.application_name(APPLICATION_NAME);
    }
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
        .after_release(|connection, meta| released_outside_a_transaction(connection, meta).boxed())
        .connect_lazy_with(options))
}

/// Asked of every connection that comes back to the pool, after its owner's queued `ROLLBACK` (a
/// transaction dropped unfinished) has run. In PostgreSQL's simple protocol a statement outside a
/// transaction block runs in a transaction of its own, which starts with it (`now()` is
/// `statement_timestamp()`); inside a block, `now()` is when the block began. An aborted block
/// refuses the statement with 25P02.
const RELEASE_CHECK: &str = "SELECT now() = statement_timestamp(), \
     (extract(epoch FROM statement_timestamp() - now()) * 1000)::int8, \
     pg_current_xact_id_if_assigned() IS NOT NULL, pg_backend_pid()";

/// Why the release check closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Discarded {
    /// The server is inside a transaction block that nobody on this side knows of.
    InTransaction,
    /// The server is inside a failed transaction block: every statement on it would fail (25P02).
    AbortedTransaction,
}

impl Discarded {
    fn as_str(self) -> &'static str {
        match self {
            Self::InTransaction => "in_transaction",
            Self::AbortedTransaction => "aborted_transaction",
        }
    }
}

/// The pool's release check (sqlx's `after_release`): a connection whose session is inside a
/// transaction is closed, never lent again, counted in [`CONNECTIONS_DISCARDED`] and logged.
///
/// Lent on, such a connection would run the next borrowers' autocommit statements inside a
/// transaction that is not theirs: acknowledged writes nobody else sees, committed late or rolled
/// back by a stranger, and after one failed statement a 25P02 for every statement after it. sqlx
/// keeps no count of a `BEGIN` whose answer its owner never awaited (before 0.9.1), and its release
/// ping reads the server's transaction status without acting on it; this check does. It costs a
/// round trip per release, beside sqlx's own ping, in the task that hands the connection back, not
/// in the request's (`make bench-compare`, bench/README.md).
async fn released_outside_a_transaction(
    connection: &mut sqlx::PgConnection,
    meta: sqlx::pool::PoolConnectionMetadata,
) -> Result<bool, sqlx::Error> {
    use sqlx::Row;
    let discarded = match sqlx::raw_sql(RELEASE_CHECK)
        .fetch_one(&mut *connection)
        .await
    {
        Ok(row) if row.try_get::<bool, _>(0)? => return Ok(true),
        Ok(row) => {
            tracing::warn!(
                backend = row.try_get::<i32, _>(3)?,
                open_ms = row.try_get::<i64, _>(1)?,
                wrote = row.try_get::<bool, _>(2)?,
                connection_age = ?meta.age,
                "a connection came back to the pool inside a transaction nobody will end (a \
                 future dropped while its BEGIN was answered?): closed, not lent again; its \
                 uncommitted statements are rolled back"
            );
            Discarded::InTransaction
        }
        Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("25P02") => {
            tracing::warn!(
                connection_age = ?meta.age,
                "a connection came back to the pool inside a failed transaction: closed, not lent \
                 again"
            );
            Discarded::AbortedTransaction
        }
        // Broken otherwise: sqlx closes it without a word to the server.
        Err(error) => return Err(error),
    };
    metrics::counter!(CONNECTIONS_DISCARDED, "reason" => discarded.as_str()).increment(1);
    Ok(false)
}

/// Applies the migrations under `migrations/` that have not run yet.
///
/// Not `idempotency::migrate`: idempay's own migrations built the keys' table and
/// `idempotency_complete` step by step, releases before the crate had a migration of its own,
/// and they keep changing them (expand, copy, contract). The crate's one migration creates the
/// finished schema from nothing, so over idempay's it would find the table there and fail; a
/// test holds the two schemas equal instead (tests/api/tools/adoption.rs). The crate records
/// what it applied in a table of its own, so idempay's `_sqlx_migrations` knows only idempay's.
///
/// A migration recorded as applied that this release does not have is a later release's: during
/// a rolling deploy, or after a rollback, this release runs on the schema the next one expanded
/// (migrations/README.md), so it starts beside it instead of refusing (sqlx refuses by default).
/// A migration of its own whose checksum changed is still refused.
///
/// One process migrates at a time, under the advisory lock sqlx takes, but asked for without
/// waiting inside a statement (`lock_migrations`): sqlx's `pg_advisory_lock` waits in a
/// statement, whose snapshot a `CREATE INDEX CONCURRENTLY` run by the lock's holder waits for in
/// turn. PostgreSQL then reports a deadlock and cancels one of the two: a second instance starting
/// beside the first (any rolling deploy of more than one), or the index's build, which leaves an
/// invalid index behind. The explorer's rolling deploy met it (tests/README.md).
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.set_ignore_missing(true).set_locking(false);
    let mut conn = pool.acquire().await?;
    let lock = lock_migrations(&mut conn).await?;
    // `run_direct`, not `run`: `run` takes the connection as an `Acquire`, whose future is not
    // `Send` for every lifetime, and a test's spawned task cannot hold it (sqlx says as much
    // beside `run_direct`).
    let migrated = migrator.run_direct(None, &mut *conn, false).await;
    // Unlocked on the connection that holds the lock; were it lost, the lock went with it.
    sqlx::query_scalar!(r#"SELECT pg_advisory_unlock($1) AS "unlocked!""#, lock)
        .fetch_one(&mut *conn)
        .await
        .ok();
    migrated
}

/// The id of the advisory lock the migrations of `database` are applied under: sqlx's (its
/// `generate_lock_id`, a CRC-32 of the name times a constant of its own).
pub fn migrations_lock_id(database: &str) -> i64 {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC);
    0x3d32_ad9e * i64::from(CRC.checksum(database.as_bytes()))
}

/// How often a process waiting to migrate asks for the lock again.
const MIGRATIONS_LOCK_POLL: Duration = Duration::from_millis(100);

/// Takes the advisory lock that sqlx's migrator takes (its id, computed as sqlx computes it, from
/// the database's name; so a release that still lets sqlx lock waits for this one and the other
/// way round), asking with `pg_try_advisory_lock` until it is granted: each ask is a statement of
/// its own that ends at once, so no snapshot of this session stays open for a concurrent index
/// build to wait for. Returns the lock's id.
async fn lock_migrations(conn: &mut PgConnection) -> Result<i64, sqlx::Error> {
    let database = sqlx::query_scalar!(r#"SELECT current_database() AS "name!""#)
        .fetch_one(&mut *conn)
        .await?;
    let lock = migrations_lock_id(&database);
    while !sqlx::query_scalar!(r#"SELECT pg_try_advisory_lock($1) AS "locked!""#, lock)
        .fetch_one(&mut *conn)
        .await?
    {
        tokio::time::sleep(MIGRATIONS_LOCK_POLL).await;
    }
    Ok(lock)
}
