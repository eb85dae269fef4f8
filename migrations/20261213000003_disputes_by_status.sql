-- no-transaction
-- `GET /v1/disputes?status=…` lists an account's disputes in one status, newest first, a page at a
-- time by the keyset (created_at, id), with its `created` bounds: this index is that order behind
-- the account and the status, so the page is an index range scan however few of the account's
-- disputes are in a rare status (the disputes `needs_response`, say): checked as a filter on the
-- account's scan, it would read every newer row of the account first. The list without a status
-- keeps `disputes_account_created` (one payment's, `disputes_payment_id`), and its statement names
-- no status at all, so that a prepared statement's generic plan never has to serve both.
-- CONCURRENTLY: disputes are written all the time, and a plain build would block them for its
-- whole length. No lock_timeout or statement_timeout before it: they would be a second statement,
-- the lock it takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes, and a build cut
-- short by a timeout would leave an invalid index behind.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS disputes_account_lifecycle_created
    ON disputes (account_id, lifecycle, created_at DESC, id DESC);
