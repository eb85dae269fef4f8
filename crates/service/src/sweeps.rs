//! The expiry job every service runs: each interval, it deletes what has expired, table after
//! table, in bounded batches, so that no table grows without end. A service says what to delete
//! (its [`Sweep`]s, in order); the job paces them, counts them and keeps going when one fails.
//!
//! Safe to run on every instance at once: each batch skips rows another instance has locked.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use idempotency::engine::{Engine, KnownEngine};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::failpoint;
use crate::name::ServiceName;

/// Rows per delete: small enough to keep each statement's locks short. Every batch statement
/// carries it as a literal `LIMIT 1000`, the mechanism's batch of keys.
pub const BATCH: u64 = idempotency::EXPIRY_BATCH;

/// The series' names after the service's prefix: `idempay_expiry_deleted_rows_total`, ….
const DELETED: &str = "expiry_deleted_rows_total";
const DURATION: &str = "expiry_run_duration_seconds";

/// The table whose deletions make the job panic under the `expiry-job-panic` crash point: the
/// test of a job that dies wants it to die after a run that did something.
const KEYS: &str = "idempotency_keys";

type Batch =
    Box<dyn Fn(PgPool, Engine) -> BoxFuture<'static, Result<u64, sqlx::Error>> + Send + Sync>;

/// What one batch statement deletes, and the table it is counted under.
pub struct Sweep {
    table: &'static str,
    batch: Batch,
}

impl Sweep {
    /// `batch` deletes up to [`BATCH`] rows and says how many; it is run until it deletes fewer.
    /// `table` labels the count (`{service}_expiry_deleted_rows_total{table}`).
    pub fn new<F, Fut>(table: &'static str, batch: F) -> Self
    where
        F: Fn(PgPool, Engine) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<u64, sqlx::Error>> + Send + 'static,
    {
        Self {
            table,
            batch: Box::new(move |pool, engine| Box::pin(batch(pool, engine))),
        }
    }
}

/// A service's sweeps, in the order they run, and the service they are counted as.
pub struct Sweeps {
    service: ServiceName,
    sweeps: Vec<Sweep>,
}

impl Sweeps {
    pub fn of(service: ServiceName, sweeps: Vec<Sweep>) -> Self {
        Self { service, sweeps }
    }
}

/// Every `interval` until `shutdown` is cancelled, runs the sweeps in their order; a pass in which
/// every sweep succeeded is the success of `job` ([`crate::jobs::succeeded`]).
pub fn spawn(
    job: &'static str,
    pool: PgPool,
    interval: Duration,
    sweeps: Sweeps,
    shutdown: CancellationToken,
) -> JoinHandle<()> {
    let Sweeps { service, sweeps } = sweeps;
    let (deleted_rows, run_duration) = (service.metric(DELETED), service.metric(DURATION));
    tokio::spawn(async move {
        let engine = KnownEngine::default();
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let started = Instant::now();
            let engine = match engine.get(&pool).await {
                Ok(engine) => engine,
                Err(error) => {
                    tracing::warn!(%error, "expiry failed; it runs again next interval");
                    continue;
                }
            };
            let mut deleted = Vec::with_capacity(sweeps.len());
            let mut failed = false;
            for sweep in &sweeps {
                let (count, ok) = drain(&shutdown, || (sweep.batch)(pool.clone(), engine)).await;
                failed |= !ok;
                metrics::counter!(deleted_rows.clone(), "table" => sweep.table).increment(count);
                deleted.push((sweep.table, count));
            }
            metrics::histogram!(run_duration.clone()).record(started.elapsed().as_secs_f64());
            if !failed && !shutdown.is_cancelled() {
                crate::jobs::succeeded(service, job);
            }
            if deleted.iter().any(|&(_, count)| count > 0) {
                tracing::info!(?deleted, "expired rows deleted");
            }
            if deleted
                .iter()
                .any(|&(table, count)| table == KEYS && count > 0)
            {
                failpoint::panic("expiry-job-panic");
            }
        }
        tracing::debug!("expiry job stopped");
    })
}

/// Runs `expire` batch after batch until one comes back short, a batch fails, or shutdown; says
/// how many rows it deleted and whether no batch failed.
async fn drain<F, Fut>(shutdown: &CancellationToken, expire: F) -> (u64, bool)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<u64, sqlx::Error>>,
{
    let mut deleted = 0;
    // Checked between batches too, so a long drain does not delay shutdown.
    while !shutdown.is_cancelled() {
        match expire().await {
            Ok(count) => {
                deleted += count;
                if count < BATCH {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(%error, "expiry failed; it runs again next interval");
                return (deleted, false);
            }
        }
    }
    (deleted, true)
}

/// Describes `service`'s expiry job's series to the recorder.
pub fn describe_metrics(service: ServiceName) {
    metrics::describe_counter!(
        service.metric(DELETED),
        "Expired rows deleted by the expiry job, by table."
    );
    metrics::describe_histogram!(
        service.metric(DURATION),
        metrics::Unit::Seconds,
        "Time of one run of the expiry job."
    );
}
