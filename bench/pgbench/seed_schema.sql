-- The seed's design, the second limit of `make bench`: the idempotency table as the article that
-- started the project has it, and the effect's table, in a schema of their own so that neither side
-- of a measurement writes to the other's tables or indexes. Applied once per run by bench.sh.
-- Nothing here is idempay's: no lease, no recovery point, no account column, no outbox; a key is
-- found by its unique constraint alone.
CREATE SCHEMA seed;

CREATE TABLE seed.idempotency_keys (
    scope         TEXT        NOT NULL,
    idem_key      TEXT        NOT NULL,
    request_hash  BYTEA       NOT NULL,
    status        TEXT        NOT NULL,
    response_code SMALLINT,
    response_body BYTEA,
    expires_at    TIMESTAMPTZ NOT NULL,
    UNIQUE (scope, idem_key)
);

-- The effect of idempay's hop.
CREATE TABLE seed.payments (
    id              TEXT        PRIMARY KEY,
    amount          BIGINT      NOT NULL,
    currency        TEXT        NOT NULL,
    status          TEXT        NOT NULL,
    idempotency_key TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The effect of the processor's hop: the payments table's twin, so that each hop writes one key
-- row and one effect row, as each service would in a database of its own.
CREATE TABLE seed.charges (LIKE seed.payments INCLUDING ALL);
