//! idempay's calls downstream, to the card processor: the client, whose every call has three
//! outcomes (done, certainly not done, unknown), and the one unit of work all of them share
//! (record the recovery point, call with the key's downstream key, settle the outcome, resume).
//! The processor itself is another service (`crates/processor`); this is only how idempay talks to it,
//! and how an operator's command reaches it (`link.rs`).

pub mod call;
pub mod client;
pub mod link;
pub mod metrics;

pub use client::{
    ChargeRequest, ProcessorClient, ProcessorOutcome, ProcessorRefusal, WhenRecorded,
};
