-- Every row a request writes names its account, and every primary key and unique constraint
-- starts with it: the account is the unit that stays together. On one PostgreSQL server this
-- changes nothing a request sees (an account's ids were unique already); on Citus, where
-- `idempay migrate --citus` distributes these tables by `account_id` (src/db/citus.rs), it is what
-- lets a request's statements all run on the one node that holds its account, and what Citus
-- requires of a distributed table's constraints.

-- A key belongs to the owner its scope names first (`acct_42` of `acct_42:POST /v1/payments`, or
-- `processor` for the simulated processor's own keys), now also as a column of its own, so that a
-- key and the payment its completion writes are found by the same value.
ALTER TABLE idempotency_keys ADD COLUMN account_id TEXT;
UPDATE idempotency_keys SET account_id = split_part(scope, ':', 1);
ALTER TABLE idempotency_keys
    ALTER COLUMN account_id SET NOT NULL,
    ADD CONSTRAINT idempotency_keys_scope_owner CHECK (starts_with(scope, account_id || ':')),
    DROP CONSTRAINT idempotency_keys_pkey,
    ADD PRIMARY KEY (account_id, id),
    DROP CONSTRAINT idempotency_keys_scope_idem_key_key,
    ADD CONSTRAINT idempotency_keys_scope_idem_key_key UNIQUE (account_id, scope, idem_key);

-- The completion now names the key by its owner too. The old signature goes: a call that still
-- used it would complete a key by id alone, which a distributed table cannot route.
DROP FUNCTION idempotency_complete(BIGINT, UUID, SMALLINT, JSONB, BYTEA, BIGINT);
CREATE FUNCTION idempotency_complete(
    owner            TEXT,
    key_id           BIGINT,
    token            UUID,
    response_code    SMALLINT,
    response_headers JSONB,
    response_body    BYTEA,
    ttl_ms           BIGINT
) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
    SET status = 'completed', lock_token = NULL, locked_until = NULL,
        response_code = idempotency_complete.response_code,
        response_headers = idempotency_complete.response_headers,
        response_body = idempotency_complete.response_body,
        completed_at = now(),
        expires_at = now() + ttl_ms * interval '1 millisecond'
    WHERE account_id = owner AND id = key_id AND lock_token = token AND status = 'in_progress';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lease on idempotency key % was lost', key_id
            USING ERRCODE = 'IK001';
    END IF;
    RETURN key_id;
END
$$;

-- The ledger: ids stay unique within their account, which is where they are looked up.
ALTER TABLE payments
    DROP CONSTRAINT payments_pkey,
    ADD PRIMARY KEY (account_id, id),
    DROP CONSTRAINT payments_charge_key,
    ADD CONSTRAINT payments_charge_key UNIQUE (account_id, charge);

ALTER TABLE refunds
    DROP CONSTRAINT refunds_pkey,
    ADD PRIMARY KEY (account_id, id),
    DROP CONSTRAINT refunds_processor_refund_key,
    ADD CONSTRAINT refunds_processor_refund_key UNIQUE (account_id, processor_refund);

ALTER TABLE disputes
    DROP CONSTRAINT disputes_pkey,
    ADD PRIMARY KEY (account_id, id);

ALTER TABLE events
    DROP CONSTRAINT events_pkey,
    ADD PRIMARY KEY (account_id, id);

-- Deliveries name the account of their event (`processor` for the processor's own outbox, which
-- has none), and an endpoint is referred to with its account.
ALTER TABLE webhook_deliveries ADD COLUMN account_id TEXT;
UPDATE webhook_deliveries AS delivery SET account_id = COALESCE(
    (SELECT endpoint.account_id FROM webhook_endpoints AS endpoint
     WHERE endpoint.id = delivery.endpoint_id),
    'processor');
ALTER TABLE webhook_attempts ADD COLUMN account_id TEXT;
UPDATE webhook_attempts AS attempt SET account_id = delivery.account_id
FROM webhook_deliveries AS delivery WHERE delivery.id = attempt.delivery_id;

ALTER TABLE webhook_attempts
    DROP CONSTRAINT webhook_attempts_delivery_id_fkey,
    DROP CONSTRAINT webhook_attempts_pkey;
ALTER TABLE webhook_deliveries
    DROP CONSTRAINT webhook_deliveries_endpoint_id_fkey,
    DROP CONSTRAINT webhook_deliveries_pkey;
ALTER TABLE webhook_endpoints
    DROP CONSTRAINT webhook_endpoints_pkey,
    ADD PRIMARY KEY (account_id, id);

ALTER TABLE webhook_deliveries
    ALTER COLUMN account_id SET NOT NULL,
    ADD PRIMARY KEY (account_id, id),
    ADD CONSTRAINT webhook_deliveries_endpoint_fkey FOREIGN KEY (account_id, endpoint_id)
        REFERENCES webhook_endpoints (account_id, id) ON DELETE CASCADE;
DROP INDEX webhook_deliveries_processor_event;
CREATE UNIQUE INDEX webhook_deliveries_processor_event ON webhook_deliveries (account_id, event_id, url)
    WHERE endpoint_id IS NULL;
DROP INDEX webhook_deliveries_endpoint_event;
CREATE UNIQUE INDEX webhook_deliveries_endpoint_event
    ON webhook_deliveries (account_id, event_id, endpoint_id) WHERE endpoint_id IS NOT NULL;
DROP INDEX webhook_deliveries_endpoint;
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (account_id, endpoint_id, delivered_at)
    WHERE endpoint_id IS NOT NULL;

ALTER TABLE webhook_attempts
    ALTER COLUMN account_id SET NOT NULL,
    ADD PRIMARY KEY (account_id, delivery_id, attempt),
    ADD CONSTRAINT webhook_attempts_delivery_fkey FOREIGN KEY (account_id, delivery_id)
        REFERENCES webhook_deliveries (account_id, id) ON DELETE CASCADE;

-- The fan-out is no longer a trigger: the statement that writes an event queues its deliveries
-- (src/events/mod.rs, src/payments/mod.rs), still in the same statement and transaction. On Citus a
-- trigger on a shard that writes another table is a distributed statement run from inside a
-- shard's, which Citus refuses by default and which, allowed, crashed a worker committing such a
-- transaction by two-phase commit (tried on Citus 13.2); the statement needs no such thing.
DROP TRIGGER events_fan_out ON events;
DROP FUNCTION events_fan_out();

-- Webhook intake is the one path that is not per account: the processor names a payment or a
-- refund by its id or its own (`ch_…`, `re_…`), and the account is what the lookup finds. These
-- indexes keep that lookup what the dropped single-column keys made it.
CREATE INDEX payments_id ON payments (id);
CREATE INDEX payments_charge ON payments (charge);
CREATE INDEX refunds_id ON refunds (id);
CREATE INDEX refunds_processor_refund ON refunds (processor_refund);

-- On Citus `accounts` is a reference table: a change is written to its copy on every node, each
-- copy fires this trigger, and the workers' copies commit by two-phase commit, which refuses a
-- transaction that notified. Instances listen on the coordinator, so only its copy notifies. (The
-- inner IF is parsed only where Citus, and its function, exist.)
CREATE OR REPLACE FUNCTION accounts_api_key_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF to_regproc('citus_is_coordinator') IS NOT NULL THEN
        IF NOT citus_is_coordinator() THEN
            RETURN NULL;
        END IF;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF OLD.api_key_hash IS NOT NULL THEN
            PERFORM pg_notify('idempay_api_keys', encode(OLD.api_key_hash, 'hex'));
        END IF;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        IF NEW.api_key_hash IS NOT NULL THEN
            PERFORM pg_notify('idempay_api_keys', encode(NEW.api_key_hash, 'hex'));
        END IF;
    END IF;
    RETURN NULL;
END
$$;
