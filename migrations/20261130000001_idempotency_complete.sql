-- The completion of a key, fenced by its lease's token, as one function of the database: the work
-- calls it in the statement that writes its effect, so the effect and the completion commit
-- together in one round trip (or in the work's transaction, for an effect of several statements).
--
-- It raises SQLSTATE IK001 when the token no longer holds the key (another request took it
-- over): the statement fails, and the effect written with it is rolled back.
CREATE FUNCTION idempotency_complete(
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
        expires_at = now() + ttl_ms * interval '1 millisecond'
    WHERE id = key_id AND lock_token = token AND status = 'in_progress';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', key_id
            USING ERRCODE = 'IK001';
    END IF;
    RETURN key_id;
END
$$;
