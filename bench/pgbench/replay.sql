-- The SQL of one POST /v1/payments replayed: a key that exists and is completed, chosen at random
-- among :replay_keys keys seeded with SQL (idem_key '1' … 'replay_keys', same scope):
-- the reservation (store::reserve in src/idempotency/store.rs), verbatim but for the column aliases: its INSERT meets
-- the existing row and its SELECT returns the stored response. It is what the first replay of a
-- key on an instance costs; later ones are answered from memory, without a round trip.
\set key random(1, :replay_keys)
WITH reserved AS (
    INSERT INTO idempotency_keys
        (account_id, scope, idem_key, request_hash, status, lock_token, locked_until, expires_at)
    VALUES (:account_id, :scope, :key, :request_hash, 'in_progress', gen_random_uuid(),
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
WHERE account_id = :account_id AND scope = :scope AND idem_key = :key AND NOT EXISTS (SELECT 1 FROM reserved)
\gset r_
