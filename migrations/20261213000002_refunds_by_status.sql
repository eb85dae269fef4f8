-- no-transaction
-- `GET /v1/refunds?status=…` lists an account's refunds in one status, newest first, a page at a
-- time by the keyset (created_at, id), with its `created` bounds: this index is that order behind
-- the account and the status, so the page is an index range scan however few of the account's
-- refunds are in a rare status (yesterday's `failed` refunds, say): checked as a filter on the
-- account's scan, it would read every newer row of the account first. The list without a status
-- keeps `refunds_account_created` (one payment's, `refunds_payment_id_created_at`), and its
-- statement names no status at all, so that a prepared statement's generic plan never has to serve
-- both.
-- CONCURRENTLY: refunds are written all the time, and a plain build would block them for its
-- whole length. No lock_timeout or statement_timeout before it: they would be a second statement,
-- the lock it takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes, and a build cut
-- short by a timeout would leave an invalid index behind.
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS refunds_account_status_created
    ON refunds (account_id, status, created_at DESC, id DESC);
