-- The limit for one POST /v1/payments with a new Idempotency-Key, both hops: the five statements of
-- the straightforward design (the seed's) at the processor, for the charge, then the same five at
-- idempay, for the payment, with nothing in between (no HTTP, no recovery point). Prepared
-- statements, bind parameters as pgbench variables:
--   1. the reservation (store::reserve in src/idempotency/store.rs), copied verbatim but for the
--      column aliases (sqlx's "id!" annotations are not valid pgbench variable names);
--   2. BEGIN, the effect's insert (the charge; the payment), the fenced completion of the key,
--      COMMIT.
-- idempay itself sends: its reservation, its recovery point, the processor's reservation and
-- charge (BEGIN, insert, completion, COMMIT), then one statement that inserts the payment and calls
-- idempotency_complete(…) (src/payments/mod.rs). The limit keeps the seed's ten, so a better design
-- shows as a better ratio.
-- idempay makes the key (the client does), the lock token and the payment id in-process; here
-- they are built inside the statements from one random number, so they cost no round trip.
-- Variables from -D: account_id, scope, processor_scope, request_hash, lease_ms, ttl_ms, response_headers,
-- response_body, currency, payment_method, payment_status.
\set amount 1000
\set response_code 201
\set n random(1, 9000000000000000000)
WITH reserved AS (
    INSERT INTO idempotency_keys
        (account_id, scope, idem_key, request_hash, status, lock_token, locked_until, expires_at)
    VALUES (:account_id, :scope, 'k' || :n, :request_hash, 'in_progress', md5(:n::text)::uuid,
            now() + :lease_ms::bigint * interval '1 millisecond',
            now() + :ttl_ms::bigint * interval '1 millisecond')
    ON CONFLICT (account_id, scope, idem_key) DO NOTHING
    RETURNING id
)
SELECT id AS key_id, TRUE AS reserved,
       NULL::bytea AS request_hash, NULL::text AS status,
       NULL::smallint AS response_code, NULL::jsonb AS response_headers,
       NULL::bytea AS response_body, FALSE AS expired,
       NULL::bigint AS lease_left_ms, NULL::bigint AS expires_in_ms,
       now() AS now
FROM reserved
UNION ALL
SELECT id, FALSE, request_hash, status, response_code, response_headers,
       response_body, expires_at <= now(),
       (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::bigint,
       (EXTRACT(EPOCH FROM expires_at - now()) * 1000)::bigint,
       now()
FROM idempotency_keys
WHERE account_id = :account_id AND scope = :scope AND idem_key = 'k' || :n AND NOT EXISTS (SELECT 1 FROM reserved)
\gset k_
-- The processor: its own key for the charge, under its own scope, then the charge.
WITH reserved AS (
    INSERT INTO idempotency_keys
        (account_id, scope, idem_key, request_hash, status, lock_token, locked_until, expires_at)
    VALUES ('processor', :processor_scope, 'idk_' || :n::text, :request_hash, 'in_progress',
            md5(:n::text)::uuid,
            now() + :lease_ms::bigint * interval '1 millisecond',
            now() + :ttl_ms::bigint * interval '1 millisecond')
    ON CONFLICT (account_id, scope, idem_key) DO NOTHING
    RETURNING id
)
SELECT id AS key_id, TRUE AS reserved,
       NULL::bytea AS request_hash, NULL::text AS status,
       NULL::smallint AS response_code, NULL::jsonb AS response_headers,
       NULL::bytea AS response_body, FALSE AS expired,
       NULL::bigint AS lease_left_ms, NULL::bigint AS expires_in_ms,
       now() AS now
FROM reserved
UNION ALL
SELECT id, FALSE, request_hash, status, response_code, response_headers,
       response_body, expires_at <= now(),
       (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::bigint,
       (EXTRACT(EPOCH FROM expires_at - now()) * 1000)::bigint,
       now()
FROM idempotency_keys
WHERE account_id = 'processor' AND scope = :processor_scope AND idem_key = 'idk_' || :n::text
  AND NOT EXISTS (SELECT 1 FROM reserved)
\gset c_
BEGIN;
INSERT INTO processor_charges
    (id, amount, currency, status, payment_method, decline_code, idempotency_key, created_at)
VALUES ('ch_' || :n::text, :amount, :currency, :payment_status, :payment_method, NULL, 'idk_' || :n::text,
        now());
UPDATE idempotency_keys
SET status = 'completed', lock_token = NULL, locked_until = NULL,
    response_code = :response_code, response_headers = :response_headers, response_body = :response_body,
    expires_at = now() + :ttl_ms::bigint * interval '1 millisecond'
WHERE account_id = 'processor' AND id = :c_key_id AND lock_token = md5(:n::text)::uuid AND status = 'in_progress';
COMMIT;
-- idempay: the payment that records the charge.
BEGIN;
-- order_ref and description are NULL: the bench's body has neither.
INSERT INTO payments
    (id, account_id, amount, currency, status, payment_method, order_ref, description,
     idempotency_key, charge)
VALUES ('pay_' || :n, :account_id, :amount, :currency, :payment_status, :payment_method, NULL,
        NULL, 'k' || :n, 'ch_' || :n::text)
RETURNING id, amount, currency, status, payment_method, order_ref, description,
          amount_refunded, amount_disputed, charge, created_at;
UPDATE idempotency_keys
SET status = 'completed', lock_token = NULL, locked_until = NULL,
    response_code = :response_code, response_headers = :response_headers, response_body = :response_body,
    expires_at = now() + :ttl_ms::bigint * interval '1 millisecond'
WHERE account_id = :account_id AND id = :k_key_id AND lock_token = md5(:n::text)::uuid AND status = 'in_progress';
COMMIT;
