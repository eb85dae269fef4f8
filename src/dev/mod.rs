//! The dev tools, apart from the service: built only with the `dev` cargo feature (on by
//! default), so `cargo build --no-default-features` makes a service binary without testcontainers,
//! a Docker client or demo code.
//!
//! - `idempay dev` (this file), the zero-set-up mode behind `make run`: a throwaway PostgreSQL
//!   container ([`postgres`]), the card processor and the API as two services, a demo account
//!   and a banner of commands to paste, each runnable from any directory (a test runs every one:
//!   `tests/api/tools/banner.rs`), until Ctrl-C. Webhook deliveries are retried on a schedule of
//!   seconds ([`DEV_RETRY_SCHEDULE`]), so that a receiver's failures are seen retried while one
//!   watches.
//! - [`demo`]: payment intents through a lossy network; [`listen`]: a receiver of a merchant
//!   endpoint's events; [`cli`]: the dev commands.
//! - [`checkout`]: the checkout page `idempay dev` serves at `/demo/checkout`
//!   (`IDEMPAY_DEMO_UI`), where a double click charges once.
//! - [`fixture`]: `idempay fixture`, the conformance suite's fixture routes behind the mechanism.

pub mod checkout;
pub mod cli;
pub mod demo;
pub mod fixture;
pub mod listen;
pub mod postgres;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::app::Application;
use crate::config::Settings;
use crate::db::{PoolLimits, check_lease};
use crate::{accounts, db};
use processor::{Processor, ProcessorApiKey, ProcessorSettings};
use service::ids;
use service::outbox::{RetrySchedule, WebhookSecrets};
use service::server::shutdown_signal;

/// Where `idempay dev` runs the processor, as `idempay processor` does by default; any free
/// loopback port when another process holds it.
const PROCESSOR_PORT: u16 = 8081;
/// The port the banner's receiver (`idempay webhook listen`) and the endpoint it registers use,
/// as `stripe listen` forwards to 4242; any free loopback port when another process holds it.
const RECEIVER_PORT: u16 = 4242;
/// The delays between webhook delivery attempts in `idempay dev`, both senders' (the processor's
/// to the API, the API's to merchant endpoints), unless `IDEMPAY_WEBHOOK_RETRY_SCHEDULE` says
/// otherwise: seconds first, where production's default waits minutes then hours, so that a
/// receiver run with `--fail-first 2` shows both retries within ten seconds, and a processor event
/// refused until its payment is recorded comes back as soon; then hours, so that such an event is
/// still redelivered for as long as its payment may take to be recorded (the recovery window:
/// `config::check_processor_redelivery`).
pub const DEV_RETRY_SCHEDULE: &str = "2s,5s,10s,30s,1m,5m,30m,2h,5h,10h";
use postgres::Postgres;

pub async fn run(listen: SocketAddr, mut settings: Settings) -> anyhow::Result<()> {
    // The dev database's pool has the default limits.
    check_lease(settings.shared.lease, &PoolLimits::default()).map_err(anyhow::Error::msg)?;
    settings
        .shared
        .webhook_secrets
        .get_or_insert_with(WebhookSecrets::generate);
    // The endpoints a developer registers are on this machine: `idempay webhook listen`.
    settings.webhook_allow_private = true;
    // Production's schedule unless one was asked for: a schedule equal to the default is taken
    // as not asked for.
    if settings.shared.webhook_retry_schedule == RetrySchedule::default() {
        settings.shared.webhook_retry_schedule =
            RetrySchedule::parse(DEV_RETRY_SCHEDULE).map_err(anyhow::Error::msg)?;
    }
    // As `serve` checks them; and here the processor's events come on this schedule.
    crate::config::check_recovery_window(&settings).map_err(anyhow::Error::msg)?;
    crate::config::check_processor_redelivery(&settings).map_err(anyhow::Error::msg)?;
    eprintln!("Starting a throwaway PostgreSQL container…");
    let postgres = Postgres::start().await?;
    let served = serve(&postgres, listen, settings).await;
    eprintln!("Removing the PostgreSQL container…");
    postgres.remove().await?;
    served
}

async fn serve(
    postgres: &Postgres,
    listen: SocketAddr,
    mut settings: Settings,
) -> anyhow::Result<()> {
    let pool = db::pool(&postgres.url("postgres"))?;
    db::migrate(&pool).await?;
    let (account, key) = accounts::create(&pool, "demo").await?;
    let listener = TcpListener::bind(listen).await?;
    let base = format!("http://{}", listener.local_addr()?);
    let webhook_secrets = settings
        .shared
        .webhook_secrets
        .clone()
        .unwrap_or_else(WebhookSecrets::generate);

    // The processor, a service of its own: its events go to the API's webhook intake.
    let processor_key = ids::generate("sk_dev", 32);
    let mut processor_settings =
        ProcessorSettings::new(ProcessorApiKey::parse(&processor_key).map_err(anyhow::Error::msg)?);
    processor_settings.shared = settings.shared.clone();
    processor_settings.shared.webhook_secrets = Some(webhook_secrets.clone());
    processor_settings.webhook_url = Some(format!("{base}/v1/webhooks/processor"));
    let processor_listener = match TcpListener::bind((Ipv4Addr::LOCALHOST, PROCESSOR_PORT)).await {
        Ok(listener) => listener,
        Err(_) => TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?,
    };
    let processor =
        Processor::build(processor_settings, pool.clone(), processor_listener)?.sharing_expiry();
    let processor_url = format!("http://{}", processor.local_addr()?);
    settings.processor.url = Some(processor_url.clone());
    settings.processor.api_key = Some(processor_key.clone());

    // The checkout page pays as the account the banner shows, so the banner's key sees its
    // payments too.
    settings.demo_ui = true;
    let exe = executable()?;
    let banner = banner(&base, account.id().as_str(), key.expose());
    let receiver = Receiver {
        port: receiver_port(),
        schedule: settings.shared.webhook_retry_schedule.clone(),
    };
    let endpoint_banner = endpoint_banner(&base, key.expose(), &exe, &receiver);
    let app = checkout::mount(
        Application::build(settings, pool.clone(), listener)?,
        Some(key),
    );
    println!("{banner}");
    println!(
        "{}",
        processor_banner(&base, &processor_url, &processor_key)
    );
    let ledgers = Ledgers {
        processor_url: &processor_url,
        processor_key: &processor_key,
        database_url: &postgres.url("postgres"),
        exe: &exe,
    };
    println!(
        "# The database, for `{exe} reconcile`, `{exe} keys show` and `{exe} account create`:\n\n  \
         export DATABASE_URL='{}'\n",
        ledgers.database_url
    );
    println!("{}", webhook_banner(&ledgers, &webhook_secrets.expose()));
    println!("{endpoint_banner}");
    // Ctrl-C stops the API first (it finishes its requests, which may call the processor), then
    // the processor.
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let processor =
        tokio::spawn(processor.run_until_stopped(async move { stopped.cancelled().await }));
    let served = app.run_until_stopped(shutdown_signal()).await;
    stop.cancel();
    processor.await??;
    // Work a request started goes on after its answer (a retry finds its result), so a statement
    // may still be running: the pool is closed once each connection is back, before the
    // container goes, so that none is cut off mid-use (bounded, should one never come back).
    if tokio::time::timeout(POOL_CLOSE_WITHIN, pool.close())
        .await
        .is_err()
    {
        tracing::warn!("a connection was still in use {POOL_CLOSE_WITHIN:?} after the stop");
    }
    Ok(served?)
}

/// How long a stop waits for the connections still in use.
const POOL_CLOSE_WITHIN: Duration = Duration::from_secs(10);

fn processor_banner(base: &str, processor_url: &str, processor_key: &str) -> String {
    format!(
        "# The API's docs: {base}/docs\n\
         # A checkout page where a double click charges once: {base}/demo/checkout\n\
         # The card processor runs at {processor_url}; idempay authenticates to it with\n\n  \
         {processor_key}\n\n\
         # Every charge idempay makes carries an Idempotency-Key of idempay's own. The processor's ledger:\n\
         curl -s {processor_url}/v1/charges -H 'Authorization: Bearer {processor_key}'\n"
    )
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
         for attempt in 1 2; do\n{} &\n  sleep 0.5\ndone; wait\n\n\
         # Authorize now, capture later: a manual payment holds 5000 (requires_capture)…\n{}\n\n\
         # …and a capture takes 3000 of it, under a key of its own (put the payment's id for pay_…):\n\
         # succeeded, with amount_captured; the rest is released\n\
         curl -i {base}/v1/payments/pay_…/capture \\\n  -H 'Authorization: Bearer {key}' \\\n  \
         -H 'Content-Type: application/json' \\\n  -H 'Idempotency-Key: {}' \\\n  \
         -d '{{\"amount_to_capture\": 3000}}'\n",
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
        post(
            &uuid::Uuid::new_v4().to_string(),
            r#"{"amount": 5000, "currency": "eur", "capture_method": "manual"}"#
        ),
        uuid::Uuid::new_v4(),
    )
}

/// The processor's webhook secret, and a dispute opened where disputes come from: at the
/// processor, as the cardholder's bank opens one (its route `POST /v1/charges/{id}/disputes`). The
/// processor records it in its ledger and sends its own `charge.dispute.created`, which idempay
/// applies: the two ledgers agree, and `idempay reconcile` finds nothing (an event sent by hand
/// with `idempay webhook send` would name a dispute the processor never made).
/// Then the two ledgers compared by `idempay reconcile`, as an operator runs it.
fn webhook_banner(processor: &Ledgers<'_>, secret: &str) -> String {
    let Ledgers {
        processor_url,
        processor_key,
        database_url,
        exe,
    } = processor;
    format!(
        "# The processor's webhooks are signed with\n\n  {secret}\n\n\
         # A dispute of 500 on a payment, opened at the processor as a cardholder's bank would\n\
         # (put the payment's \"charge\" for ch_…): the processor sends its charge.dispute.created,\n\
         # and the payment then shows amount_disputed (GET /v1/disputes lists it).\n\
         curl -s {processor_url}/v1/charges/ch_…/disputes \\\n  \
         -H 'Authorization: Bearer {processor_key}' \\\n  \
         -H 'Content-Type: application/json' -d '{{\"amount\": 500}}'\n\n\
         # The two ledgers compared: every payment, refund and dispute against the processor's\n\
         # (a line per difference, and exit status 1).\n\
         DATABASE_URL='{database_url}' IDEMPAY_PROCESSOR_URL={processor_url} \\\n  \
         IDEMPAY_PROCESSOR_API_KEY={processor_key} {exe} reconcile\n"
    )
}

/// Where the banner's commands find the two ledgers.
struct Ledgers<'a> {
    processor_url: &'a str,
    processor_key: &'a str,
    database_url: &'a str,
    exe: &'a str,
}

/// Where the banner's receiver listens, and the retry schedule it will see.
struct Receiver {
    port: u16,
    schedule: RetrySchedule,
}

/// How to receive the demo account's events on this machine.
fn endpoint_banner(base: &str, key: &str, exe: &str, receiver: &Receiver) -> String {
    let port = receiver.port;
    format!(
        "# Receive the account's events: register an endpoint on this machine…\n\
         curl -s {base}/v1/webhook_endpoints \\\n  -H 'Authorization: Bearer {key}' \\\n  \
         -H 'Content-Type: application/json' \\\n  -H 'Idempotency-Key: {}' \\\n  \
         -d '{{\"url\": \"http://127.0.0.1:{port}/\", \"enabled_events\": [\"*\"]}}'\n\n\
         # …then run a receiver with the secret it answered (put it for whsec_…), and make a payment.\n\
         # It answers 500 to the first 2 deliveries: idempay retries a failed one after each delay\n\
         # of {} (IDEMPAY_WEBHOOK_RETRY_SCHEDULE).\n\
         {exe} webhook listen --port {port} --fail-first 2 --secret whsec_…\n",
        uuid::Uuid::new_v4(),
        receiver.schedule,
    )
}

/// This executable, as a shell word that runs it from any directory: its absolute path, quoted
/// when it holds a character the shell would read.
fn executable() -> anyhow::Result<String> {
    let path = std::env::current_exe()?;
    let path = path.to_string_lossy();
    let plain = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b));
    Ok(if plain {
        path.into_owned()
    } else {
        format!("'{}'", path.replace('\'', r"'\''"))
    })
}

/// [`RECEIVER_PORT`] if nothing listens there now, else any free loopback port.
fn receiver_port() -> u16 {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, RECEIVER_PORT))
        .or_else(|_| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .and_then(|listener| listener.local_addr())
        .map_or(RECEIVER_PORT, |address| address.port())
}
