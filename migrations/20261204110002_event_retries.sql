-- `POST /v1/events/{id}/retry` queues one more delivery of an event to an endpoint: a row of its
-- own, delivered by the same loop on the same schedule, while the event's first delivery to that
-- endpoint keeps its attempts. The fan-out still queues an event once per endpoint (the unique
-- index holds that line); the rows a retry asks for are outside it.
ALTER TABLE webhook_deliveries ADD COLUMN retry BOOLEAN NOT NULL DEFAULT false;
DROP INDEX webhook_deliveries_endpoint_event;
CREATE UNIQUE INDEX webhook_deliveries_endpoint_event
    ON webhook_deliveries (account_id, event_id, endpoint_id)
    WHERE endpoint_id IS NOT NULL AND NOT retry;
