-- no-transaction
-- `GET /v1/events?type=…` pages through one type of an account's events in the feed's order
-- (txid, seq): this index is that order behind the account and the type, so a page of a rare type
-- reads its own events only, not every event the account wrote since. CONCURRENTLY, without
-- timeouts: see 20261211000001_refunds_by_account.sql.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS events_type_feed ON events (account_id, type, txid, seq);
