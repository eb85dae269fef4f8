-- The formats a key keeps across requests, and so across releases, say their version: a release
-- compares a key's fingerprint under the version it was made with, and leaves alone (503 with
-- Retry-After, never a mismatch, a replay of something else, a release or a second call) a key
-- in a version it does not read. (A recovery state says its version inside itself, its `version`
-- member: see crates/idempotency/src/recovery.rs, `StateVersion`.)
--
-- Expand only (migrations/README.md): two nullable columns, no default, no rewrite, nothing the
-- previous release reads is changed. A key it writes has NULL in both, which is version 1: what
-- it writes. The lock is brief, and waits for no more than lock_timeout.
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE idempotency_keys
    -- What the fingerprint (request_hash) was computed over: NULL is version 1, the releases
    -- before versions; 2 adds the request's query to its target.
    ADD COLUMN fingerprint_version SMALLINT,
    -- How the stored response's columns are kept: NULL is version 1, the headers as one JSON
    -- object of lower-case names to values.
    ADD COLUMN response_version SMALLINT;
