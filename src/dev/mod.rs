//! The dev tools, apart from the service: built only with the `dev` cargo feature (on by
//! default), so `cargo build --no-default-features` makes a service binary without testcontainers,
//! a Docker client or demo code.
//!
//! - `idempay dev` (this file), the zero-set-up mode behind `make run`: a throwaway PostgreSQL
//!   container ([`postgres`]), a demo account and ready-to-paste `curl` examples, until Ctrl-C.
//! - [`demo`]: payment intents through a lossy network; [`cli`]: the dev commands.

pub mod cli;
pub mod demo;
pub mod postgres;

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::config::Settings;
use crate::http::{Application, shutdown_signal};
use crate::webhooks::WebhookSecret;
use crate::{accounts, db};
use postgres::Postgres;

pub async fn run(listen: SocketAddr, mut settings: Settings) -> anyhow::Result<()> {
    settings
        .webhook_secret
        .get_or_insert_with(WebhookSecret::generate);
    eprintln!("Starting a throwaway PostgreSQL container…");
    let postgres = Postgres::start().await?;
    let served = serve(&postgres, listen, settings).await;
    eprintln!("Removing the PostgreSQL container…");
    postgres.remove().await?;
    served
}

async fn serve(postgres: &Postgres, listen: SocketAddr, settings: Settings) -> anyhow::Result<()> {
    let pool = db::pool(&postgres.url("postgres"))?;
    db::migrate(&pool).await?;
    let (account, key) = accounts::create(&pool, "demo").await?;
    let listener = TcpListener::bind(listen).await?;
    let app = Application::build(settings.clone(), pool, listener);
    let base = format!("http://{}", app.local_addr()?);
    let webhook_secret = settings
        .webhook_secret
        .as_ref()
        .map(WebhookSecret::expose)
        .unwrap_or_default();
    println!("{}", banner(&base, account.id().as_str(), key.expose()));
    println!("{}", webhook_banner(&base, &webhook_secret));
    app.run_until_stopped(shutdown_signal()).await?;
    Ok(())
}

fn banner(base: &str, account: &str, key: &str) -> String {
    let idem_key = uuid::Uuid::new_v4();
    let post = |key_header: &str, body: &str| {
        format!(
            "curl -i {base}/v1/payments \\\n  -H 'Authorization: Bearer {key}' \\\n  \
             -H 'Content-Type: application/json' \\\n  -H 'Idempotency-Key: {key_header}' \\\n  \
             -d '{body}'"
        )
    };
    format!(
        "\nidempay is serving on {base} with a throwaway database (Ctrl-C stops and removes it).\n\
         Demo account {account}, API key:\n\n  {key}\n\n\
         # A payment:\n{}\n\n\
         # The same request again: the stored response, with Idempotent-Replayed: true\n\
         # (run the command above once more).\n\n\
         # The same key with another body: 422\n{}\n\n\
         # A slow charge and, half a second later, its retry: the retry gets 409 with Retry-After\n\
         for attempt in 1 2; do\n{} &\n  sleep 0.5\ndone; wait\n",
        post(
            &idem_key.to_string(),
            r#"{"amount": 4200, "currency": "eur", "order": "cmd_9182"}"#
        ),
        post(
            &idem_key.to_string(),
            r#"{"amount": 9900, "currency": "eur", "order": "cmd_9182"}"#
        ),
        post(
            &uuid::Uuid::new_v4().to_string(),
            r#"{"amount": 1500, "currency": "eur", "payment_method": "pm_card_slow"}"#
        ),
    )
}

fn webhook_banner(base: &str, secret: &str) -> String {
    format!(
        "# The processor's webhooks are signed with\n\n  {secret}\n\n\
         # Send one (a dispute of 500 on a payment), twice with the same --id: applied, then duplicate\n\
         IDEMPAY_WEBHOOK_SECRET={secret} target/debug/idempay webhook send \\\n  \
         --url {base}/v1/webhooks/processor --id evt_demo_1 \\\n  \
         --type dispute.created --data '{{\"payment\": \"pay_…\", \"amount\": 500}}'\n"
    )
}
