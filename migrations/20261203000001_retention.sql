-- Retention: the expiry job deletes events, and deliveries with their attempts, once they are
-- older than their retention (src/webhooks/retention.rs). Each of its batches is an index scan.

-- Events by age: the oldest first, for `IDEMPAY_EVENT_RETENTION`.
CREATE INDEX events_created_at ON events (created_at);

-- Finished deliveries by when they finished (acknowledged or given up), of each sender apart (the
-- processor's own, `endpoint_id` NULL, have a retention of their own): for
-- `IDEMPAY_WEBHOOK_DELIVERY_RETENTION`. A pending delivery is not in it, so it is never a candidate.
CREATE INDEX webhook_deliveries_finished
    ON webhook_deliveries ((endpoint_id IS NULL), (COALESCE(delivered_at, failed_at)))
    WHERE delivered_at IS NOT NULL OR failed_at IS NOT NULL;
