//! What every test stands on: the runner and its one PostgreSQL container ([`harness`]), a server
//! in the test process ([`helpers`]) or as a process of its own ([`instance`]), a raw HTTP/1.1
//! client for bytes no HTTP client sends ([`raw_http`]), the exactly-once invariants
//! ([`invariants`]) and the check of every response against the API description ([`contract`]);
//! for the cluster suite, the Citus cluster and its template on every node ([`citus`]).

pub mod checks;
pub mod citus;
pub mod contract;
pub mod harness;
pub mod helpers;
pub mod instance;
pub mod invariants;
pub mod pg_proxy;
pub mod raw_http;
pub mod stream;
