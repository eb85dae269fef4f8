//! The connections of the key lifecycle: the [`Lot`] its single statements run on, taken back
//! without sqlx's release ping, the [`Server`] generations that keep a connection from before
//! a database restart from ever being used again (the service's pool asks the same registry), and
//! [`begin`], the one way the workspace opens a transaction.

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection, PgPool, Postgres, Transaction};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Opens a transaction on a connection of `pool`: the one way this workspace opens one (clippy.toml
/// refuses sqlx's `begin` everywhere else).
///
/// The `BEGIN` round trip runs in a task of its own, which the caller only awaits. Any future can
/// be dropped at any `.await` (a client hangs up, a timeout fires). sqlx before 0.9.1 raised its
/// transaction depth only after `BEGIN`'s answer, so a future dropped while it waited left the
/// server inside a transaction that neither drop guard ended; the pool then lent that connection
/// on, and the next borrowers' autocommit writes ran inside it: acknowledged, invisible to everyone
/// else, and committed late or rolled back by a stranger. sqlx 0.9.1 claims the depth first; this
/// makes the window unreachable whatever the version does, as the release check of the service's
/// pool discards any connection that still comes back inside a transaction.
///
/// The task always reads `BEGIN`'s answer. If nobody awaits the transaction any more, it is dropped
/// in the task, which queues its `ROLLBACK` before the connection goes back to the pool. Once
/// begun, a transaction dropped at any later `.await` rolls back: nothing of it is committed.
pub async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let pool = pool.clone();
    #[allow(
        clippy::disallowed_methods,
        reason = "the one way: in a task of its own"
    )]
    let begun = tokio::spawn(async move { pool.begin().await });
    match begun.await {
        Ok(transaction) => transaction,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        // The runtime is shutting down: so is the pool.
        Err(_) => Err(sqlx::Error::PoolClosed),
    }
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
/// lot closes its connections at rest when one of its statements meets that ([`Lent::give_back`]).
pub struct Server {
    /// The start time of the server last met, in microseconds since the Unix epoch.
    started: Mutex<Option<i64>>,
    generation: AtomicU64,
    /// When this process met the current generation, in microseconds after `base`.
    since: AtomicU64,
    base: Instant,
}

/// The servers this process has met, by address: the pool and the lots beside it (a service's,
/// and those of another service embedded in the same process) share one.
static SERVERS: LazyLock<Mutex<HashMap<String, Arc<Server>>>> = LazyLock::new(Mutex::default);

impl Server {
    /// The server `options` connect to.
    pub fn at(options: &PgConnectOptions) -> Arc<Self> {
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
    pub async fn meet(&self, connection: &mut PgConnection) -> Result<u64, sqlx::Error> {
        let started: i64 = sqlx::query_scalar(
            "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::int8",
        )
        .fetch_one(&mut *connection)
        .await?;
        Ok(self.met_started_at(started))
    }

    /// Notes that a new connection met the server started at `started` (microseconds since the
    /// Unix epoch), and returns its generation: the current one, or a new one when the server
    /// started at another time than the last one met.
    fn met_started_at(&self, started: i64) -> u64 {
        let mut last = self.started.lock().unwrap_or_else(PoisonError::into_inner);
        let restarted = last.is_some_and(|before| before != started);
        *last = Some(started);
        if !restarted {
            return self.generation();
        }
        let since = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.since.store(since, Ordering::Release);
        // Under the lock: no other connection's meeting moves the generation meanwhile.
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        tracing::warn!(
            generation,
            "the database server restarted or changed: the connections to the one before are \
             closed, unused"
        );
        generation
    }

    /// The current generation: connections of an earlier one are not used again.
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a connection opened `age` ago was opened before this process met the current
    /// generation (no round trip).
    pub fn predates(&self, age: Duration) -> bool {
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
const LOT_APPLICATION_NAME: &str = "idempotency lot";

/// How long the lot uses one connection before it closes it and opens another, as sqlx's pool
/// does by default: nothing a session accumulated on the server lives forever.
const LOT_LIFETIME: Duration = Duration::from_secs(30 * 60);

/// Connections for the statements a new key cannot do without (its reservation; the statement
/// that writes the effect and completes the key), taken back without a round trip.
///
/// sqlx's pool pings every connection it gets back (a `Sync` message and its answer), in a task
/// of its own: it cannot know whether the statement on it finished or was cut short, and a
/// future dropped mid-statement leaves a connection mid-protocol. A new key of a service that
/// calls another service adopting the crate returns four connections (two on each side), so the
/// pings are four more round trips and eight more wake-ups for PostgreSQL and the services after
/// every answer: the workspace's `make bench` measured 10–14 % more new keys per second with the
/// lot, and 7–8 % less PostgreSQL CPU for each (bench/README.md). Whoever holds a [`Lent`]
/// connection does know: a statement that returned, with rows or
/// with the database's refusal, left the connection idle and ready (as between the statements of
/// a transaction, which sqlx does not ping either), and [`Lent::give_back`] keeps it for the next
/// one. A connection dropped before it is given back (the request's future was cut short) or given
/// back after an I/O or protocol error is closed.
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
    /// name themselves `idempotency lot` (or the pool's application name with ` (lot)`), so
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

/// A connection of the [`Lot`], for one statement; give it back with [`Lent::give_back`].
pub struct Lent {
    parked: Option<Parked>,
    lot: Arc<LotShared>,
    // Released after the connection is back at rest, so the next borrower finds it.
    _permit: OwnedSemaphorePermit,
}

impl Lent {
    /// Gives the connection back with the result of its statement, which it returns: at rest in
    /// the lot when the statement returned, rows or the database's refusal (a constraint, a
    /// raised exception: the server ended the statement and is ready); closed after any other
    /// error, which may have left it mid-protocol or ended the session (an I/O error, the server
    /// terminating its backends), and once it is 30 minutes old (`LOT_LIFETIME`).
    ///
    /// Such an error closes the connections at rest too: it mostly means the server went away (a
    /// restart, a failover), and each of them would fail a request of its own before the lot
    /// opened a live one. The next statements open new connections.
    pub fn give_back<T>(mut self, result: Result<T, sqlx::Error>) -> Result<T, sqlx::Error> {
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
            .expect("a lent connection until given back")
            .connection
    }
}

impl DerefMut for Lent {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self
            .parked
            .as_mut()
            .expect("a lent connection until given back")
            .connection
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

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
    fn a_server_met_with_another_start_time_begins_a_generation_its_old_connections_predate() {
        let server = server();
        assert_eq!(server.met_started_at(100), 0, "the first server met");
        assert_eq!(server.met_started_at(100), 0, "the same one again");
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(server.met_started_at(200), 1, "restarted");
        assert_eq!(server.generation(), 1);
        // A connection opened at the start predates it; one opened now does not.
        assert!(server.predates(server.base.elapsed()));
        assert!(!server.predates(Duration::ZERO));
        assert_eq!(server.met_started_at(200), 1);
        assert_eq!(server.met_started_at(100), 2, "any other start time");
    }

    #[test]
    fn an_error_that_ends_the_session_is_a_connection_exception_or_a_terminated_backend() {
        for code in ["08006", "08P01", "57P01", "57P02", "57P03"] {
            assert!(ends_the_session(Some(code)), "{code}");
        }
        for code in ["23505", "40001", "57014", "55P03"] {
            assert!(!ends_the_session(Some(code)), "{code}");
        }
        assert!(!ends_the_session(None));
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
