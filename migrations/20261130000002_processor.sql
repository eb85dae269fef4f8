-- The simulated card processor's ledger, in tables of its own: it can share idempay's database
-- (embedded, or as `idempay processor` on the same DATABASE_URL) or have one to itself. Its
-- idempotency keys live in `idempotency_keys` under scopes of their own (`processor:POST …`).
CREATE TABLE processor_charges (
    id              TEXT        PRIMARY KEY,
    amount          BIGINT      NOT NULL CHECK (amount BETWEEN 1 AND 99999999),
    currency        TEXT        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- A decline is a result: recorded, replayed and listed like a success.
    status          TEXT        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    payment_method  TEXT        NOT NULL,
    decline_code    TEXT,
    -- Running totals, kept under the charge's row lock: the checks make "never more than was
    -- charged" a property of the database, not only of the code.
    amount_refunded BIGINT      NOT NULL DEFAULT 0,
    amount_disputed BIGINT      NOT NULL DEFAULT 0,
    idempotency_key TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT processor_charges_refunded CHECK (amount_refunded BETWEEN 0 AND amount),
    CONSTRAINT processor_charges_disputed CHECK (amount_disputed BETWEEN 0 AND amount),
    CONSTRAINT processor_charges_declined CHECK ((status = 'declined') = (decline_code IS NOT NULL))
);

-- Keyset pages, newest first.
CREATE INDEX processor_charges_created_at ON processor_charges (created_at DESC, id DESC);

CREATE TABLE processor_refunds (
    id              TEXT        PRIMARY KEY,
    charge_id       TEXT        NOT NULL REFERENCES processor_charges (id),
    amount          BIGINT      NOT NULL CHECK (amount > 0),
    -- 'failed' when the card network gave the refund back later: its amount is the charge's again.
    status          TEXT        NOT NULL CHECK (status IN ('succeeded', 'failed')),
    idempotency_key TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX processor_refunds_created_at ON processor_refunds (created_at DESC, id DESC);
CREATE INDEX processor_refunds_charge_id ON processor_refunds (charge_id);

CREATE TABLE processor_disputes (
    id         TEXT        PRIMARY KEY,
    charge_id  TEXT        NOT NULL REFERENCES processor_charges (id),
    amount     BIGINT      NOT NULL CHECK (amount > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX processor_disputes_charge_id ON processor_disputes (charge_id);

-- The outbox of outgoing webhooks, for any sender (the processor today, idempay's own events
-- later). A row is written in the transaction of the change it announces, so an event exists if and
-- only if its change committed; a loop delivers it afterwards, at least once, until a 2xx.
CREATE TABLE webhook_deliveries (
    id              BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- `evt_…`: the `webhook-id` of every attempt, which the receiver deduplicates on.
    event_id        TEXT        NOT NULL,
    url             TEXT        NOT NULL,
    -- The exact bytes that are signed and sent, the same on every attempt.
    body            BYTEA       NOT NULL,
    attempts        INTEGER     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- When the next attempt is due. A claimed attempt pushes it past its own timeout, so another
    -- loop leaves the row alone while it is in flight, and takes it again if its sender died.
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    delivered_at    TIMESTAMPTZ,
    last_status     SMALLINT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (event_id, url)
);

-- Only undelivered rows are ever looked for: the index stays as small as the backlog.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE delivered_at IS NULL;
