-- no-transaction
-- The processor's charges found by the idempotency key they were made under
-- (`GET /v1/charges?idempotency_key=…`): how an operator settles a key of idempay's that was held
-- for want of a known outcome. Built CONCURRENTLY, outside a transaction (one statement per file:
-- several in one are sent as one implicit transaction), so that the release still serving while
-- this one migrates keeps writing charges meanwhile.
-- No lock_timeout or statement_timeout before it: they would be a second statement (see above),
-- the lock it takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes, and a build cut
-- short by a timeout would leave an invalid index behind.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS processor_charges_idempotency_key
    ON processor_charges (idempotency_key);
