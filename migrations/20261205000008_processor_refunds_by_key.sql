-- no-transaction
-- The processor's refunds found by the idempotency key they were made under
-- (`GET /v1/refunds?idempotency_key=…`), as its charges are; CONCURRENTLY for the same reason.
-- No lock_timeout or statement_timeout before it: they would be a second statement (see above),
-- the lock it takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes, and a build cut
-- short by a timeout would leave an invalid index behind.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS processor_refunds_idempotency_key
    ON processor_refunds (idempotency_key);
