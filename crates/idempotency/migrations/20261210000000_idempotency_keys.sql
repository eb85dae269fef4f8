-- The keys' table and the one function the mechanism needs, as `idempotency::migrate` creates them
-- in a database of a service adopting the crate. (idempay's own migrations built the same schema
-- step by step; an integration test holds the two equal.)

-- One row per key and scope: the unique constraint on (account_id, scope, idem_key) is what
-- decides between concurrent requests with one key. `account_id` is the owner the service names
-- (`Owners`), the scope's first part, and the column a cluster distributes the table by.
CREATE TABLE idempotency_keys (
    id bigint GENERATED ALWAYS AS IDENTITY,
    scope text NOT NULL,
    idem_key text NOT NULL,
    -- The request's fingerprint (SHA-256), and the version of the format it was made in (NULL is 1).
    request_hash bytea NOT NULL CHECK (length(request_hash) = 32),
    status text NOT NULL CHECK (status IN ('in_progress', 'completed', 'held')),
    -- The lease of the request that holds the key while it runs.
    lock_token uuid,
    locked_until timestamptz,
    -- The stored response a repeat gets, byte for byte, and the version of its format (NULL is 1).
    response_code smallint,
    response_headers jsonb,
    response_body bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    -- Where a request that died stopped, what it needs to resume, and the key it sent downstream.
    recovery_point text CHECK (length(recovery_point) <= 100),
    recovery_state jsonb,
    downstream_key text,
    completed_at timestamptz,
    takeovers integer NOT NULL DEFAULT 0,
    -- The digests of the body's fields, to name which one changed in a 422.
    field_digests jsonb,
    account_id text NOT NULL,
    -- A key whose call has no known outcome within the recovery window waits for an operator.
    held_at timestamptz,
    recover_after timestamptz,
    recoveries integer NOT NULL DEFAULT 0,
    fingerprint_version smallint,
    response_version smallint,
    PRIMARY KEY (account_id, id),
    CONSTRAINT idempotency_keys_scope_idem_key_key UNIQUE (account_id, scope, idem_key),
    CONSTRAINT idempotency_keys_scope_owner CHECK (starts_with(scope, account_id || ':')),
    CONSTRAINT idempotency_keys_recovery CHECK ((recovery_point IS NULL) = (recovery_state IS NULL)),
    -- Each status with exactly what it needs: a lease in progress, a response once completed.
    CONSTRAINT idempotency_keys_state CHECK (
        (status = 'in_progress' AND lock_token IS NOT NULL AND locked_until IS NOT NULL
            AND response_code IS NULL AND response_headers IS NULL AND response_body IS NULL)
        OR (status = 'completed' AND lock_token IS NULL AND locked_until IS NULL
            AND response_code IS NOT NULL AND response_headers IS NOT NULL
            AND response_body IS NOT NULL)
        OR (status = 'held' AND lock_token IS NULL AND locked_until IS NULL AND held_at IS NOT NULL
            AND recovery_point IS NOT NULL
            AND response_code IS NULL AND response_headers IS NULL AND response_body IS NULL)
    )
);

-- The expiry job's deletes, oldest first.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
-- The recovery job's scan: only keys in progress at a recovery point.
CREATE INDEX idempotency_keys_recoverable ON idempotency_keys (locked_until)
    WHERE status = 'in_progress' AND recovery_point IS NOT NULL;
-- The held keys an operator settles.
CREATE INDEX idempotency_keys_held ON idempotency_keys (held_at) WHERE status = 'held';

-- Completes a key whose lease `token` still holds, in the caller's transaction, so that the effect
-- and the key's completion commit together; a lost lease raises IK001 and rolls the effect back.
CREATE FUNCTION idempotency_complete(
    owner text, key_id bigint, token uuid, response_code smallint, response_headers jsonb,
    response_body bytea, ttl_ms bigint
) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET status = 'completed', lock_token = NULL, locked_until = NULL,
        response_code = idempotency_complete.response_code,
        response_headers = idempotency_complete.response_headers,
        response_body = idempotency_complete.response_body,
        completed_at = now(),
        expires_at = now() + ttl_ms * interval '1 millisecond'
    WHERE account_id = owner AND id = key_id AND lock_token = token AND status = 'in_progress';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', key_id
            USING ERRCODE = 'IK001';
    END IF;
    RETURN key_id;
END
$$;
