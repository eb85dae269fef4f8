-- idempay as a provider: the events it writes about a merchant's objects, the endpoints a merchant
-- registers to receive them, and the attempts to deliver each one.

-- What happened, written in the transaction of the change it describes (a transactional outbox):
-- an event exists if and only if its change committed.
CREATE TABLE events (
    -- `evt_…`: the `webhook-id` of every delivery of it, which receivers deduplicate on.
    id         TEXT        PRIMARY KEY,
    account_id TEXT        NOT NULL REFERENCES accounts (id),
    type       TEXT        NOT NULL CHECK (type IN (
                   'payment.succeeded', 'payment.declined', 'payment.failed', 'payment.refunded',
                   'payment.disputed', 'refund.created', 'refund.failed')),
    -- The writing transaction's id, then the order within it: the feed's order. A transaction may
    -- take its id before another and commit after it, so the feed shows only events of
    -- transactions older than every transaction still running (`pg_snapshot_xmin`): whatever
    -- commits later sorts after everything already shown, and a cursor never skips it.
    txid       XID8        NOT NULL DEFAULT pg_current_xact_id(),
    seq        BIGINT      GENERATED ALWAYS AS IDENTITY,
    -- The event as served by the feed and sent to endpoints, `{"id", "object": "event", "type",
    -- "created_at", "data": {"object": …}}`: the same bytes every time.
    body       BYTEA       NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX events_feed ON events (account_id, txid, seq);

-- Where a merchant wants its events sent.
CREATE TABLE webhook_endpoints (
    -- `we_…`
    id             TEXT        PRIMARY KEY,
    account_id     TEXT        NOT NULL REFERENCES accounts (id),
    url            TEXT        NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    -- Event types, or `{*}` for all of them.
    enabled_events TEXT[]      NOT NULL CHECK (cardinality(enabled_events) >= 1),
    -- `whsec_…`, kept in clear: every delivery is signed with it, so it cannot be a hash.
    secret         TEXT        NOT NULL,
    -- 'disabled' once its deliveries failed for the whole retry schedule.
    status         TEXT        NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX webhook_endpoints_account_id ON webhook_endpoints (account_id, created_at DESC, id DESC);

-- The outbox serves both senders: the processor (a row per event and URL, signed with its secret)
-- and merchant endpoints (a row per event and endpoint, signed with the endpoint's secret).
ALTER TABLE webhook_deliveries
    ADD COLUMN endpoint_id TEXT REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    -- Set when the retry schedule is exhausted: the event is given up for this receiver.
    ADD COLUMN failed_at   TIMESTAMPTZ,
    DROP CONSTRAINT webhook_deliveries_event_id_url_key;

CREATE UNIQUE INDEX webhook_deliveries_processor_event ON webhook_deliveries (event_id, url)
    WHERE endpoint_id IS NULL;
CREATE UNIQUE INDEX webhook_deliveries_endpoint_event ON webhook_deliveries (event_id, endpoint_id)
    WHERE endpoint_id IS NOT NULL;

DROP INDEX webhook_deliveries_due;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL;

-- Every attempt, as it went: listed at `GET /v1/events/{id}/attempts`. The primary key is the
-- claim: an attempt number is recorded once, whoever claimed it.
CREATE TABLE webhook_attempts (
    delivery_id  BIGINT      NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt      INTEGER     NOT NULL CHECK (attempt >= 1),
    -- The receiver's status code; NULL when none came back (refused, timed out).
    status_code  SMALLINT,
    latency_ms   INTEGER     NOT NULL CHECK (latency_ms >= 0),
    error        TEXT,
    attempted_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (delivery_id, attempt)
);

-- An event is queued for every enabled endpoint of its account that subscribes to its type, in
-- the event's own transaction: no event committed without its deliveries, and the write path
-- pays no extra round trip for it.
CREATE FUNCTION events_fan_out() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_deliveries (event_id, url, body, endpoint_id)
    SELECT NEW.id, endpoint.url, NEW.body, endpoint.id
    FROM webhook_endpoints AS endpoint
    WHERE endpoint.account_id = NEW.account_id
      AND endpoint.status = 'enabled'
      AND (NEW.type = ANY (endpoint.enabled_events) OR '*' = ANY (endpoint.enabled_events));
    RETURN NULL;
END
$$;

CREATE TRIGGER events_fan_out AFTER INSERT ON events
    FOR EACH ROW EXECUTE FUNCTION events_fan_out();
