//! idempay: a reference payment API in which idempotency keys turn "at least once" delivery into
//! "exactly once" effects.
//!
//! - [`idempotency`]: the mechanism, one entry point for every mutating route.
//! - [`payments`]: `POST /v1/payments` and `GET /v1/payments/{id}` on a simulated processor.
//! - [`accounts`]: API keys and authentication.
//! - [`refunds`], [`webhooks`]: refunds, and the processor's events applied exactly once.
//! - [`client`]: the retrying client that keeps one key per intent; [`demo`] shows why it must.
//! - [`app`]: the router, its middleware and the running [`app::Application`].

pub mod accounts;
pub mod app;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod demo;
pub mod dev;
pub mod error;
pub mod expiry;
pub mod extract;
pub mod failpoint;
pub mod health;
pub mod idempotency;
mod ids;
pub mod monitoring;
pub mod openapi;
pub mod pagination;
pub mod payments;
pub mod postgres;
pub mod problems;
pub mod refunds;
pub mod server;
pub mod telemetry;
pub mod webhooks;
