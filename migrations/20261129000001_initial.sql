-- Accounts are the merchants calling the API. Only a SHA-256 hash of each secret API key is kept:
-- a leaked database does not leak credentials, and lookup by hash needs no secret comparison.
CREATE TABLE accounts (
    id           TEXT        PRIMARY KEY,
    name         TEXT        NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
    api_key_hash BYTEA       NOT NULL UNIQUE CHECK (length(api_key_hash) = 32),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The effect that must happen exactly once per idempotency key. A declined charge is a payment too:
-- the processor answered, so the attempt is recorded and its answer replayed like a success.
CREATE TABLE payments (
    id              TEXT        PRIMARY KEY,
    account_id      TEXT        NOT NULL REFERENCES accounts (id),
    amount          BIGINT      NOT NULL CHECK (amount BETWEEN 1 AND 99999999),
    currency        TEXT        NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    status          TEXT        NOT NULL CHECK (status IN ('succeeded', 'declined')),
    payment_method  TEXT        NOT NULL,
    order_ref       TEXT        CHECK (length(order_ref) <= 255),
    description     TEXT        CHECK (length(description) <= 1000),
    -- The key the client sent, kept for audit after its idempotency row has expired.
    idempotency_key TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX payments_account_id_created_at ON payments (account_id, created_at DESC, id DESC);

-- One row per (scope, key): the unique constraint, not a check in the application, decides which
-- of several concurrent requests executes.
CREATE TABLE idempotency_keys (
    id               BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- account + method + route template, e.g. 'acct_42:POST /v1/payments'
    scope            TEXT        NOT NULL,
    idem_key         TEXT        NOT NULL,
    -- SHA-256 of the canonical JSON body: the same key with another payload is refused.
    request_hash     BYTEA       NOT NULL CHECK (length(request_hash) = 32),
    status           TEXT        NOT NULL CHECK (status IN ('in_progress', 'completed')),
    -- The lease: the request holding lock_token may complete the key until locked_until, and renews
    -- it while it works. A retry may take over a key whose lease ran out (its process died).
    lock_token       UUID,
    locked_until     TIMESTAMPTZ,
    -- The response as sent: the exact body bytes (bytea, not jsonb, which would reorder keys and
    -- change whitespace) and the headers a client relies on.
    response_code    SMALLINT,
    response_headers JSONB,
    response_body    BYTEA,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at       TIMESTAMPTZ NOT NULL,
    UNIQUE (scope, idem_key),
    CONSTRAINT idempotency_keys_state CHECK (
        (status = 'in_progress'
            AND lock_token IS NOT NULL AND locked_until IS NOT NULL
            AND response_code IS NULL AND response_headers IS NULL AND response_body IS NULL)
        OR
        (status = 'completed'
            AND lock_token IS NULL AND locked_until IS NULL
            AND response_code IS NOT NULL AND response_headers IS NOT NULL AND response_body IS NOT NULL)
    )
);

-- Keeps each batch of the expiry job an index scan, however large the table grows.
CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);
