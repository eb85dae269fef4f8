//! idempay: a reference payment API in which idempotency keys turn "at least once" delivery into
//! "exactly once" effects.
//!
//! - [`idempotency`]: the mechanism, one entry point for every mutating route; it knows no accounts,
//!   and any axum service can adopt it (the service names each request's owner).
//! - [`payments`], [`refunds`], [`disputes`], [`events`], [`webhooks`], [`accounts`]: the domains,
//!   each with its router.
//! - [`downstream`]: idempay's side of the card processor: its client, whose calls carry idempay's
//!   own keys downstream, and the unit of work a charge, refund, capture or cancel shares. The
//!   processor itself is the crate `processor` (crates/processor/), a service of its own.
//! - [`keys`], [`recovery`], [`settle`], [`expiry`], [`reconcile`]: the keys' life after the
//!   request: inspection, the recovery job, an operator's way out of a held key, the expiry job's
//!   deletes, and the two ledgers held against each other.
//! - [`app`]: the assembly, on top: the state, the sub-states each domain asks of it, every router
//!   merged, and [`app::Application`], which serves them beside the background jobs.
//! - [`http`]: the plumbing below the domains, naming none: middleware, errors, extractors, docs,
//!   metrics.
//! - [`config`], [`db`], [`metadata`]: the settings (each in `src/config.md`), the pool with its
//!   release check and the lot of a new key's statements, and a merchant's key–value pairs.
//! - [`cli`], [`telemetry`], [`exit`]: the command line `main.rs` parses and hands here, the logs,
//!   and the exit codes of the operator's commands.
//! - `dev` (the `dev` feature): `idempay dev`, the demo, `idempay fixture` (the conformance suite's
//!   fixture behind the mechanism) and the dev commands, apart from the service.
//!
//! The retrying client that keeps one key per intent is the crate `client` beside this one
//! (crates/client/), so a merchant adds it without the server. What idempay and the processor both
//! run on (the accept loop, the jobs' watch, setting parsers, ids, vocabularies, crash points) is
//! the crate `service` (crates/service/), which names neither.

pub mod accounts;
pub mod app;
pub mod cli;
pub mod config;
pub mod db;
#[cfg(feature = "dev")]
pub mod dev;
pub mod disputes;
pub mod downstream;
pub mod events;
pub mod exit;
pub mod expiry;
pub mod http;
pub mod keys;
pub mod metadata;
pub mod payments;
pub mod reconcile;
pub mod recovery;
pub mod refunds;
pub mod settle;
pub mod telemetry;
pub mod webhooks;

/// idempay, as what it runs on (`crates/service`) names it: the prefix of the series of its jobs,
/// expiry and outbox (`idempay_job_up`, `idempay_webhook_…`, as the dashboard and the alert rules
/// name them) and its webhook deliveries' `User-Agent` (`idempay/<version> (+webhooks)`).
pub const SERVICE: service::name::ServiceName =
    service::name::ServiceName::new("idempay", env!("CARGO_PKG_VERSION"));
