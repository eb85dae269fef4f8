//! Runs async tests on one shared runtime with one PostgreSQL container for the whole run, and
//! removes the container when the run ends.

use std::future::Future;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

use idempay::postgres::Postgres;
use libtest_mimic::{Arguments, Trial};
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

/// Builds a trial that runs `test` on the shared runtime.
pub fn trial<F, Fut>(name: &str, test: F) -> Trial
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Trial::test(name, move || {
        let outcome = shared().runtime.block_on(async move {
            tokio::time::timeout(TEST_TIMEOUT, tokio::spawn(test())).await
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

/// `trials![module; test_a, test_b]` names each test `module::test_a`.
#[macro_export]
macro_rules! trials {
    ($module:ident; $($test:ident),* $(,)?) => {
        vec![$($crate::harness::trial(
            concat!(stringify!($module), "::", stringify!($test)),
            $test,
        )),*]
    };
}

pub fn run(args: Arguments, trials: Vec<Trial>) -> ExitCode {
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
    println!("\n{}", crate::contract::report());
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
