//! Idempotency keys: one `Idempotency-Key` per business intent turns a client's "at least once"
//! into "exactly once" effects. [`Idempotency::run`] is the single entry point every mutating route
//! uses.
//!
//! The mechanism knows no accounts: a service adopts it by telling it who owns a request
//! ([`Owners`]), then either puts its routes behind [`IdempotencyLayer`], a tower layer that needs
//! no code in the handlers, or, for an effect that must commit with the key in one transaction (a
//! payment), takes the [`Idempotent`] extractor and calls [`Idempotency::run`] with its unit of
//! work.
//!
//! This file tells the lifecycle of a key in order, each step with its types:
//!
//! 1. **Decide**: reserve the key, or read the row that holds it, and decide (execute, replay,
//!    409, 422).
//! 2. **Take over** a key whose request died, or **recycle** one that expired.
//! 3. **Execute** the work under a lease, renewed while it runs. Work that calls another system
//!    records a **recovery point** on the key first, with a downstream key (`recovery.rs`).
//! 4. **Complete** (the effect and the key commit together) or **release** (a failure of ours;
//!    a key with a recovery point is suspended instead, for the next attempt to resume).
//! 5. **Expire**: a background job deletes old keys.
//! 6. **Recover**: a background job resumes suspended keys no client came back for, within the
//!    recovery window, and holds for an operator those past it (`recovery.rs`).
//! 7. **Settle**: an operator completes a held key from the other system's ledger, read under the
//!    key's downstream key, and the key answers as its first request would have (`settle.rs`).
//!
//! The SQL of each step is in `store.rs` (of the recovery side, in `store/recovery.rs`). The
//! PostgreSQL unique constraint on `(account_id, scope, idem_key)` decides between concurrent
//! requests, and every clock reading is the database's `now()`.

mod answer;
pub mod body;
pub mod connections;
pub mod decimal;
pub mod engine;
mod error;
mod fields;
mod fingerprint;
mod form;
mod formats;
pub mod gauges;
mod inspect;
mod instrumentation;
mod jobs;
mod key;
mod layer;
mod lease;
pub mod metrics;
mod migrations;
mod point;
mod policy;
mod recovery;
mod replays;
mod request;
mod response;
mod settle;
mod store;

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use axum::response::{IntoResponse, Response};
use chrono::{DateTime, SubsecRound, Utc};
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::time::MissedTickBehavior;
use tracing::Instrument;
use uuid::Uuid;

use answer::{Answer, IN_FLIGHT_RETRY_HINT};
use connections::Lot;
use engine::KnownEngine;
use fields::mismatched_fields;
use formats::{Reported, UnknownFormat};
use instrumentation::Instrumentation;
use lease::{Completed, HeldLease};
pub use lease::{Completion, Fence, Lease, Resumers};
use metrics::KeyOutcome;
use point::{PointAt, RecoveryBounds};
use replays::Replays;
use store::{ExistingKey, KeyState, Reservation};

pub use body::BodyError;
pub use engine::Engine;
pub use error::{Error, Refusal, is_unavailable, sentence};
pub use fields::FieldDigests;
pub use fingerprint::{Comparison, Fingerprint, FingerprintVersion, Fingerprints, Target};
pub use inspect::{KeyInspection, KeyUse, KeyUseState};
pub use jobs::RecoveryJob;
pub use key::{IdempotencyKey, KeyError, MAX_KEY_LEN};
pub use layer::{IdempotencyLayer, IdempotencyService, MAX_STORED_BODY, NotStored};
pub use migrations::{MIGRATIONS_TABLE, migrate};
pub use point::{EarlierCalls, RecoveryPoint, StateVersion};
pub use policy::{CLOCK_MARGIN, LeaseTooShort, Policy};
pub use recovery::{HOLD_BATCH, KeyRecovery, LONGEST_RECOVERY_BACKOFF, RECOVERY_BATCH};
pub use request::{Idempotent, KeyedRequest, Owner, Owners, Scope, key_schema};
pub use response::{IDEMPOTENT_REPLAYED, ResponseVersion, StoredResponse};
pub use settle::{Settled, Settlement};
pub use store::BATCH as EXPIRY_BATCH;

/// The README's Rust blocks, the adoption block among them, compiled (and run, unless marked
/// otherwise) by `cargo test --doc`: what a reader copies from it builds.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The idempotency mechanism, shared by every mutating route.
#[derive(Clone)]
pub struct Idempotency {
    instrumentation: Instrumentation,
    pool: PgPool,
    /// Where the reservation and the completion run: connections taken back without sqlx's
    /// release ping (see [`Lot`]); the pool serves the rest.
    lot: Lot,
    /// The kind of database, asked once (see [`Lease::engine`]).
    engine: KnownEngine,
    policy: Policy,
    /// The work that records recovery points, by point: what the recovery job resumes, and the
    /// only points a lease may record.
    resumers: Arc<Resumers>,
    replays: Replays,
    /// The suspended keys left alone for their state's version that this instance reported.
    reported: Reported,
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("policy", &self.policy)
            .field("cached_replays", &self.replays.len())
            .finish_non_exhaustive()
    }
}

impl Idempotency {
    pub fn new(pool: PgPool, policy: Policy) -> Self {
        Self {
            instrumentation: Instrumentation::default(),
            lot: Lot::beside(&pool),
            engine: KnownEngine::default(),
            pool,
            policy,
            resumers: Arc::default(),
            replays: Replays::default(),
            reported: Reported::default(),
        }
    }

    /// Counts outcomes in the counter `name` (default [`metrics::OUTCOMES`]), by route and outcome.
    #[must_use]
    pub fn counted_as(mut self, name: &'static str) -> Self {
        self.instrumentation.outcomes = name;
        self
    }

    /// Calls `hook` at each crash point of the lifecycle (`after-reserve`, `before-commit`,
    /// `after-commit`), for fault tests that abort the process there; by default nothing.
    #[must_use]
    pub fn crash_points(mut self, hook: fn(&'static str)) -> Self {
        self.instrumentation.crash_point = hook;
        self
    }

    /// Resumes keys suspended at a recovery point with `resumers` (the recovery job, and a retry
    /// or takeover through the work itself). A point none of them names is refused when the work
    /// records it, so a unit of work registered nowhere fails at its first use, loudly, instead of
    /// leaving keys the recovery job would never resume.
    #[must_use]
    pub fn resuming(mut self, resumers: Resumers) -> Self {
        self.resumers = Arc::new(resumers);
        self
    }

    /// The recovery points of suspended keys that no resumer of this instance knows, with how
    /// many keys wait at each: a service that finds any at start lacks the code that resumes
    /// them (a unit of work removed or renamed), and should refuse to start.
    pub async fn unresumable(&self) -> Result<Vec<(String, i64)>, sqlx::Error> {
        store::unresumable(&self.pool, &self.resumers.names()).await
    }

    /// The database the keys live in, asked once per instance: the engine [`Lease::engine`] tells
    /// the work, and what other parts of the service that share this instance's pool ask.
    pub async fn engine(&self) -> Result<Engine, sqlx::Error> {
        self.engine.get(&self.pool).await
    }

    /// Runs `work` at most once for the request's scope and key and answers with its response, or
    /// replays the stored response of an earlier run, or refuses the request (409, 422).
    ///
    /// Everything from the reservation on runs in a task of its own, not in the request's future:
    /// a client that hangs up drops that future, and must neither strand a reserved key with no one
    /// to complete or release it, nor cut short an effect that happened (a charge at the processor
    /// must be recorded). If `work` fails or panics, nothing is stored and the key is released for
    /// a retry.
    ///
    /// The work fails with the service's own error type `E`; the mechanism's refusals and faults
    /// become one through `From<Error>`.
    pub async fn run<W, F, E>(&self, mut request: KeyedRequest, work: W) -> Result<Response, E>
    where
        W: FnOnce(Lease) -> F + Send + 'static,
        F: Future<Output = Result<Completion, E>> + Send + 'static,
        E: From<Error> + fmt::Display + Send + 'static,
    {
        let span = tracing::Span::current();
        span.record("scope", request.scope.as_str());
        // A key this instance saw completed is answered here: no database, no task to strand.
        let cached = self.replays.decide(&mut request).map_err(Error::from)?;
        if let Some(answer) = cached {
            let route = request.scope.route();
            return answer.respond(self.instrumentation, route).map_err(E::from);
        }
        request.prepare()?;
        let mechanism = self.clone();
        // The task carries the request's span, so its logs and the key's outcome stay with it.
        tokio::spawn(mechanism.decide_and_answer(request, work).instrument(span))
            .await
            .map_err(|error| E::from(Error::Internal(error.into())))?
    }

    async fn decide_and_answer<W, F, E>(self, request: KeyedRequest, work: W) -> Result<Response, E>
    where
        W: FnOnce(Lease) -> F,
        F: Future<Output = Result<Completion, E>> + Send + 'static,
        E: From<Error> + fmt::Display + Send + 'static,
    {
        match self.decide(&request).await? {
            Decision::Execute(lease) => {
                self.instrumentation.crash_point("after-reserve");
                let held = HeldLease::of(&lease, &request);
                self.execute(&request, held, work(lease)).await.0
            }
            Decision::Answer(answer) => answer
                .respond(self.instrumentation, request.scope.route())
                .map_err(E::from),
        }
    }
}

// ===========================================================================================
// 1. Decide: "the winning insert executes the work, the other fails and reads the result".
// ===========================================================================================

/// What to do with a request, decided from the state of its key.
#[derive(Debug)]
enum Decision {
    /// This request holds the key: execute the work.
    Execute(Lease),
    /// Another request executes or executed it: answer without executing.
    Answer(Answer),
}

/// How often an undecided reservation (see [`Reservation::Undecided`]) is tried again before the
/// client is asked to come back.
const DECIDE_ATTEMPTS: usize = 5;

impl Idempotency {
    /// Reserves the key with a single `INSERT … ON CONFLICT DO NOTHING`; when the key exists, the
    /// same statement returns its row, and the decision follows from it.
    async fn decide(&self, request: &KeyedRequest) -> Result<Decision, Error> {
        for _ in 0..DECIDE_ATTEMPTS {
            let token = Uuid::new_v4();
            // Before the statement: `now() + expires_in` seen from here is then no later than the
            // database's `expires_at`.
            let asked = Instant::now();
            if let Some((name, state)) = &request.first_point {
                self.resumers.require(name, state)?;
            }
            let first_point = RecoveryPoint::first(request);
            let engine = self.engine().await?;
            let reservation = store::reserve(
                &self.lot,
                engine,
                request,
                token,
                self.policy.lease,
                self.policy.key_ttl,
                first_point.as_ref(),
            )
            .await?;
            let existing = match reservation {
                Reservation::Reserved { key_id, now } => {
                    let mut lease =
                        self.lease(KeyOutcome::Executed, key_id, token, (now, now), request);
                    lease.recovery = first_point;
                    return Ok(Decision::Execute(lease));
                }
                Reservation::Existing(existing) => existing,
                Reservation::Undecided => continue,
            };
            if let Some(decision) = self.decide_existing(request, existing, asked).await? {
                return Ok(decision);
            }
        }
        // Heavy contention on one key: ask the client to come back rather than spin.
        Ok(Decision::Answer(Answer::InFlight {
            retry_after: IN_FLIGHT_RETRY_HINT,
        }))
    }

    /// Decides for a key that already exists; `None` means it changed meanwhile, look again.
    async fn decide_existing(
        &self,
        request: &KeyedRequest,
        existing: ExistingKey,
        asked: Instant,
    ) -> Result<Option<Decision>, Error> {
        // An expired key is new again, whatever it was used for: the documented expiry policy.
        if existing.expired {
            return Ok(self
                .recycle(existing.key_id, request)
                .await?
                .map(Decision::Execute));
        }
        // A different payload is refused whatever the key's state, before anything is replayed;
        // compared under the fingerprint's version the key was made with (`formats.rs`).
        let left_alone = |unknown: UnknownFormat| {
            unknown.report(existing.key_id);
            Ok(Some(Decision::Answer(Answer::UnknownFormat)))
        };
        let fingerprint = match (
            request.fingerprints.compare(existing.fingerprint),
            existing.fingerprint,
        ) {
            (Comparison::Same, Some(fingerprint)) => fingerprint,
            (Comparison::UnknownVersion(version), _) => {
                return left_alone(UnknownFormat::fingerprint(version));
            }
            _ => {
                let fields = mismatched_fields(existing.fields.as_ref(), request.fields.as_ref());
                return Ok(Some(Decision::Answer(Answer::Mismatch(fields))));
            }
        };
        Ok(match existing.state {
            // Replay: "the original response is returned unchanged, status code included".
            KeyState::Completed(stored) => {
                if let Some(expires_in) = existing.expires_in {
                    self.replays
                        .remember(request, fingerprint, &stored, asked + expires_in);
                }
                Some(Decision::Answer(Answer::Replay(stored)))
            }
            KeyState::Unreadable(unknown) => return left_alone(unknown),
            // Conflict: "an identical request is already under way".
            KeyState::InProgress {
                lease_left: Some(left),
                ..
            } => Some(Decision::Answer(Answer::InFlight {
                retry_after: left.min(IN_FLIGHT_RETRY_HINT),
            })),
            KeyState::Held => Some(Decision::Answer(Answer::Held)),
            KeyState::InProgress {
                lease_left: None,
                point,
            } => {
                match self
                    .take_over(existing.key_id, fingerprint, request)
                    .await?
                {
                    Some(lease) => Some(Decision::Execute(lease)),
                    // Not taken over: someone else was faster (look again), or the key's work is
                    // past the recovery window, and this request holds it for an operator.
                    None if store::hold(
                        &self.pool,
                        request.scope.owner(),
                        existing.key_id,
                        self.policy.recovery_window,
                    )
                    .await? =>
                    {
                        tracing::error!(
                            key_id = existing.key_id,
                            "a suspended key passed the recovery window: held for an operator"
                        );
                        Some(Decision::Answer(Answer::Held))
                    }
                    // Or its state is one no resumer of this release reads: left alone.
                    None => match point.filter(|at| !self.resumers.reads(&at.name, at.version)) {
                        Some(at) => {
                            return left_alone(UnknownFormat::recovery_state(&at.name, at.written));
                        }
                        None => None,
                    },
                }
            }
        })
    }
}

// ===========================================================================================
// 2. Take over: a request whose process died stops renewing its lease; a retry may then execute.
//    Recycle: an expired key is new again.
// ===========================================================================================

impl Idempotency {
    /// Installs a new lock token on a key whose lease ran out. One conditional update: of several
    /// contenders, at most one wins.
    async fn take_over(
        &self,
        key_id: i64,
        fingerprint: (FingerprintVersion, Fingerprint),
        request: &KeyedRequest,
    ) -> Result<Option<Lease>, sqlx::Error> {
        let token = Uuid::new_v4();
        let taken = store::take_over(
            &self.pool,
            request.scope.owner(),
            key_id,
            fingerprint,
            &self.resumers.known_pairs(),
            token,
            self.policy.lease,
            self.policy.recovery_window,
            RecoveryPoint::first(request).as_ref(),
        )
        .await?;
        let Some(taken) = taken else {
            return Ok(None);
        };
        tracing::warn!(
            key_id,
            recovery_point = taken.recovery.as_ref().map(|point| point.name.as_str()),
            "took over an idempotency key whose lease had expired"
        );
        let times = (taken.now, taken.window_from);
        let mut lease = self.lease(KeyOutcome::TakenOver, key_id, token, times, request);
        lease.recovery = taken.recovery;
        Ok(Some(lease))
    }

    /// Reserves an expired key for a new request, unless its row changed meanwhile.
    async fn recycle(&self, key_id: i64, request: &KeyedRequest) -> Result<Option<Lease>, Error> {
        let token = Uuid::new_v4();
        let first_point = RecoveryPoint::first(request);
        let recycled = store::recycle(
            &self.pool,
            key_id,
            request,
            token,
            self.policy.lease,
            self.policy.key_ttl,
            first_point.as_ref(),
        )
        .await?;
        Ok(recycled.map(|now| {
            let mut lease = self.lease(KeyOutcome::Executed, key_id, token, (now, now), request);
            lease.recovery = first_point;
            lease
        }))
    }

    /// A lease granted at `now` (the database's time) on a key whose recovery window began at
    /// `window_from` (its `created_at`: `now` for a key reserved or recycled by this request).
    fn lease(
        &self,
        outcome: KeyOutcome,
        key_id: i64,
        token: Uuid,
        (now, window_from): (DateTime<Utc>, DateTime<Utc>),
        request: &KeyedRequest,
    ) -> Lease {
        let window = self.policy.recovery_window.saturating_sub(CLOCK_MARGIN);
        Lease {
            instrumentation: self.instrumentation,
            resumers: Arc::clone(&self.resumers),
            pool: self.pool.clone(),
            lot: self.lot.clone(),
            engine: self.engine.clone(),
            outcome,
            granted: Instant::now(),
            granted_at: now,
            call_deadline: chrono::Duration::from_std(window)
                .ok()
                .and_then(|window| window_from.checked_add_signed(window))
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
            owner: request.scope.owner().into(),
            key_id,
            token,
            key: request.key.clone(),
            key_ttl: self.policy.key_ttl,
            recovery: None,
        }
    }
}

// ===========================================================================================
// 3. Execute: the work runs under the lease, renewed while it runs.
// ===========================================================================================

impl Idempotency {
    /// Runs the work while renewing the lease, then answers from its completion or releases the
    /// key; counts what became of the request (once, by how it ended) and says it.
    async fn execute<F, E>(
        &self,
        request: &KeyedRequest,
        held: HeldLease,
        work: F,
    ) -> (Result<Response, E>, KeyOutcome)
    where
        F: Future<Output = Result<Completion, E>> + Send + 'static,
        E: From<Error> + fmt::Display + Send + 'static,
    {
        // A panic in the work is caught here, so the key is released. The work runs in this task
        // (already one of its own, see `run`): a task more would cost a wake-up per request. The
        // heartbeat is a future beside it, not a step after it: `select!` polls both whenever
        // either can move, so a renewal waiting for a connection or for the key row's lock never
        // holds the work up. When the work ends, the heartbeat is dropped with any renewal in
        // flight (fenced by the token and `in_progress`, a late one changes nothing).
        let work = AssertUnwindSafe(work).catch_unwind();
        let joined = tokio::select! {
            joined = work => joined,
            never = self.heartbeat(&held) => match never {},
        };
        let (answer, outcome) = match joined {
            Ok(Ok(Completion(Completed::Stored(response)))) => {
                if let Some(fingerprint) = held.fingerprint {
                    let until = held.reserved + self.policy.key_ttl;
                    self.replays
                        .remember(request, fingerprint, &response, until);
                }
                (Ok(response.into_response()), held.outcome)
            }
            Ok(Ok(Completion(Completed::LeaseLost))) => (
                self.answer_after_lost_lease(request).await.map_err(E::from),
                KeyOutcome::LeaseLost,
            ),
            // A failure of a request that no longer held the key is no answer of its own: another
            // request took the key over, and may already have written the same effect (a holder's
            // insert then fails on it). Answer from the key, as after a lost lease.
            Ok(Err(error)) => match self.release(&held).await {
                store::Released::NotHeld => {
                    tracing::warn!(%error, "the work failed after losing its lease");
                    let answer = self.answer_after_lost_lease(request).await;
                    (answer.map_err(E::from), KeyOutcome::LeaseLost)
                }
                released => (Err(error), released.outcome()),
            },
            Err(panic) => {
                let released = self.release(&held).await;
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|message| (*message).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                let fault = Error::Internal(anyhow::anyhow!("the work panicked: {message}"));
                (Err(fault.into()), released.outcome())
            }
        };
        let route = match held.outcome {
            KeyOutcome::Recovered => metrics::RECOVERY_ROUTE,
            _ => request.scope.route(),
        };
        self.instrumentation.record(outcome, route);
        (answer, outcome)
    }

    /// Keeps a slow but alive request from being taken over: renews the lease every third of its
    /// length, for as long as the work runs. Each renewal is given until the next tick and then
    /// abandoned, so renewals never pile up; a renewal that lands by then sets the lease a whole
    /// lease past its own `now()`, so after any successful renewal two more start (and end) before
    /// the lease runs out, and one stuck renewal does not lose the key. Start-up checks that the
    /// pool can serve a renewal within its third (the adopting service checks that at start).
    async fn heartbeat(&self, held: &HeldLease) -> Infallible {
        let period = self.policy.lease / 3;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if tokio::time::timeout(period, self.renew(held))
                .await
                .is_err()
            {
                tracing::warn!(
                    key_id = held.key_id,
                    "a lease renewal took a third of the lease and was abandoned"
                );
            }
        }
    }

    /// Renews the lease once. A request that lost its lease finds out when it tries to complete.
    async fn renew(&self, held: &HeldLease) {
        match store::renew(
            &self.pool,
            &held.owner,
            held.key_id,
            held.token,
            self.policy.lease,
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                key_id = held.key_id,
                "lease lost while the work was running"
            ),
            Err(error) => tracing::warn!(%error, "could not renew the lease"),
        }
    }

    /// The work ran but another request had taken the key over, so this run's effect was rolled
    /// back: answer with the winner's response, or 409 while it is still working.
    async fn answer_after_lost_lease(&self, request: &KeyedRequest) -> Result<Response, Error> {
        match store::completed_response(&self.pool, request).await? {
            Some(stored) => Ok(stored.replay()),
            None => Err(Refusal::InFlight {
                retry_after: IN_FLIGHT_RETRY_HINT,
            }
            .into()),
        }
    }
}

// ===========================================================================================
// 4a. Complete: "the business write and the key's status update share one transaction".
// ===========================================================================================

impl Lease {
    /// The key this lease is for, for records that keep it.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// The database's time now, as the lease's grant read it and this instance's monotonic clock
    /// carried it forward (to the microsecond, as PostgreSQL keeps it): a timestamp for the
    /// effect's records that no instance's wall clock can skew, known before the effect is written.
    pub fn now(&self) -> DateTime<Utc> {
        let elapsed = chrono::Duration::from_std(self.granted.elapsed()).unwrap_or_default();
        (self.granted_at + elapsed).trunc_subsecs(6)
    }

    /// The instant after which no call made under this key may act: the end of the key's
    /// recovery window, less [`CLOCK_MARGIN`]. Past the window the key may be held, and an operator
    /// settles it from what the other system made under its downstream key; a holder that stalled
    /// (a paused process, a starved task) and wakes after that must not make anything more. A
    /// check of the lease before each call cannot promise it (the stall may fall between the check
    /// and the send), so the call carries this deadline and the other system refuses it, storing
    /// nothing, once its own clock is past it, in the transaction that would act.
    pub fn call_deadline(&self) -> DateTime<Utc> {
        self.call_deadline
    }

    fn fence(&self, response: &StoredResponse) -> Fence {
        Fence {
            owner: self.owner.clone(),
            key_id: self.key_id,
            token: self.token,
            response_code: i16::try_from(response.status().as_u16()).unwrap_or(i16::MAX),
            response_headers: response.headers_json(),
            response_body: response.body_bytes(),
            ttl_ms: store::millis(self.key_ttl),
        }
    }

    /// The database the key lives in. On [`Engine::Citus`] the work must write its effect in the
    /// transaction of [`Lease::begin`] and [`Lease::complete`], not with [`Lease::complete_with`]:
    /// Citus may run a function called inside a distributed statement on another node than the
    /// rows that statement writes, so there the key is completed by a statement of its own, in the
    /// same transaction, which stays on the account's node. Asked once per instance.
    pub async fn engine(&self) -> Result<Engine, sqlx::Error> {
        self.engine.get(&self.pool).await
    }

    /// Writes the effect and completes the key in one statement: one round trip, atomic as every
    /// statement is. `effect` runs that statement on the connection it is given; it must call
    /// `idempotency_complete(…)` with the [`Fence`]'s values, for example
    /// `WITH payment AS (INSERT … RETURNING id) SELECT idempotency_complete($9, …) FROM payment`.
    ///
    /// If another request took the key over, the call fails, the statement rolls back (the effect
    /// with it) and the completion says so.
    pub async fn complete_with<E>(
        self,
        response: StoredResponse,
        effect: E,
    ) -> Result<Completion, sqlx::Error>
    where
        E: for<'c> FnOnce(&'c mut PgConnection, Fence) -> BoxFuture<'c, Result<(), sqlx::Error>>,
    {
        let fence = self.fence(&response);
        // The statement is the commit: before it, nothing of this request is in the database.
        self.instrumentation.crash_point("before-commit");
        let mut connection = self.lot.lend().await?;
        let written = effect(&mut connection, fence).await;
        match connection.give_back(written) {
            Ok(()) => {}
            Err(error) if store::is_lease_lost(&error) => return Ok(self.lost()),
            Err(error) => return Err(error),
        }
        self.instrumentation.crash_point("after-commit");
        Ok(Completion(Completed::Stored(response)))
    }

    /// Opens a transaction for an effect of several statements (checks, locks, writes), to be
    /// handed to [`Lease::complete`]. Slow work (calling a processor) belongs before this call: it
    /// must not hold a pool connection or a transaction open.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        connections::begin(&self.pool).await
    }

    /// Stores the response with the key and commits the transaction, effect included.
    ///
    /// The completion is fenced by this lease's token: if another request took the key over, it
    /// fails, the transaction rolls back (the effect with it) and the completion says so.
    pub async fn complete(
        self,
        mut tx: Transaction<'static, Postgres>,
        response: StoredResponse,
    ) -> Result<Completion, sqlx::Error> {
        if !store::complete(&mut tx, &self.fence(&response)).await? {
            tx.rollback().await?;
            return Ok(self.lost());
        }
        self.instrumentation.crash_point("before-commit");
        tx.commit().await?;
        self.instrumentation.crash_point("after-commit");
        Ok(Completion(Completed::Stored(response)))
    }

    /// Ends work that found its lease lost (at a recovery point): nothing of it is committed, and
    /// the request answers from the winner's result.
    pub fn lost(&self) -> Completion {
        tracing::warn!(
            key_id = self.key_id,
            "lease lost before completion; the effect was rolled back"
        );
        Completion(Completed::LeaseLost)
    }
}

// ===========================================================================================
// 4b. Release: a failure of ours is not a result. Nothing is stored; the retry runs afresh, or
//     resumes from the recovery point when the work got that far.
// ===========================================================================================

impl Idempotency {
    /// Deletes the reservation, fenced by this request's token. If even that fails (the database
    /// is gone), the lease runs out and a retry takes the key over: the system heals by itself.
    ///
    /// A key whose work recorded a recovery point is not deleted but suspended: its call to another
    /// system may have taken effect, so the next attempt must resume, not start over.
    /// Says what became of the key (`Unknown` when the database could not be asked).
    async fn release(&self, held: &HeldLease) -> store::Released {
        match store::release(&self.pool, &held.owner, held.key_id, held.token).await {
            Ok(released) => {
                if released == store::Released::Suspended {
                    tracing::warn!(
                        key_id = held.key_id,
                        "work failed after its recovery point; the key waits for a retry or \
                         the recovery job"
                    );
                }
                released
            }
            Err(error) => {
                tracing::error!(%error, key_id = held.key_id, "could not release the key; its lease will expire");
                store::Released::Unknown
            }
        }
    }
}

// ===========================================================================================
// 5. Expire: "the expiry keeps the table from growing without end".
// ===========================================================================================

impl Idempotency {
    /// Deletes up to [`EXPIRY_BATCH`] expired keys and returns how many it deleted. `SKIP LOCKED`
    /// keeps locks short and lets several instances run this at once without waiting on each
    /// other; the index on `expires_at` keeps each batch an index scan. A key whose request still
    /// holds a live lease is left alone.
    ///
    /// On Citus, which locks rows (`FOR UPDATE`) only in a statement on one shard, the batch is
    /// chosen without locks and its rows deleted with the conditions checked again: instances
    /// running it at once may wait on each other's rows instead of skipping them.
    pub async fn expire_batch(pool: &PgPool, engine: Engine) -> Result<u64, sqlx::Error> {
        match engine {
            Engine::Postgres => store::expire_batch(pool).await,
            Engine::Citus => store::expire_batch_unlocked(pool).await,
        }
    }
}
