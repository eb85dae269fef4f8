-- no-transaction
-- The delivery loop's fair claim (crates/service/src/outbox/fair.rs) reads the due deliveries of
-- each endpoint in turn, the oldest first: an endpoint is the account's endpoint id, or the URL for
-- the processor's deliveries, which have none. This index serves both the walk over the endpoints
-- with pending deliveries and each endpoint's oldest due ones, so a claim reads a few rows per
-- endpoint however long one endpoint's backlog. CONCURRENTLY: the outbox is written by every
-- payment, and a plain build would block them for its whole length.
-- No lock_timeout or statement_timeout before it: they would be a second statement, the lock it
-- takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes, and a build cut short by a
-- timeout would leave an invalid index behind.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS webhook_deliveries_due_by_endpoint
    ON webhook_deliveries (account_id, (COALESCE(endpoint_id, url)), next_attempt_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL;
