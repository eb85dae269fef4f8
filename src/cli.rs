//! The command line: `serve`, `migrate`, `account create` and `dev`, each setting also readable
//! from the environment.

use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

use crate::app::{Application, shutdown_signal};
use crate::config::{DatabaseArgs, ListenArgs, Settings};
use crate::{accounts, db, dev, openapi};

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
    /// Starts a throwaway PostgreSQL container, creates a demo account and serves until Ctrl-C.
    Dev {
        #[command(flatten)]
        listen: ListenArgs,
        #[command(flatten)]
        settings: Settings,
    },
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
            let pool = db::pool(&database.database_url)?;
            db::migrate(&pool).await?;
            let listener = TcpListener::bind(listen.listen).await?;
            let app = Application::build(settings, pool, listener);
            tracing::info!(address = %app.local_addr()?, "serving");
            app.run_until_stopped(shutdown_signal()).await?;
        }
        Command::Migrate { database } => {
            let pool = db::pool(&database.database_url)?;
            db::migrate(&pool).await?;
            eprintln!("migrations applied");
        }
        Command::Account {
            command: AccountCommand::Create { name, database },
        } => {
            let pool = db::pool(&database.database_url)?;
            let (account, key) = accounts::create(&pool, &name).await?;
            eprintln!("created account {} ({})", account.id(), account.name());
            println!("{}", key.expose());
        }
        Command::Openapi => print!("{}", openapi::spec_json()),
        Command::Dev { listen, settings } => dev::run(listen.listen, settings).await?,
    }
    Ok(())
}
