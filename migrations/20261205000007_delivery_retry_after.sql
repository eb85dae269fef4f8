-- A receiver's `Retry-After` (crates/service/src/outbox/schedule.rs, `RetrySchedule::retry`): an
-- attempt it asks for sooner than the schedule's next one is made then, once per step, and does
-- not use up the schedule. `early_attempts` counts those among `attempts` (the schedule's step is
-- the difference); `step_due_at` is when the schedule's own attempt is due, while an early one is
-- pending. A release that does not know them leaves them as they are: 0 and NULL are a delivery
-- that was never answered with `Retry-After`.
-- Brief locks, never a long wait behind the release still serving (migrations/README.md).
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE webhook_deliveries
    ADD COLUMN early_attempts INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN step_due_at TIMESTAMPTZ;
