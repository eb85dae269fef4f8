-- The seed limit for one POST /v1/payments replayed: the single read of the stored response of a
-- completed key, chosen at random among :replay_keys keys seeded with SQL (idem_key '1' …
-- 'replay_keys', same scope; bench.sh seed_seed_replay_keys). A replay never reaches the processor.
\set key random(1, :replay_keys)
SELECT status, request_hash, response_code, response_body, expires_at
FROM seed.idempotency_keys
WHERE scope = :scope AND idem_key = :key;
