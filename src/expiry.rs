//! What idempay's expiry job deletes (the job itself is `service::sweeps`): expired
//! idempotency keys and processed webhook event ids, and the merchants' events and their webhook
//! deliveries (with their attempts) past their retention. Not parked webhook events: one whose
//! object is never recorded is a difference `idempay reconcile` shows, not something to forget
//! (`webhooks/parked.rs`); a parked event's processed id that expires is recorded again when it
//! is applied.

use std::time::Duration;

use idempotency::Idempotency;
use service::outbox::retention::{self, Owner};
use service::sweeps::{Sweep, Sweeps};

use crate::webhooks;

/// How long idempay's outbox keeps what it no longer needs, counted from each row's creation (an
/// event) or its end (a delivery acknowledged or given up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub events: Duration,
    pub deliveries: Duration,
}

/// Expired keys and processed webhook ids: what `idempay fixture` (the mechanism adopted alone)
/// deletes too.
pub fn keys() -> Sweeps {
    Sweeps::of(crate::SERVICE, key_sweeps())
}

fn key_sweeps() -> Vec<Sweep> {
    vec![
        Sweep::new("idempotency_keys", |pool, engine| async move {
            Idempotency::expire_batch(&pool, engine).await
        }),
        Sweep::new("processed_events", |pool, _| async move {
            webhooks::expire_batch(&pool).await
        }),
    ]
}

/// Everything idempay expires: the keys, then the deliveries, then the events (an event whose
/// last delivery goes in this run can go in the same run).
pub fn all(retention: Retention) -> Sweeps {
    let mut sweeps = key_sweeps();
    sweeps.push(Sweep::new(
        "webhook_deliveries",
        move |pool, engine| async move {
            retention::prune_deliveries(&pool, engine, Owner::Endpoints, retention.deliveries).await
        },
    ));
    sweeps.push(Sweep::new("events", move |pool, engine| async move {
        webhooks::retention::prune_events(&pool, engine, retention.events).await
    }));
    Sweeps::of(crate::SERVICE, sweeps)
}
