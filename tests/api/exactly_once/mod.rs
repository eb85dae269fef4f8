//! The idempotency-key mechanism: one key, one effect. Replays byte for byte, mismatches and keys
//! in flight refused, leases taken over, simultaneous requests, and keys that expire.

mod concurrency;
mod expiry;
mod lifecycle;
mod mechanism;
