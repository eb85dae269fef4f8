//! Exactly once when things go wrong: processes crash or are killed, the database stops or
//! stalls, clients are slow or send hostile bytes, and another account tries what it may not.

mod api_keys;
mod background_jobs;
mod cancellation;
mod connections;
mod faults;
mod graceful_stop;
mod hostile;
mod lock_timeout;
mod outage;
mod rate_limits;
mod restart;
mod security;
mod signals;
mod slow_clients;
