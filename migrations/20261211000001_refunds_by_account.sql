-- no-transaction
-- `GET /v1/refunds` lists an account's refunds newest first, a page at a time by the keyset
-- (created_at, id), and its `created` bounds narrow the same range: this index is that order
-- behind the account every query names, so a page is an index range scan (on Citus, on the shard
-- of the account). Filtered by payment, the list uses `refunds_payment_id_created_at`.
-- CONCURRENTLY: refunds are written all the time, and a plain build would block them for its
-- whole length. No lock_timeout or statement_timeout before it: they would be a second statement,
-- the lock it takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes, and a build cut
-- short by a timeout would leave an invalid index behind.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS refunds_account_created
    ON refunds (account_id, created_at DESC, id DESC);
