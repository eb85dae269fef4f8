-- `metadata`: the merchant's own key-value pairs on a payment or a refund (src/metadata.rs), kept
-- as sent and returned; the API never reads them, so they need no index. A JSON object always.
ALTER TABLE payments
    ADD COLUMN metadata JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object');
ALTER TABLE refunds
    ADD COLUMN metadata JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object');
