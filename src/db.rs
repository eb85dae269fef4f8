//! The connection pool, the lot of connections the key lifecycle's single statements run on, the
//! schema migrations, and their distribution on Citus ([`citus`]).

pub mod citus;

pub use citus::{Engine, KnownEngine, distribute, engine};

use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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

/// The `application_name` of the lot's connections when the database URL sets none.
const LOT_APPLICATION_NAME: &str = "idempay lot";

/// How long the lot uses one connection before it closes it and opens another, as sqlx's pool
/// does by default: nothing a session accumulated on the server lives forever.
const LOT_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// Connections for the statements a new key cannot do without (its reservation; the statement
/// that writes the effect and completes the key), taken back without a round trip.
///
/// sqlx's pool pings every connection it gets back (a `Sync` message and its answer), in a task
/// of its own: it cannot know whether the statement on it finished or was cut short, and a
/// future dropped mid-statement leaves a connection mid-protocol. A new key returns four
/// connections (two at idempay, two at the processor), so the pings were four more round trips
/// and eight more wake-ups for PostgreSQL and the services to pay after every answer: `make
/// bench` measured 10–14 % more new keys per second with the lot, and 7–8 % less PostgreSQL CPU
/// for each (bench/README.md). Whoever holds a [`Lent`] connection does know: a statement that returned, with rows or
/// with the database's refusal, left the connection idle and ready (as between the statements of
/// a transaction, which sqlx does not ping either), and [`Lent::settle`] keeps it for the next
/// one. A connection dropped unsettled (the request's future was cut short) or settled after an
/// I/O or protocol error is closed.
///
/// The lot has as many connections as the pool, opened as they are first needed and apart from
/// it, so the pool's other users (transactions, lists, the background jobs, lease renewals) never
/// wait for a connection the lot holds. A request waits for one at most the pool's acquire
/// timeout, as for the pool's.
#[derive(Clone)]
pub struct Lot(Arc<LotShared>);

struct LotShared {
    options: PgConnectOptions,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Parked>>,
    acquire_timeout: Duration,
}

/// A connection at rest in the lot, and when it was opened.
struct Parked {
    connection: PgConnection,
    opened: Instant,
}

impl std::fmt::Debug for Lot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lot")
            .field("available", &self.0.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl Lot {
    /// A lot the size of `pool`, whose connections have its settings and session limits. They
    /// name themselves `idempay lot` (or the pool's application name with ` (lot)`), so
    /// that `pg_stat_activity` tells them from the pool's.
    pub fn beside(pool: &PgPool) -> Self {
        let options = pool.options();
        let connect = pool.connect_options();
        let name = connect.get_application_name().map_or_else(
            || LOT_APPLICATION_NAME.to_owned(),
            |name| format!("{name} (lot)"),
        );
        Self(Arc::new(LotShared {
            options: connect.as_ref().clone().application_name(&name),
            permits: Arc::new(Semaphore::new(options.get_max_connections() as usize)),
            idle: Mutex::new(Vec::new()),
            acquire_timeout: options.get_acquire_timeout(),
        }))
    }

    /// A connection for one statement: one at rest, or a new one while the lot has fewer than
    /// its size. Fails with [`sqlx::Error::PoolTimedOut`] after the acquire timeout, as the pool.
    pub async fn lend(&self) -> Result<Lent, sqlx::Error> {
        let shared = &self.0;
        let lend = async {
            let permit = Arc::clone(&shared.permits)
                .acquire_owned()
                .await
                .map_err(|_| sqlx::Error::PoolClosed)?;
            let at_rest = shared
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            let parked = match at_rest {
                Some(parked) => parked,
                None => Parked {
                    connection: connect(&shared.options).await?,
                    opened: Instant::now(),
                },
            };
            Ok(Lent {
                parked: Some(parked),
                lot: Arc::clone(shared),
                _permit: permit,
            })
        };
        tokio::time::timeout(shared.acquire_timeout, lend)
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
    }
}

/// A connection of the [`Lot`], for one statement; hand it back with [`Lent::settle`].
pub struct Lent {
    parked: Option<Parked>,
    lot: Arc<LotShared>,
    // Released after the connection is back at rest, so the next borrower finds it.
    _permit: OwnedSemaphorePermit,
}

impl Lent {
    /// Hands the connection back with the result of its statement, which it returns: at rest in
    /// the lot when the statement returned, rows or the database's refusal (a constraint, a
    /// raised exception: the server ended the statement and is ready); closed after any other
    /// error, which may have left it mid-protocol or ended the session (an I/O error, the server
    /// terminating its backends), and after [`LOT_LIFETIME`].
    ///
    /// Such an error closes the connections at rest too: it mostly means the server went away (a
    /// restart, a failover), and each of them would fail a request of its own before the lot
    /// opened a live one. The next statements open new connections.
    pub fn settle<T>(mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
        let reusable = match &result {
            Ok(_) => true,
            Err(sqlx::Error::Database(error)) => !ends_the_session(error.code().as_deref()),
            Err(_) => false,
        };
        let mut idle = self.lot.idle.lock().unwrap_or_else(PoisonError::into_inner);
        match self.parked.take() {
            Some(parked) if reusable && parked.opened.elapsed() < LOT_LIFETIME => idle.push(parked),
            _ if !reusable => idle.clear(),
            _ => {}
        }
        result
    }
}

/// Opens a connection, trying again while the server refuses connections or says it cannot take
/// one yet (starting up, too many connections), as sqlx's pool does: the caller's acquire timeout
/// bounds the attempts. A restarted database is then met as the pool meets it, not failed at its
/// first moment.
async fn connect(options: &PgConnectOptions) -> Result<PgConnection, sqlx::Error> {
    let mut pause = Duration::from_millis(10);
    loop {
        match PgConnection::connect_with(options).await {
            Err(sqlx::Error::Io(error))
                if error.kind() == std::io::ErrorKind::ConnectionRefused => {}
            Err(sqlx::Error::Database(error))
                if matches!(error.code().as_deref(), Some("57P03" | "53300")) => {}
            connected => return connected,
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Whether a database error with SQLSTATE `code` ended the session rather than the statement: a
/// connection exception (class 08), or the server terminating its backends (57P01 admin shutdown,
/// 57P02 crash shutdown, 57P03 cannot connect now). Such a connection is closed, never reused.
fn ends_the_session(code: Option<&str>) -> bool {
    matches!(code, Some(code) if code.starts_with("08") || code.starts_with("57P"))
}

impl Deref for Lent {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self
            .parked
            .as_ref()
            .expect("a lent connection until settled")
            .connection
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self
            .parked
            .as_mut()
            .expect("a lent connection until settled")
            .connection
    }
}

/// Applies the migrations under `migrations/` that have not run yet.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("./migrations").run(pool).await
}
