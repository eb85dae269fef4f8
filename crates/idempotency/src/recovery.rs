//! The recovery side of the lifecycle (steps 3b and 6 of `mod.rs`): work that calls another system
//! records a **recovery point** with a downstream key before the call, and whoever picks the key
//! up later (a retry, a takeover, the recovery job) resumes from it with that same key, which is
//! never forgotten once a call with it may have gone out; within bounds: the recovery job waits
//! longer after each of its tries, and a key whose call stays unsettled past the recovery window
//! is held for an operator, never resumed by itself.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use uuid::Uuid;

use super::lease::HeldLease;
use super::{Completion, Error, Idempotency, KeyedRequest, Lease, Scope, store};
use super::{Engine, Fingerprint, IdempotencyKey};
use crate::metrics::KeyOutcome;

// ===========================================================================================
// 3b. Recovery points: "once a call to another system has been sent, a failure no longer means
//     that nothing happened".
// ===========================================================================================

/// Where work that calls another system can be resumed, recorded on its key before the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPoint {
    /// The step the work reached, named by the work: the recovery job picks the resumer by it.
    pub name: String,
    /// What resuming needs, as the work recorded it.
    pub state: serde_json::Value,
    /// The key to send downstream as the call's `Idempotency-Key`: the same for every attempt,
    /// takeover and restart of this key, so the other system answers them all with one result.
    pub downstream_key: String,
    /// Whether a call with that key may already have reached the other system.
    pub earlier_calls: EarlierCalls,
}

/// Whether a call with a recovery point's downstream key may have reached the other system before
/// this lease: what decides if a "nothing happened" answer can be believed. A refused connection
/// or a 4xx speaks of the attempt it answers, not of the downstream key: after an earlier attempt
/// that may have gone through, it proves nothing, and forgetting the key then lets the retry
/// charge a second time under a new one. The downstream key is forever once it may have been sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarlierCalls {
    /// This lease recorded the point and its downstream key (the reservation, a recycled key, or a
    /// first point recorded by the work): no call has used the key yet.
    None,
    /// An earlier holder of the key recorded it (a request that answered 503, one whose process
    /// died, the recovery job): a call with the key may have reached the other system.
    Possible,
}

impl EarlierCalls {
    /// For a point holding `recorded` as its downstream key, where this lease offered `made_here`:
    /// a key this lease made is new; one the row already held was made, and maybe sent, by an
    /// earlier holder (the statements keep a row's downstream key over the one offered).
    pub(super) fn of(recorded: &str, made_here: Option<&str>) -> Self {
        if made_here == Some(recorded) {
            Self::None
        } else {
            Self::Possible
        }
    }
}

impl RecoveryPoint {
    /// The point a request starts at (see [`KeyedRequest::starting_at`]), with a fresh downstream
    /// key, for the reservation to record.
    pub(super) fn first(request: &KeyedRequest) -> Option<Self> {
        let (name, state) = request.first_point.as_ref()?;
        Some(Self {
            name: (*name).to_owned(),
            state: state.clone(),
            downstream_key: new_downstream_key(),
            earlier_calls: EarlierCalls::None,
        })
    }

    /// The point as a statement that may have installed `made_here`'s downstream key returned it.
    pub(super) fn from_columns(
        name: Option<String>,
        state: Option<serde_json::Value>,
        downstream_key: Option<String>,
        made_here: Option<&str>,
    ) -> Option<Self> {
        let downstream_key = downstream_key?;
        Some(Self {
            name: name?,
            state: state?,
            earlier_calls: EarlierCalls::of(&downstream_key, made_here),
            downstream_key,
        })
    }
}

/// A key for calls downstream: random, so no two key rows (nor a row recycled after expiry) ever
/// share one.
fn new_downstream_key() -> String {
    format!("idk_{}", Uuid::new_v4().simple())
}

impl Lease {
    /// The recovery point the key is at: recorded by an earlier holder (resume from it rather than
    /// start over), or by this request's own reservation (see [`KeyedRequest::starting_at`]).
    /// `None` for a key whose work has not reached one.
    pub fn recovery_point(&self) -> Option<&RecoveryPoint> {
        self.recovery.as_ref()
    }

    /// Records, in a commit of its own and fenced by this lease's token, that the work is about to
    /// call another system: `name` and `state` say how to resume. The downstream key is created
    /// with the first point and kept by every later one. From here on, a failure of the work does
    /// not release the key but suspends it (see [`Idempotency::release`]).
    ///
    /// `None` when another request took the key over: the work must stop, with [`Lease::lost`].
    ///
    /// A point no resumer of the mechanism knows is refused before anything is recorded.
    pub async fn record_recovery_point(
        &mut self,
        name: &str,
        state: serde_json::Value,
    ) -> Result<Option<&RecoveryPoint>, Error> {
        self.resumers.require(name)?;
        let recorded = store::record_recovery_point(
            &self.pool,
            &self.owner,
            self.key_id,
            self.token,
            name,
            &state,
            &new_downstream_key(),
        )
        .await?;
        self.instrumentation.crash_point("after-recovery-point");
        self.recovery = recorded;
        Ok(self.recovery.as_ref())
    }

    /// Forgets the recovery point when the other system said for certain that nothing happened
    /// (it refused the call before acting on it): a failure then releases the key as before, and
    /// the client's retry starts afresh. `false` when another request took the key over.
    pub async fn clear_recovery_point(&mut self) -> Result<bool, sqlx::Error> {
        let cleared =
            store::clear_recovery_point(&self.pool, &self.owner, self.key_id, self.token).await?;
        if cleared {
            self.recovery = None;
        }
        Ok(cleared)
    }
}

/// The recovery job's bounds: the window above, and the wait between its tries at one key, from
/// `first_backoff` doubling up to `longest_backoff`.
#[derive(Clone, Copy, Debug)]
pub(super) struct RecoveryBounds {
    pub(super) window: Duration,
    pub(super) first_backoff: Duration,
    pub(super) longest_backoff: Duration,
}

impl RecoveryBounds {
    /// The wait after the recovery job's try number `tries + 1` at a key: the first backoff,
    /// doubled for each earlier try, at most the longest (the statements of a single server
    /// compute the same in SQL).
    pub(super) fn backoff(&self, tries: i32) -> Duration {
        let doublings = u32::try_from(tries.clamp(0, 30)).unwrap_or(30);
        self.first_backoff
            .saturating_mul(1 << doublings)
            .min(self.longest_backoff)
    }
}

/// The longest wait between two of the recovery job's tries at one key.
pub const LONGEST_RECOVERY_BACKOFF: Duration = Duration::from_secs(15 * 60);

// ===========================================================================================
// 6. Recover: a client that never comes back still ends with its effect recorded.
// ===========================================================================================

/// Resumes the work of a suspended key from its recovery point, under a lease the recovery job
/// took: the same unit of work a retry would run, so it stores the response the retry would get.
/// Its failure, in the service's own error type, is only logged: the key waits for the next try.
pub(crate) type Resumer = Arc<
    dyn Fn(Lease) -> futures_util::future::BoxFuture<'static, Result<Completion, Error>>
        + Send
        + Sync,
>;

/// The resumers of the work that records recovery points, by point name: handed to the mechanism
/// once ([`Idempotency::resuming`]), which then refuses to record a point none of them resumes
/// and tells, at start, of suspended keys at such a point ([`Idempotency::unresumable`]). A unit
/// may also say how an operator settles a key held at its point ([`Resumers::settled_by`]).
#[derive(Clone, Default)]
pub struct Resumers(Vec<Unit>);

/// The work behind one recovery point: how it is resumed, and how a key held there is settled.
#[derive(Clone)]
struct Unit {
    name: String,
    resume: Resumer,
    settle: Option<Resumer>,
}

impl fmt::Debug for Resumers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|unit| &unit.name))
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
    /// Resumes keys suspended at the point `name` with `resume`, a unit of work that fails with
    /// the service's own error type.
    #[must_use]
    pub fn on<F, Fut, E>(mut self, name: &str, resume: F) -> Self
    where
        F: Fn(Lease) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Completion, E>> + Send + 'static,
        E: fmt::Display + Send + 'static,
    {
        self.0.push(Unit {
            name: name.to_owned(),
            resume: boxed(resume),
            settle: None,
        });
        self
    }

    /// Settles keys held at the point `name` with `settle` ([`Idempotency::settle`]): a unit of
    /// work that asks the other system what the call under the key's downstream key made, with
    /// a read that never makes it again, and completes the key with it. `name` must be resumed
    /// ([`Resumers::on`]) first: a point is settled by the unit that records it.
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

    /// Refuses a point no resumer knows: a key suspended there would never be resumed.
    pub(crate) fn require(&self, name: &str) -> Result<(), Error> {
        if self.0.iter().any(|unit| unit.name == name) {
            Ok(())
        } else {
            Err(Error::Internal(anyhow::anyhow!(
                "no resumer for the recovery point `{name}`: register one with \
                 Idempotency::resuming before recording it"
            )))
        }
    }

    fn unit(&self, name: &str) -> Option<&Unit> {
        self.0.iter().find(|unit| unit.name == name)
    }

    fn get(&self, name: &str) -> Option<&Resumer> {
        self.unit(name).map(|unit| &unit.resume)
    }

    /// How a key held at `name` is settled, if its unit says.
    pub(crate) fn settler(&self, name: &str) -> Option<&Resumer> {
        self.unit(name).and_then(|unit| unit.settle.as_ref())
    }
}

impl Idempotency {
    /// Takes over a batch of keys whose lease is dead at a recovery point that `resumers` know,
    /// and resumes each as a retry would: renewed while it runs, completed with the response the
    /// client's retry will replay, suspended again if it still cannot finish. Returns how many it
    /// claimed. Safe on several instances at once: each key is claimed by one.
    ///
    /// Each key is tried again only after a wait that starts at `interval` (the job's) and doubles
    /// with every try, up to [`LONGEST_RECOVERY_BACKOFF`]; a key past the recovery window is
    /// held for an operator instead (see [`Idempotency::hold_overdue`]).
    pub async fn recover_batch(&self, interval: Duration) -> Result<usize, sqlx::Error> {
        let resumers = &self.resumers;
        let bounds = RecoveryBounds {
            window: self.policy.recovery_window,
            first_backoff: interval,
            longest_backoff: LONGEST_RECOVERY_BACKOFF.max(interval),
        };
        let names = resumers.names();
        let claimed = match self.engine().await? {
            Engine::Postgres => {
                store::claim_recoverable(&self.pool, &names, self.policy.lease, &bounds).await?
            }
            Engine::Citus => {
                store::claim_recoverable_unlocked(&self.pool, &names, self.policy.lease, &bounds)
                    .await?
            }
        };
        let count = claimed.len();
        let mut resumed = Vec::with_capacity(count);
        for key in claimed {
            let Some(resume) = resumers.get(&key.recovery.name).cloned() else {
                continue;
            };
            let (Ok(idem_key), Some(fingerprint)) = (
                IdempotencyKey::parse(key.idem_key.as_bytes()),
                Fingerprint::from_slice(&key.fingerprint),
            ) else {
                tracing::error!(
                    key_id = key.key_id,
                    "a stored key does not parse; left alone"
                );
                continue;
            };
            let request = KeyedRequest::new(Scope::stored(key.scope), idem_key, fingerprint);
            let mut lease = self.lease(
                KeyOutcome::Recovered,
                key.key_id,
                key.token,
                key.now,
                &request,
            );
            tracing::warn!(
                key_id = key.key_id,
                recovery_point = key.recovery.name.as_str(),
                "recovering a key its request left at a recovery point"
            );
            lease.recovery = Some(key.recovery);
            self.instrumentation.record(lease.outcome);
            let held = HeldLease::from(&lease);
            let key_id = held.key_id;
            let mechanism = self.clone();
            resumed.push(tokio::spawn(async move {
                let answer: Result<_, Error> =
                    mechanism.execute(&request, held, resume(lease)).await;
                match answer {
                    Ok(response) => {
                        tracing::info!(key_id, status = response.status().as_u16(), "recovered")
                    }
                    Err(error) => tracing::warn!(
                        key_id,
                        error = %error,
                        "recovery did not finish; the key waits for the next run"
                    ),
                }
            }));
        }
        for task in resumed {
            if let Err(error) = task.await {
                tracing::error!(%error, "a recovery task failed");
            }
        }
        Ok(count)
    }
}

impl Idempotency {
    /// Holds for an operator every suspended key whose recovery point is older than the recovery
    /// window, a batch at a time, and returns how many it held. Never a silent retry: the other
    /// system may have forgotten the downstream key by the time a resume would ask it again, and
    /// would then act a second time. Each is logged as an error and counted
    /// (`outcome="held"`); `idempay reconcile` and the key's inspection show it.
    pub async fn hold_overdue(&self) -> Result<usize, sqlx::Error> {
        let window = self.policy.recovery_window;
        let held = match self.engine().await? {
            Engine::Postgres => store::hold_overdue(&self.pool, window).await?,
            Engine::Citus => store::hold_overdue_unlocked(&self.pool, window).await?,
        };
        for key in &held {
            self.instrumentation.record(KeyOutcome::Held);
            tracing::error!(
                key_id = key.id,
                scope = key.scope,
                recovery_point = key.recovery_point,
                downstream_key = key.downstream_key,
                "a suspended key passed the recovery window: held for an operator"
            );
        }
        Ok(held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recovery_backoff_doubles_from_the_interval_up_to_its_longest() {
        let bounds = RecoveryBounds {
            window: Duration::from_secs(12 * 60 * 60),
            first_backoff: Duration::from_secs(10),
            longest_backoff: LONGEST_RECOVERY_BACKOFF,
        };
        let waits: Vec<u64> = [0, 1, 2, 3, 6, 7, 30, 1000, -1]
            .into_iter()
            .map(|tries| bounds.backoff(tries).as_secs())
            .collect();
        assert_eq!(waits, [10, 20, 40, 80, 640, 900, 900, 900, 10]);
    }
}
