//! Black-box tests of the HTTP API: the real server over HTTP, against a real PostgreSQL started
//! by testcontainers. One container serves the whole run; every test gets a fresh database cloned
//! from a migrated template, so tests run in parallel without seeing each other.
//!
//! A test is an `async fn` marked `#[api_test]`, named `module::function` in the run; the
//! attribute is all it takes for the runner to find it. The suites, by what they prove:
//!
//! - [`endpoints`]: what each route answers: payments, refunds, lists, webhooks, errors, docs.
//! - [`exactly_once`]: the idempotency-key mechanism: replay, conflicts, concurrency, expiry.
//! - [`resilience`]: the guarantees when things go wrong: crashes, outages, slow and hostile
//!   clients, another account.
//! - [`processor`]: the simulated card processor idempay calls: its routes, its client's three
//!   outcomes under each fault, its signed webhooks.
//! - [`delivery`]: idempay's own events delivered to merchant endpoints: registration, no
//!   private URLs, signed retries on the schedule, many instances, the local receiver.
//! - [`tools`]: what ships around the API: the command line, the client and its demo, metrics
//!   and logs.
//! - [`ops`]: what an operator sees: the alert rules under promtool, a live Prometheus firing
//!   them, the dashboard's queries.
//!
//! [`support`] holds what they share.

mod delivery;
mod endpoints;
mod exactly_once;
mod ops;
mod processor;
mod resilience;
mod support;
mod tools;

use std::process::ExitCode;

use libtest_mimic::Arguments;

fn main() -> ExitCode {
    support::harness::run(Arguments::from_args())
}
