//! Events about an object idempay has not recorded yet, kept until it is. The processor answers
//! idempay's call and delivers its events on two independent paths, and an event can come first: a
//! dispute of a charge whose payment is answered 503 `processor-outcome-unknown`, recorded later by
//! the client's retry, the recovery job or an operator settling the held key. The intake parks such
//! an event (acknowledged, outcome `parked`) instead of counting on the sender to deliver it again,
//! since the sender may give up first; it is applied once, when its object is recorded:
//!
//! - right after the recording, by whoever recorded it (a fresh request, a retry, a takeover, the
//!   recovery job, a settle: `downstream::call::record` runs [`when_recorded`]): the processor's
//!   outbox often delivers an event before idempay's recording of the answer commits;
//! - right after the parking, by the intake, for an object recorded while the event was being
//!   parked: the recording's look for parked events may have come before the parking committed,
//!   but then the intake's look comes after the recording committed. It runs in a task of its
//!   own (`apply_waiting_detached`), so a sender that hangs up cannot take it with it;
//! - by the [`spawn`]ed sweep, for an event whose recorder or intake died (or failed) before
//!   applying it.
//!
//! Each application takes its event's `processed_events` row, then deletes its parked row, in the
//! transaction that applies it: two appliers of one event take turns, and the second finds it gone.
//! Parked events do not expire: one whose object is never recorded is a difference that
//! `idempay reconcile` shows ([`waiting`]) until an operator looks at it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::events::{Envelope, EventOutcome, NotRecorded};
use super::metrics;
use crate::db::{Engine, KnownEngine};
use crate::downstream::WhenRecorded;

/// How many events may wait per account, and as many for the events whose account is not known
/// (about a charge no payment names, which is most of them: the processor's event names no account).
/// Past it the intake refuses the event as it did before events were parked (409
/// `webhook-object-not-recorded`, the sender keeps it and delivers it again), so nothing is
/// dropped, and one account, or a flood of events about charges made outside idempay, cannot fill
/// the table for the others.
pub const MAX_PARKED: i64 = 10_000;

/// What parking an event came to.
pub(super) enum Parking {
    /// Kept, to be applied when its object is recorded.
    Parked,
    /// Already kept under this id (its `processed_events` row had expired): nothing more.
    AlreadyParked,
    /// Its account's bound is reached: not kept.
    Full,
}

/// Parks the event `id` (its verified `body`) in the intake's transaction, which recorded it in
/// `processed_events` and then found its object not recorded. The bound is counted under an
/// advisory lock of the account's (or of the unknown account's), so events parked at once cannot
/// pass it together.
pub(super) async fn park(
    conn: &mut PgConnection,
    id: &str,
    envelope: &Envelope,
    body: &[u8],
    not_recorded: &NotRecorded,
) -> Result<Parking, sqlx::Error> {
    // Every event of the processor names its charge, a refund's event too: when that charge is
    // recorded, the account is known.
    let charge = envelope
        .data
        .get("charge")
        .and_then(|charge| charge.as_str());
    let account = match charge {
        Some(charge) => {
            sqlx::query_scalar!(
                "SELECT account_id FROM payments WHERE charge = $1 LIMIT 1",
                charge
            )
            .fetch_optional(&mut *conn)
            .await?
        }
        None => None,
    };
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('parked_events:' || COALESCE($1, ''), 0))",
        account.as_deref(),
    )
    .execute(&mut *conn)
    .await?;
    let parked = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM parked_events WHERE account_id IS NOT DISTINCT FROM $1"#,
        account.as_deref(),
    )
    .fetch_one(&mut *conn)
    .await?;
    if parked >= MAX_PARKED {
        tracing::warn!(
            event = id,
            account,
            parked,
            "parked events at their bound: refused"
        );
        return Ok(Parking::Full);
    }
    let inserted = sqlx::query_scalar!(
        r#"
        INSERT INTO parked_events (id, type, object, account_id, body)
        VALUES ($1, $2, $3, $4, $5)
        ON CONFLICT (id) DO NOTHING
        RETURNING id
        "#,
        id,
        envelope.kind,
        not_recorded.object,
        account.as_deref(),
        body,
    )
    .fetch_optional(&mut *conn)
    .await?;
    Ok(if inserted.is_some() {
        Parking::Parked
    } else {
        Parking::AlreadyParked
    })
}

/// What a recording runs next: applies the events waiting for the object just recorded, each once.
/// A failure is logged, not returned: the object is recorded, and the sweep applies them later.
pub fn when_recorded(pool: PgPool, ttl: Duration) -> WhenRecorded {
    let engine = KnownEngine::default();
    WhenRecorded::new(move |object| {
        let (pool, engine) = (pool.clone(), engine.clone());
        async move {
            let applied =
                async { apply_waiting(&pool, engine.get(&pool).await?, ttl, &object).await };
            if let Err(error) = applied.await {
                tracing::warn!(%error, object, "parked events not applied; the sweep will");
            }
        }
    })
}

/// [`apply_waiting`] for a request's intake, in a task of its own: a sender that hangs up after
/// the intake committed (its delivery timed out) drops the request's future, and the look that
/// future was to make after the commit with it. The task makes it all the same, so an event parked
/// while its object was being recorded is applied now, not at the sweep, whether or not anyone
/// waits for the answer. A failure is logged: the sweep applies the events later.
pub(super) async fn apply_waiting_detached(
    pool: &PgPool,
    engine: Engine,
    ttl: Duration,
    object: &str,
) {
    let (pool, object) = (pool.clone(), object.to_owned());
    let look = tokio::spawn(async move {
        if let Err(error) = apply_waiting(&pool, engine, ttl, &object).await {
            tracing::warn!(%error, object, "parked events not applied; the sweep will");
        }
    });
    // A panic in the task is the task's: logged by the runtime, the sweep applies the events.
    let _ = look.await;
}

/// Applies the events parked for `object`, oldest first, each in its own transaction; how many
/// were applied now (none while the object is not recorded).
async fn apply_waiting(
    pool: &PgPool,
    engine: Engine,
    ttl: Duration,
    object: &str,
) -> Result<usize, sqlx::Error> {
    let waiting = sqlx::query!(
        "SELECT id, type FROM parked_events WHERE object = $1 ORDER BY received_at, id",
        object,
    )
    .fetch_all(pool)
    .await?;
    let mut applied = 0;
    for event in waiting {
        if apply(pool, engine, ttl, &event.id, &event.r#type).await? {
            applied += 1;
        }
    }
    Ok(applied)
}

/// Applies the parked event `id` of type `kind`, once; whether it was applied now. Its
/// `processed_events` row is taken first (inserted again if it expired meanwhile), as the intake
/// takes it first, so a redelivery being applied at this moment and this wait for each other
/// rather than deadlock; then the parked row is deleted, and found gone if another applier came
/// first. A row that says the event was applied since (a redelivery found its object recorded
/// after the row had expired) means only the parked copy goes.
async fn apply(
    pool: &PgPool,
    engine: Engine,
    ttl: Duration,
    id: &str,
    kind: &str,
) -> Result<bool, sqlx::Error> {
    let mut tx = idempotency::connections::begin(pool).await?;
    let outcome = sqlx::query_scalar!(
        r#"
        INSERT INTO processed_events (id, type, outcome, expires_at)
        VALUES ($1, $2, $4, now() + $3::bigint * interval '1 millisecond')
        ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at
        RETURNING outcome
        "#,
        id,
        kind,
        i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
        EventOutcome::Parked.as_str(),
    )
    .fetch_one(&mut *tx)
    .await?;
    let Some(body) =
        sqlx::query_scalar!("DELETE FROM parked_events WHERE id = $1 RETURNING body", id)
            .fetch_optional(&mut *tx)
            .await?
    else {
        tx.rollback().await?;
        return Ok(false);
    };
    if outcome != EventOutcome::Parked.as_str() {
        tx.commit().await?;
        return Ok(false);
    }
    // The bytes the intake verified and parsed: an error here is a release that reads them no
    // more, and the event is left parked, for `reconcile` to show.
    let envelope: Envelope = match serde_json::from_slice(&body) {
        Ok(envelope) => envelope,
        Err(error) => {
            tracing::error!(%error, event = id, "a parked event cannot be read; left parked");
            tx.rollback().await?;
            return Ok(false);
        }
    };
    let applied = match envelope.apply(&mut tx, engine, id).await? {
        Ok(applied) => applied,
        // Its object is not recorded after all (the sweep read it committed, this transaction
        // began before): left parked for the next sweep.
        Err(_) => {
            tx.rollback().await?;
            return Ok(false);
        }
    };
    sqlx::query!(
        "UPDATE processed_events SET outcome = $2 WHERE id = $1",
        id,
        applied.outcome.as_str(),
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    crate::events::written(&applied.event);
    metrics::webhook_event_unparked();
    tracing::info!(event = id, kind, outcome = ?applied.outcome, "parked webhook applied: its object is recorded");
    Ok(true)
}

/// How many objects one look of the sweep asks about: a bounded array per statement.
const SWEEP_BATCH: i64 = 1_000;

/// Applies every parked event whose object is recorded now; how many were applied. The objects
/// are read in batches from the parked events, then looked up among payments, refunds and
/// disputes (a dispute's change may arrive before its creation) by
/// statements of their own (on Citus those tables are distributed, the parked events are not).
pub async fn sweep(pool: &PgPool, engine: Engine, ttl: Duration) -> Result<usize, sqlx::Error> {
    let mut after = String::new();
    let mut applied = 0;
    loop {
        let objects = sqlx::query_scalar!(
            r#"
            SELECT DISTINCT object AS "object!" FROM parked_events
            WHERE object > $1 ORDER BY 1 LIMIT $2
            "#,
            after,
            SWEEP_BATCH,
        )
        .fetch_all(pool)
        .await?;
        let Some(last) = objects.last() else {
            return Ok(applied);
        };
        after.clone_from(last);
        let recorded = sqlx::query_scalar!(
            r#"
            SELECT charge AS "object!" FROM payments WHERE charge = ANY($1)
            UNION ALL
            SELECT processor_refund AS "object!" FROM refunds WHERE processor_refund = ANY($1)
            UNION ALL
            SELECT id AS "object!" FROM disputes WHERE id = ANY($1)
            "#,
            &objects,
        )
        .fetch_all(pool)
        .await?;
        for object in recorded {
            applied += apply_waiting(pool, engine, ttl, &object).await?;
        }
        if objects.len() < usize::try_from(SWEEP_BATCH).unwrap_or(usize::MAX) {
            return Ok(applied);
        }
    }
}

/// Every `interval` until `stop` is cancelled, applies the parked events whose object is recorded
/// ([`sweep`]). Safe on every instance at once: each event is applied by one of them.
pub fn spawn(
    pool: PgPool,
    ttl: Duration,
    interval: Duration,
    stop: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let engine = KnownEngine::default();
        // The first sweep at once, at start: a process killed between recording an object and
        // its look for the events parked for it (the look runs after the commit) left them
        // waiting; the instance that comes back applies them now, not an interval later (in CI
        // the explorer's seed 534060137 ended with one such event, its sweeps hourly).
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticks.tick() => {}
            }
            let swept = async { sweep(&pool, engine.get(&pool).await?, ttl).await };
            match swept.await {
                Ok(0) => service::jobs::succeeded(crate::SERVICE, "parked-webhooks"),
                Ok(applied) => {
                    tracing::info!(applied, "the sweep applied parked webhooks");
                    service::jobs::succeeded(crate::SERVICE, "parked-webhooks");
                }
                Err(error) => {
                    tracing::warn!(%error, "sweeping parked webhooks failed; tried again next interval");
                }
            }
        }
        tracing::debug!("parked webhooks' sweep stopped");
    })
}

/// An event waiting for its object, as `idempay reconcile` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub id: String,
    pub kind: String,
    pub object: String,
    pub received_at: DateTime<Utc>,
}

/// Every parked event, oldest first.
pub async fn waiting(pool: &PgPool) -> Result<Vec<Waiting>, sqlx::Error> {
    sqlx::query_as!(
        Waiting,
        r#"
        SELECT id, type AS kind, object, received_at FROM parked_events
        ORDER BY received_at, id
        "#
    )
    .fetch_all(pool)
    .await
}
