//! Retention of idempay's events: they are deleted once older than their retention, in batches, by
//! the expiry job (`expiry.rs`), so that the feed does not grow without end; the deliveries of the
//! outbox go by the outbox's own batches (`service::outbox::retention`). An event is never deleted
//! while a delivery of it is pending, nor while a retry queues one ([`prune_events`]): the event a
//! receiver's `webhook-id` names still reads at `GET /v1/events/{id}`.
//!
//! The batches are those of the key expiry (`Idempotency::expire_batch`, where the literal batch
//! size and the batch locked once in `ARRAY(…)` are explained): several instances run them at once
//! without waiting on each other. On Citus, which locks rows only in a statement on one shard, the
//! batch is read without locks and then deleted by primary key with its conditions checked again.

use std::time::Duration;

use sqlx::PgPool;

use crate::db::Engine;

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Deletes up to [`EXPIRY_BATCH`](idempotency::EXPIRY_BATCH) events created more than `retention` ago of
/// which no delivery is pending, and returns how many.
///
/// A retry (`POST /v1/events/{id}/retry`) queues a delivery of an event long after it was written,
/// holding the event's row lock (`FOR NO KEY UPDATE`) until it commits. So the batch is locked
/// first, skipping the events a retry holds, and the pending deliveries are looked for again in a
/// second statement, whose snapshot is taken once every lock is held: a retry that committed
/// before is seen there and keeps its event, and one that comes after waits for this transaction,
/// then finds its event gone and answers 404. Neither a delivery of a deleted event nor a deleted
/// event named by a pending delivery can come of it.
pub async fn prune_events(
    pool: &PgPool,
    engine: Engine,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    if engine == Engine::Citus {
        return prune_events_unlocked(pool, retention).await;
    }
    let mut tx = idempotency::connections::begin(pool).await?;
    let batch = sqlx::query!(
        r#"
        SELECT account_id, id FROM events
        WHERE created_at <= now() - $1::bigint * interval '1 millisecond'
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries AS delivery
              WHERE delivery.account_id = events.account_id
                AND delivery.event_id = events.id
                AND delivery.endpoint_id IS NOT NULL
                AND delivery.delivered_at IS NULL AND delivery.failed_at IS NULL)
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
        "#,
        millis(retention),
    )
    .fetch_all(&mut *tx)
    .await?;
    if batch.is_empty() {
        return Ok(0);
    }
    let (owners, ids): (Vec<String>, Vec<String>) = batch
        .into_iter()
        .map(|row| (row.account_id, row.id))
        .unzip();
    let deleted = delete_unless_pending(&mut tx, &owners, &ids, retention).await?;
    tx.commit().await?;
    Ok(deleted)
}

/// Deletes these events unless a delivery of one is pending, by primary key, their conditions
/// checked again.
async fn delete_unless_pending(
    conn: &mut sqlx::PgConnection,
    owners: &[String],
    ids: &[String],
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    let deleted = sqlx::query!(
        r#"
        DELETE FROM events
        WHERE (account_id, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
          AND created_at <= now() - $3::bigint * interval '1 millisecond'
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries AS delivery
              WHERE delivery.account_id = events.account_id
                AND delivery.event_id = events.id
                AND delivery.endpoint_id IS NOT NULL
                AND delivery.delivered_at IS NULL AND delivery.failed_at IS NULL)
        "#,
        owners,
        ids,
        millis(retention),
    )
    .execute(conn)
    .await?;
    Ok(deleted.rows_affected())
}

/// [`prune_events`] on Citus: the pending deliveries are looked for again in the delete, by the
/// event's account, on the node that holds both. The batch is read without locks (Citus locks rows
/// only in a statement on one shard), so a retry that commits while the delete runs is not seen
/// by it: on Citus the retention can still race a retry of an event as old as the retention.
async fn prune_events_unlocked(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let batch = sqlx::query!(
        r#"
        SELECT account_id, id FROM events
        WHERE created_at <= now() - $1::bigint * interval '1 millisecond'
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries AS delivery
              WHERE delivery.account_id = events.account_id
                AND delivery.event_id = events.id
                AND delivery.endpoint_id IS NOT NULL
                AND delivery.delivered_at IS NULL AND delivery.failed_at IS NULL)
        LIMIT 1000
        "#,
        millis(retention),
    )
    .fetch_all(pool)
    .await?;
    if batch.is_empty() {
        return Ok(0);
    }
    let (owners, ids): (Vec<String>, Vec<String>) = batch
        .into_iter()
        .map(|row| (row.account_id, row.id))
        .unzip();
    let mut conn = pool.acquire().await?;
    delete_unless_pending(&mut conn, &owners, &ids, retention).await
}
