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
use super::{Engine, Fingerprint, FingerprintVersion, Fingerprints, IdempotencyKey};
use crate::metrics::{KeyOutcome, RECOVERY_ROUTE};

// ===========================================================================================
// 3b. Recovery points: "once a call to another system has been sent, a failure no longer means
//     that nothing happened".
// ===========================================================================================

/// Where work that calls another system can be resumed, recorded on its key before the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPoint {
    /// The step the work reached, named by the work: the recovery job picks the resumer by it.
    pub name: String,
    /// What resuming needs, as the work recorded it: a JSON object in the format its `version`
    /// member names ([`StateVersion`]).
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

/// The version of a recovery state's format: its `version` member, a positive integer. A state
/// without one is version 1, the format of the releases before versions (which wrote none).
///
/// The version travels inside the state, in the one column that holds it, so that no statement of
/// any release, those before versions included, can write a state and leave beside it a version
/// that is not its own. A resumer reads the versions it names ([`Resumers::on`]); a key whose state
/// is in another (a later release wrote it) is left alone by this release: not taken over by a
/// retry (answered 503 with `Retry-After`), not claimed by the recovery job, never released nor
/// its call resent, and reported ([`Idempotency::report_unknown_states`]). Past the recovery window
/// it is held for an operator like any other key: the window is the other system's memory, not
/// the format's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateVersion(u16);

impl StateVersion {
    /// The format of the states recorded before versions: no `version` member.
    pub const FIRST: Self = Self(1);

    /// Version `version`, a positive integer.
    pub const fn new(version: u16) -> Self {
        assert!(version > 0, "state versions start at 1");
        Self(version)
    }

    pub fn get(self) -> u16 {
        self.0
    }

    /// The version of `state`: its `version` member, [`StateVersion::FIRST`] without one. `None`
    /// when the member is not a positive integer that fits: no resumer reads such a state.
    pub fn of(state: &serde_json::Value) -> Option<Self> {
        Self::of_member(state.get("version"))
    }

    fn of_member(member: Option<&serde_json::Value>) -> Option<Self> {
        match member {
            None => Some(Self::FIRST),
            Some(member) => member
                .as_u64()
                .and_then(|version| u16::try_from(version).ok())
                .filter(|version| *version > 0)
                .map(Self),
        }
    }

    /// How the statements compare a state's version with the ones a resumer reads: the text of
    /// its `version` member (`COALESCE(recovery_state -> 'version', '1')::text`, so `2`, never
    /// `2.0` nor `"2"`), a space, the point's name.
    fn paired_with(self, point: &str) -> String {
        format!("{} {point}", self.0)
    }
}

/// The recovery point a key is at, as the reservation reads it: its name and its state's version,
/// for the decision to take the key over or leave it alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PointAt {
    pub(crate) name: String,
    /// `None` for a `version` member that is no version.
    pub(crate) version: Option<StateVersion>,
    /// The member as written, for the report of a key left alone.
    pub(crate) written: String,
}

impl PointAt {
    /// The point `name` whose state's `version` member is `member`.
    pub(crate) fn new(name: String, member: Option<&serde_json::Value>) -> Self {
        Self {
            version: StateVersion::of_member(member),
            written: member.map_or_else(|| "1".to_owned(), ToString::to_string),
            name,
        }
    }
}

impl fmt::Display for StateVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl RecoveryPoint {
    /// The version of the point's state; `None` for a state no release reads.
    pub fn version(&self) -> Option<StateVersion> {
        StateVersion::of(&self.state)
    }

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
        self.resumers.require(name, &state)?;
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

/// The resumers of the work that records recovery points, by point name, each with the versions of
/// its state it reads: handed to the mechanism once ([`Idempotency::resuming`]), which then refuses
/// to record a point (or a version of its state) none of them resumes, tells at start of
/// suspended keys at an unknown point ([`Idempotency::unresumable`]), and leaves alone the keys
/// whose state is in a version none of them reads. A unit may also say how an operator settles a
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

    /// Settles keys held at the point `name` with `settle` ([`Idempotency::settle`]): a unit of
    /// work that asks the other system what the call under the key's downstream key made, with
    /// a read that never makes it again, and completes the key with it. `name` must be resumed
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
        Ok(self.recover(interval).await?.len())
    }

    /// [`Idempotency::recover_batch`], saying what became of each key it claimed: `Recovered`
    /// (completed), `Suspended` (still unsettled, tried again later), `Released` or `LeaseLost`.
    pub async fn recover(&self, interval: Duration) -> Result<Vec<KeyRecovery>, sqlx::Error> {
        let resumers = &self.resumers;
        let bounds = RecoveryBounds {
            window: self.policy.recovery_window,
            first_backoff: interval,
            longest_backoff: LONGEST_RECOVERY_BACKOFF.max(interval),
        };
        // Only keys whose state a resumer reads: the rest wait for a release that reads them.
        let known = resumers.known_pairs();
        let claimed = match self.engine().await? {
            Engine::Postgres => {
                store::claim_recoverable(&self.pool, &known, self.policy.lease, &bounds).await?
            }
            Engine::Citus => {
                store::claim_recoverable_unlocked(&self.pool, &known, self.policy.lease, &bounds)
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
            let fingerprints = Fingerprints::stored(
                FingerprintVersion::stored(key.fingerprint_version),
                fingerprint,
            );
            let request = KeyedRequest::new(Scope::stored(key.scope), idem_key, fingerprints);
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
            let point = key.recovery.name.clone();
            lease.recovery = Some(key.recovery);
            let held = HeldLease::of(&lease, &request);
            let key_id = held.key_id;
            let mechanism = self.clone();
            resumed.push(tokio::spawn(async move {
                let (answer, outcome): (Result<_, Error>, _) =
                    mechanism.execute(&request, held, resume(lease)).await;
                let result = outcome.as_str();
                let key = request.key.as_str();
                match answer {
                    Ok(response) => tracing::info!(
                        key_id,
                        key,
                        recovery_point = point,
                        result,
                        status = response.status().as_u16(),
                        "recovery resumed a key"
                    ),
                    Err(error) => tracing::warn!(
                        key_id,
                        key,
                        recovery_point = point,
                        result,
                        cause = %error,
                        "recovery did not settle a key; it waits for the next run"
                    ),
                }
                KeyRecovery { key_id, outcome }
            }));
        }
        let mut results = Vec::with_capacity(count);
        for task in resumed {
            match task.await {
                Ok(result) => results.push(result),
                Err(error) => tracing::error!(%error, "a recovery task failed"),
            }
        }
        Ok(results)
    }
}

/// What became of one key the recovery job claimed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRecovery {
    pub key_id: i64,
    /// `Recovered` when its work completed; otherwise how the attempt ended.
    pub outcome: KeyOutcome,
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
            self.instrumentation
                .record(KeyOutcome::Held, RECOVERY_ROUTE);
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
    fn a_state_s_version_is_its_version_member_and_one_without_it() {
        use serde_json::json;
        assert_eq!(
            StateVersion::of(&json!({ "payment": "pay_1" })),
            Some(StateVersion::FIRST)
        );
        assert_eq!(
            StateVersion::of(&json!({ "version": 2, "payment": "pay_1" })),
            Some(StateVersion::new(2))
        );
        for no_version in [
            json!("2"),
            json!(2.0),
            json!(0),
            json!(-1),
            json!(70_000),
            json!(null),
        ] {
            assert_eq!(
                StateVersion::of(&json!({ "version": no_version })),
                None,
                "{no_version}"
            );
        }
        // As the statements compare it: the member's JSON text, a space, the point.
        assert_eq!(StateVersion::new(2).paired_with("payment.x"), "2 payment.x");
        let resumers = Resumers::default().on(
            "payment.x",
            &[StateVersion::FIRST, StateVersion::new(2)],
            |_lease: Lease| async { Err::<Completion, _>("never run") },
        );
        assert!(resumers.reads("payment.x", Some(StateVersion::new(2))));
        assert!(!resumers.reads("payment.x", Some(StateVersion::new(3))));
        assert!(!resumers.reads("payment.x", None));
        assert!(!resumers.reads("refund.x", Some(StateVersion::FIRST)));
        assert_eq!(resumers.known_pairs(), ["1 payment.x", "2 payment.x"]);
        assert!(
            resumers
                .require("payment.x", &json!({ "version": 3 }))
                .is_err()
        );
        assert!(resumers.require("payment.x", &json!({})).is_ok());
    }

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
