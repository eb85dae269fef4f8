//! What the processor's handlers share, apart from the routes that hand it to them: the handlers,
//! the extractors and the probes read it, and the root builds it.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use idempotency::Idempotency;
use sqlx::PgPool;

use crate::faults::Faults;
use crate::settings::ProcessorApiKey;

/// What the processor's handlers share: one pointer, cloned per request.
#[derive(Clone, Debug)]
pub struct ProcessorState(pub(crate) Arc<Shared>);

#[derive(Debug)]
pub struct Shared {
    pub(crate) pool: PgPool,
    /// Its own instance of the mechanism: its own replay cache, the same table as idempay's.
    pub(crate) idempotency: Idempotency,
    pub(crate) api_key: ProcessorApiKey,
    pub(crate) slow_charge: Duration,
    /// Changed at run time by `PUT /v1/test/faults`, so a demo can make a running processor lossy.
    pub(crate) faults: std::sync::RwLock<Faults>,
    /// Where events go; `None` records none.
    pub(crate) webhook_url: Option<String>,
}

impl Deref for ProcessorState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}
