//! The lease a request holds on a key while its work runs, and the proof that the work completed
//! it: what [`Idempotency::run`](crate::Idempotency::run) hands the work, and what it gets back.
//! How a lease is granted, renewed, completed and released is told in order in `lib.rs`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use sqlx::PgPool;
use uuid::Uuid;

use crate::connections::Lot;
use crate::engine::KnownEngine;
use crate::instrumentation::Instrumentation;
use crate::metrics::KeyOutcome;
use crate::{
    Error, Fingerprint, FingerprintVersion, IdempotencyKey, KeyedRequest, RecoveryPoint,
    StateVersion, StoredResponse,
};

/// The right to execute the work of one key, held by exactly one request at a time. The work
/// writes its effect in the transaction from [`Lease::begin`] and hands it to [`Lease::complete`],
/// so the effect and the key's completion commit together or not at all.
#[derive(Debug)]
pub struct Lease {
    pub(crate) instrumentation: Instrumentation,
    /// The points this lease may record.
    pub(crate) resumers: Arc<Resumers>,
    pub(crate) pool: PgPool,
    pub(crate) lot: Lot,
    pub(crate) engine: KnownEngine,
    /// How this request came to hold the key: a fresh or recycled one, or a takeover.
    pub(crate) outcome: KeyOutcome,
    /// When this instance was granted the lease, on its monotonic clock and on the database's.
    pub(crate) granted: Instant,
    pub(crate) granted_at: DateTime<Utc>,
    /// The end of the key's recovery window, less the clock margin: see [`Lease::call_deadline`].
    pub(crate) call_deadline: DateTime<Utc>,
    /// The key's row: its owner (the scope's first part) and id.
    pub(crate) owner: Arc<str>,
    pub(crate) key_id: i64,
    pub(crate) token: Uuid,
    pub(crate) key: IdempotencyKey,
    pub(crate) key_ttl: Duration,
    /// Where an earlier holder of the key left its work, if it recorded a recovery point.
    pub(crate) recovery: Option<RecoveryPoint>,
}

/// What the mechanism keeps of a lease it handed to the work: enough to renew and release it.
#[derive(Clone, Debug)]
pub(crate) struct HeldLease {
    pub(crate) owner: Arc<str>,
    pub(crate) key_id: i64,
    pub(crate) token: Uuid,
    /// When the lease was granted: earlier than the completing transaction's `now()`, so
    /// `reserved + key_ttl` is no later than the key's `expires_at`.
    pub(crate) reserved: Instant,
    /// The key's fingerprint, when the lease made it (a new or recycled key, under the current
    /// version), for the replay cache; a key taken over keeps the one it was made with, which
    /// the cache then learns from the row.
    pub(crate) fingerprint: Option<(FingerprintVersion, Fingerprint)>,
    /// How the request came to hold the key: what it counts as if its work completes.
    pub(crate) outcome: KeyOutcome,
}

impl HeldLease {
    pub(crate) fn of(lease: &Lease, request: &KeyedRequest) -> Self {
        Self {
            owner: lease.owner.clone(),
            key_id: lease.key_id,
            token: lease.token,
            reserved: lease.granted,
            outcome: lease.outcome,
            fingerprint: match lease.outcome {
                KeyOutcome::Executed => request.fingerprints.current(),
                _ => None,
            },
        }
    }
}

/// Proof that the work ran [`Lease::complete`]: the only way to finish a unit of work.
#[derive(Debug)]
pub struct Completion(pub(crate) Completed);

impl Completion {
    /// Whether the effect committed with the key; `false` when another request had taken the key
    /// over and the effect rolled back.
    pub fn committed(&self) -> bool {
        matches!(self.0, Completed::Stored(_))
    }
}

#[derive(Debug)]
pub(crate) enum Completed {
    /// The effect and the response were committed with the key.
    Stored(StoredResponse),
    /// Another request took the key over; nothing was committed.
    LeaseLost,
}

/// What the completion needs to know, bound as the parameters of `idempotency_complete($1, $2, $3,
/// $4, $5, $6, $7)`, in this order: the key (its owner and id), the lease's token, the response
/// (status, headers, body) and how long the key lives from now.
#[derive(Debug)]
pub struct Fence {
    pub owner: Arc<str>,
    pub key_id: i64,
    pub token: Uuid,
    pub response_code: i16,
    pub response_headers: serde_json::Value,
    pub response_body: bytes::Bytes,
    pub ttl_ms: i64,
}

/// Resumes the work of a suspended key from its recovery point, under a lease the recovery job
/// took: the same unit of work a retry would run, so it stores the response the retry would get.
/// Its failure, in the service's own error type, is only logged: the key waits for the next try.
pub(crate) type Resumer = Arc<
    dyn Fn(Lease) -> futures_util::future::BoxFuture<'static, Result<Completion, Error>>
        + Send
        + Sync,
>;

/// The resumers of the work that records recovery points, by point name, each with the versions of
/// its state it reads: handed to the mechanism once ([`resuming`](crate::Idempotency::resuming)),
/// which then refuses to record a point (or a version of its state) none of them resumes, tells at
/// start of suspended keys at an unknown point
/// ([`unresumable`](crate::Idempotency::unresumable)), and leaves alone the keys whose state is in
/// a version none of them reads. A unit may also say how an operator settles a
/// key held at its point ([`Resumers::settled_by`]).
#[derive(Clone, Default)]
pub struct Resumers(Vec<Unit>);

/// The work behind one recovery point: the versions of its state it reads, how it is resumed, and
/// how a key held there is settled.
#[derive(Clone)]
struct Unit {
    name: String,
    versions: Vec<StateVersion>,
    resume: Resumer,
    settle: Option<Resumer>,
}

impl fmt::Debug for Resumers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|unit| (&unit.name, &unit.versions)))
            .finish()
    }
}

/// A unit of work of the service's, in the mechanism's error type.
fn boxed<F, Fut, E>(work: F) -> Resumer
where
    F: Fn(Lease) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Completion, E>> + Send + 'static,
    E: fmt::Display + Send + 'static,
{
    Arc::new(move |lease| {
        work(lease)
            .map(|done| done.map_err(|error| Error::Internal(anyhow::anyhow!("{error}"))))
            .boxed()
    })
}

impl Resumers {
    /// Resumes keys suspended at the point `name`, whose state is in one of `versions`, with
    /// `resume`, a unit of work that fails with the service's own error type.
    #[must_use]
    pub fn on<F, Fut, E>(mut self, name: &str, versions: &[StateVersion], resume: F) -> Self
    where
        F: Fn(Lease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.0.push(Unit {
            name: name.to_owned(),
            versions: versions.to_vec(),
            resume: boxed(resume),
            settle: None,
        });
        self
    }

    /// Settles keys held at the point `name` with `settle`
    /// ([`Idempotency::settle`](crate::Idempotency::settle)): a unit of work that asks the other
    /// system what the call under the key's downstream key made, with a read that never makes it
    /// again, and completes the key with it. `name` must be resumed
    /// ([`Resumers::on`]) first: a point is settled by the unit that records it, reading the same
    /// versions of its state.
    ///
    /// # Panics
    /// When no resumer of `name` is registered: a mistake in the service's assembly, found at start.
    #[must_use]
    pub fn settled_by<F, Fut, E>(mut self, name: &str, settle: F) -> Self
    where
        F: Fn(Lease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        let unit = self
            .0
            .iter_mut()
            .find(|unit| unit.name == name)
            .unwrap_or_else(|| panic!("settled_by(`{name}`) before on(`{name}`)"));
        unit.settle = Some(boxed(settle));
        self
    }

    /// The names of the points resumed.
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|unit| unit.name.clone()).collect()
    }

    /// Whether a resumer resumes keys at `point` whose state is in `version`.
    pub fn reads(&self, point: &str, version: Option<StateVersion>) -> bool {
        let Some(version) = version else {
            return false;
        };
        self.0
            .iter()
            .any(|unit| unit.name == point && unit.versions.contains(&version))
    }

    /// Every point and version resumed, as the statements compare them (see
    /// [`StateVersion::paired_with`]).
    pub(crate) fn known_pairs(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|unit| unit.versions.iter().map(|v| v.paired_with(&unit.name)))
            .collect()
    }

    /// Refuses a point, or a version of its state, no resumer knows: a key suspended there would
    /// never be resumed.
    pub(crate) fn require(&self, name: &str, state: &serde_json::Value) -> Result<(), Error> {
        if self.reads(name, StateVersion::of(state)) {
            return Ok(());
        }
        if self.get(name).is_none() {
            return Err(Error::Internal(anyhow::anyhow!(
                "no resumer for the recovery point `{name}`: register one with \
                 Idempotency::resuming before recording it"
            )));
        }
        let version = state
            .get("version")
            .map_or_else(|| "1".to_owned(), |v| v.to_string());
        Err(Error::Internal(anyhow::anyhow!(
            "the resumer of the recovery point `{name}` reads no state of version {version}: \
             name the version it writes among those it reads"
        )))
    }

    fn unit(&self, name: &str) -> Option<&Unit> {
        self.0.iter().find(|unit| unit.name == name)
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Resumer> {
        self.unit(name).map(|unit| &unit.resume)
    }

    /// How a key held at `name` is settled, if its unit says.
    pub(crate) fn settler(&self, name: &str) -> Option<&Resumer> {
        self.unit(name).and_then(|unit| unit.settle.as_ref())
    }
}
