//! Runs async tests on one shared runtime with one PostgreSQL container for the whole run, and
//! removes the container when the run ends.
//!
//! With `IDEMPAY_TEST_CITUS=1` it is the cluster suite instead: only the tests marked
//! `#[api_test(citus)]`, on a Citus cluster (a coordinator and two workers, [`super::citus`])
//! started for the run and removed when it ends; every test's database exists on every node, and
//! the tests connect to the coordinator.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use idempay::dev::postgres::Postgres;
use libtest_mimic::{Arguments, Trial};
use linkme::distributed_slice;
use sqlx::{Connection, PgConnection};
use tokio::runtime::{Handle, Runtime};

use crate::support::citus::{self, Cluster};

/// The name of the migrated database every test database is cloned from.
pub const TEMPLATE: &str = "idempay_template";

/// No test may run longer than this; a hang is a failure, not a stuck CI. It counts the wait of a
/// test queued behind another storm (`helpers::one_storm_at_a_time`).
const TEST_TIMEOUT: Duration = Duration::from_secs(300);

/// How long a finished test's databases stay open on the cluster before they are closed: the
/// test's servers and pools, stopped when it ended, may still be closing.
const CLOSE_AFTER: Duration = Duration::from_secs(5);

struct Shared {
    runtime: Handle,
    /// Every node's connection string without the database, the one tests connect to first: the
    /// server alone, or the cluster's coordinator then its workers.
    node_url_bases: Vec<String>,
    /// Whether this run is the cluster suite.
    citus: bool,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// Connection string of `database` in the shared server (on the cluster, the coordinator).
pub fn database_url(database: &str) -> String {
    format!("{}/{database}", shared().node_url_bases[0])
}

/// Connection strings of `database` on every node, the one tests connect to first: the server's
/// alone, or the coordinator's then each worker's.
pub fn node_database_urls(database: &str) -> Vec<String> {
    shared()
        .node_url_bases
        .iter()
        .map(|base| format!("{base}/{database}"))
        .collect()
}

tokio::task_local! {
    /// The databases the running test created, closed on the cluster once it ended.
    static CREATED: Arc<Mutex<Vec<String>>>;
}

/// Test databases created on the cluster, and the time they took in all, for the run's summary.
static CLUSTER_DATABASES: AtomicU64 = AtomicU64::new(0);
static CLUSTER_DATABASE_MICROS: AtomicU64 = AtomicU64::new(0);

/// The tests that failed, with why, printed again as the run's last lines: a CI log cut to its
/// beginning and its end then still says what failed, after the contract's long report.
static FAILURES: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// What a test's panic said: its message, or a placeholder for a payload that is not text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The message of a panic a test causes on purpose (it checks how the code under test survives
/// one). The panic hook does not report it: the first "panicked at" of a run's output is then a
/// failure.
pub const EXPECTED_PANIC: &str = "expected by the test: a panic inside the unit of work";

/// Installs a panic hook that reports every panic as the default hook does, except
/// [`EXPECTED_PANIC`].
fn quiet_expected_panics() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if panic_message(info.payload()) != EXPECTED_PANIC {
            report(info);
        }
    }));
}

/// Prints the failed tests and why, last, and returns the run's exit code.
fn conclude(conclusion: &libtest_mimic::Conclusion) -> ExitCode {
    let failures = FAILURES.lock().unwrap_or_else(PoisonError::into_inner);
    if !failures.is_empty() {
        eprintln!(
            "\nfailed, {} of {}:",
            failures.len(),
            conclusion.num_passed + conclusion.num_failed
        );
        for (name, why) in failures.iter() {
            eprintln!("  {name}: {}", why.replace('\n', "\n    "));
        }
    }
    conclusion.exit_code()
}

/// Creates `database` as a copy of the migrated template: on the server, or on every node of the
/// cluster at once, each node copying its own template (the coordinator then finds the shards in
/// the workers' copies of the same name). Citus's own propagation of `CREATE DATABASE` is kept
/// off: it would create the database empty on the workers first.
pub async fn create_database(database: &str) -> Result<(), sqlx::Error> {
    let shared = shared();
    let started = Instant::now();
    let statement = format!("CREATE DATABASE {database} TEMPLATE {TEMPLATE}");
    futures::future::try_join_all(shared.node_url_bases.iter().map(|base| {
        let statement = &statement;
        async move {
            let mut admin = PgConnection::connect(&format!("{base}/postgres")).await?;
            if shared.citus {
                citus::no_database_propagation(&mut admin).await?;
            }
            sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                .execute(&mut admin)
                .await?;
            admin.close().await
        }
    }))
    .await?;
    if shared.citus {
        CLUSTER_DATABASES.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        CLUSTER_DATABASE_MICROS.fetch_add(micros, Ordering::Relaxed);
        let _ = CREATED.try_with(|created| created.lock().unwrap().push(database.to_owned()));
    }
    Ok(())
}

/// Closes a finished test's databases on every node, coordinator first: no connection is allowed
/// and those left are ended. Each database with the extension holds, on every node, a maintenance
/// daemon (a background worker) and connections cached between the nodes: kept for the whole run
/// they would outnumber what the nodes allow. Dropping the databases would free their disk too,
/// but `DROP DATABASE` forces a checkpoint on each node, which made the suite half as slow again
/// (each database's creation then took twice as long); closed, they stay until the cluster goes.
/// Failures are left: the cluster is removed at the end of the run anyway.
async fn close_later(databases: Vec<String>) {
    tokio::time::sleep(CLOSE_AFTER).await;
    let shared = shared();
    for database in databases {
        for base in &shared.node_url_bases {
            let _ = citus::close_to_connections(base, &database).await;
        }
    }
}

fn shared() -> &'static Shared {
    SHARED
        .get()
        .expect("the harness starts PostgreSQL before any test")
}

/// One test of the suite, as `#[api_test]` registers it.
pub struct Test {
    /// The module that declares it, from `module_path!()`.
    pub module: &'static str,
    /// The test function's name.
    pub name: &'static str,
    /// Part of the cluster suite (`#[api_test(citus)]`), which `IDEMPAY_TEST_CITUS=1` runs.
    pub citus: bool,
    /// Meaningful on the cluster only (`#[api_test(citus_only)]`): ignored on a single server.
    pub citus_only: bool,
    /// A measurement (`#[api_test(bench)]`), which a bench script runs with `--ignored`.
    pub bench: bool,
    pub run: fn() -> Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// Every test of the suite: each `#[api_test]` adds its own entry (see `tests/macros`).
#[distributed_slice]
pub static TESTS: [Test];

impl Test {
    /// `module::test_name`: the last segment of the declaring module, then the function. CI logs
    /// and `cargo test --test api -- NAME` filters use these names.
    fn full_name(&self) -> String {
        let module = self.module.rsplit("::").next().unwrap_or(self.module);
        format!("{module}::{}", self.name)
    }

    /// A trial that runs this test on the shared runtime.
    fn trial(&self, citus: bool) -> Trial {
        let run = self.run;
        let name = self.full_name();
        Trial::test(name.clone(), move || {
            let shared = shared();
            let created = Arc::new(Mutex::new(Vec::new()));
            let scope = created.clone();
            let outcome = shared.runtime.block_on(async move {
                let mut test = tokio::spawn(CREATED.scope(scope, run()));
                let outcome = tokio::time::timeout(TEST_TIMEOUT, &mut test).await;
                // A test that ran out of time stops here, its processes with it (they are killed
                // when dropped), before its databases are closed under it.
                test.abort();
                outcome
            });
            if shared.citus {
                let databases = std::mem::take(&mut *created.lock().unwrap());
                shared.runtime.spawn(close_later(databases));
            }
            let failure = match outcome {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(join_error)) => match join_error.try_into_panic() {
                    Ok(panic) => panic_message(panic.as_ref()),
                    Err(error) => format!("test task failed: {error}"),
                },
                Err(_) => format!("test timed out after {TEST_TIMEOUT:?}"),
            };
            FAILURES
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((name.clone(), failure.clone()));
            Err(failure.into())
        })
        .with_ignored_flag(self.bench || (self.citus_only && !citus))
    }
}

/// Every registered test as a trial, by name; on the cluster, only the cluster suite's.
fn trials(citus: bool) -> Vec<Trial> {
    let mut tests: Vec<&Test> = TESTS.iter().filter(|test| test.citus || !citus).collect();
    tests.sort_by_key(|test| test.full_name());
    tests.into_iter().map(|test| test.trial(citus)).collect()
}

/// Runs the suite: starts PostgreSQL (unless only listing), runs the trials the arguments select,
/// prints what the contract covered and removes the container.
pub fn run(args: Arguments) -> ExitCode {
    let citus = citus::enabled();
    let trials = trials(citus);
    if args.list {
        return libtest_mimic::run(&args, trials).exit_code();
    }
    quiet_expected_panics();
    let runtime = Runtime::new().expect("a tokio runtime");
    if citus {
        return run_on_cluster(&args, trials, &runtime);
    }
    let postgres = match runtime.block_on(start()) {
        Ok(postgres) => postgres,
        Err(error) => {
            eprintln!("cannot start PostgreSQL for the tests: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let conclusion = libtest_mimic::run(&args, trials);
    println!("\n{}", crate::support::contract::report());
    if let Err(error) = runtime.block_on(postgres.remove()) {
        eprintln!("could not remove the PostgreSQL container: {error:#}");
    }
    conclude(&conclusion)
}

async fn start() -> anyhow::Result<Postgres> {
    let postgres = Postgres::start().await?;
    let admin_url = postgres.url("postgres");
    let mut admin = PgConnection::connect(&admin_url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {TEMPLATE}")))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    // Migrate the template once; every test database is a cheap file-level copy of it.
    let pool = idempay::db::pool(&postgres.url(TEMPLATE))?;
    idempay::db::migrate(&pool).await?;
    pool.close().await;
    let url_base = admin_url
        .rsplit_once('/')
        .map(|(base, _)| base.to_owned())
        .unwrap_or_default();
    let _ = SHARED.set(Shared {
        runtime: Handle::current(),
        node_url_bases: vec![url_base],
        citus: false,
    });
    Ok(postgres)
}

/// The cluster suite: starts the cluster and its template, runs the trials, prints what the
/// contract covered and what the databases cost, and removes the cluster (on failure and on
/// Ctrl-C too).
fn run_on_cluster(args: &Arguments, trials: Vec<Trial>, runtime: &Runtime) -> ExitCode {
    let cluster = match Cluster::up() {
        Ok(cluster) => cluster,
        Err(error) => {
            eprintln!("cannot start the Citus cluster for the tests: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    runtime.spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("citus: interrupted; removing the cluster");
            citus::down_now();
            std::process::exit(130);
        }
    });
    if let Err(error) = runtime.block_on(start_on_cluster(&cluster)) {
        eprintln!("cannot make the template database on the Citus cluster: {error:#}");
        return ExitCode::FAILURE;
    }
    let conclusion = libtest_mimic::run(args, trials);
    println!("\n{}", crate::support::contract::report());
    let databases = CLUSTER_DATABASES.load(Ordering::Relaxed);
    if let Some(micros) = CLUSTER_DATABASE_MICROS
        .load(Ordering::Relaxed)
        .checked_div(databases)
    {
        println!(
            "citus: {databases} test databases, each made on the {} nodes in {} ms on average",
            cluster.ports().len(),
            micros / 1000
        );
    }
    let crashes = cluster.crashes();
    if !crashes.is_empty() {
        println!("citus: server processes of the cluster crashed during the run:");
        for crash in &crashes {
            println!("  {crash}");
        }
    }
    drop(cluster);
    conclude(&conclusion)
}

async fn start_on_cluster(cluster: &Cluster) -> anyhow::Result<()> {
    let took = cluster.create_template(TEMPLATE).await?;
    let ports = cluster.ports();
    eprintln!(
        "citus: {TEMPLATE} made on the {} nodes (coordinator on 127.0.0.1:{}) in {:.1} s",
        ports.len(),
        ports[0],
        took.as_secs_f64()
    );
    let node_url_bases: Vec<String> = ports.iter().map(|&port| Cluster::url_base(port)).collect();
    let _ = SHARED.set(Shared {
        runtime: Handle::current(),
        node_url_bases,
        citus: true,
    });
    Ok(())
}
