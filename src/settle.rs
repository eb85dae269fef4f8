//! `idempay keys settle`: the way out of a held key. A key is held when its call to the processor
//! got no known outcome within the recovery window; nothing resumes it by itself from then on,
//! because the processor may have forgotten the downstream key and would charge again. An
//! operator settles it: the processor's ledger is read under the key's downstream key (a read,
//! never the call again), and the key completes with the answer its first request would have had.
//! The work is each call's own (`downstream::call::settle_held`, registered with its resumer in
//! app.rs), run by the mechanism under a lease (`Idempotency::settle`); ops/runbooks.md walks an
//! operator through it.

use sqlx::PgPool;

use crate::accounts::AccountId;
use crate::app::AppState;
use crate::config::Settings;
use crate::downstream::link::Linked;
use crate::keys::IDEMPOTENT_ROUTES;
use idempotency::{IdempotencyKey, Settled};

/// What a settle did, as the command prints it.
#[derive(Debug)]
pub struct Report {
    /// One line per route the key was used on.
    pub lines: Vec<String>,
    /// Whether the key is settled on every route it is on (now, or before).
    pub done: bool,
    /// The line that ends the report.
    pub summary: String,
}

/// Settles the key `raw` of `account` on every route where it is held, with the processor
/// `settings` name (or the one embedded in the database), and reports each route.
pub async fn settle(
    pool: &PgPool,
    settings: &Settings,
    account: &str,
    raw: &str,
) -> anyhow::Result<Report> {
    let key = IdempotencyKey::parse(raw.as_bytes())
        .map_err(|error| anyhow::anyhow!("that is not an idempotency key: {error}"))?;
    let account = AccountId::parse(account).ok_or_else(|| {
        anyhow::anyhow!(
            "that is not an account id: an account id is `acct_` and letters and digits"
        )
    })?;
    let link = &settings.processor;
    let processor = Linked::to(pool, link.client()?, link.timeout).await?;
    let state = AppState::new(pool.clone(), settings, processor.client.clone(), None);
    let settled = state
        .idempotency
        .settle(account.as_str(), &key, &IDEMPOTENT_ROUTES)
        .await;
    processor.stop().await?;
    let settlements = settled?;
    if settlements.is_empty() {
        anyhow::bail!(
            "account {} has no key {raw:?}: never used, expired, or of another account",
            account.as_str()
        );
    }
    let done = settlements.iter().all(|settlement| {
        matches!(
            settlement.outcome,
            Settled::Completed { .. } | Settled::AlreadyCompleted
        )
    });
    let lines = settlements
        .iter()
        .map(|settlement| format!("{}: {}", settlement.route, settlement.outcome))
        .collect();
    let summary = if done {
        format!("key {raw:?} is settled: its retry is answered with its result, replayed")
    } else {
        format!("key {raw:?} is not settled on every route (see above)")
    };
    Ok(Report {
        lines,
        done,
        summary,
    })
}
