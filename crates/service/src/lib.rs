//! What idempay and its simulated card processor both run on, so that neither service imports the
//! other: the outbox their events are delivered from, signed ([`outbox`]), the accept loop
//! ([`server`]), the watch over background jobs ([`jobs`]), the metrics' recorder ([`metrics`]),
//! the name each service passes in, which prefixes its series and makes its `User-Agent`
//! ([`name`]),
//! how a setting's value is read ([`settings`]) and the settings both share
//! ([`shared_settings`]), keyset pagination
//! ([`pagination`]), public ids and their newtypes ([`ids`], `public_id!`), the problem
//! catalogue's macro ([`problem`], `problem_catalogue!`), closed vocabularies ([`vocabulary`]) and
//! the crash points of the fault-injection tests ([`failpoint`]).
//!
//! It names no service and none of their domains: each service keeps its own routes, problem
//! catalogue and settings, and builds them on these pieces.

pub mod failpoint;
pub mod ids;
pub mod jobs;
pub mod metrics;
pub mod name;
pub mod outbox;
pub mod pagination;
pub mod problem;
pub mod server;
pub mod settings;
pub mod shared_settings;
pub mod sweeps;
pub mod vocabulary;
