-- Indexes the delivery of events to merchant endpoints needs beyond those of 000005.

-- An endpoint is disabled when it acknowledged nothing since its delivery that just failed was
-- created (a look-up by endpoint and delivery time), and deleting an endpoint deletes its
-- deliveries (the cascade of the foreign key, a look-up by endpoint).
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, delivered_at)
    WHERE endpoint_id IS NOT NULL;

-- The age of the oldest event not yet delivered, read at every scrape of `/metrics`: the first
-- entry of this index, which holds only the deliveries still pending.
CREATE INDEX webhook_deliveries_pending ON webhook_deliveries (created_at)
    WHERE delivered_at IS NULL AND failed_at IS NULL;
