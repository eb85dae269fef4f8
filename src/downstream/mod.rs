//! idempay's calls downstream, to the card processor: the client, whose every call has three
//! outcomes (done, certainly not done, unknown), and the one unit of work all of them share
//! (record the recovery point, call with the key's downstream key, resolve the outcome, resume).
//! The processor itself is another service (`crates/processor`); this is only how idempay talks to it,
//! and how an operator's command reaches it (`link.rs`).

pub mod call;
pub mod client;
pub mod link;
pub mod metrics;

pub use client::{
    ChargeRequest, ProcessorClient, ProcessorOutcome, ProcessorRefusal, WhenRecorded,
};

/// The processor's wire types, as its answers and events carry them. idempay's domains read them
/// from here, never from the processor's crate, so that all idempay takes from the processor is
/// named in this one module.
pub use processor::{
    CaptureState, Charge, ChargeStatus, Dispute, DisputeStatus, ProcessorEventType,
    ProcessorRefund, RefundStatus,
};
