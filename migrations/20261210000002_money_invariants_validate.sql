-- The money rules of 20261210000001_money_invariants.sql, validated apart, as in
-- 20261208000002_authorizations_validate.sql: VALIDATE CONSTRAINT reads the table under a lock
-- that blocks no reads or writes (SHARE UPDATE EXCLUSIVE).
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '300s';

ALTER TABLE payments VALIDATE CONSTRAINT payments_money_held;
ALTER TABLE payments VALIDATE CONSTRAINT payments_capturable;
ALTER TABLE payments VALIDATE CONSTRAINT payments_canceled;
ALTER TABLE processor_charges VALIDATE CONSTRAINT processor_charges_money_held;
ALTER TABLE processor_charges VALIDATE CONSTRAINT processor_charges_released;
