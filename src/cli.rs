//! The command line of the service: `serve`, `migrate`, `account create` and `openapi`, each
//! setting also readable from the environment. With the `dev` feature (on by default) the dev
//! tools join them: `dev`, `pay`, `demo` and `webhook send` (see [`crate::dev`]).

use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

use crate::config::{DatabaseArgs, ListenArgs, Settings};
use crate::http::{Application, openapi, shutdown_signal};
use crate::{accounts, db};

#[derive(Parser, Debug)]
#[command(
    name = "idempay",
    version,
    about = "A payment API where idempotency keys turn \
    at-least-once delivery into exactly-once effects"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Runs the HTTP API; applies pending migrations at start.
    Serve {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        listen: ListenArgs,
        #[command(flatten)]
        settings: Settings,
    },
    /// Applies pending migrations and exits.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Manages accounts.
    Account {
        #[command(subcommand)]
        command: AccountCommand,
    },
    /// Prints the OpenAPI description of the API.
    Openapi,
    #[cfg(feature = "dev")]
    #[command(flatten)]
    Dev(crate::dev::cli::DevCommand),
}

#[derive(Subcommand, Debug)]
pub enum AccountCommand {
    /// Creates an account and prints its new secret API key as the last line.
    Create {
        /// The account's display name.
        #[arg(long)]
        name: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            database,
            listen,
            settings,
        } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            db::migrate(&pool).await?;
            let listener = TcpListener::bind(listen.listen).await?;
            let app = Application::build(settings, pool, listener);
            tracing::info!(address = %app.local_addr()?, "serving");
            app.run_until_stopped(shutdown_signal()).await?;
        }
        Command::Migrate { database } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            db::migrate(&pool).await?;
            eprintln!("migrations applied");
        }
        Command::Account {
            command: AccountCommand::Create { name, database },
        } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            let (account, key) = accounts::create(&pool, &name).await?;
            eprintln!("created account {} ({})", account.id(), account.name());
            println!("{}", key.expose());
        }
        Command::Openapi => print!("{}", openapi::spec_json()),
        #[cfg(feature = "dev")]
        Command::Dev(command) => crate::dev::cli::run(command).await?,
    }
    Ok(())
}
