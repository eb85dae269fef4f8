-- The constraint of 20261212000001_endpoint_updates.sql, validated apart: VALIDATE CONSTRAINT reads
-- the table under a lock that blocks no reads or writes (SHARE UPDATE EXCLUSIVE).
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '300s';

ALTER TABLE events VALIDATE CONSTRAINT events_type_endpoints;
