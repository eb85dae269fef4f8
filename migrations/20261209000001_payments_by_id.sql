-- no-transaction
-- A payment is found by its id alone where its account is not known yet (the processor's events
-- name it), and `payments_id_account_id` (id, account_id), the target of the refunds' and disputes'
-- foreign keys, serves that look-up as well as `payments_id` (id) did: the latter only cost every
-- payment one more index entry (bench/README.md, what a payment writes). CONCURRENTLY: payments
-- are written all the time, and a plain drop would block them behind its ACCESS EXCLUSIVE lock.
-- No lock_timeout or statement_timeout before it: they would be a second statement, and the lock
-- it takes (SHARE UPDATE EXCLUSIVE) blocks neither reads nor writes.
-- squawk-ignore require-lock-timeout, require-statement-timeout
DROP INDEX CONCURRENTLY IF EXISTS payments_id;
