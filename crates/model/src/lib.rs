//! The idempotency protocol of idempay as a model that stateright checks exhaustively: clients
//! retrying with one key per intent, two idempay instances reserving, leasing, taking over,
//! calling the processor with a downstream key, completing, suspending and holding keys, the
//! processor with its own keys, the recovery and expiry jobs, an operator's settle, a network that
//! loses answers, refuses connections and delays calls, crashes, and holders stalled for hours
//! before their send. What must never happen, what must come once the faults stop (checked where
//! the world comes to rest), and what must be possible. What is modelled and what is left out is
//! in this crate's README.md.
//!
//! `config` says what is checked (the size, the defects switched on), `state` what the world is,
//! `steps` what can happen, `rules` what a state allows, `protocol` how it moves, `properties`
//! what must hold, `check` runs the checker.

pub mod check;
pub mod config;
pub mod properties;
pub mod protocol;
pub mod rules;
pub mod state;
pub mod steps;

pub use check::{PropertyOutcome, Report, check};
pub use config::{Config, Defect, Size};
