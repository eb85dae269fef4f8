-- The lifecycle constraints of 20261208000004_dispute_outcomes.sql, validated apart, as in
-- 20261208000002_authorizations_validate.sql.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '300s';

ALTER TABLE processor_disputes VALIDATE CONSTRAINT processor_disputes_status;
ALTER TABLE disputes VALIDATE CONSTRAINT disputes_lifecycle;
