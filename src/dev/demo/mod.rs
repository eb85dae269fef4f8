//! `idempay demo`: payment intents through a lossy network, with and without idempotency keys.
//!
//! A proxy on loopback loses a share of the server's answers and resets some connections. The
//! retrying client keeps one key per intent, so every intent ends in exactly one payment however
//! often it was sent; with `--naive` it makes a new key per attempt and the ledger shows the
//! duplicate charges that the key prevents.
//!
//! Given the processor (`--processor-url`), it also makes the processor lose answers
//! (`--processor-loss`) and counts the charges there next to the payments: with the downstream
//! key they are equal; a server started with `IDEMPAY_UNSAFE_NEW_PROCESSOR_KEY_PER_CALL` shows the
//! charges it would otherwise make twice.

mod proxy;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use client::{Client, ClientError, NewPayment, RetryPolicy};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::downstream::ProcessorClient;

pub use proxy::{Faults, LossyProxy, ProxyStats};

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub intents: usize,
    pub faults: Faults,
    /// A new key per attempt instead of one per intent: wrong on purpose.
    pub naive: bool,
    /// Intents in flight at once.
    pub concurrency: usize,
    /// The processor the server charges at, to count its charges, and the share of its answers
    /// it loses during the run (0 to 1).
    pub processor: Option<(ProcessorClient, f64)>,
}

/// How one intent ended.
#[derive(Clone, Debug)]
pub struct IntentOutcome {
    /// The order reference that names the intent in the ledger.
    pub order: String,
    pub idempotency_key: Option<String>,
    /// The final answer's status and body, or `None` if none came within the retries.
    pub status: Option<u16>,
    pub raw: Option<Vec<u8>>,
    pub replayed: bool,
}

/// The story in numbers.
#[derive(Clone, Debug)]
pub struct Tally {
    pub intents: usize,
    pub attempts: u64,
    pub replays: usize,
    pub unanswered: usize,
    pub payments_in_ledger: usize,
    pub duplicates: usize,
    pub lost_responses: u64,
    pub resets: u64,
    /// Charges the processor made during the run, when it was given.
    pub charges_at_processor: Option<usize>,
    pub outcomes: Vec<IntentOutcome>,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "intents:             {}", self.intents)?;
        writeln!(f, "HTTP attempts:       {}", self.attempts)?;
        writeln!(f, "  answers lost:      {}", self.lost_responses)?;
        writeln!(f, "  connections reset: {}", self.resets)?;
        writeln!(f, "replayed answers:    {}", self.replays)?;
        writeln!(f, "intents unanswered:  {}", self.unanswered)?;
        writeln!(f, "payments in ledger:  {}", self.payments_in_ledger)?;
        write!(f, "duplicate charges:   {}", self.duplicates)?;
        if let Some(charges) = self.charges_at_processor {
            write!(
                f,
                "\ncharges at processor: {charges} ({} without a payment)",
                charges.saturating_sub(self.payments_in_ledger)
            )?;
        }
        Ok(())
    }
}

/// Runs the intents against the API at `base_url` through a lossy proxy; `progress` is called
/// with the number of intents done.
pub async fn run(
    base_url: &str,
    api_key: &str,
    options: &Options,
    progress: impl Fn(usize) + Send + Sync + 'static,
) -> anyhow::Result<Tally> {
    let charges_before = match &options.processor {
        Some((processor, loss)) => {
            processor
                .set_faults(*loss, 0.0)
                .await
                .context("cannot set the processor's faults")?;
            Some(processor.charges().await?.len())
        }
        None => None,
    };
    let upstream = upstream_address(base_url).await?;
    let proxy = LossyProxy::start(upstream, options.faults).await?;
    let attempts = Arc::new(AtomicU64::new(0));
    let counted = attempts.clone();
    let mut client = Client::new(format!("http://{}", proxy.address()), api_key)
        .with_fresh_connections()
        .with_policy(RetryPolicy {
            base_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(500),
            attempt_timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(60),
        })
        .on_attempt(move |attempt| {
            tracing::debug!(?attempt, "demo attempt");
            counted.fetch_add(1, Ordering::Relaxed);
        });
    if options.naive {
        client = client.with_new_key_per_attempt();
    }

    let run = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("demo-{}-", &run[..8]);
    let slots = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let done = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(progress);
    let mut intents = JoinSet::new();
    for number in 0..options.intents {
        let (client, slots, done, progress) = (
            client.clone(),
            slots.clone(),
            done.clone(),
            progress.clone(),
        );
        let order = format!("{prefix}{number}");
        intents.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let outcome = pay(&client, order).await;
            progress(done.fetch_add(1, Ordering::Relaxed) + 1);
            outcome
        });
    }
    let mut outcomes = Vec::with_capacity(options.intents);
    while let Some(outcome) = intents.join_next().await {
        outcomes.push(outcome?);
    }
    outcomes.sort_by(|a, b| a.order.cmp(&b.order));

    // The ledger is read around the proxy: the point is what the server recorded.
    let charged = count_in_ledger(&Client::new(base_url, api_key), &prefix).await?;
    let charges_at_processor = match (&options.processor, charges_before) {
        (Some((processor, _)), Some(before)) => {
            processor.set_faults(0.0, 0.0).await?;
            Some(processor.charges().await?.len() - before)
        }
        _ => None,
    };
    let payments_in_ledger = charged.values().sum();
    Ok(Tally {
        intents: options.intents,
        attempts: attempts.load(Ordering::Relaxed),
        replays: outcomes.iter().filter(|o| o.replayed).count(),
        unanswered: outcomes.iter().filter(|o| o.status.is_none()).count(),
        payments_in_ledger,
        duplicates: charged.values().map(|count| count - 1).sum(),
        lost_responses: proxy.stats().lost_responses.load(Ordering::Relaxed),
        resets: proxy.stats().resets.load(Ordering::Relaxed),
        charges_at_processor,
        outcomes,
    })
}

async fn pay(client: &Client, order: String) -> IntentOutcome {
    let payment = NewPayment {
        amount: 4200,
        currency: "eur".to_owned(),
        order: Some(order.clone()),
        ..NewPayment::default()
    };
    match client.create_payment(&payment, None).await {
        Ok(answer) => IntentOutcome {
            order,
            idempotency_key: answer.idempotency_key,
            status: Some(answer.status),
            raw: Some(answer.raw),
            replayed: answer.replayed,
        },
        Err(ClientError::Api {
            problem,
            replayed,
            idempotency_key,
            raw,
            ..
        }) => IntentOutcome {
            order,
            idempotency_key,
            status: Some(problem.status),
            raw: Some(raw),
            replayed,
        },
        Err(_) => IntentOutcome {
            order,
            idempotency_key: None,
            status: None,
            raw: None,
            replayed: false,
        },
    }
}

/// How many payments the ledger holds for each order of this run. The run's payments are the
/// newest, so the listing stops at the first page past them.
async fn count_in_ledger(client: &Client, prefix: &str) -> anyhow::Result<HashMap<String, usize>> {
    let mut charged = HashMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list_payments(100, cursor.as_deref())
            .await
            .context("cannot read the ledger")?
            .value;
        let mut ours = 0;
        for payment in &page.data {
            if let Some(order) = payment.order.as_deref().filter(|o| o.starts_with(prefix)) {
                *charged.entry(order.to_owned()).or_insert(0) += 1;
                ours += 1;
            }
        }
        if !page.has_more || (ours == 0 && !charged.is_empty()) {
            return Ok(charged);
        }
        cursor = page.data.last().map(|payment| payment.id.clone());
    }
}

async fn upstream_address(base_url: &str) -> anyhow::Result<std::net::SocketAddr> {
    let authority = base_url
        .strip_prefix("http://")
        .context("the demo speaks plain http to a local server: http://HOST:PORT")?
        .trim_end_matches('/');
    tokio::net::lookup_host(authority)
        .await?
        .next()
        .with_context(|| format!("cannot resolve {authority}"))
}
