//! The SQL of the recovery side of the lifecycle: recovery points recorded before a call to another
//! system and cleared when it certainly did nothing, the recovery job's claims (with their
//! growing waits), the holds of keys past the recovery window, and an operator's settles of them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{KeyStatus, granted_at, millis};
use crate::{EarlierCalls, RecoveryBounds, RecoveryPoint};

// -------------------------------------------------------------------------------------------
// Recovery points: recorded before a call to another system, fenced by the token; claimed by the
// recovery job once the lease that recorded them is dead.
// -------------------------------------------------------------------------------------------

/// Records `point` with `state` on the key held under `token`, and the downstream key
/// (`downstream_key` unless the key already has one, which is kept); `None` when the key was taken
/// over.
pub(crate) async fn record_recovery_point(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    token: Uuid,
    point: &str,
    state: &serde_json::Value,
    downstream_key: &str,
) -> Result<Option<RecoveryPoint>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET recovery_point = $3, recovery_state = $4,
            downstream_key = COALESCE(downstream_key, $5)
        WHERE account_id = $6 AND id = $1 AND lock_token = $2 AND status = 'in_progress'
        RETURNING recovery_point AS "recovery_point!", recovery_state AS "recovery_state!",
                  downstream_key AS "downstream_key!"
        "#,
        key_id,
        token,
        point,
        state,
        downstream_key,
        owner,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| RecoveryPoint {
        earlier_calls: EarlierCalls::of(&row.downstream_key, Some(downstream_key)),
        name: row.recovery_point,
        state: row.recovery_state,
        downstream_key: row.downstream_key,
    }))
}

/// Clears the key's recovery point (the downstream key stays with the row); `false` when the key
/// was taken over.
pub(crate) async fn clear_recovery_point(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    token: Uuid,
) -> Result<bool, sqlx::Error> {
    let cleared = sqlx::query!(
        r#"
        UPDATE idempotency_keys SET recovery_point = NULL, recovery_state = NULL
        WHERE account_id = $3 AND id = $1 AND lock_token = $2 AND status = 'in_progress'
        "#,
        key_id,
        token,
        owner,
    )
    .execute(pool)
    .await?;
    Ok(cleared.rows_affected() > 0)
}

/// A key the recovery job took over: everything needed to resume its work under a new lease.
pub(crate) struct Recoverable {
    pub key_id: i64,
    pub token: Uuid,
    pub now: DateTime<Utc>,
    /// When the key's recovery window began (its `created_at`).
    pub window_from: DateTime<Utc>,
    pub scope: String,
    pub idem_key: String,
    pub fingerprint: Vec<u8>,
    pub fingerprint_version: Option<i16>,
    pub recovery: RecoveryPoint,
}

/// Takes over up to 20 in-progress keys whose lease is dead and whose work recorded one of
/// the recovery points in `known` with a state of a version resumed there (each a version and a
/// point, see `StateVersion::paired_with`), each under a fresh token: the same conditional takeover a
/// retry makes, so a retry arriving meanwhile and the job never both win a key. `SKIP LOCKED` lets
/// several instances run the job at once without waiting on each other. The batch size is a
/// literal, and the batch is locked once in `ARRAY(…)`, for the reasons given at [`expire_batch`];
/// each key claimed is a call to another system, so batches stay small.
pub(crate) async fn claim_recoverable(
    pool: &PgPool,
    known: &[String],
    lease: Duration,
    bounds: &RecoveryBounds,
) -> Result<Vec<Recoverable>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET lock_token = gen_random_uuid(),
            locked_until = now() + $2::bigint * interval '1 millisecond',
            takeovers = takeovers + 1,
            recover_after = now() + LEAST($5::bigint,
                $4::bigint * power(2, LEAST(recoveries, 30))::bigint) * interval '1 millisecond',
            recoveries = recoveries + 1
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM idempotency_keys
            WHERE status = 'in_progress' AND recovery_point IS NOT NULL
              AND locked_until <= now()
              AND COALESCE(recovery_state -> 'version', '1')::text || ' ' || recovery_point
                  = ANY($1)
              AND created_at > now() - $3::bigint * interval '1 millisecond'
              AND (recover_after IS NULL OR recover_after <= now())
            ORDER BY locked_until
            LIMIT 20
            FOR UPDATE SKIP LOCKED
        ))
          AND status = 'in_progress' AND locked_until <= now()
        RETURNING id, lock_token AS "lock_token!", locked_until AS "locked_until!", scope, idem_key,
                  request_hash, fingerprint_version, recovery_point AS "recovery_point!",
                  recovery_state AS "recovery_state!", downstream_key AS "downstream_key!",
                  created_at
        "#,
        known,
        millis(lease),
        millis(bounds.window),
        millis(bounds.first_backoff),
        millis(bounds.longest_backoff),
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| Recoverable {
            key_id: row.id,
            token: row.lock_token,
            now: granted_at(row.locked_until, lease),
            window_from: row.created_at,
            scope: row.scope,
            idem_key: row.idem_key,
            fingerprint: row.request_hash,
            fingerprint_version: row.fingerprint_version,
            recovery: RecoveryPoint {
                name: row.recovery_point,
                state: row.recovery_state,
                downstream_key: row.downstream_key,
                // Claimed from a suspended key: its holder may have called.
                earlier_calls: EarlierCalls::Possible,
            },
        })
        .collect())
}

/// Holds up to 100 suspended keys whose recovery point is older than the window for an operator,
/// and returns the key ids it held. `SKIP LOCKED`, as the claim: instances running it at once
/// share the work.
pub(crate) async fn hold_overdue(
    pool: &PgPool,
    window: Duration,
) -> Result<Vec<HeldKey>, sqlx::Error> {
    sqlx::query_as!(
        HeldKey,
        r#"
        UPDATE idempotency_keys
        SET status = 'held', held_at = now(), lock_token = NULL, locked_until = NULL
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM idempotency_keys
            WHERE status = 'in_progress' AND recovery_point IS NOT NULL
              AND locked_until <= now()
              AND created_at <= now() - $1::bigint * interval '1 millisecond'
            LIMIT 100
            FOR UPDATE SKIP LOCKED
        ))
          AND status = 'in_progress' AND locked_until <= now()
        RETURNING id, scope, recovery_point AS "recovery_point!", downstream_key
        "#,
        millis(window),
    )
    .fetch_all(pool)
    .await
}

/// [`hold_overdue`] for a distributed table: the batch read without locks, each key held by a
/// statement routed to its node, with the conditions checked again.
pub(crate) async fn hold_overdue_unlocked(
    pool: &PgPool,
    window: Duration,
) -> Result<Vec<HeldKey>, sqlx::Error> {
    let batch = sqlx::query!(
        r#"
        SELECT account_id, id FROM idempotency_keys
        WHERE status = 'in_progress' AND recovery_point IS NOT NULL
          AND locked_until <= now()
          AND created_at <= now() - $1::bigint * interval '1 millisecond'
        LIMIT 100
        "#,
        millis(window),
    )
    .fetch_all(pool)
    .await?;
    let mut held = Vec::with_capacity(batch.len());
    for candidate in batch {
        let row = sqlx::query_as!(
            HeldKey,
            r#"
            UPDATE idempotency_keys
            SET status = 'held', held_at = now(), lock_token = NULL, locked_until = NULL
            WHERE account_id = $1 AND id = $2
              AND status = 'in_progress' AND locked_until <= now() AND recovery_point IS NOT NULL
              AND created_at <= now() - $3::bigint * interval '1 millisecond'
            RETURNING id, scope, recovery_point AS "recovery_point!", downstream_key
            "#,
            candidate.account_id,
            candidate.id,
            millis(window),
        )
        .fetch_optional(pool)
        .await?;
        held.extend(row);
    }
    Ok(held)
}

/// A key held for an operator, as the statement that held it returned it.
pub(crate) struct HeldKey {
    pub id: i64,
    pub scope: String,
    pub recovery_point: String,
    pub downstream_key: Option<String>,
}

/// Holds a suspended key whose recovery point is older than `window` for an operator: nothing
/// resumes it by itself from now on. `true` when this statement held it; `false` when the key is
/// not such a key (any more: the decision then reads it again, and finds it held, say).
pub(crate) async fn hold(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    window: Duration,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query_scalar!(
        r#"
        UPDATE idempotency_keys
        SET status = 'held', held_at = now(), lock_token = NULL, locked_until = NULL
        WHERE account_id = $1 AND id = $2
          AND status = 'in_progress' AND locked_until <= now() AND recovery_point IS NOT NULL
          AND created_at <= now() - $3::bigint * interval '1 millisecond'
        RETURNING id
        "#,
        owner,
        key_id,
        millis(window),
    )
    .fetch_optional(pool)
    .await?;
    Ok(held.is_some())
}

/// [`claim_recoverable`] for a distributed table: the candidates are read without locks, and the
/// update claims those whose lease is still dead when it reaches them. Of two instances claiming
/// the same key, the second waits on the first's row lock, then finds its lease alive and leaves it.
pub(crate) async fn claim_recoverable_unlocked(
    pool: &PgPool,
    known: &[String],
    lease: Duration,
    bounds: &RecoveryBounds,
) -> Result<Vec<Recoverable>, sqlx::Error> {
    let batch = sqlx::query!(
        r#"
        SELECT account_id, id, recoveries FROM idempotency_keys
        WHERE status = 'in_progress' AND recovery_point IS NOT NULL
          AND locked_until <= now()
          AND COALESCE(recovery_state -> 'version', '1')::text || ' ' || recovery_point = ANY($1)
          AND created_at > now() - $2::bigint * interval '1 millisecond'
          AND (recover_after IS NULL OR recover_after <= now())
        ORDER BY locked_until
        LIMIT 20
        "#,
        known,
        millis(bounds.window),
    )
    .fetch_all(pool)
    .await?;
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    // One update per key, each routed to its node, with a token and a wait made here: Citus
    // refuses a volatile function such as `gen_random_uuid()` in an update of a distributed table,
    // and a stable one (`now()`) combined with a column (the count of tries the wait grows with).
    // The state's version is checked again: the key may have been recorded anew meanwhile.
    let mut claimed = Vec::with_capacity(batch.len());
    for candidate in batch {
        let token = Uuid::new_v4();
        let row = sqlx::query!(
            r#"
            UPDATE idempotency_keys
            SET lock_token = $3,
                locked_until = now() + $4::bigint * interval '1 millisecond',
                takeovers = takeovers + 1,
                recover_after = now() + $5::bigint * interval '1 millisecond',
                recoveries = recoveries + 1
            WHERE account_id = $1 AND id = $2
              AND status = 'in_progress' AND locked_until <= now()
              AND COALESCE(recovery_state -> 'version', '1')::text || ' ' || recovery_point
                  = ANY($6)
            RETURNING id, locked_until AS "locked_until!", scope, idem_key, request_hash,
                      fingerprint_version, recovery_point AS "recovery_point!",
                      recovery_state AS "recovery_state!", downstream_key AS "downstream_key!",
                      created_at
            "#,
            candidate.account_id,
            candidate.id,
            token,
            millis(lease),
            millis(bounds.backoff(candidate.recoveries)),
            known,
        )
        .fetch_optional(pool)
        .await?;
        if let Some(row) = row {
            claimed.push(Recoverable {
                key_id: row.id,
                token,
                now: granted_at(row.locked_until, lease),
                window_from: row.created_at,
                scope: row.scope,
                idem_key: row.idem_key,
                fingerprint: row.request_hash,
                fingerprint_version: row.fingerprint_version,
                recovery: RecoveryPoint {
                    name: row.recovery_point,
                    state: row.recovery_state,
                    downstream_key: row.downstream_key,
                    earlier_calls: EarlierCalls::Possible,
                },
            });
        }
    }
    Ok(claimed)
}

/// The recovery points of suspended keys (in progress at a point) that are none of `known`, with
/// how many keys wait at each. Held keys are not counted: nothing of a build resumes them, so no
/// build lacks what they need; an operator settles them (a settle by a build that cannot read
/// their point fails, and leaves them held).
pub(crate) async fn unresumable(
    pool: &PgPool,
    known: &[String],
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT recovery_point AS "point!", count(*) AS "keys!"
        FROM idempotency_keys
        WHERE recovery_point IS NOT NULL AND status = 'in_progress'
          AND NOT (recovery_point = ANY($1))
        GROUP BY recovery_point
        ORDER BY recovery_point
        "#,
        known,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|row| (row.point, row.keys)).collect())
}

// -------------------------------------------------------------------------------------------
// Settle: an operator takes a held key, under a lease like any holder's, to complete it from the
// other system's ledger; a settle that fails hands the key back, held as before.
// -------------------------------------------------------------------------------------------

/// A held key an operator's settle took: everything the settling work needs, under a new lease.
pub(crate) struct Claimed {
    pub key_id: i64,
    pub now: DateTime<Utc>,
    /// When the key's recovery window began (its `created_at`).
    pub window_from: DateTime<Utc>,
    pub fingerprint: Vec<u8>,
    pub fingerprint_version: Option<i16>,
    pub recovery: RecoveryPoint,
}

/// Takes the key `key` of `scope` if it is held, under `token` for a lease's length: one
/// conditional update, so of two settles (or a settle and anything else) at most one wins it. The
/// key stays past the recovery window, so no retry takes it over, and the recovery job never
/// claims it: if this settle dies, its lease runs out and the job's [`hold_overdue`] holds it again.
pub(crate) async fn claim_held(
    pool: &PgPool,
    owner: &str,
    scope: &str,
    key: &str,
    token: Uuid,
    lease: Duration,
) -> Result<Option<Claimed>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET status = 'in_progress', lock_token = $4,
            locked_until = now() + $5::bigint * interval '1 millisecond',
            takeovers = takeovers + 1
        WHERE account_id = $1 AND scope = $2 AND idem_key = $3 AND status = 'held'
        RETURNING id, locked_until AS "locked_until!", request_hash, fingerprint_version,
                  recovery_point AS "recovery_point!", recovery_state AS "recovery_state!",
                  downstream_key AS "downstream_key!", created_at
        "#,
        owner,
        scope,
        key,
        token,
        millis(lease),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| Claimed {
        key_id: row.id,
        now: granted_at(row.locked_until, lease),
        window_from: row.created_at,
        fingerprint: row.request_hash,
        fingerprint_version: row.fingerprint_version,
        recovery: RecoveryPoint {
            name: row.recovery_point,
            state: row.recovery_state,
            downstream_key: row.downstream_key,
            // Held: calls with the downstream key may have reached the other system.
            earlier_calls: EarlierCalls::Possible,
        },
    }))
}

/// Holds again a key a settle took under `token` and could not complete (the other system did not
/// answer, say): as it was, for the next settle. Its `held_at` is the first hold's: a claim keeps
/// it (and Citus refuses `COALESCE(held_at, now())` in an update of a distributed table). `false`
/// when the key is no longer under that token (it completed, or the settle's lease ran out and the
/// recovery job held it already).
pub(crate) async fn hand_back(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    token: Uuid,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET status = 'held', lock_token = NULL, locked_until = NULL
        WHERE account_id = $1 AND id = $2 AND lock_token = $3 AND status = 'in_progress'
        "#,
        owner,
        key_id,
        token,
    )
    .execute(pool)
    .await?;
    Ok(held.rows_affected() > 0)
}

/// The state of `key` on each of `scopes` that has it: for a settle to say what it found.
pub(crate) async fn key_states(
    pool: &PgPool,
    owner: &str,
    scopes: &[String],
    key: &str,
) -> Result<Vec<(String, KeyStatus)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT scope, status AS "status: KeyStatus"
        FROM idempotency_keys
        WHERE account_id = $1 AND scope = ANY($2) AND idem_key = $3
        ORDER BY scope
        "#,
        owner,
        scopes,
        key,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.scope, row.status))
        .collect())
}

/// A suspended key whose state is in a version no resumer of this release reads.
pub(crate) struct UnknownState {
    pub id: i64,
    pub recovery_point: String,
    /// The state's `version` member as text (`1` without one).
    pub version: String,
}

/// Up to 100 suspended keys (in progress, lease dead, within the recovery window) whose point and
/// state's version are none of `known` (see [`claim_recoverable`]): what the recovery job leaves
/// alone, a later release's version of a known point or a point of its own. Read only, never
/// locked.
pub(crate) async fn unknown_states(
    pool: &PgPool,
    known: &[String],
    window: Duration,
) -> Result<Vec<UnknownState>, sqlx::Error> {
    sqlx::query_as!(
        UnknownState,
        r#"
        SELECT id, recovery_point AS "recovery_point!",
               COALESCE(recovery_state -> 'version', '1')::text AS "version!"
        FROM idempotency_keys
        WHERE status = 'in_progress' AND recovery_point IS NOT NULL
          AND locked_until <= now()
          AND NOT (COALESCE(recovery_state -> 'version', '1')::text || ' ' || recovery_point
                   = ANY($1))
          AND created_at > now() - $2::bigint * interval '1 millisecond'
        ORDER BY id
        LIMIT 100
        "#,
        known,
        millis(window),
    )
    .fetch_all(pool)
    .await
}
