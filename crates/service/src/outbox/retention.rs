//! Retention of the outbox: deliveries, with their attempts, are deleted once acknowledged or given
//! up longer ago than their retention, in batches, by each service's expiry job, so that the
//! outbox does not grow without end. A delivery still pending (neither acknowledged nor given up)
//! is never deleted, whatever its age: a receiver that has been down for the whole retention
//! still gets what it is owed.
//!
//! The batches are those of the key expiry (`Idempotency::expire_batch`, where the literal batch
//! size and the batch locked once in `ARRAY(…)` are explained): several instances run them at once
//! without waiting on each other. On Citus, which locks rows only in a statement on one shard, the
//! batch is read without locks and then deleted by primary key with its conditions checked again.

use std::time::Duration;

use sqlx::PgPool;

use idempotency::engine::Engine;

/// Whose deliveries a batch deletes: the two senders share the outbox and keep theirs for times of
/// their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Deliveries to merchant endpoints (`endpoint_id` set).
    Endpoints,
    /// The processor's own events (`endpoint_id` NULL).
    Processor,
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Deletes up to [`EXPIRY_BATCH`](idempotency::EXPIRY_BATCH) deliveries of `owner` acknowledged or given up
/// more than `retention` ago, their attempts with them (the foreign key cascades), and returns
/// how many deliveries.
pub async fn prune_deliveries(
    pool: &PgPool,
    engine: Engine,
    owner: Owner,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let processor = owner == Owner::Processor;
    if engine == Engine::Citus {
        return prune_deliveries_unlocked(pool, processor, retention).await;
    }
    let deleted = sqlx::query!(
        r#"
        DELETE FROM webhook_deliveries
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM webhook_deliveries
            WHERE (endpoint_id IS NULL) = $1
              AND (delivered_at IS NOT NULL OR failed_at IS NOT NULL)
              AND COALESCE(delivered_at, failed_at) <= now() - $2::bigint * interval '1 millisecond'
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        ))
        "#,
        processor,
        millis(retention),
    )
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}

/// [`prune_deliveries`] on Citus. A row finished stays finished (nothing sets `delivered_at` or
/// `failed_at` back), so the conditions checked again only guard against a row's id being reused.
async fn prune_deliveries_unlocked(
    pool: &PgPool,
    processor: bool,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let batch = sqlx::query!(
        r#"
        SELECT account_id, id FROM webhook_deliveries
        WHERE (endpoint_id IS NULL) = $1
          AND (delivered_at IS NOT NULL OR failed_at IS NOT NULL)
          AND COALESCE(delivered_at, failed_at) <= now() - $2::bigint * interval '1 millisecond'
        LIMIT 1000
        "#,
        processor,
        millis(retention),
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
        DELETE FROM webhook_deliveries
        WHERE (account_id, id) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))
          AND (delivered_at IS NOT NULL OR failed_at IS NOT NULL)
          AND COALESCE(delivered_at, failed_at) <= now() - $3::bigint * interval '1 millisecond'
        "#,
        &owners,
        &ids,
        millis(retention),
    )
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}
