-- The seed limit for one POST /v1/payments with a new Idempotency-Key: the seed's design, done for
-- both hops, the processor's (the charge) then idempay's (the payment), nothing in between. Per hop:
--   1. INSERT … ON CONFLICT DO NOTHING, the key reserved in a transaction of its own (its commit
--      waits for the disk with synchronous_commit=on, as the design has it);
--   2. BEGIN, the effect's INSERT, the key's UPDATE to completed with the response, COMMIT.
-- Eight statements and four commits that wait, on the tables of seed_schema.sql. The key is new
-- (one random number per payment), so the INSERT always reserves it and the client's check of
-- its row count, which pgbench cannot branch on, would always pass.
-- Variables from -D (bench/lib.sh run_pgbench): scope, processor_scope, request_hash, response_body,
-- ttl_ms, currency, payment_status.
\set amount 1000
\set response_code 201
\set n random(1, 9000000000000000000)
-- The processor's hop.
INSERT INTO seed.idempotency_keys (scope, idem_key, request_hash, status, expires_at)
VALUES (:processor_scope, 'idk_' || :n, :request_hash, 'in_progress',
        now() + :ttl_ms::bigint * interval '1 millisecond')
ON CONFLICT (scope, idem_key) DO NOTHING;
BEGIN;
INSERT INTO seed.charges (id, amount, currency, status, idempotency_key)
VALUES ('ch_' || :n, :amount, :currency, :payment_status, 'idk_' || :n);
UPDATE seed.idempotency_keys
SET status = 'completed', response_code = :response_code, response_body = :response_body
WHERE scope = :processor_scope AND idem_key = 'idk_' || :n;
COMMIT;
-- idempay's hop.
INSERT INTO seed.idempotency_keys (scope, idem_key, request_hash, status, expires_at)
VALUES (:scope, 'k' || :n, :request_hash, 'in_progress',
        now() + :ttl_ms::bigint * interval '1 millisecond')
ON CONFLICT (scope, idem_key) DO NOTHING;
BEGIN;
INSERT INTO seed.payments (id, amount, currency, status, idempotency_key)
VALUES ('pay_' || :n, :amount, :currency, :payment_status, 'k' || :n);
UPDATE seed.idempotency_keys
SET status = 'completed', response_code = :response_code, response_body = :response_body
WHERE scope = :scope AND idem_key = 'k' || :n;
COMMIT;
