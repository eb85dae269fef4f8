//! The dev tools' commands: `dev` (the service with a throwaway database), `pay` (the retrying
//! client), `keys show` (what became of a key), `demo` (intents through a lossy network),
//! `webhook send` (events signed as the processor signs them), `webhook listen` (a receiver for a
//! merchant endpoint's events) and `fixture` (the conformance suite's fixture behind the
//! mechanism). They join the service's commands in `cli.rs`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use client::{Client, ClientError, RetryPolicy};

use super::demo as lossy;
use crate::config::{ListenArgs, Settings};
use crate::exit::Exit;
use crate::webhooks;
use service::outbox::WebhookSecrets;

/// `idempay pay`'s exit code when the API refused the payment with a final answer (printed).
pub const EXIT_REFUSED: u8 = 1;
/// … when no attempt could connect: nothing was sent (sysexits' `EX_UNAVAILABLE`).
pub const EXIT_NOT_SENT: u8 = 69;
/// … when the deadline ran out with the outcome unknown: run it again later with the same key,
/// printed on stderr, never with a new one (sysexits' `EX_TEMPFAIL`, "try again later").
pub const EXIT_OUTCOME_UNKNOWN: u8 = 75;

/// The exit codes, as `idempay pay --help` lists them (a unit test checks them against the
/// constants).
const PAY_EXIT_CODES: &str = "\
Exit codes:
  0   paid (or answered with a payment made by an earlier attempt): the payment is on stdout
  1   refused with a final answer (declined, invalid, mismatch…): the problem is on stdout
  69  not sent: no attempt could connect to the API before the deadline; nothing happened
  75  outcome unknown: the deadline ran out while the payment may have been made or may still
      be in progress; run again later with the same --idempotency-key (printed on stderr),
      never a new one";

#[derive(Subcommand, Debug)]
pub enum DevCommand {
    /// Pays through the retrying client: one key for the intent, reused on every retry.
    #[command(after_help = PAY_EXIT_CODES)]
    Pay(PayArgs),
    /// Payment intents through a lossy network: the key turns retries into exactly one charge.
    Demo(DemoArgs),
    /// Sends signed events to a webhook endpoint, as the payment processor does, or receives a
    /// merchant endpoint's events.
    Webhook {
        #[command(subcommand)]
        command: WebhookCommand,
    },
    /// Serves the fixture routes of the IETF draft's conformance suite (anyonce) behind the
    /// idempotency mechanism, for its runner or ours; applies pending migrations at start.
    Fixture(super::fixture::FixtureArgs),
    /// Starts a throwaway PostgreSQL container, creates a demo account and serves until Ctrl-C.
    Dev {
        #[command(flatten)]
        listen: ListenArgs,
        /// Boxed: the other commands are small beside the service's settings.
        #[command(flatten)]
        settings: Box<Settings>,
    },
}

/// Where the API is and who calls it.
#[derive(Args, Debug)]
pub struct ApiArgs {
    /// The API's base URL, as `idempay dev` prints it; IDEMPAY_URL when not given.
    #[arg(long, env = "IDEMPAY_URL", default_value = "http://127.0.0.1:8080")]
    pub base_url: String,
    /// The account's secret API key (`sk_…`), as `make run` prints it.
    #[arg(long, env = "IDEMPAY_API_KEY", hide_env_values = true)]
    pub api_key: String,
}

#[derive(Args, Debug)]
pub struct PayArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// The amount in minor units.
    #[arg(long)]
    pub amount: i64,
    /// A lowercase ISO 4217 code.
    #[arg(long)]
    pub currency: String,
    /// A test payment method: pm_card_visa, pm_card_chargeDeclined or pm_card_slow.
    #[arg(long)]
    pub payment_method: Option<String>,
    /// The merchant's order reference.
    #[arg(long)]
    pub order: Option<String>,
    /// The key naming this intent; a new UUID v4 when absent. Pass the same key to retry an intent.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// How long one attempt may take.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// How long the whole call, retries included, may take: retries go on until then. The default
    /// outlasts a lease left by a crashed instance (`IDEMPAY_LEASE`) and a processor call.
    #[arg(long, default_value_t = RetryPolicy::DEFAULT_DEADLINE.into())]
    pub deadline: humantime::Duration,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// How many payment intents to run.
    #[arg(long, default_value_t = 100)]
    pub intents: usize,
    /// The share of answers the proxy loses after the server answered (0 to 1).
    #[arg(long, default_value_t = 0.3)]
    pub loss: f64,
    /// The share of connections the proxy resets before forwarding (0 to 1).
    #[arg(long, default_value_t = 0.05)]
    pub resets: f64,
    /// Intents in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// A new key per attempt, as a client that forgets the intent: shows the duplicates.
    #[arg(long)]
    pub naive: bool,
    /// The processor the server charges at (`make run` prints it): its charges are counted next
    /// to the payments.
    #[arg(long, env = "IDEMPAY_PROCESSOR_URL", requires = "processor_api_key")]
    pub processor_url: Option<String>,
    /// The processor's API key (`make run` prints it).
    #[arg(long, env = "IDEMPAY_PROCESSOR_API_KEY", hide_env_values = true)]
    pub processor_api_key: Option<String>,
    /// The share of the processor's answers it loses during the run (0 to 1), after charging.
    #[arg(long, default_value_t = 0.0, requires = "processor_url")]
    pub processor_loss: f64,
}

/// The data each event type the intake applies needs, as `idempay webhook send --help` lists it
/// (a unit test reads every example back through the intake's parser). `pay_…` and `re_…` are
/// idempay's ids; `ch_…`, `pyr_…` and `dp_…` the processor's.
const EVENT_DATA: &str = "\
Event types and the --data each needs (an event without them is acknowledged `ignored`):
  dispute.created                  {\"payment\": \"pay_…\", \"dispute\": \"dp_…\", \"amount\": 500}
  payment.succeeded                {\"payment\": \"pay_…\"}
  payment.failed                   {\"payment\": \"pay_…\"}
  refund.failed                    {\"refund\": \"re_…\"}
  charge.dispute.created           {\"charge\": \"ch_…\", \"dispute\": \"dp_…\", \"amount\": 500}
  charge.dispute.updated           {\"charge\": \"ch_…\", \"dispute\": \"dp_…\", \"amount\": 500, \"status\": \"under_review\"}
  charge.dispute.closed            {\"charge\": \"ch_…\", \"dispute\": \"dp_…\", \"amount\": 500, \"status\": \"won\"}
  charge.succeeded                 {\"charge\": \"ch_…\"}
  charge.failed                    {\"charge\": \"ch_…\"}
  charge.declined                  {\"charge\": \"ch_…\"}
  charge.refunded                  {\"refund\": \"pyr_…\"}
  charge.refund.failed             {\"refund\": \"pyr_…\"}
A dispute counts once per `dispute` id, whatever the event id.

Exit codes:
  0   applied, or answered duplicate, stale or needs_review: the answer is on stdout
  1   not sent (the type or data cannot apply, said why), refused, or acknowledged `ignored`";

#[derive(Subcommand, Debug)]
pub enum WebhookCommand {
    /// Signs an event with the webhook secret and delivers it, as the processor does; prints the
    /// answer. An event whose type or data cannot apply is not sent.
    #[command(after_help = EVENT_DATA)]
    Send {
        /// Where to deliver.
        #[arg(long, default_value = "http://127.0.0.1:8080/v1/webhooks/processor")]
        url: String,
        /// The secrets shared with the service (`whsec_…`), space separated; the first signs.
        #[arg(long, env = "IDEMPAY_WEBHOOK_SECRET", hide_env_values = true, value_parser = WebhookSecrets::parse)]
        secret: WebhookSecrets,
        /// The event type, e.g. `dispute.created`.
        #[arg(long = "type")]
        kind: String,
        /// The event's data object, as JSON, e.g. `{"payment": "pay_…", "dispute": "dp_…",
        /// "amount": 500}` for `dispute.created` (each type's below).
        #[arg(long)]
        data: String,
        /// The event id; a new one when absent. Send an id again to see it answered `duplicate`.
        #[arg(long)]
        id: Option<String>,
    },
    /// Receives a webhook endpoint's events on 127.0.0.1: verifies each signature, deduplicates
    /// by `webhook-id` and prints each event once, until Ctrl-C. Register
    /// `http://127.0.0.1:PORT/` as an endpoint first (idempay must run with
    /// `IDEMPAY_WEBHOOK_ALLOW_PRIVATE`, as `idempay dev` does), and pass the secret it answered.
    Listen {
        /// The port to listen on, on 127.0.0.1; 0 for any free one (the first line says which).
        #[arg(long, default_value_t = 4242)]
        port: u16,
        /// The endpoint's secret (`whsec_…`), from the answer to its creation; several, space
        /// separated, while one is rotated.
        #[arg(long, value_parser = WebhookSecrets::parse)]
        secret: WebhookSecrets,
        /// Answers 500 to the first N deliveries, to watch them come again.
        #[arg(long, default_value_t = 0)]
        fail_first: usize,
    },
}

pub async fn run(command: DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Pay(args) => pay(args).await,
        DevCommand::Demo(args) => demo(args).await,
        DevCommand::Webhook {
            command:
                WebhookCommand::Send {
                    url,
                    secret,
                    kind,
                    data,
                    id,
                },
        } => send_event(&url, &secret, &kind, &data, id).await,
        DevCommand::Fixture(args) => super::fixture::run(args).await,
        DevCommand::Webhook {
            command:
                WebhookCommand::Listen {
                    port,
                    secret,
                    fail_first,
                },
        } => super::listen::run(port, secret, fail_first).await,
        DevCommand::Dev { listen, settings } => super::run(listen.listen, *settings).await,
    }
}

/// `idempay webhook send`. An event the intake would acknowledge `ignored` whatever it holds is
/// refused here, with the reason the service would only log, and its id is not spent; one
/// acknowledged `ignored` all the same (a payment id that does not exist) fails too, as nothing
/// happened.
async fn send_event(
    url: &str,
    secret: &WebhookSecrets,
    kind: &str,
    data: &str,
    id: Option<String>,
) -> anyhow::Result<()> {
    let data: serde_json::Value = serde_json::from_str(data).context("--data is not JSON")?;
    if let Some(reason) = webhooks::unreadable(kind, &data) {
        anyhow::bail!(
            "not sent: the service would acknowledge it without effect ({reason}); \
             `idempay webhook send --help` lists the data each type needs"
        );
    }
    let id = id.unwrap_or_else(|| format!("evt_{}", uuid::Uuid::new_v4().simple()));
    let (status, body) = webhooks::send(url, secret, &id, kind, data).await?;
    eprintln!("delivered {id}: HTTP {status}");
    println!("{body}");
    anyhow::ensure!((200..300).contains(&status), "the delivery was refused");
    let outcome = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|answer| answer.get("outcome")?.as_str().map(str::to_owned));
    anyhow::ensure!(
        outcome.as_deref() != Some(webhooks::EventOutcome::Ignored.as_str()),
        "acknowledged without effect (`ignored`): nothing was applied, and {id} is spent; the \
         service's log says why"
    );
    Ok(())
}

async fn pay(args: PayArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.api.base_url, &args.api.api_key)
        .with_policy(RetryPolicy {
            attempt_timeout: args.timeout,
            deadline: args.deadline.into(),
            ..RetryPolicy::default()
        })
        .on_attempt(|attempt| {
            let what = match (attempt.result, &attempt.error) {
                (client::AttemptResult::Status { status, .. }, _) => format!("HTTP {status}"),
                (client::AttemptResult::NotSent, Some(error)) => format!("not sent ({error})"),
                (client::AttemptResult::NotSent, None) => "not sent".to_owned(),
                (client::AttemptResult::NoAnswer, Some(error)) => format!("no answer ({error})"),
                (client::AttemptResult::NoAnswer, None) => "no answer".to_owned(),
            };
            match attempt.retry_in {
                Some(delay) => eprintln!(
                    "attempt {}: {what}; retrying in {}",
                    attempt.number,
                    humantime::format_duration(Duration::from_millis(
                        u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)
                    ))
                ),
                None => eprintln!("attempt {}: {what}", attempt.number),
            }
        });
    let payment = client::NewPayment {
        metadata: Default::default(),
        amount: args.amount,
        currency: args.currency,
        order: args.order,
        description: None,
        payment_method: args.payment_method,
        capture_method: None,
    };
    let key = args
        .idempotency_key
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    eprintln!("Idempotency-Key: {key}");
    match client.create_payment(&payment, Some(key.clone())).await {
        Ok(answer) => {
            if answer.replayed {
                eprintln!("replayed: the payment was made by an earlier attempt");
            }
            println!("{}", String::from_utf8_lossy(&answer.raw));
            Ok(())
        }
        Err(ClientError::Api { raw, problem, .. }) => {
            println!("{}", String::from_utf8_lossy(&raw));
            Err(Exit {
                code: EXIT_REFUSED,
                message: format!("{} ({})", problem.title, problem.status),
            }
            .into())
        }
        Err(error @ ClientError::OutcomeUnknown { .. }) => Err(Exit {
            code: EXIT_OUTCOME_UNKNOWN,
            message: format!("{error}: run again with --idempotency-key {key}"),
        }
        .into()),
        Err(error @ ClientError::Unreachable { .. }) => Err(Exit {
            code: EXIT_NOT_SENT,
            message: error.to_string(),
        }
        .into()),
        Err(error @ ClientError::Unexpected { .. }) => Err(error.into()),
    }
}

/// A client for the commands that only read: a refused connection ends the read at once, rather
/// than after the 90 s a write retries for. A read loses nothing by not being retried, and a
/// person who mistyped the URL, or whose server is not running, is told so while still looking.
fn reader(api: &ApiArgs) -> Client {
    Client::new(&api.base_url, &api.api_key).with_unreachable_reads_final()
}

/// What a read that could not connect exits with: the URL it tried, and how to name another.
fn unreachable(api: &ApiArgs, error: &ClientError) -> anyhow::Error {
    Exit {
        code: EXIT_NOT_SENT,
        message: format!(
            "cannot reach the API at {}: {error}. Is idempay running there? --base-url or \
             IDEMPAY_URL names another",
            api.base_url
        ),
    }
    .into()
}

/// Prints a key for a person: one block per route, its fields aligned, absent ones left out.
pub async fn show_key(api: ApiArgs, key: &str) -> anyhow::Result<()> {
    let client = reader(&api);
    match client.get_idempotency_key(key).await {
        Ok(answer) => {
            print!("{}", key_blocks(&answer.value));
            Ok(())
        }
        Err(ClientError::Api { problem, .. }) => Err(Exit {
            code: EXIT_REFUSED,
            message: format!("{} ({}): {}", problem.title, problem.status, problem.detail),
        }
        .into()),
        Err(error @ ClientError::Unreachable { .. }) => Err(unreachable(&api, &error)),
        Err(error) => Err(error.into()),
    }
}

/// The fields of a key's use, in the order a person reads them, with their labels.
const KEY_FIELDS: [(&str, &str); 15] = [
    ("state", "state"),
    ("created_at", "created"),
    ("completed_at", "completed"),
    ("expires_at", "expires"),
    ("locked_until", "locked until"),
    ("recovery_point", "recovery point"),
    ("recovery_state", "recovery state"),
    ("downstream_key", "downstream key"),
    ("recovery_attempts", "recoveries"),
    ("next_recovery_at", "next recovery"),
    ("held_at", "held"),
    ("response_status", "response"),
    ("response_location", "location"),
    ("fingerprint", "fingerprint"),
    ("takeovers", "takeovers"),
];

fn key_blocks(inspection: &serde_json::Value) -> String {
    let width = KEY_FIELDS
        .iter()
        .map(|(_, label)| label.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    let uses = inspection["uses"].as_array().map_or(&[][..], Vec::as_slice);
    for (index, used) in uses.iter().enumerate() {
        if index > 0 {
            out.push('\n');
        }
        out.push_str(&format!(
            "{} {}\n",
            used["route"].as_str().unwrap_or("?"),
            inspection["key"].as_str().unwrap_or("?")
        ));
        for (field, label) in KEY_FIELDS {
            let value = match &used[field] {
                serde_json::Value::Null => continue,
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!("  {label:<width$}  {value}\n"));
        }
    }
    out
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    let options = lossy::Options {
        intents: args.intents,
        faults: lossy::Faults {
            lost_responses: args.loss,
            resets: args.resets,
        },
        naive: args.naive,
        concurrency: args.concurrency,
        processor: match (&args.processor_url, args.processor_api_key) {
            (Some(url), Some(key)) => Some((
                crate::downstream::ProcessorClient::new(
                    url,
                    key,
                    std::time::Duration::from_secs(10),
                )?,
                args.processor_loss,
            )),
            _ => None,
        },
    };
    eprintln!(
        "{} payment intents through a proxy that loses {:.0} % of answers and resets {:.0} % of \
         connections, the processor losing {:.0} % of its answers, {}",
        args.intents,
        args.loss * 100.0,
        args.resets * 100.0,
        args.processor_loss * 100.0,
        if args.naive {
            "with a NEW key for every attempt (--naive)"
        } else {
            "with one idempotency key per intent"
        }
    );
    let total = args.intents;
    let terminal = std::io::stderr().is_terminal();
    let tally = lossy::run(
        &args.api.base_url,
        &args.api.api_key,
        &options,
        move |done| {
            // A bar redrawn in place on a terminal; elsewhere a line every tenth of the way.
            let width = 40;
            let filled = done * width / total.max(1);
            let bar = format!(
                "[{}{}] {done}/{total}",
                "#".repeat(filled),
                " ".repeat(width - filled)
            );
            if terminal {
                eprint!("\r{bar}");
                let _ = std::io::stderr().flush();
            } else if done == total || done % (total / 10).max(1) == 0 {
                eprintln!("{bar}");
            }
        },
    )
    .await?;
    eprintln!();
    println!("{tally}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_printed_one_aligned_block_per_route_without_absent_fields() {
        let inspection = serde_json::json!({
            "key": "k1",
            "uses": [
                { "route": "POST /v1/payments", "state": "completed", "response_status": 201,
                  "locked_until": null, "takeovers": 0 },
                { "route": "POST /v1/payments/{id}/refunds", "state": "in_progress",
                  "locked_until": "2026-12-01T10:00:00Z", "takeovers": 1 },
            ]
        });
        assert_eq!(
            key_blocks(&inspection),
            "POST /v1/payments k1\n\
             \x20 state           completed\n\
             \x20 response        201\n\
             \x20 takeovers       0\n\
             \n\
             POST /v1/payments/{id}/refunds k1\n\
             \x20 state           in_progress\n\
             \x20 locked until    2026-12-01T10:00:00Z\n\
             \x20 takeovers       1\n"
        );
    }

    /// Each example of `webhook send --help`, its placeholders filled with ids of the right
    /// shape, is one the intake can apply; and the data the banner showed before, without the
    /// dispute's id, is refused before it is sent.
    #[test]
    fn send_s_help_gives_data_each_type_can_apply() {
        let mut listed = 0;
        for line in EVENT_DATA.lines().filter(|line| line.contains('{')) {
            let (kind, data) = line.trim().split_once(' ').unwrap();
            let data = data
                .trim()
                .replace("pay_…", "pay_U5PgTqA02dYsv3cLANIGkqIs")
                .replace("re_…", "re_U5PgTqA02dYsv3cLANIGkqIs")
                .replace('…', "Yq3tNw8LbV0c");
            let data: serde_json::Value = serde_json::from_str(&data).unwrap();
            assert_eq!(webhooks::unreadable(kind, &data), None, "{line}");
            listed += 1;
        }
        assert_eq!(listed, 12);
        let old_banner =
            serde_json::json!({"payment": "pay_U5PgTqA02dYsv3cLANIGkqIs", "amount": 500});
        let refused = webhooks::unreadable("dispute.created", &old_banner).unwrap();
        assert!(refused.contains("missing field `dispute`"), "{refused}");
        let placeholder = serde_json::json!({"payment": "pay_…", "dispute": "dp_1", "amount": 5});
        assert!(webhooks::unreadable("dispute.created", &placeholder).is_some());
        assert!(webhooks::unreadable("dispute.create", &serde_json::json!({})).is_some());
    }

    #[test]
    fn pay_s_help_lists_each_exit_code() {
        for code in [0, EXIT_REFUSED, EXIT_NOT_SENT, EXIT_OUTCOME_UNKNOWN] {
            let listed = PAY_EXIT_CODES
                .lines()
                .any(|line| line.trim_start().starts_with(&format!("{code} ")));
            assert!(listed, "{code} is not in:\n{PAY_EXIT_CODES}");
        }
    }
}
