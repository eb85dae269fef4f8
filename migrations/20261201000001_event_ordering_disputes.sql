-- What can be refunded is what was paid less what was refunded and what the cardholder disputes
-- (the disputed money is the bank's to take back, as Stripe refuses refunds of it): the database
-- holds that line, whatever the code does.
ALTER TABLE payments
    ADD CONSTRAINT payments_refunded_and_disputed CHECK (amount_refunded + amount_disputed <= amount),
    -- The target of the composite foreign keys below: a refund or a dispute names its payment and
    -- that payment's account, so it can never be filed under another account.
    ADD CONSTRAINT payments_id_account_id UNIQUE (id, account_id),
    -- The `timestamp` of the last event applied to the status: an older event arriving later (a
    -- redelivery, a retry from before the last change) is recorded as stale and changes nothing.
    ADD COLUMN last_event_at TIMESTAMPTZ;

ALTER TABLE refunds
    DROP CONSTRAINT refunds_payment_id_fkey,
    ADD CONSTRAINT refunds_payment_account_fkey
        FOREIGN KEY (payment_id, account_id) REFERENCES payments (id, account_id);

-- One row per dispute the processor reports, keyed by the processor's own dispute id: the same
-- dispute arriving under another event id, or after its event's record expired, changes nothing.
-- Kept for good: a dispute is part of the ledger, not a deduplication record.
CREATE TABLE disputes (
    id         TEXT        PRIMARY KEY CHECK (length(id) <= 100),
    payment_id TEXT        NOT NULL,
    account_id TEXT        NOT NULL,
    -- What the processor reports as disputed, whether or not the payment could take it all.
    amount     BIGINT      NOT NULL CHECK (amount > 0),
    -- 'open' when the payment's amount_disputed took all of it; 'needs_review' when it did not
    -- (more than remains after refunds and other disputes): the money may leave twice, an operator
    -- must look.
    status     TEXT        NOT NULL CHECK (status IN ('open', 'needs_review')),
    -- The webhook id that first brought it.
    event_id   TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    FOREIGN KEY (payment_id, account_id) REFERENCES payments (id, account_id)
);

CREATE INDEX disputes_payment_id ON disputes (payment_id);
-- An operator's queue: only the disputes to review are indexed.
CREATE INDEX disputes_needs_review ON disputes (created_at) WHERE status = 'needs_review';

-- Processed events expire after IDEMPAY_EVENT_TTL; they may now also have been too old to apply
-- ('stale'), a known effect under a new event id ('duplicate'), or recorded and flagged
-- ('needs_review').
ALTER TABLE processed_events
    DROP CONSTRAINT processed_events_outcome_check,
    ADD CONSTRAINT processed_events_outcome_check
        CHECK (outcome IN ('applied', 'ignored', 'duplicate', 'stale', 'needs_review'));
