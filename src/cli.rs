//! The command line: `serve`, `migrate`, `account create` and `dev`, each setting also readable
//! from the environment.

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

use crate::app::{Application, shutdown_signal};
use crate::config::{DatabaseArgs, ListenArgs, Settings};
use crate::webhooks::{self, WebhookSecret};
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
    /// Sends signed events to a webhook endpoint, as the payment processor does.
    Webhook {
        #[command(subcommand)]
        command: WebhookCommand,
    },
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

#[derive(Subcommand, Debug)]
pub enum WebhookCommand {
    /// Signs an event with the webhook secret and delivers it; prints the answer.
    Send {
        /// Where to deliver.
        #[arg(long, default_value = "http://127.0.0.1:8080/v1/webhooks/processor")]
        url: String,
        /// The secret shared with the service (`whsec_…`).
        #[arg(long, env = "IDEMPAY_WEBHOOK_SECRET", hide_env_values = true, value_parser = WebhookSecret::parse)]
        secret: WebhookSecret,
        /// The event type, e.g. `dispute.created`.
        #[arg(long = "type")]
        kind: String,
        /// The event's data object, as JSON, e.g. `{"payment": "pay_…", "amount": 500}`.
        #[arg(long)]
        data: String,
        /// The event id; a new one when absent. Send an id again to see the redelivery ignored.
        #[arg(long)]
        id: Option<String>,
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
        Command::Webhook {
            command:
                WebhookCommand::Send {
                    url,
                    secret,
                    kind,
                    data,
                    id,
                },
        } => {
            let data = serde_json::from_str(&data).context("--data is not JSON")?;
            let id = id.unwrap_or_else(|| format!("evt_{}", uuid::Uuid::new_v4().simple()));
            let (status, body) = webhooks::send(&url, &secret, &id, &kind, data).await?;
            eprintln!("delivered {id}: HTTP {status}");
            println!("{body}");
            anyhow::ensure!((200..300).contains(&status), "the delivery was refused");
        }
        Command::Dev { listen, settings } => dev::run(listen.listen, settings).await?,
    }
    Ok(())
}
