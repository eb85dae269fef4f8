//! The lease a request holds on a key while its work runs, and the proof that the work completed
//! it: what [`Idempotency::run`](crate::Idempotency::run) hands the work, and what it gets back.
//! How a lease is granted, renewed, completed and released is told in order in `lib.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::connections::Lot;
use crate::engine::KnownEngine;
use crate::instrumentation::Instrumentation;
use crate::metrics::KeyOutcome;
use crate::{
    Fingerprint, FingerprintVersion, IdempotencyKey, KeyedRequest, RecoveryPoint, Resumers,
    StoredResponse,
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
