-- The processor's events about an object of its own that idempay has not recorded yet (a charge no
-- payment names, a refund no refund names): the intake keeps them here, acknowledged, and applies
-- each once when its object is recorded (src/webhooks/parked.rs). Each has its row in
-- processed_events too, with the outcome 'parked', so a redelivery is a duplicate.
--
-- Not per account, as processed_events is not: the processor's event names none, and nothing of
-- ours names its object yet. On Citus it stays on the coordinator with processed_events.
-- Brief locks, never a long wait behind the release still serving (migrations/README.md).
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE parked_events (
    -- The event's `webhook-id`.
    id          TEXT        PRIMARY KEY,
    type        TEXT        NOT NULL,
    -- The object the event waits for: a charge (`ch_…`) or a refund (`pyr_…`) of the processor's.
    object      TEXT        NOT NULL,
    -- The account, when what the event names is recorded for one (a refund's charge); NULL for an
    -- event about a charge no payment names. The bound on parked events counts by it.
    account_id  TEXT,
    -- The delivery's body as it was verified: applied later as a redelivery of it would be, so no
    -- type of idempay's own is kept across releases.
    body        BYTEA       NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The events of an object, looked up each time a payment or refund is recorded.
CREATE INDEX parked_events_object ON parked_events (object);
-- The count of an account's parked events, taken before one more is parked.
CREATE INDEX parked_events_account ON parked_events (account_id);

-- 'parked': received and kept until its object is recorded. The check is widened, so dropping the
-- narrower one removes nothing the previous release relies on (it never writes 'parked' and reads
-- no outcome). NOT VALID: every row holds one of the outcomes the narrower check allowed, so there
-- is nothing to validate, and the new check takes effect for new rows without scanning the table
-- under its lock.
ALTER TABLE processed_events
    -- squawk-ignore ban-drop-constraint
    DROP CONSTRAINT processed_events_outcome_check,
    ADD CONSTRAINT processed_events_outcome_check
        CHECK (outcome IN ('applied', 'ignored', 'duplicate', 'stale', 'needs_review', 'parked'))
        NOT VALID;
