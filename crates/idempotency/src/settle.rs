//! Step 7 of the lifecycle, settle: a held key is not an end state but a handover. An operator asks the other system's
//! ledger what the call under the key's downstream key made (a read, never the call again: the
//! other system may have forgotten the key, and would act a second time), and the key completes
//! with the answer its first request would have had, in one transaction fenced like any holder's.
//! The client's retry then gets that answer, marked replayed.
//!
//! The settling work is the service's, registered beside the unit that records the point
//! ([`Resumers::settled_by`](crate::Resumers::settled_by)); the mechanism takes the key, renews its
//! lease while the work runs, and hands the key back, held as before, if the work fails.

use std::fmt;
use std::panic::AssertUnwindSafe;

use axum::http::StatusCode;
use axum::http::header::LOCATION;
use futures_util::FutureExt;
use uuid::Uuid;

use crate::lease::{Completed, HeldLease};
use crate::metrics::KeyOutcome;
use crate::store::{self, KeyStatus};
use crate::{
    Completion, Error, Fingerprint, FingerprintVersion, Fingerprints, Idempotency, IdempotencyKey,
    KeyedRequest, Scope,
};

/// What a settle did to a key on one route.
#[derive(Debug)]
pub struct Settlement {
    /// The method and route template the key was used on, e.g. `POST /v1/payments`.
    pub route: String,
    pub outcome: Settled,
}

/// The outcome of a settle on one route, as the operator is told it.
#[derive(Debug)]
pub enum Settled {
    /// The key was held and now answers with this response (and every retry with it, replayed).
    Completed {
        status: StatusCode,
        location: Option<String>,
    },
    /// The key had completed already (settled before, say): nothing was done. A settle is safe to
    /// run twice.
    AlreadyCompleted,
    /// A request, the recovery job or another settle holds the key: nothing was done; it is not
    /// the operator's yet (or any more).
    InProgress,
}

impl fmt::Display for Settled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completed { status, location } => {
                write!(f, "settled: the key now answers {}", status.as_u16())?;
                match location {
                    Some(location) => write!(f, " ({location})"),
                    None => Ok(()),
                }
            }
            Self::AlreadyCompleted => write!(f, "already completed: nothing to settle"),
            Self::InProgress => write!(
                f,
                "not held: a request or the recovery job is working on it (nothing done; if it \
                 is held later, settle it then)"
            ),
        }
    }
}

impl Idempotency {
    /// Settles the key `key` of `owner` on each of `routes` (method and route template) where it
    /// is held, with the settling work registered for its recovery point, and says what became of
    /// the key on each route it was used on. An empty list: the key is on none of them.
    ///
    /// Safe to run twice, and beside the recovery job (which never claims a held key) and other
    /// instances: the key is taken by one conditional update, completed fenced by its token, and
    /// handed back, held, when the work fails. The error of a failed work is returned after that.
    pub async fn settle(
        &self,
        owner: &str,
        key: &IdempotencyKey,
        routes: &[&str],
    ) -> Result<Vec<Settlement>, Error> {
        let scopes: Vec<String> = routes
            .iter()
            .map(|route| format!("{owner}:{route}"))
            .collect();
        let prefix = format!("{owner}:");
        let mut settlements = Vec::new();
        for (scope, status) in store::key_states(&self.pool, owner, &scopes, key.as_str()).await? {
            let outcome = match status {
                KeyStatus::Completed => Settled::AlreadyCompleted,
                KeyStatus::InProgress => Settled::InProgress,
                KeyStatus::Held => match self.settle_one(owner, &scope, key).await? {
                    Some(settled) => settled,
                    // Taken by another settle between the two reads.
                    None => Settled::InProgress,
                },
            };
            settlements.push(Settlement {
                route: scope.strip_prefix(&prefix).unwrap_or(&scope).to_owned(),
                outcome,
            });
        }
        Ok(settlements)
    }

    /// Takes the held key of `scope` and runs its settling work under a renewed lease; `None` when
    /// the key was not held any more.
    async fn settle_one(
        &self,
        owner: &str,
        scope: &str,
        key: &IdempotencyKey,
    ) -> Result<Option<Settled>, Error> {
        let token = Uuid::new_v4();
        let Some(claimed) = store::claim_held(
            &self.pool,
            owner,
            scope,
            key.as_str(),
            token,
            self.policy.lease,
        )
        .await?
        else {
            return Ok(None);
        };
        let point = claimed.recovery.name.clone();
        let Some(settle) = self.resumers.settler(&point).cloned() else {
            store::hand_back(&self.pool, owner, claimed.key_id, token).await?;
            return Err(Error::Internal(anyhow::anyhow!(
                "no unit of work of this build settles the recovery point `{point}`: settle it \
                 with the version that recorded it"
            )));
        };
        let Some(fingerprint) = Fingerprint::from_slice(&claimed.fingerprint) else {
            store::hand_back(&self.pool, owner, claimed.key_id, token).await?;
            return Err(Error::Internal(anyhow::anyhow!(
                "the key's stored fingerprint does not parse"
            )));
        };
        let fingerprints = Fingerprints::stored(
            FingerprintVersion::stored(claimed.fingerprint_version),
            fingerprint,
        );
        let request = KeyedRequest::new(Scope::stored(scope.to_owned()), key.clone(), fingerprints);
        let mut lease = self.lease(
            KeyOutcome::Settled,
            claimed.key_id,
            token,
            (claimed.now, claimed.window_from),
            &request,
        );
        lease.recovery = Some(claimed.recovery);
        tracing::warn!(
            key_id = claimed.key_id,
            scope,
            recovery_point = point.as_str(),
            "an operator settles a held key"
        );
        let held = HeldLease::of(&lease, &request);
        // Renewed while the work asks the other system, as any holder's lease: the settle is never
        // taken for dead while it runs (nothing takes over a key past the window, but the recovery
        // job would hold it again).
        let work = AssertUnwindSafe(settle(lease)).catch_unwind();
        let done = tokio::select! {
            done = work => done,
            never = self.heartbeat(&held) => match never {},
        };
        let failure = match done {
            Ok(Ok(Completion(Completed::Stored(response)))) => {
                // Counted once the key answers with its result, not when the settle begins.
                self.instrumentation
                    .record(KeyOutcome::Settled, request.scope.route());
                tracing::info!(
                    key_id = held.key_id,
                    status = response.status().as_u16(),
                    "settled a held key"
                );
                return Ok(Some(Settled::Completed {
                    status: response.status(),
                    location: response
                        .header(LOCATION)
                        .map(|location| location.to_owned()),
                }));
            }
            Ok(Ok(Completion(Completed::LeaseLost))) => return Ok(Some(Settled::InProgress)),
            Ok(Err(error)) => error,
            Err(_) => Error::Internal(anyhow::anyhow!("the settling work panicked")),
        };
        if !store::hand_back(&self.pool, owner, held.key_id, held.token).await? {
            tracing::warn!(
                key_id = held.key_id,
                "a failed settle found the key taken meanwhile"
            );
        }
        Err(failure)
    }
}
