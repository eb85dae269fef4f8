-- The constraints of 20261208000001_authorizations.sql, validated apart: VALIDATE CONSTRAINT reads
-- the table under a lock that blocks no reads or writes (SHARE UPDATE EXCLUSIVE), where adding a
-- valid constraint would have held ACCESS EXCLUSIVE for the whole scan.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '300s';

ALTER TABLE processor_charges VALIDATE CONSTRAINT processor_charges_capture_state;
ALTER TABLE processor_charges VALIDATE CONSTRAINT processor_charges_amount_captured;
ALTER TABLE payments VALIDATE CONSTRAINT payments_status;
ALTER TABLE events VALIDATE CONSTRAINT events_type;
ALTER TABLE payments VALIDATE CONSTRAINT payments_capture_method;
ALTER TABLE payments VALIDATE CONSTRAINT payments_amount_captured;
