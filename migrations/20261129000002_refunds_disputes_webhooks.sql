-- Refunds and disputes change a payment after the fact: it keeps running totals, and its status
-- becomes 'refunded' once fully refunded. 'failed' is set by the processor's payment.failed event.
ALTER TABLE payments
    ADD COLUMN amount_refunded BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN amount_disputed BIGINT NOT NULL DEFAULT 0,
    ADD CONSTRAINT payments_amount_refunded_check CHECK (amount_refunded BETWEEN 0 AND amount),
    ADD CONSTRAINT payments_amount_disputed_check CHECK (amount_disputed >= 0),
    DROP CONSTRAINT payments_status_check,
    ADD CONSTRAINT payments_status_check
        CHECK (status IN ('succeeded', 'declined', 'refunded', 'failed'));

CREATE TABLE refunds (
    id              TEXT        PRIMARY KEY,
    payment_id      TEXT        NOT NULL REFERENCES payments (id),
    account_id      TEXT        NOT NULL REFERENCES accounts (id),
    amount          BIGINT      NOT NULL CHECK (amount > 0),
    reason          TEXT        CHECK (length(reason) <= 500),
    status          TEXT        NOT NULL CHECK (status IN ('succeeded', 'failed')),
    idempotency_key TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX refunds_payment_id_created_at ON refunds (payment_id, created_at DESC, id DESC);

-- Webhook events already applied. The primary key is the event id the processor sends with every
-- delivery, so a redelivery conflicts with the first one; the row is written in the transaction
-- that applies the event, so "recorded" and "applied" cannot disagree.
CREATE TABLE processed_events (
    id          TEXT        PRIMARY KEY,
    type        TEXT        NOT NULL,
    -- 'applied', or 'ignored' for an unknown type or payment (acknowledged, never retried)
    outcome     TEXT        NOT NULL CHECK (outcome IN ('applied', 'ignored')),
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL
);

CREATE INDEX processed_events_expires_at ON processed_events (expires_at);
