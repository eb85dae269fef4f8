-- Suspension has bounds. A key suspended at a recovery point (its call to the processor may have
-- taken effect) is resumed by retries and the recovery job, but only while the processor still
-- remembers the downstream key (it forgets keys after 24 h): a resume after that would be a new
-- charge under the old key. Past the recovery window (IDEMPAY_RECOVERY_WINDOW, counted from the
-- key's creation) the key is 'held': nothing resumes it by itself, and an operator sees it in the
-- key's inspection, the metrics and `idempay reconcile`.
ALTER TABLE idempotency_keys
    -- When the key was held for an operator.
    ADD COLUMN held_at TIMESTAMPTZ,
    -- The recovery job's next try at a suspended key: each try it makes doubles the wait, so a
    -- processor that stays down is not asked about every key at every tick.
    ADD COLUMN recover_after TIMESTAMPTZ,
    -- How many times the recovery job tried the key: the exponent of that wait.
    ADD COLUMN recoveries INTEGER NOT NULL DEFAULT 0,
    DROP CONSTRAINT idempotency_keys_status_check,
    ADD CONSTRAINT idempotency_keys_status_check
        CHECK (status IN ('in_progress', 'completed', 'held')),
    DROP CONSTRAINT idempotency_keys_state,
    ADD CONSTRAINT idempotency_keys_state CHECK (
        (status = 'in_progress'
            AND lock_token IS NOT NULL AND locked_until IS NOT NULL
            AND response_code IS NULL AND response_headers IS NULL AND response_body IS NULL)
        OR
        (status = 'completed'
            AND lock_token IS NULL AND locked_until IS NULL
            AND response_code IS NOT NULL AND response_headers IS NOT NULL AND response_body IS NOT NULL)
        OR
        (status = 'held'
            AND lock_token IS NULL AND locked_until IS NULL AND held_at IS NOT NULL
            AND recovery_point IS NOT NULL
            AND response_code IS NULL AND response_headers IS NULL AND response_body IS NULL)
    );

-- Held keys, for the operator's views (reconcile, the metrics).
CREATE INDEX idempotency_keys_held ON idempotency_keys (held_at) WHERE status = 'held';
