-- Disputes close: the cardholder's bank decides them `won` (the money comes back) or `lost` (it
-- stays with the cardholder), after the merchant's evidence put them `under_review`, as Stripe's
-- lifecycle has it. Both ledgers keep where each dispute stands.
--
-- Expand only (migrations/README.md): columns with a constant default or nullable, no rewrite.
-- What the previous release inserts gets the default, `needs_response`, which is where every
-- dispute it knows stands. idempay's `disputes.status` keeps meaning what it meant (`open`, or
-- `needs_review` for one that claimed more than remained, which an operator must look at); the
-- lifecycle is a column of its own, so neither release misreads the other's.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE processor_disputes ADD COLUMN status TEXT NOT NULL DEFAULT 'needs_response';

ALTER TABLE processor_disputes
    ADD CONSTRAINT processor_disputes_status
        CHECK (status IN ('needs_response', 'under_review', 'won', 'lost')) NOT VALID;

ALTER TABLE disputes
    ADD COLUMN lifecycle TEXT NOT NULL DEFAULT 'needs_response',
    -- The `timestamp` of the processor's last event applied to the lifecycle: an older one
    -- arriving later is `stale`, as for a payment's status.
    ADD COLUMN last_event_at TIMESTAMPTZ;

ALTER TABLE disputes
    ADD CONSTRAINT disputes_lifecycle
        CHECK (lifecycle IN ('needs_response', 'under_review', 'won', 'lost')) NOT VALID;
