//! Black-box tests of the HTTP API: the real server over HTTP, against a real PostgreSQL started
//! by testcontainers. One container serves the whole run; every test gets a fresh database cloned
//! from a migrated template, so tests run in parallel without seeing each other.

mod cli;
mod concurrency;
mod contract;
mod demo;
mod docs;
mod errors;
mod expiry;
mod faults;
mod harness;
mod helpers;
mod hostile;
mod instance;
mod invariants;
mod lifecycle;
mod listing;
mod mechanism;
mod observability;
mod outage;
mod payments;
mod refunds;
mod security;
mod slow_clients;
mod webhooks;

use std::process::ExitCode;

use libtest_mimic::Arguments;

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let trials = [
        payments::trials(),
        lifecycle::trials(),
        concurrency::trials(),
        expiry::trials(),
        errors::trials(),
        mechanism::trials(),
        refunds::trials(),
        listing::trials(),
        webhooks::trials(),
        demo::trials(),
        cli::trials(),
        faults::trials(),
        docs::trials(),
        slow_clients::trials(),
        hostile::trials(),
        security::trials(),
        outage::trials(),
        observability::trials(),
    ]
    .into_iter()
    .flatten()
    .collect();
    harness::run(args, trials)
}
