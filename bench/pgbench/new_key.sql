-- The SQL of one POST /v1/payments with a new Idempotency-Key, statement for statement as idempay
-- sends it (prepared statements, bind parameters as pgbench variables):
--   1. the account lookup (src/accounts/mod.rs); the server generates the key's lock token, and the
--      client the key, in-process: here they ride on the lookup, so they cost no round trip;
--   2. the reservation (Idempotency::decide in src/idempotency/mod.rs), copied verbatim but for the
--      column aliases (sqlx's "id!" annotations are not valid pgbench variable names);
--   3. the transaction: the payment insert (src/payments/mod.rs) and the fenced completion
--      (Lease::complete), committed together.
-- Variables from -D: api_key_hash, scope, request_hash, lease_ms, ttl_ms, response_headers,
-- response_body, currency, payment_method, payment_status.
\set amount 1000
\set response_code 201
SELECT id AS account_id, name,
       gen_random_uuid()::text AS idem_key, gen_random_uuid() AS lock_token,
       'pay_' || replace(gen_random_uuid()::text, '-', '') AS payment_id
FROM accounts WHERE api_key_hash = :api_key_hash \gset
WITH reserved AS (
    INSERT INTO idempotency_keys
        (scope, idem_key, request_hash, status, lock_token, locked_until, expires_at)
    VALUES (:scope, :idem_key, :request_hash, 'in_progress', :lock_token,
            now() + :lease_ms::bigint * interval '1 millisecond',
            now() + :ttl_ms::bigint * interval '1 millisecond')
    ON CONFLICT (scope, idem_key) DO NOTHING
    RETURNING id
)
SELECT id AS key_id, TRUE AS reserved,
       NULL::bytea AS request_hash, NULL::text AS status,
       NULL::smallint AS response_code, NULL::jsonb AS response_headers,
       NULL::bytea AS response_body, FALSE AS expired,
       NULL::bigint AS lease_left_ms
FROM reserved
UNION ALL
SELECT id, FALSE, request_hash, status, response_code, response_headers,
       response_body, expires_at <= now(),
       (EXTRACT(EPOCH FROM locked_until - now()) * 1000)::bigint
FROM idempotency_keys
WHERE scope = :scope AND idem_key = :idem_key AND NOT EXISTS (SELECT 1 FROM reserved)
\gset k_
BEGIN;
-- order_ref and description are NULL: the bench's body has neither.
INSERT INTO payments
    (id, account_id, amount, currency, status, payment_method, order_ref, description,
     idempotency_key)
VALUES (:payment_id, :account_id, :amount, :currency, :payment_status, :payment_method, NULL, NULL,
        :idem_key)
RETURNING id, amount, currency, status, payment_method, order_ref, description,
          amount_refunded, amount_disputed, created_at;
UPDATE idempotency_keys
SET status = 'completed', lock_token = NULL, locked_until = NULL,
    response_code = :response_code, response_headers = :response_headers, response_body = :response_body,
    expires_at = now() + :ttl_ms::bigint * interval '1 millisecond'
WHERE id = :k_key_id AND lock_token = :lock_token AND status = 'in_progress';
COMMIT;
