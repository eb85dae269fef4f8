//! The recovery side of the lifecycle (steps 3b and 6 of `mod.rs`): work that calls another system
//! records a **recovery point** with a downstream key before the call, and whoever picks the key
//! up later (a retry, a takeover, the recovery job) resumes from it with that same key, which is
//! never forgotten once a call with it may have gone out; within bounds: the recovery job waits
//! longer after each of its tries, and a key whose call stays unresolved past the recovery window
//! is held for an operator, never resumed by itself.

use std::collections::BTreeSet;
use std::sync::PoisonError;
use std::time::Duration;

use super::lease::HeldLease;
use super::point::{RecoveryBounds, new_downstream_key};
use super::{Engine, Fingerprint, FingerprintVersion, Fingerprints, IdempotencyKey};
use super::{Error, Idempotency, KeyedRequest, Lease, RecoveryPoint, Scope, store};
use crate::formats::UnknownFormat;
use crate::metrics::{KeyOutcome, RECOVERY_ROUTE};

// ===========================================================================================
// 3b. Recovery points: "once a call to another system has been sent, a failure no longer means
//     that nothing happened".
// ===========================================================================================

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
    /// not release the key but suspends it (see `Idempotency::release`).
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

/// The longest wait between two of the recovery job's tries at one key.
pub const LONGEST_RECOVERY_BACKOFF: Duration = Duration::from_secs(15 * 60);

// ===========================================================================================
// 6. Recover: a client that never comes back still ends with its effect recorded.
// ===========================================================================================

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
    /// (completed), `Suspended` (still unresolved, tried again later), `Released` or `LeaseLost`.
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
                (key.now, key.window_from),
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

/// How many overdue keys [`Idempotency::hold_overdue`] holds at a time (its statements' literal
/// `LIMIT 100`): a job that held this many calls it again, since more may be waiting.
pub const HOLD_BATCH: usize = 100;

/// How many keys [`Idempotency::recover`] resumes at a time (its statements' literal `LIMIT 20`):
/// a job that got this many results calls it again, since more may be waiting.
pub const RECOVERY_BATCH: usize = 20;

impl Idempotency {
    /// Holds for an operator every suspended key whose recovery point is older than the recovery
    /// window, a batch at a time, and returns how many it held. Never a silent retry: the other
    /// system may have forgotten the downstream key by the time a resume would ask it again, and
    /// would then act a second time. Each is logged as an error and counted
    /// (`outcome="held"`); the key's inspection ([`Idempotency::inspect`]) shows it.
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

impl Idempotency {
    /// Reports the suspended keys that the recovery job leaves alone because no resumer of this
    /// release reads their recovery state (its version, or its point: a later release's): each
    /// logged as a warning (its id, its point, the version) and counted
    /// (`outcome="unknown_format"`) the first time this instance meets it, and returned. The
    /// recovery job calls it at every run; the end of a rolling deploy (an instance that reads
    /// them resumes them) ends them.
    pub async fn report_unknown_states(&self) -> Result<Vec<i64>, sqlx::Error> {
        let known = self.resumers.known_pairs();
        let waiting =
            store::unknown_states(&self.pool, &known, self.policy.recovery_window).await?;
        let mut reported = self
            .reported
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now: BTreeSet<i64> = waiting.iter().map(|key| key.id).collect();
        for key in &waiting {
            if !reported.contains(&key.id) {
                self.instrumentation
                    .record(KeyOutcome::UnknownFormat, RECOVERY_ROUTE);
                UnknownFormat::recovery_state(&key.recovery_point, key.version.clone())
                    .report(key.id);
            }
        }
        *reported = now;
        Ok(waiting.into_iter().map(|key| key.id).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Completion, Resumers, StateVersion};

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
