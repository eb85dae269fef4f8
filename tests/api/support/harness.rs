//! Runs async tests on one shared runtime with one PostgreSQL container for the whole run, and
//! removes the container when the run ends.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use idempay::dev::postgres::Postgres;
use libtest_mimic::{Arguments, Trial};
use linkme::distributed_slice;
use sqlx::{Connection, PgConnection};
use tokio::runtime::{Handle, Runtime};

/// The name of the migrated database every test database is cloned from.
pub const TEMPLATE: &str = "idempay_template";

/// No test may run longer than this; a hang is a failure, not a stuck CI.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);

struct Shared {
    runtime: Handle,
    admin_url: String,
    url_base: String,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// Connection string of `database` in the shared server.
pub fn database_url(database: &str) -> String {
    format!("{}/{database}", shared().url_base)
}

/// Connection string of the server's maintenance database, for `CREATE DATABASE`.
pub fn admin_url() -> &'static str {
    &shared().admin_url
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
    fn trial(&self) -> Trial {
        let run = self.run;
        Trial::test(self.full_name(), move || {
            let outcome = shared().runtime.block_on(async move {
                tokio::time::timeout(TEST_TIMEOUT, tokio::spawn(run())).await
            });
            match outcome {
                Ok(Ok(())) => Ok(()),
                Ok(Err(join_error)) => match join_error.try_into_panic() {
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(error) => Err(format!("test task failed: {error}").into()),
                },
                Err(_) => Err(format!("test timed out after {TEST_TIMEOUT:?}").into()),
            }
        })
    }
}

/// Every registered test as a trial, by name.
fn trials() -> Vec<Trial> {
    let mut tests: Vec<&Test> = TESTS.iter().collect();
    tests.sort_by_key(|test| test.full_name());
    tests.into_iter().map(Test::trial).collect()
}

/// Runs the suite: starts PostgreSQL (unless only listing), runs the trials the arguments select,
/// prints what the contract covered and removes the container.
pub fn run(args: Arguments) -> ExitCode {
    let trials = trials();
    if args.list {
        return libtest_mimic::run(&args, trials).exit_code();
    }
    let runtime = Runtime::new().expect("a tokio runtime");
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
    conclusion.exit_code()
}

async fn start() -> anyhow::Result<Postgres> {
    let postgres = Postgres::start().await?;
    let admin_url = postgres.url("postgres");
    let mut admin = PgConnection::connect(&admin_url).await?;
    sqlx::query(&format!("CREATE DATABASE {TEMPLATE}"))
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
        admin_url,
        url_base,
    });
    Ok(postgres)
}
