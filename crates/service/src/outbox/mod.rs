//! The outbox both services send their events from: an event is written to `webhook_deliveries` in
//! the transaction of the change it announces, and a loop delivers it afterwards, signed per
//! Standard Webhooks, at least once, until the receiver answers 2xx or the retry schedule runs out
//! ([`delivery`]). The processor sends its own events this way, and idempay the events of its
//! merchants' endpoints, to the URLs they registered.
//!
//! - [`delivery`]: `enqueue`, the envelope, event ids, and the delivery loop (`Deliverer`), with
//!   the SQL it runs, the merchant endpoints' table's included (their secrets, disabling one that
//!   acknowledged nothing for the whole schedule);
//! - [`fair`]: the claim of due deliveries, fair across endpoints, with a bound on each one's sends
//!   in flight;
//! - [`lag`]: each endpoint's oldest due delivery, read at each scrape;
//! - [`schedule`]: when a failed delivery is tried again ([`RetrySchedule`]);
//! - [`signature`]: signing and verifying ([`WebhookSecret`], [`WebhookSecrets`]);
//! - [`address`]: the addresses a merchant's URL may not reach, checked at every delivery by the
//!   loop itself, so no sender can deliver around it;
//! - [`retention`]: the batches that delete finished deliveries past their retention, which each
//!   service's expiry job runs on its own rows;
//! - [`metrics`]: the deliveries' series.

pub mod address;
pub mod delivery;
pub mod fair;
pub mod lag;
pub mod metrics;
pub mod retention;
pub mod schedule;
pub mod signature;

pub use schedule::{JITTER, RetrySchedule};
pub use signature::{
    MAX_ID_LEN, MAX_SIGNATURES, NotUtf8, Rejection, TOLERANCE, WebhookSecret, WebhookSecrets,
};
