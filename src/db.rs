//! The connection pool, the lot of connections the key lifecycle's single statements run on, the
//! schema migrations, and their distribution on Citus ([`citus`]).

pub mod citus;

pub use citus::{Engine, KnownEngine, distribute, engine};

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Args;
use futures_util::FutureExt;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::settings::{at_least_one, positive};

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
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Refuses at start a lease the pool could not renew in time. The lease is renewed every third of
/// its length, each renewal abandoned when the next is due (`idempotency::Idempotency::heartbeat`),
/// and a renewal first waits for a pool connection, up to the acquire timeout. A third of the lease
/// must cover that wait: otherwise, under load, renewals are abandoned while the pool would still
/// serve them, and a slow but alive request loses its key to a takeover (safely, the completion is
/// fenced, but its work is then done for nothing and its client answered 409). The session's
/// statement and lock timeouts (`db.rs`) do not enter: a renewal is one UPDATE of one row by its
/// primary key, which runs in a millisecond or waits for that row's lock, held only by another
/// one-row statement (a completion, a takeover) or by nobody, and its third bounds that wait.
pub fn check_lease(lease: Duration, pool: &PoolLimits) -> Result<(), String> {
    let needed = pool.acquire_timeout * 3;
    if lease < needed {
        return Err(format!(
            "IDEMPAY_LEASE ({}) must be at least 3 × IDEMPAY_DATABASE_ACQUIRE_TIMEOUT ({}) = {}: \
             the lease is renewed every third of its length, and a renewal may wait that long for \
             a connection. Lengthen the lease or shorten the acquire timeout.",
            humantime::format_duration(lease),
            humantime::format_duration(pool.acquire_timeout),
            humantime::format_duration(needed),
        ));
    }
    Ok(())
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

/// What this process knows of the PostgreSQL server behind one address: which one it is (when it
/// started), and from when its connections are of that one.
///
/// After a restart, every connection at rest from before holds a session the old server ended:
/// its `FATAL 57P01` waits unread on the socket, and the next statement sent on it fails. Telling
/// that on each connection takes a round trip (a ping), which the pool and the lot exist to save.
/// Telling it once per server does not: each new connection reads `pg_postmaster_start_time()`,
/// and the first to read a start time other than the one before begins a new generation. The
/// connections at rest of earlier generations are then closed as they come up, unused. Nothing
/// works on the new server before some connection has been opened to it, so `/readyz` cannot
/// answer 200 before the old connections are known for what they are.
///
/// A session ended alone (`pg_terminate_backend`) leaves the server's start time as it was: the
/// lot closes its connections at rest when one of its statements meets that ([`Lent::settle`]).
pub struct Server {
    /// The start time of the server last met, in microseconds since the Unix epoch.
    started: Mutex<Option<i64>>,
    generation: AtomicU64,
    /// When this process met the current generation, in microseconds after `base`.
    since: AtomicU64,
    base: Instant,
}

/// The servers this process has met, by address: the pool and the lots beside it (idempay's,
/// the embedded processor's) share one.
static SERVERS: LazyLock<Mutex<HashMap<String, Arc<Server>>>> = LazyLock::new(Mutex::default);

impl Server {
    /// The server `options` connect to.
    fn at(options: &PgConnectOptions) -> Arc<Self> {
        let address = format!(
            "{}:{}:{:?}",
            options.get_host(),
            options.get_port(),
            options.get_socket()
        );
        let mut servers = SERVERS.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(servers.entry(address).or_insert_with(|| {
            Arc::new(Self {
                started: Mutex::new(None),
                generation: AtomicU64::new(0),
                since: AtomicU64::new(0),
                base: Instant::now(),
            })
        }))
    }

    /// Asks the server `connection` reached when it started (one round trip, once per new
    /// connection); a start time other than the last one's begins a new generation. Returns the
    /// generation of `connection`.
    async fn meet(&self, connection: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let started: i64 = sqlx::query_scalar(
            "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::int8",
        )
        .fetch_one(&mut *connection)
        .await?;
        let mut last = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        match *last {
            Some(before) if before != started => {
                let since = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX);
                self.since.store(since, Ordering::Release);
                let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                tracing::warn!(
                    generation,
                    "the database server restarted or changed: the connections to the one before \
                     are closed, unused"
                );
            }
            _ => {}
        }
        *last = Some(started);
        Ok(self.generation.load(Ordering::Acquire))
    }

    /// The current generation: connections of an earlier one are not used again.
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a connection opened `age` ago was opened before this process met the current
    /// generation (no round trip).
    fn predates(&self, age: Duration) -> bool {
        let since = Duration::from_micros(self.since.load(Ordering::Acquire));
        let opened = self.base.elapsed().saturating_sub(age);
        opened < since
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("generation", &self.generation())
            .finish_non_exhaustive()
    }
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
    server: Arc<Server>,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Parked>>,
    acquire_timeout: Duration,
}

/// A connection at rest in the lot, when it was opened, and to which generation of the server.
struct Parked {
    connection: PgConnection,
    opened: Instant,
    generation: u64,
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
            server: Server::at(&connect),
            options: connect.as_ref().clone().application_name(&name),
            permits: Arc::new(Semaphore::new(options.get_max_connections() as usize)),
            idle: Mutex::new(Vec::new()),
            acquire_timeout: options.get_acquire_timeout(),
        }))
    }

    /// A connection for one statement: one at rest, or a new one while the lot has fewer than
    /// its size. Fails with [`sqlx::Error::PoolTimedOut`] after the acquire timeout, as the pool.
    ///
    /// A connection at rest to an earlier generation of the server (from before a restart) is
    /// closed unused; that costs a comparison, no round trip ([`Server`]).
    pub async fn lend(&self) -> Result<Lent, sqlx::Error> {
        let shared = &self.0;
        let lend = async {
            let permit = Arc::clone(&shared.permits)
                .acquire_owned()
                .await
                .map_err(|_| sqlx::Error::PoolClosed)?;
            let at_rest = {
                let generation = shared.server.generation();
                let mut idle = shared.idle.lock().unwrap_or_else(PoisonError::into_inner);
                // The old generation's are dropped, each closing its dead socket.
                idle.retain(|parked| parked.generation == generation);
                idle.pop()
            };
            let parked = match at_rest {
                Some(parked) => parked,
                None => {
                    let mut connection = connect(&shared.options).await?;
                    let generation = shared.server.meet(&mut connection).await?;
                    Parked {
                        connection,
                        opened: Instant::now(),
                        generation,
                    }
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        Server {
            started: Mutex::new(None),
            generation: AtomicU64::new(0),
            since: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    #[test]
    fn a_connection_predates_a_generation_met_after_it_was_opened() {
        let server = server();
        std::thread::sleep(Duration::from_millis(2));
        // Nothing met since the start: even a connection opened then is current.
        assert!(!server.predates(server.base.elapsed()));
        // The current generation met 1 ms after the start.
        server.since.store(1_000, Ordering::Release);
        // Opened at the start, before it.
        assert!(server.predates(server.base.elapsed()));
        // Opened now, 2 ms or more after the start: after it.
        assert!(!server.predates(Duration::ZERO));
    }

    #[test]
    fn the_servers_are_told_apart_by_address() {
        let one = PgConnectOptions::from_str("postgres://u@127.0.0.1:5432/a").unwrap();
        let same = PgConnectOptions::from_str("postgres://v@127.0.0.1:5432/b").unwrap();
        let other = PgConnectOptions::from_str("postgres://u@127.0.0.1:5433/a").unwrap();
        assert!(Arc::ptr_eq(&Server::at(&one), &Server::at(&same)));
        assert!(!Arc::ptr_eq(&Server::at(&one), &Server::at(&other)));
    }
}
