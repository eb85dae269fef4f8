//! What ships around the API: the `idempay` command line, the retrying client and its demo, the
//! checkout page, and what an operator sees in the metrics and the logs.

mod checkout;
mod cli;
mod demo;
mod observability;
mod queries;
