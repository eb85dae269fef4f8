-- Recovery points: work that calls another system (the processor) records, on its key and in a
-- commit of its own, where it can be resumed before it makes the call. From then on the key's fate
-- is no longer "release it and let the retry start over": the call may have taken effect, so
-- whoever picks the key up next (the client's retry, a takeover, the recovery job) resumes from the
-- point with the same downstream key, and the other system answers it with its first result.
ALTER TABLE idempotency_keys
    -- The step the work reached, named by the work (e.g. 'payment.charge_requested').
    ADD COLUMN recovery_point TEXT CHECK (length(recovery_point) <= 100),
    -- What resuming needs (e.g. the charge's parameters), opaque to the mechanism.
    ADD COLUMN recovery_state JSONB,
    -- The key this key's work sends downstream as its own Idempotency-Key: one per key row, kept
    -- across takeovers and restarts, so every attempt names the same downstream intent.
    ADD COLUMN downstream_key TEXT,
    ADD CONSTRAINT idempotency_keys_recovery CHECK ((recovery_point IS NULL) = (recovery_state IS NULL));

-- The recovery job's scan: in-progress keys with a recovery point, oldest lease first.
CREATE INDEX idempotency_keys_recoverable ON idempotency_keys (locked_until)
    WHERE status = 'in_progress' AND recovery_point IS NOT NULL;

-- A payment records the processor's charge; one payment per charge, whatever retries and
-- recoveries do. (NULL only for payments written before the processor became a service.)
ALTER TABLE payments ADD COLUMN charge TEXT UNIQUE CHECK (charge ~ '^ch_[A-Za-z0-9]{1,64}$');
-- A refund records the processor's refund, likewise.
ALTER TABLE refunds ADD COLUMN processor_refund TEXT UNIQUE CHECK (length(processor_refund) <= 100);
