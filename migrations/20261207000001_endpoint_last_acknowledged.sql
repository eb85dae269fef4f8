-- When an endpoint last acknowledged a delivery, kept on its row (within a minute): an endpoint is
-- disabled when it acknowledged nothing since the delivery it gave up on was created
-- (crates/service/src/outbox/delivery.rs, `disable_if_dead`), and its deliveries alone cannot say
-- so once retention pruned them, as it does when a delivery outlives the schedule's span on a
-- machine too busy to send on time.
-- Expand only (migrations/README.md): a nullable column, no default, no rewrite. A release that
-- does not know it leaves it NULL, which is "read the deliveries", what that release did.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE webhook_endpoints ADD COLUMN last_acknowledged_at TIMESTAMPTZ;
