//! The SQL of the key lifecycle, one function per statement, in the order of the lifecycle. Every
//! clock reading is the database's `now()`, never an instance's: instances disagree. Durations
//! travel as whole milliseconds added to that `now()`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{
    Comparison, Fence, FieldDigests, Fingerprint, FingerprintVersion, KeyedRequest, PointAt,
    RecoveryPoint, StoredResponse,
};
use crate::Error;
use crate::connections::Lot;
use crate::engine::Engine;
use crate::formats::UnknownFormat;

mod recovery;

pub(super) use recovery::{
    claim_held, claim_recoverable, claim_recoverable_unlocked, clear_recovery_point, hand_back,
    hold, hold_overdue, hold_overdue_unlocked, key_states, record_recovery_point, unknown_states,
    unresumable,
};

/// A key's `status` column: a request is working on it, or its response is stored, or its work's
/// outcome stayed unresolved past the recovery window and it waits for an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, sqlx::Type)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub(super) enum KeyStatus {
    InProgress,
    Completed,
    Held,
}

/// A key that exists, as the reservation found it.
pub(super) struct ExistingKey {
    pub(super) key_id: i64,
    /// The stored fingerprint and its version; `None` for bytes that are no fingerprint.
    pub(super) fingerprint: Option<(FingerprintVersion, Fingerprint)>,
    /// The digests of the stored request's top-level members; `None` for keys reserved before
    /// they were recorded.
    pub(super) fields: Option<FieldDigests>,
    /// Whether the key expired and may be recycled: completed, or abandoned before any recovery
    /// point. A key whose call downstream is unresolved does not expire with its `expires_at`: its
    /// retry still resumes it, and its result then lives a whole key TTL from completion.
    pub(super) expired: bool,
    /// How long until the key expires, as the database saw it; `None` when it has.
    pub(super) expires_in: Option<Duration>,
    pub(super) state: KeyState,
}

/// The state of an existing key.
pub(super) enum KeyState {
    /// A request is working on it; `lease_left` is `None` when its lease ran out (its process
    /// died, or stopped renewing). `point`, the recovery point its work recorded.
    InProgress {
        lease_left: Option<Duration>,
        point: Option<PointAt>,
    },
    /// Its response is stored: every repeat gets it.
    Completed(StoredResponse),
    /// Its work's outcome stayed unresolved past the recovery window; an operator settles it.
    Held,
    /// Its response is stored in a format this release does not read.
    Unreadable(UnknownFormat),
}

/// What the reservation found.
pub(super) enum Reservation {
    /// The insert won: this request holds the key under the token it brought, since `now`.
    Reserved { key_id: i64, now: DateTime<Utc> },
    /// The key exists; its row as the same statement read it.
    Existing(ExistingKey),
    /// Neither: the insert met a row this statement's snapshot cannot see (committed after the
    /// statement began), or one released meanwhile. A new statement sees the current state.
    Undecided,
}

// -------------------------------------------------------------------------------------------
// Reserve: one `INSERT … ON CONFLICT DO NOTHING`; when the key exists, the same statement returns
// its row.
// -------------------------------------------------------------------------------------------

/// Whether a reservation's commit must wait for its WAL to reach the disk (PostgreSQL's
/// `synchronous_commit`, on by default: a commit answered is a commit that survives a crash).
///
/// A commit has to be durable before anything outside the database acts on it. A key reserved
/// **with a recovery point** is about to be named to another system (its downstream key goes out
/// with the call right after): lost in a crash, it would let the retry call again under a new
/// downstream key, so it waits. A key reserved **without one** is acted on by nothing outside the
/// database until its work commits (the effect with the completion, or a recovery point recorded
/// before a call): that later commit waits, and because the WAL is flushed in order, its flush
/// carries the reservation to disk with it. Lost in a crash before that, the reservation takes
/// nothing with it but a 409 some retry saw: the retry then finds the key new, as if the first
/// request had never come. So it need not wait, and a new key of a route whose work is database
/// work only (a charge made by the service that is called, say) costs one commit that waits, not two.
/// On Citus the reservation ([`reserve_routed`]) keeps the session's setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Durability {
    /// The commit waits for the disk, as the session is configured (on by default).
    BeforeAnswer,
    /// The commit does not wait: the next commit that waits carries it.
    WithTheNextCommit,
}

impl Durability {
    fn of_reservation(first_point: Option<&RecoveryPoint>) -> Self {
        match first_point {
            Some(_) => Self::BeforeAnswer,
            None => Self::WithTheNextCommit,
        }
    }

    /// The value for the statement's `set_config('synchronous_commit', …, true)`: `None` keeps
    /// the session's setting.
    fn synchronous_commit(self) -> Option<&'static str> {
        match self {
            Self::BeforeAnswer => None,
            Self::WithTheNextCommit => Some("off"),
        }
    }
}

pub(super) async fn reserve(
    lot: &Lot,
    engine: Engine,
    request: &KeyedRequest,
    token: Uuid,
    lease: Duration,
    key_ttl: Duration,
    first_point: Option<&RecoveryPoint>,
) -> Result<Reservation, Error> {
    if engine == Engine::Citus {
        return reserve_routed(lot, request, token, lease, key_ttl, first_point).await;
    }
    let (fingerprint_version, fingerprint) = current(request)?;
    let mut connection = lot.lend().await?;
    // `$12` is `synchronous_commit` for this statement's own commit: `off` for a key reserved
    // without a recovery point, else the session's (see `Durability`).
    let row = sqlx::query!(
        r#"
        WITH reserved AS (
            INSERT INTO idempotency_keys
                (account_id, scope, idem_key, request_hash, status, lock_token, locked_until,
                 expires_at, recovery_point, recovery_state, downstream_key, field_digests,
                 fingerprint_version)
            SELECT $11, $1, $2, $3, 'in_progress', $4,
                   now() + $5::bigint * interval '1 millisecond',
                   now() + $6::bigint * interval '1 millisecond',
                   $7, $8, $9, $10, $13
            FROM (SELECT set_config('synchronous_commit',
                                    COALESCE($12, current_setting('synchronous_commit')),
                                    true)) AS this_commit
            ON CONFLICT (account_id, scope, idem_key) DO NOTHING
            RETURNING id
        )
        SELECT id AS "id!", TRUE AS "reserved!",
               NULL::bytea AS request_hash, NULL::smallint AS fingerprint_version,
               NULL::text AS "status: KeyStatus",
               NULL::smallint AS response_version, NULL::smallint AS response_code,
               NULL::jsonb AS response_headers, NULL::bytea AS response_body,
               NULL::text AS recovery_point, NULL::jsonb AS state_version,
               FALSE AS "expired!",
               NULL::bigint AS lease_left_ms, NULL::bigint AS expires_in_ms,
               NULL::jsonb AS field_digests, now() AS "now!"
        FROM reserved
        UNION ALL
        SELECT id, FALSE, request_hash, fingerprint_version, status, response_version,
               response_code, response_headers, response_body,
               recovery_point, recovery_state -> 'version',
               expires_at <= now()
                 AND (status = 'completed' OR (locked_until <= now() AND recovery_point IS NULL)),
               (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::bigint,
               (EXTRACT(EPOCH FROM expires_at - now()) * 1000)::bigint,
               field_digests, now()
        FROM idempotency_keys
        WHERE account_id = $11 AND scope = $1 AND idem_key = $2
          AND NOT EXISTS (SELECT 1 FROM reserved)
        "#,
        request.scope.as_str(),
        request.key.as_str(),
        fingerprint.as_bytes().as_slice(),
        token,
        millis(lease),
        millis(key_ttl),
        first_point.map(|point| point.name.as_str()),
        first_point.map(|point| &point.state),
        first_point.map(|point| point.downstream_key.as_str()),
        request.fields.as_ref().map(Json) as Option<Json<&FieldDigests>>,
        request.scope.owner(),
        Durability::of_reservation(first_point).synchronous_commit(),
        fingerprint_version.get(),
    )
    .fetch_optional(&mut *connection)
    .await;
    let Some(row) = connection.give_back(row)? else {
        return Ok(Reservation::Undecided);
    };
    if row.reserved {
        return Ok(Reservation::Reserved {
            key_id: row.id,
            now: row.now,
        });
    }
    existing(KeyRow {
        id: row.id,
        request_hash: row.request_hash,
        fingerprint_version: row.fingerprint_version,
        status: row.status,
        response_version: row.response_version,
        response_code: row.response_code,
        response_headers: row.response_headers,
        response_body: row.response_body,
        recovery_point: row.recovery_point,
        state_version: row.state_version,
        expired: row.expired,
        lease_left_ms: row.lease_left_ms,
        expires_in_ms: row.expires_in_ms,
        field_digests: row.field_digests,
    })
}

/// The fingerprint a new key records: the request's under the current version.
fn current(request: &KeyedRequest) -> Result<(FingerprintVersion, Fingerprint), Error> {
    request
        .fingerprints
        .current()
        .ok_or_else(|| Error::Internal(anyhow::anyhow!("a request to reserve has no fingerprint")))
}

/// A key row as the reservation reads it when the key exists.
struct KeyRow {
    id: i64,
    request_hash: Option<Vec<u8>>,
    fingerprint_version: Option<i16>,
    status: Option<KeyStatus>,
    response_version: Option<i16>,
    response_code: Option<i16>,
    response_headers: Option<serde_json::Value>,
    response_body: Option<Vec<u8>>,
    recovery_point: Option<String>,
    /// The `version` member of the recovery point's state, if it has one.
    state_version: Option<serde_json::Value>,
    expired: bool,
    lease_left_ms: Option<i64>,
    expires_in_ms: Option<i64>,
    field_digests: Option<serde_json::Value>,
}

fn existing(row: KeyRow) -> Result<Reservation, Error> {
    let state = match row.status {
        Some(KeyStatus::Completed) => match StoredResponse::from_row(
            row.response_version,
            row.response_code,
            row.response_headers,
            row.response_body,
        )? {
            Ok(stored) => KeyState::Completed(stored),
            Err(unknown) => KeyState::Unreadable(unknown),
        },
        Some(KeyStatus::Held) => KeyState::Held,
        Some(KeyStatus::InProgress) | None => KeyState::InProgress {
            lease_left: positive(row.lease_left_ms),
            point: row
                .recovery_point
                .map(|name| PointAt::new(name, row.state_version.as_ref())),
        },
    };
    Ok(Reservation::Existing(ExistingKey {
        key_id: row.id,
        fingerprint: row
            .request_hash
            .as_deref()
            .and_then(Fingerprint::from_slice)
            .map(|hash| (FingerprintVersion::stored(row.fingerprint_version), hash)),
        // Digests in a shape this release does not read name nothing: the 422 omits the list.
        fields: row
            .field_digests
            .and_then(|digests| serde_json::from_value(digests).ok()),
        expired: row.expired,
        expires_in: positive(row.expires_in_ms),
        state,
    }))
}

/// The reservation on Citus: the insert alone, then, if it met a row, the read of that row, each
/// a statement Citus routes to the one node that holds the account. (A statement that modifies
/// in a CTE is run there as several steps; these two are one step each.) A new key still costs
/// one round trip; an existing one costs two, the second seeing the row as it is now.
async fn reserve_routed(
    lot: &Lot,
    request: &KeyedRequest,
    token: Uuid,
    lease: Duration,
    key_ttl: Duration,
    first_point: Option<&RecoveryPoint>,
) -> Result<Reservation, Error> {
    let (fingerprint_version, fingerprint) = current(request)?;
    let mut connection = lot.lend().await?;
    let reserved = sqlx::query!(
        r#"
        INSERT INTO idempotency_keys
            (account_id, scope, idem_key, request_hash, status, lock_token, locked_until,
             expires_at, recovery_point, recovery_state, downstream_key, field_digests,
             fingerprint_version)
        VALUES ($11, $1, $2, $3, 'in_progress', $4,
                now() + $5::bigint * interval '1 millisecond',
                now() + $6::bigint * interval '1 millisecond',
                $7, $8, $9, $10, $12)
        ON CONFLICT (account_id, scope, idem_key) DO NOTHING
        RETURNING id, created_at AS now
        "#,
        request.scope.as_str(),
        request.key.as_str(),
        fingerprint.as_bytes().as_slice(),
        token,
        millis(lease),
        millis(key_ttl),
        first_point.map(|point| point.name.as_str()),
        first_point.map(|point| &point.state),
        first_point.map(|point| point.downstream_key.as_str()),
        request.fields.as_ref().map(Json) as Option<Json<&FieldDigests>>,
        request.scope.owner(),
        fingerprint_version.get(),
    )
    .fetch_optional(&mut *connection)
    .await;
    // An error gives the connection back (and may close it); a met row keeps it for the read.
    let reserved = match reserved {
        Ok(reserved) => reserved,
        Err(error) => return Err(connection.give_back::<()>(Err(error)).unwrap_err().into()),
    };
    if let Some(row) = reserved {
        connection.give_back(Ok(()))?;
        return Ok(Reservation::Reserved {
            key_id: row.id,
            now: row.now,
        });
    }
    let row = sqlx::query!(
        r#"
        SELECT id, request_hash, fingerprint_version, status AS "status: KeyStatus",
               response_version, response_code, response_headers, response_body,
               recovery_point, recovery_state -> 'version' AS state_version,
               expires_at <= now()
                 AND (status = 'completed' OR (locked_until <= now() AND recovery_point IS NULL))
                 AS "expired!",
               (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::bigint AS lease_left_ms,
               (EXTRACT(EPOCH FROM expires_at - now()) * 1000)::bigint AS expires_in_ms,
               field_digests
        FROM idempotency_keys
        WHERE account_id = $3 AND scope = $1 AND idem_key = $2
        "#,
        request.scope.as_str(),
        request.key.as_str(),
        request.scope.owner(),
    )
    .fetch_optional(&mut *connection)
    .await;
    let Some(row) = connection.give_back(row)? else {
        return Ok(Reservation::Undecided);
    };
    existing(KeyRow {
        id: row.id,
        request_hash: Some(row.request_hash),
        fingerprint_version: row.fingerprint_version,
        status: Some(row.status),
        response_version: row.response_version,
        response_code: row.response_code,
        response_headers: row.response_headers,
        response_body: row.response_body,
        recovery_point: row.recovery_point,
        state_version: row.state_version,
        expired: row.expired,
        lease_left_ms: row.lease_left_ms,
        expires_in_ms: row.expires_in_ms,
        field_digests: row.field_digests,
    })
}

// -------------------------------------------------------------------------------------------
// Take over and recycle: one conditional update each; of several contenders, at most one wins.
// -------------------------------------------------------------------------------------------

/// A key taken over: the database's time when it was, and the recovery point its earlier holder
/// recorded, if it reached one.
pub(super) struct TakenOver {
    pub now: DateTime<Utc>,
    /// When the key's recovery window began: its `created_at`. (A key taken over past its window
    /// before it reached a call gets a call refused for its deadline, is released, and its next
    /// retry reserves it anew.)
    pub window_from: DateTime<Utc>,
    pub recovery: Option<RecoveryPoint>,
}

/// Installs `token` on a key whose lease ran out, if it is still in progress with this payload
/// (`fingerprint`, under the version the key was made with). A key that has no recovery point yet
/// gets `first_point`, the one the request starts at (its earlier holder died before it recorded
/// one, or the key predates recovery points). A key at a recovery point older than `window` is not
/// taken over: it is for [`hold`]; nor one whose point and state's version are none of `known`
/// (see `StateVersion::paired_with`): it is left alone for a release that reads it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn take_over(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    fingerprint: (FingerprintVersion, Fingerprint),
    known: &[String],
    token: Uuid,
    lease: Duration,
    window: Duration,
    first_point: Option<&RecoveryPoint>,
) -> Result<Option<TakenOver>, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET lock_token = $2, locked_until = now() + $3::bigint * interval '1 millisecond',
            takeovers = takeovers + 1,
            recovery_point = COALESCE(recovery_point, $5),
            recovery_state = CASE WHEN recovery_point IS NULL THEN $6 ELSE recovery_state END,
            downstream_key = COALESCE(downstream_key, $7)
        WHERE account_id = $8 AND id = $1 AND status = 'in_progress' AND locked_until <= now()
          AND request_hash = $4 AND COALESCE(fingerprint_version, 1) = $10::smallint
          AND (recovery_point IS NULL
               OR (created_at > now() - $9::bigint * interval '1 millisecond'
                   AND COALESCE(recovery_state -> 'version', '1')::text || ' ' || recovery_point
                       = ANY($11)))
        RETURNING locked_until AS "locked_until!", created_at, recovery_point, recovery_state,
                  downstream_key
        "#,
        key_id,
        token,
        millis(lease),
        fingerprint.1.as_bytes().as_slice(),
        first_point.map(|point| point.name.as_str()),
        first_point.map(|point| &point.state),
        first_point.map(|point| point.downstream_key.as_str()),
        owner,
        millis(window),
        fingerprint.0.get(),
        known,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| TakenOver {
        now: granted_at(row.locked_until, lease),
        window_from: row.created_at,
        recovery: RecoveryPoint::from_columns(
            row.recovery_point,
            row.recovery_state,
            row.downstream_key,
            first_point.map(|point| point.downstream_key.as_str()),
        ),
    }))
}

/// Reserves an expired key anew for another payload, unless its row changed meanwhile; the
/// database's time when it did.
pub(super) async fn recycle(
    pool: &PgPool,
    key_id: i64,
    request: &KeyedRequest,
    token: Uuid,
    lease: Duration,
    key_ttl: Duration,
    first_point: Option<&RecoveryPoint>,
) -> Result<Option<DateTime<Utc>>, Error> {
    let (fingerprint_version, fingerprint) = current(request)?;
    // Every column of the key's earlier life is written anew, its versions included: a version
    // left behind would name the format of what this life writes.
    let recycled = sqlx::query_scalar!(
        r#"
        UPDATE idempotency_keys
        SET request_hash = $2, fingerprint_version = $11, status = 'in_progress', lock_token = $3,
            locked_until = now() + $4::bigint * interval '1 millisecond',
            response_version = NULL, response_code = NULL, response_headers = NULL,
            response_body = NULL,
            recovery_point = $6, recovery_state = $7, downstream_key = $8,
            field_digests = $9, takeovers = 0, completed_at = NULL,
            created_at = now(), expires_at = now() + $5::bigint * interval '1 millisecond'
        WHERE account_id = $10 AND id = $1 AND expires_at <= now()
          AND (status = 'completed' OR (locked_until <= now() AND recovery_point IS NULL))
        RETURNING created_at
        "#,
        key_id,
        fingerprint.as_bytes().as_slice(),
        token,
        millis(lease),
        millis(key_ttl),
        first_point.map(|point| point.name.as_str()),
        first_point.map(|point| &point.state),
        first_point.map(|point| point.downstream_key.as_str()),
        request.fields.as_ref().map(Json) as Option<Json<&FieldDigests>>,
        request.scope.owner(),
        fingerprint_version.get(),
    )
    .fetch_optional(pool)
    .await?;
    Ok(recycled)
}

// -------------------------------------------------------------------------------------------
// Execute with the lease: renewed while the work runs, fenced by the token.
// -------------------------------------------------------------------------------------------

/// Extends the lease held under `token`; `false` when the key was taken over.
pub(super) async fn renew(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    token: Uuid,
    lease: Duration,
) -> Result<bool, sqlx::Error> {
    let renewed = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET locked_until = now() + $3::bigint * interval '1 millisecond'
        WHERE account_id = $4 AND id = $1 AND lock_token = $2 AND status = 'in_progress'
        "#,
        key_id,
        token,
        millis(lease),
        owner,
    )
    .execute(pool)
    .await?;
    Ok(renewed.rows_affected() > 0)
}

/// The key's stored response, read after this request lost its lease: `None` while the key is in
/// progress, gone, completed for another payload, or in a format this release does not read.
pub(super) async fn completed_response(
    pool: &PgPool,
    request: &KeyedRequest,
) -> Result<Option<StoredResponse>, Error> {
    let row = sqlx::query!(
        r#"
        SELECT request_hash, fingerprint_version, status AS "status: KeyStatus",
               response_version, response_code, response_headers, response_body
        FROM idempotency_keys
        WHERE account_id = $3 AND scope = $1 AND idem_key = $2
        "#,
        request.scope.as_str(),
        request.key.as_str(),
        request.scope.owner(),
    )
    .fetch_optional(pool)
    .await?;
    match row {
        Some(row)
            if row.status == KeyStatus::Completed
                && request
                    .fingerprints
                    .compare(Fingerprint::from_slice(&row.request_hash).map(|hash| {
                        (FingerprintVersion::stored(row.fingerprint_version), hash)
                    }))
                    == Comparison::Same =>
        {
            Ok(StoredResponse::from_row(
                row.response_version,
                row.response_code,
                row.response_headers,
                row.response_body,
            )?
            .ok())
        }
        _ => Ok(None),
    }
}

// -------------------------------------------------------------------------------------------
// Complete: `idempotency_complete(…)`, a function of the database (see its migration), fenced by
// the token. The work calls it in the statement that writes its effect, or the mechanism calls it
// in the work's transaction.
// -------------------------------------------------------------------------------------------

/// The SQLSTATE `idempotency_complete` raises when the token no longer holds the key.
const LEASE_LOST: &str = "IK001";

/// Whether `error` is the completion's refusal: another request took the key over.
pub(super) fn is_lease_lost(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(error) if error.code().as_deref() == Some(LEASE_LOST))
}

/// Completes the key in the work's transaction; `false` when another request took it over (the
/// caller then rolls the transaction back).
///
/// The same update as `idempotency_complete(…)`, as a statement of its own rather than a call of
/// the function: on Citus a statement inside a function is planned without the values of its
/// parameters, so it would update every shard of the table (and commit by two-phase commit),
/// where this one is routed to the key's shard.
pub(super) async fn complete(tx: &mut PgConnection, fence: &Fence) -> Result<bool, sqlx::Error> {
    let completed = sqlx::query!(
        r#"
        UPDATE idempotency_keys
        SET status = 'completed', lock_token = NULL, locked_until = NULL,
            response_code = $4, response_headers = $5, response_body = $6,
            completed_at = now(), expires_at = now() + $7::bigint * interval '1 millisecond'
        WHERE account_id = $1 AND id = $2 AND lock_token = $3 AND status = 'in_progress'
        "#,
        &*fence.owner,
        fence.key_id,
        fence.token,
        fence.response_code,
        fence.response_headers,
        &fence.response_body[..],
        fence.ttl_ms,
    )
    .execute(tx)
    .await?;
    Ok(completed.rows_affected() == 1)
}

// -------------------------------------------------------------------------------------------
// Release: a DELETE fenced by the same token.
// -------------------------------------------------------------------------------------------

/// What became of a key whose work failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Released {
    /// Deleted: the work never reached a recovery point, so nothing happened outside the database
    /// and the retry starts afresh.
    Deleted,
    /// Kept in progress with its lease ended now: the work had recorded a recovery point, so its
    /// call may have taken effect; the next attempt takes the key over at once and resumes.
    Suspended,
    /// Neither: the token no longer holds the key (it was taken over).
    NotHeld,
    /// The database could not be asked: the lease runs out and a retry takes the key over.
    Unknown,
}

impl Released {
    /// How the request that released the key ended, as counted.
    pub(super) fn outcome(self) -> crate::metrics::KeyOutcome {
        use crate::metrics::KeyOutcome;
        match self {
            Self::Deleted | Self::Unknown => KeyOutcome::Released,
            Self::Suspended => KeyOutcome::Suspended,
            Self::NotHeld => KeyOutcome::LeaseLost,
        }
    }
}

/// Deletes the key, or suspends it if it has a recovery point; both fenced by the token. One
/// statement, so the choice is made on the row as it is.
pub(super) async fn release(
    pool: &PgPool,
    owner: &str,
    key_id: i64,
    token: Uuid,
) -> Result<Released, sqlx::Error> {
    let row = sqlx::query!(
        r#"
        WITH deleted AS (
            DELETE FROM idempotency_keys
            WHERE account_id = $3 AND id = $1 AND lock_token = $2 AND status = 'in_progress'
              AND recovery_point IS NULL
            RETURNING id
        ), suspended AS (
            UPDATE idempotency_keys SET locked_until = now()
            WHERE account_id = $3 AND id = $1 AND lock_token = $2 AND status = 'in_progress'
              AND recovery_point IS NOT NULL
            RETURNING id
        )
        SELECT EXISTS (SELECT 1 FROM deleted) AS "deleted!",
               EXISTS (SELECT 1 FROM suspended) AS "suspended!"
        "#,
        key_id,
        token,
        owner,
    )
    .fetch_one(pool)
    .await?;
    Ok(match (row.deleted, row.suspended) {
        (true, _) => Released::Deleted,
        (_, true) => Released::Suspended,
        _ => Released::NotHeld,
    })
}

// -------------------------------------------------------------------------------------------
// Expire: batched, `SKIP LOCKED`, an index scan on `expires_at`.
// -------------------------------------------------------------------------------------------

/// Keys per expiry batch: small enough to keep each statement's locks short. The statements carry
/// it as a literal `LIMIT 1000`.
pub const BATCH: u64 = 1_000;

/// Deletes up to [`BATCH`] expired keys and returns how many. The batch size
/// is written into the statement, not passed to it: a generic plan of a prepared statement does
/// not know a parameter's value, guesses a large share of the table, and joins the batch to it
/// with a scan of the whole table.
///
/// The batch is locked by a sub-select in `ARRAY(…)`, which PostgreSQL runs once, before the
/// delete, and its rows are then found by their address (`ctid`, a TID scan); the locks keep the
/// addresses valid until the delete. Written as `WHERE (account_id, id) IN (SELECT … LIMIT 1000
/// FOR UPDATE SKIP LOCKED)`, the planner may run the sub-select again for every row it compares,
/// and it does when the plan was made while the table's statistics said it was empty: each run
/// skips the rows the statement has already deleted, so the limit bounds nothing. Measured: one
/// such statement deleted 30,000 keys in 257 s, and three instances' jobs met the statement
/// timeout; the same batch in this form takes 7 ms.
pub(super) async fn expire_batch(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let deleted = sqlx::query!(
        r#"
        DELETE FROM idempotency_keys
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM idempotency_keys
            WHERE expires_at <= now()
              AND (status = 'completed' OR (locked_until <= now() AND recovery_point IS NULL))
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        ))
        "#,
    )
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}

/// [`expire_batch`] for a distributed table (Citus), which takes row locks only in a statement on
/// one shard: the batch is read without locks, then deleted by its primary keys with the
/// conditions checked again, so a key recycled or taken up meanwhile stays. The read alone runs
/// when nothing has expired: a write to every shard would commit by two-phase commit at every run.
pub(super) async fn expire_batch_unlocked(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let batch = sqlx::query!(
        r#"
        SELECT account_id, id FROM idempotency_keys
        WHERE expires_at <= now()
          AND (status = 'completed' OR (locked_until <= now() AND recovery_point IS NULL))
        LIMIT 1000
        "#,
    )
    .fetch_all(pool)
    .await?;
    if batch.is_empty() {
        return Ok(0);
    }
    let (owners, ids): (Vec<String>, Vec<i64>) = batch
        .into_iter()
        .map(|row| (row.account_id, row.id))
        .unzip();
    let deleted = sqlx::query!(
        r#"
        DELETE FROM idempotency_keys
        WHERE (account_id, id) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))
          AND expires_at <= now()
          AND (status = 'completed' OR (locked_until <= now() AND recovery_point IS NULL))
        "#,
        &owners,
        &ids,
    )
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}

/// The database's `now()` when a lease ending at `locked_until` was granted for `lease`. Statements
/// return the lease's end rather than `now()`: Citus evaluates `now()` on the coordinator and
/// allows no such function in a distributed statement's `RETURNING`.
pub(super) fn granted_at(locked_until: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    locked_until - chrono::Duration::milliseconds(millis(lease))
}

/// A time left in milliseconds, `None` when it has run out.
fn positive(ms: Option<i64>) -> Option<Duration> {
    ms.filter(|ms| *ms > 0)
        .map(|ms| Duration::from_millis(ms.unsigned_abs()))
}

pub(super) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
