-- no-transaction
-- The processor's authorizations awaiting capture, oldest first: what its expiry job reads to void
-- those not captured in time. Partial, so it holds only the few charges held at any moment; built
-- CONCURRENTLY (see 20261205000008_processor_refunds_by_key.sql for why without timeouts).
-- squawk-ignore require-lock-timeout, require-statement-timeout
CREATE INDEX CONCURRENTLY IF NOT EXISTS processor_charges_requires_capture
    ON processor_charges (created_at) WHERE capture_state = 'requires_capture';
