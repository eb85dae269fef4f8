-- no-transaction
-- The processor's refunds found by the idempotency key they were made under
-- (`GET /v1/refunds?idempotency_key=…`), as its charges are; CONCURRENTLY for the same reason.
CREATE INDEX CONCURRENTLY IF NOT EXISTS processor_refunds_idempotency_key
    ON processor_refunds (idempotency_key);
