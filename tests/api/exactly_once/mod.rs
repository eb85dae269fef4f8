//! The idempotency-key mechanism: one key, one effect. Replays byte for byte, mismatches and keys
//! in flight refused, leases taken over, simultaneous requests, and keys that expire; and one
//! effect across two hops, idempay and the processor it charges at, whatever the processor does;
//! and the mechanism as a layer, case by case against the IETF draft, through `idempay fixture`.

mod across_instances;
mod across_releases;
mod cluster;
mod concurrency;
mod conformance;
mod early_events;
mod expiry;
mod forever;
mod lifecycle;
mod mechanism;
mod rebalance;
mod settle;
mod suspension;
pub(crate) mod two_hops;
mod two_hops_capture;
mod two_hops_charge;
mod two_hops_dispute;
mod two_hops_outage;
mod two_hops_reconcile;
mod two_hops_recovery;
mod two_hops_refund;
