-- A key's life made visible (`GET /v1/idempotency_keys/{key}`), and a 422 that names what changed.
ALTER TABLE idempotency_keys
    -- When the key completed; NULL while it is in progress (and for keys completed before this
    -- migration, whose completion time was not recorded).
    ADD COLUMN completed_at  TIMESTAMPTZ,
    -- How many times another request (a retry, or the recovery job) took the key over from a
    -- holder whose lease ran out.
    ADD COLUMN takeovers     INTEGER NOT NULL DEFAULT 0,
    -- One digest per top-level member of the request body, `{"amount": "<hex SHA-256>", …}`, from
    -- the fingerprint's canonical form: a mismatch can name the members that differ without the
    -- request being stored. NULL for keys reserved before this migration.
    ADD COLUMN field_digests JSONB;

-- The completion, as before, now also recording when it happened.
CREATE OR REPLACE FUNCTION idempotency_complete(
    key_id           BIGINT,
    token            UUID,
    response_code    SMALLINT,
    response_headers JSONB,
    response_body    BYTEA,
    ttl_ms           BIGINT
) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET status = 'completed', lock_token = NULL, locked_until = NULL,
        response_code = idempotency_complete.response_code,
        response_headers = idempotency_complete.response_headers,
        response_body = idempotency_complete.response_body,
        completed_at = now(),
        expires_at = now() + ttl_ms * interval '1 millisecond'
    WHERE id = key_id AND lock_token = token AND status = 'in_progress';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', key_id
            USING ERRCODE = 'IK001';
    END IF;
    RETURN key_id;
END
$$;
