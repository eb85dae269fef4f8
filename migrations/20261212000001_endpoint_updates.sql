-- A merchant changes its webhook endpoints (`POST /v1/webhook_endpoints/{id}`) and rolls their
-- secrets (`…/roll_secret`) instead of deleting them, which lost their delivery history.
-- Expand only (migrations/README.md): nullable columns, no default, no rewrite. A release that does
-- not know them leaves them NULL, which means what that release did: no description, one secret
-- (it signs with `secret` alone, so during a roll's overlap its deliveries carry the new signature
-- only), and a failure streak counted from each delivery's creation.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE webhook_endpoints
    -- The merchant's own note; its length is bounded where it is parsed (`webhooks::endpoints`).
    ADD COLUMN description TEXT,
    -- The secret a roll replaced, which signs beside `secret` until `previous_secret_expires_at`:
    -- a receiver that still holds it verifies every delivery meanwhile. Kept in clear for the
    -- same reason `secret` is.
    ADD COLUMN previous_secret TEXT,
    ADD COLUMN previous_secret_expires_at TIMESTAMPTZ,
    -- When the secret was last rolled, which the endpoint shows (never the secrets).
    ADD COLUMN secret_rolled_at TIMESTAMPTZ,
    -- When the merchant last enabled the endpoint again: no delivery created before it can disable
    -- it (its failure streak starts here; `disable_if_dead` in crates/service/src/outbox/).
    ADD COLUMN enabled_at TIMESTAMPTZ;

-- One more event type, the audit of an endpoint's change. The old CHECK goes: it allows a subset
-- of what the new one does (as in 20261208000001_authorizations.sql).
-- squawk-ignore ban-drop-constraint
ALTER TABLE events DROP CONSTRAINT events_type;

ALTER TABLE events
    ADD CONSTRAINT events_type_endpoints
        CHECK (type IN ('payment.succeeded', 'payment.declined', 'payment.failed',
                        'payment.refunded', 'payment.disputed', 'refund.created', 'refund.failed',
                        'payment.authorized', 'payment.captured', 'payment.canceled',
                        'dispute.updated', 'dispute.closed', 'webhook_endpoint.updated')) NOT VALID;
