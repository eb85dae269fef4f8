//! The command line of the service: `serve`, `processor` (the simulated card processor),
//! `migrate`, `account create`, `account rotate-key`, `account revoke-key`, `reconcile`,
//! `keys settle` and `openapi`, each
//! setting also readable from the environment. With the `dev` feature (on by default) the dev
//! tools join them: `dev`, `pay`, `demo`, `webhook send`, `webhook listen` and `fixture` (see
//! [`crate::dev`]).

use clap::{Parser, Subcommand};
use tokio::net::TcpListener;

use crate::app::{self, Application};
use crate::config::{self, DatabaseArgs, ListenArgs, ProcessorLink, Settings};
use crate::exit::refused_settings;
use crate::{accounts, db, reconcile, settle};
use processor::{Processor, ProcessorListen, ProcessorSettings};
use service::server::shutdown_signal;

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
    /// Runs the HTTP API; applies pending migrations at start, then refuses to start while keys
    /// wait at a recovery point that no unit of work of this build resumes.
    Serve {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        listen: ListenArgs,
        #[command(flatten)]
        settings: Settings,
    },
    /// Runs the simulated card processor idempay calls; applies pending migrations at start.
    Processor {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        listen: ProcessorListen,
        #[command(flatten)]
        settings: ProcessorSettings,
    },
    /// Applies pending migrations and exits.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
        /// Then distributes the tables by account on the Citus cluster DATABASE_URL names (its
        /// coordinator, with the workers registered); tables already distributed are left alone.
        #[arg(long)]
        citus: bool,
    },
    /// Manages accounts.
    Account {
        #[command(subcommand)]
        command: AccountCommand,
    },
    /// Compares idempay's payments and refunds with the processor's ledger and prints every
    /// difference; exits 1 if there is one.
    Reconcile {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        processor: ProcessorLink,
    },
    /// An account's idempotency keys: settle one held for an operator, or show one (dev tools).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
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
    /// Gives an account a new secret API key, printed as the last line, which replaces its key at
    /// once: the old one stops working on every serving instance within a second.
    #[command(group(clap::ArgGroup::new("holder").required(true)))]
    RotateKey {
        /// The key to replace (`sk_…`).
        #[arg(long, group = "holder")]
        api_key: Option<String>,
        /// The account, for one without a key (its key was revoked).
        #[arg(long, group = "holder")]
        account: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
    /// Revokes a secret API key: it stops working on every serving instance within a second, and
    /// its account has no key until `rotate-key --account` gives it one.
    RevokeKey {
        /// The key to revoke (`sk_…`).
        #[arg(long)]
        api_key: String,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Settles a key held for an operator (its call to the processor got no known outcome within
    /// the recovery window): asks the processor what it made under the key's downstream key, a
    /// read, and records it as the first request would have (the payment or refund, its events,
    /// the key's answer), or, when it made nothing, completes the key with
    /// `processor-made-nothing`. The client's retry then gets that answer. Safe to run twice and
    /// beside running instances; run it with the settings `serve` runs with (the same key TTL and
    /// processor). Exits 0 when the key is settled (or was), 1 otherwise.
    Settle {
        /// The key, as the client sent it in `Idempotency-Key`.
        key: String,
        /// The account the key belongs to (`acct_…`, as `idempay reconcile` names it).
        #[arg(long)]
        account: String,
        #[command(flatten)]
        database: DatabaseArgs,
        /// Boxed: the other command of the group is small.
        #[command(flatten)]
        settings: Box<Settings>,
    },
    /// Prints what became of a key: one block per route it was used on.
    #[cfg(feature = "dev")]
    Show {
        #[command(flatten)]
        api: crate::dev::cli::ApiArgs,
        /// The key, as sent in `Idempotency-Key`.
        key: String,
    },
}

/// The key a command names, refused with a clear message when it does not have the shape of one.
fn api_key(raw: &str) -> anyhow::Result<accounts::ApiKey> {
    accounts::ApiKey::parse(raw.trim()).ok_or_else(|| {
        anyhow::anyhow!("that is not an API key: a key is `sk_` followed by 40 letters and digits")
    })
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            database,
            listen,
            settings,
        } => {
            // Settings that contradict each other are refused as one that cannot be read is.
            db::check_lease(settings.shared.lease, &database.pool).map_err(refused_settings)?;
            config::check_recovery_window(&settings).map_err(refused_settings)?;
            config::check_delivery_retention(
                settings.shared.webhook_delivery_retention,
                &settings.shared.webhook_retry_schedule,
                settings.shared.webhook_delivery_timeout,
            )
            .map_err(refused_settings)?;
            let pool = db::pool_with(&database.database_url, database.pool)?;
            db::migrate(&pool).await?;
            let listener = TcpListener::bind(listen.listen).await?;
            let app = Application::build(settings, pool, listener)?;
            // Right after the migrations, before anything is served or resumed: keys suspended at
            // a point no unit of work of this build resumes refuse the start.
            app.refuse_unresumable().await?;
            #[cfg(feature = "dev")]
            let app = crate::dev::checkout::mount(app, None);
            tracing::info!(address = %app.local_addr()?, "serving");
            app.run_until_stopped(shutdown_signal()).await?;
        }
        Command::Processor {
            database,
            listen,
            settings,
        } => {
            db::check_lease(settings.shared.lease, &database.pool).map_err(refused_settings)?;
            settings.check_redelivery().map_err(refused_settings)?;
            let pool = db::pool_with(&database.database_url, database.pool)?;
            db::migrate(&pool).await?;
            let listener = TcpListener::bind(listen.listen).await?;
            let processor = Processor::build(settings, pool, listener)?;
            tracing::info!(address = %processor.local_addr()?, "processor serving");
            processor.run_until_stopped(shutdown_signal()).await?;
        }
        Command::Migrate { database, citus } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            db::migrate(&pool).await?;
            eprintln!("migrations applied");
            if citus {
                let distribution = db::distribute(&pool).await?;
                eprintln!(
                    "distributed by account on Citus: {}",
                    if distribution.tables.is_empty() {
                        "every table already was".to_owned()
                    } else {
                        distribution.tables.join(", ")
                    }
                );
            }
        }
        Command::Account {
            command: AccountCommand::Create { name, database },
        } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            let (account, key) = accounts::create(&pool, &name).await?;
            eprintln!("created account {} ({})", account.id(), account.name());
            println!("{}", key.expose());
        }
        Command::Account {
            command:
                AccountCommand::RotateKey {
                    api_key: key,
                    account,
                    database,
                },
        } => {
            let holder = match (key, account) {
                (Some(key), _) => accounts::KeyHolder::Key(api_key(&key)?),
                (None, Some(account)) => accounts::KeyHolder::Account(account),
                (None, None) => anyhow::bail!("name the key to rotate: --api-key or --account"),
            };
            let pool = db::pool_with(&database.database_url, database.pool)?;
            let (account, key) = accounts::rotate_key(&pool, &holder).await?;
            eprintln!(
                "new key for account {} ({}); the old one no longer works",
                account.id(),
                account.name()
            );
            println!("{}", key.expose());
        }
        Command::Account {
            command:
                AccountCommand::RevokeKey {
                    api_key: key,
                    database,
                },
        } => {
            let key = api_key(&key)?;
            let pool = db::pool_with(&database.database_url, database.pool)?;
            let account = accounts::revoke_key(&pool, &key).await?;
            eprintln!(
                "revoked the key of account {} ({}); `idempay account rotate-key --account {}` \
                 gives it a new one",
                account.id(),
                account.name(),
                account.id()
            );
        }
        Command::Reconcile {
            database,
            processor,
        } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            let report = reconcile::run(&pool, &processor).await?;
            for difference in &report.differences {
                println!("{difference}");
            }
            // Not differences: said, since one that stays in flight may become one.
            for in_flight in &report.in_flight {
                println!("{in_flight}");
            }
            // Not differences either, nor in the report's output: warnings, on stderr.
            for suspended in &report.suspended {
                eprintln!("{suspended}");
            }
            println!("{}", report.summary());
            if !report.is_clean() {
                std::process::exit(1);
            }
        }
        Command::Keys {
            command:
                KeysCommand::Settle {
                    key,
                    account,
                    database,
                    settings,
                },
        } => {
            let pool = db::pool_with(&database.database_url, database.pool)?;
            let settled = settle::settle(&pool, &settings, &account, &key).await?;
            for line in &settled.lines {
                println!("{line}");
            }
            if !settled.done {
                anyhow::bail!("{}", settled.summary);
            }
            eprintln!("{}", settled.summary);
        }
        #[cfg(feature = "dev")]
        Command::Keys {
            command: KeysCommand::Show { api, key },
        } => crate::dev::cli::show_key(api, &key).await?,
        Command::Openapi => print!("{}", app::spec_json()),
        #[cfg(feature = "dev")]
        Command::Dev(command) => crate::dev::cli::run(command).await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::CommandFactory;

    use super::Cli;

    /// Every setting the command line reads from the environment, with its default (`—` for none).
    fn settings(command: &clap::Command, found: &mut BTreeMap<String, String>) {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                let default = arg
                    .get_default_values()
                    .first()
                    .map_or("—".to_owned(), |value| {
                        format!("`{}`", value.to_string_lossy())
                    });
                found.insert(env.to_string_lossy().into_owned(), default);
            }
        }
        for sub in command.get_subcommands() {
            settings(sub, found);
        }
    }

    /// Refused before anything else happens: the database named here is never reached.
    #[tokio::test]
    async fn serve_and_processor_refuse_at_start_a_lease_the_pool_could_not_renew_in_time() {
        use clap::Parser;
        let database = ["--database-url", "postgres://127.0.0.1:1/unreachable"];
        let lease = ["--lease", "1s", "--database-acquire-timeout", "5s"];
        let serve = Cli::parse_from([&["idempay", "serve"][..], &database, &lease].concat());
        let processor = Cli::parse_from(
            [
                &["idempay", "processor", "--api-key", "pk_test"][..],
                &database,
                &lease,
            ]
            .concat(),
        );
        for cli in [serve, processor] {
            let refused = super::run(cli).await.unwrap_err().to_string();
            assert!(
                refused.starts_with(
                    "IDEMPAY_LEASE (1s) must be at least 3 × IDEMPAY_DATABASE_ACQUIRE_TIMEOUT (5s)"
                ),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_readme_configuration_table_gives_every_setting_with_its_default() {
        let mut expected = BTreeMap::new();
        settings(&Cli::command(), &mut expected);
        // The settings table beside config.rs, and the processor's own beside its code.
        let tables = [
            include_str!("config.md"),
            include_str!("../crates/processor/README.md"),
        ];
        let documented: BTreeMap<String, String> = tables
            .iter()
            .flat_map(|table| table.lines())
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
                let is_setting = name == "DATABASE_URL" || name.starts_with("IDEMPAY_");
                let default = cells.get(2)?;
                is_setting.then(|| (name.to_owned(), (*default).to_owned()))
            })
            .collect();
        for (name, default) in &expected {
            assert_eq!(
                documented.get(name),
                Some(default),
                "src/config.md's settings table on {name}"
            );
        }
    }
}
