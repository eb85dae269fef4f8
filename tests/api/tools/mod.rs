//! What ships around the API: the `idempay` command line and `idempay dev`'s banner, the retrying client and its demo, the
//! checkout page, and what an operator sees in the metrics and the logs; and the cluster suite's
//! own ground, a test's database on every node of the Citus cluster.

mod adoption;
mod banner;
mod checkout;
mod citus;
mod cli;
mod demo;
mod observability;
mod queries;
mod test_map;
