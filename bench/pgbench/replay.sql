-- The SQL of one POST /v1/payments replayed: a key that exists and is completed, chosen at random
-- among :replay_keys keys seeded with SQL (idem_key '1' … 'replay_keys', same scope):
--   1. the account lookup (src/accounts/mod.rs), with the lock token the server generates for the
--      attempt;
--   2. the reservation (Idempotency::decide), verbatim but for the column aliases: its INSERT meets
--      the existing row and its SELECT returns the stored response.
\set key random(1, :replay_keys)
SELECT id AS account_id, name, gen_random_uuid() AS lock_token
FROM accounts WHERE api_key_hash = :api_key_hash \gset
WITH reserved AS (
    INSERT INTO idempotency_keys
        (scope, idem_key, request_hash, status, lock_token, locked_until, expires_at)
    VALUES (:scope, :key, :request_hash, 'in_progress', :lock_token,
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
WHERE scope = :scope AND idem_key = :key AND NOT EXISTS (SELECT 1 FROM reserved)
\gset r_
