//! The exactly-once invariants, written once as SQL and checked after every fault scenario.

use sqlx::PgPool;

/// Panics with the offending rows if any invariant does not hold:
/// - every completed payment key that answered with a payment (201, 402) has exactly one payment,
///   with the id its stored response names;
/// - every payment belongs to a key that is completed: the payment and the key's completion
///   commit together, so a payment never exists beside a key still in progress;
/// - no two payments share an account and a key;
/// - every payment has exactly one creation event, every refund one `refund.created`, and every
///   event names a payment or refund of its account: an event exists if and only if its change
///   committed.
pub async fn assert_exactly_once(db: &PgPool) {
    let without_one_payment: Vec<(String, i64)> = sqlx::query_as(
        "SELECT k.idem_key, count(p.id)
         FROM idempotency_keys k
         LEFT JOIN payments p
           ON p.account_id = k.account_id AND p.idempotency_key = k.idem_key
         WHERE k.scope LIKE '%:POST /v1/payments' AND k.status = 'completed'
           AND k.response_code IN (201, 402)
         GROUP BY k.scope, k.idem_key
         HAVING count(p.id) <> 1",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        without_one_payment.is_empty(),
        "keys without exactly one payment: {without_one_payment:?}"
    );

    let replay_names_another_payment: Vec<String> = sqlx::query_scalar(
        "SELECT k.idem_key
         FROM idempotency_keys k
         JOIN payments p
           ON p.account_id = k.account_id AND p.idempotency_key = k.idem_key
         WHERE k.scope LIKE '%:POST /v1/payments' AND k.status = 'completed'
           AND k.response_code IN (201, 402)
           AND p.id <> coalesce(convert_from(k.response_body, 'UTF8')::jsonb ->> 'id',
                                convert_from(k.response_body, 'UTF8')::jsonb ->> 'payment')",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        replay_names_another_payment.is_empty(),
        "stored responses naming another payment: {replay_names_another_payment:?}"
    );

    // The payment and its key's completion are written by one statement: a payment whose key is
    // missing, or still in progress, was committed without its completion.
    let without_a_completed_key: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT p.id, k.status::text
         FROM payments p
         LEFT JOIN idempotency_keys k
           ON k.account_id = p.account_id AND k.scope = p.account_id || ':POST /v1/payments'
          AND k.idem_key = p.idempotency_key
         WHERE k.status IS DISTINCT FROM 'completed'
         ORDER BY p.id",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        without_a_completed_key.is_empty(),
        "payments without their completed key (payment, the key's status if any): \
         {without_a_completed_key:?}"
    );

    let shared: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT account_id, idempotency_key, count(*)
         FROM payments GROUP BY account_id, idempotency_key HAVING count(*) > 1",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        shared.is_empty(),
        "payments sharing an account and key: {shared:?}"
    );
    assert_one_event_per_change(db).await;
}

/// The events are written in the transaction of their change: a payment's creation event
/// (`payment.succeeded`, `payment.declined`, or `payment.authorized` for a manual one, at the
/// payment's own `created_at`; a later `payment.succeeded` may follow a failure) and a refund's
/// `refund.created` exist once each, and no event outlives a change that rolled back.
async fn assert_one_event_per_change(db: &PgPool) {
    let without_one_event: Vec<(String, i64)> = sqlx::query_as(
        "WITH created AS (
             SELECT account_id, type, created_at,
                    convert_from(body, 'UTF8')::jsonb -> 'data' -> 'object' ->> 'id' AS object
             FROM events
             WHERE type IN ('payment.succeeded', 'payment.declined', 'payment.authorized',
                            'refund.created')
         )
         SELECT p.id, count(c.object)
         FROM payments p
         LEFT JOIN created c
           ON c.object = p.id AND c.account_id = p.account_id AND c.created_at = p.created_at
          AND c.type <> 'refund.created'
         GROUP BY p.id HAVING count(c.object) <> 1
         UNION ALL
         SELECT r.id, count(c.object)
         FROM refunds r
         LEFT JOIN created c
           ON c.object = r.id AND c.account_id = r.account_id AND c.type = 'refund.created'
         GROUP BY r.id HAVING count(c.object) <> 1",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        without_one_event.is_empty(),
        "payments and refunds without exactly one creation event (object, events): \
         {without_one_event:?}"
    );

    let about_nothing: Vec<String> = sqlx::query_scalar(
        "SELECT e.id
         FROM events e
         WHERE NOT EXISTS (
                 SELECT FROM payments p
                 WHERE p.account_id = e.account_id
                   AND p.id = convert_from(e.body, 'UTF8')::jsonb -> 'data' -> 'object' ->> 'id')
           AND NOT EXISTS (
                 SELECT FROM refunds r
                 WHERE r.account_id = e.account_id
                   AND r.id = convert_from(e.body, 'UTF8')::jsonb -> 'data' -> 'object' ->> 'id')
           AND NOT EXISTS (
                 SELECT FROM disputes d
                 WHERE d.account_id = e.account_id
                   AND d.id = convert_from(e.body, 'UTF8')::jsonb -> 'data' -> 'object' ->> 'id')
         ORDER BY e.id",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        about_nothing.is_empty(),
        "events about no payment, refund or dispute: {about_nothing:?}"
    );
}

/// Panics unless every charge at the processor (its ledger in the same database) is recorded by
/// exactly one payment, and every payment records a charge that exists with its amount: one
/// charge per intent, one payment per charge, no charge unrecorded.
pub async fn assert_every_charge_recorded_once(db: &PgPool) {
    let differences: Vec<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT c.id, p.id
         FROM processor_charges c
         FULL JOIN payments p ON p.charge = c.id
         WHERE c.id IS NULL OR p.id IS NULL OR p.amount <> c.amount",
    )
    .fetch_all(db)
    .await
    .unwrap();
    assert!(
        differences.is_empty(),
        "charges and payments that do not match one to one (charge, payment): {differences:?}"
    );
}
