//! One unit of work for a call to the processor, whatever the call (a charge, a refund, a capture,
//! a void): record the recovery point, call with the key's downstream key, resolve the three
//! outcomes, resume. A call says only what is its own ([`ProcessorCall`]); its resumer is registered from the same type
//! ([`CallResumers::unit`]), and a point no resumer knows is refused when recorded, and at start.
//!
//! What a call records is a format of its own, versioned ([`ProcessorCall::VERSIONS`]): it outlives
//! the release that wrote it, so a later release reads it ([`read_state`]), and a state in a version
//! a release does not read is left alone by the mechanism (see the `idempotency` crate's
//! `formats.rs`).
//!
//! A new processor-calling endpoint touches: its domain's files (the handler, and a type that
//! implements [`ProcessorCall`], its recovery state a versioned type of its own with a golden
//! fixture in tests/fixtures/, its client call in downstream/client.rs); a migration for what it
//! records; the spec (openapi/openapi.json, `make openapi`); its tests in tests/api; and one line in
//! app.rs's `resumers`, `.unit::<…>(processor)`. The capture and the cancel of a manual payment
//! (payments/capturing.rs) are two such calls in one file.

use std::future::Future;

use super::client::{self, Listed, ProcessorClient, ProcessorOutcome, ProcessorRefusal};
use crate::http::error::{ApiError, Problem, ProblemKind};
use idempotency::{
    Completion, EarlierCalls, KeyedRequest, Lease, RecoveryPoint, Resumers, StateVersion,
};

/// A call to the processor, as its recovery point records it: what resuming it needs, and what is
/// the call's own (what it sends, how its answer is recorded). The rest is the same for every call
/// and lives here once.
pub trait ProcessorCall: Send + Sync + 'static {
    /// The recovery point recorded on the key before the call, by which it is resumed.
    const POINT: &'static str;
    /// What the call makes, as logs and problems name it (`charge`, `refund`).
    const WHAT: &'static str;
    /// The versions of its recovery state this build reads, oldest first; the last is the one it
    /// writes ([`ProcessorCall::state`]). A change of the state's format is a new version added
    /// here, with its golden fixture in the tests; an old one stays while keys may wait in it.
    const VERSIONS: &'static [StateVersion];
    /// What the processor answers when it made the call.
    type Answer: Send;

    /// The recovery state recorded with the point, in the newest version of
    /// [`ProcessorCall::VERSIONS`], its `version` member included.
    fn state(&self) -> Result<serde_json::Value, serde_json::Error>;

    /// The call from a state recorded in `version`, one of [`ProcessorCall::VERSIONS`]. Callers
    /// go through [`read_state`].
    fn from_state(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self>
    where
        Self: Sized;

    /// One attempt at the call, with `downstream_key` as its `Idempotency-Key`.
    fn send(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = ProcessorOutcome<Self::Answer>> + Send;

    /// Records the processor's answer and completes the key. Called through [`record`], which
    /// applies what waited for the answer's object afterwards.
    fn record(
        self,
        lease: Lease,
        answer: Self::Answer,
    ) -> impl Future<Output = Result<Completion, ApiError>> + Send;

    /// What the processor made under `downstream_key`, read back, never asked for again: how an
    /// operator settles a key held at this point ([`settle_held`]). `None` when it made nothing;
    /// an error when it cannot tell (unreachable, still making it) or made something other than
    /// this call asked (the operator then looks by hand).
    fn made_under(
        &self,
        processor: &ProcessorClient,
        downstream_key: &str,
    ) -> impl Future<Output = anyhow::Result<Option<Self::Answer>>> + Send;

    /// The processor's id of what it made (a charge `ch_…`, a refund `pyr_…`): the object its
    /// events name.
    fn object(answer: &Self::Answer) -> &str;

    /// A refusal by the processor that is the call's result, stored and replayed like one, rather
    /// than an outage the key is released after: none, unless the call says otherwise.
    fn refusal_as_result(&self, _refusal: &ProcessorRefusal) -> Option<Problem> {
        None
    }
}

/// `request`, starting at the call: its reservation records the recovery point, so a new key costs
/// no round trip more for it. The call, and the point's state, are made only then: never for a
/// replay. The work then [`resume`]s from it.
pub fn starting_at<C: ProcessorCall>(
    request: KeyedRequest,
    call: impl FnOnce() -> C + Send + Sync + 'static,
) -> KeyedRequest {
    request.starting_at(C::POINT, move || call().state())
}

/// The call a recovery point records, read from its state in whichever version of
/// [`ProcessorCall::VERSIONS`] it was written: the one way a state is decoded, for the resume and
/// for anything else that reads a key's call. An error for another call's point, for a version this
/// build does not read (the mechanism leaves such keys alone, so a resume never meets one), and
/// for a state that is not what its version says.
pub fn read_state<C: ProcessorCall>(point: &RecoveryPoint) -> anyhow::Result<C> {
    if point.name != C::POINT {
        anyhow::bail!(
            "a {}'s key at the recovery point `{}`, not `{}`",
            C::WHAT,
            point.name,
            C::POINT
        );
    }
    match point.version() {
        Some(version) if C::VERSIONS.contains(&version) => C::from_state(version, &point.state)
            .map_err(|error| {
                anyhow::anyhow!(
                    "unreadable {} state of version {version}: {error:#}",
                    C::POINT
                )
            }),
        _ => Err(anyhow::anyhow!(
            "the {} state is of version {}, which this build does not read (it reads {:?})",
            C::POINT,
            point
                .state
                .get("version")
                .map_or_else(|| "1".to_owned(), ToString::to_string),
            C::VERSIONS
                .iter()
                .map(|version| version.get())
                .collect::<Vec<_>>()
        )),
    }
}

/// Makes the call from the recovery point the key is at: recorded by this request's reservation
/// (see [`starting_at`]), or by an earlier holder of the key, whose call is then resumed with the
/// same downstream key (a retry, a takeover, the recovery job).
pub async fn resume<C: ProcessorCall>(
    processor: ProcessorClient,
    lease: Lease,
) -> Result<Completion, ApiError> {
    let (call, point) = the_call::<C>(&lease)?;
    let (downstream_key, earlier) = (point.downstream_key.clone(), point.earlier_calls);
    resolve(processor, lease, call, downstream_key, earlier).await
}

/// The call the key's recovery point records, and the point: what a resume and an operator's settle
/// ([`settle_held`]) start from.
fn the_call<C: ProcessorCall>(lease: &Lease) -> Result<(C, &RecoveryPoint), ApiError> {
    let point = lease.recovery_point().ok_or_else(|| {
        anyhow::anyhow!(
            "a {}'s key without its recovery point `{}`",
            C::WHAT,
            C::POINT
        )
    })?;
    Ok((read_state::<C>(point)?, point))
}

/// Makes the call from a fresh intent: records its recovery point, then calls.
pub async fn start<C: ProcessorCall>(
    processor: ProcessorClient,
    mut lease: Lease,
    call: C,
) -> Result<Completion, ApiError> {
    let state = call.state().map_err(anyhow::Error::from)?;
    let (downstream_key, earlier) = match lease.record_recovery_point(C::POINT, state).await? {
        Some(point) => (point.downstream_key.clone(), point.earlier_calls),
        None => return Ok(lease.lost()),
    };
    resolve(processor, lease, call, downstream_key, earlier).await
}

/// Settles a key held at `C`'s point: asks the processor what it made under the key's downstream
/// key, and records it as the first request would have (the payment or refund under the id the
/// recovery state chose, its events, the key's completion, in one fenced transaction), or, when it
/// made nothing, completes the key with a final problem saying so. The client's retry then gets
/// that answer, replayed. Run by `idempay keys settle` through the mechanism, which takes the key
/// and hands it back, held, if this fails.
pub async fn settle_held<C: ProcessorCall>(
    processor: ProcessorClient,
    lease: Lease,
) -> Result<Completion, ApiError> {
    let (call, point) = the_call::<C>(&lease)?;
    let downstream_key = point.downstream_key.clone();
    let made = call
        .made_under(&processor, &downstream_key)
        .await
        .map_err(|error| {
            anyhow::anyhow!(
                "asking the processor for the {} under {downstream_key}: {error:#}",
                C::WHAT
            )
        })?;
    match made {
        Some(answer) => record(&processor, lease, call, answer).await,
        None => refuse(lease, &nothing_made_problem(C::WHAT)).await,
    }
}

/// What the processor lists as made under one downstream key: one object, or none. Two would
/// mean the processor forgot the key and made the call again: not settled by a program.
pub fn the_one_made<T: Listed>(mut made: Vec<T>) -> anyhow::Result<Option<T>> {
    match made.len() {
        0 | 1 => Ok(made.pop()),
        _ => anyhow::bail!(
            "the processor made {} objects under this one key ({}): settle it by hand",
            made.len(),
            made.iter().map(Listed::id).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Stores a refusal as the key's result, replayed like any other.
pub async fn refuse(lease: Lease, refusal: &Problem) -> Result<Completion, ApiError> {
    let tx = lease.begin().await?;
    Ok(lease.complete(tx, refusal.stored()).await?)
}

/// Calls until the outcome is known or this request's attempts run out, and resolves the key by
/// it: done is recorded; definitely not done releases the key (or is stored, when the call says the refusal is
/// its result); unknown keeps the key, and its downstream key, for the next attempt.
async fn resolve<C: ProcessorCall>(
    processor: ProcessorClient,
    mut lease: Lease,
    call: C,
    downstream_key: String,
    earlier: EarlierCalls,
) -> Result<Completion, ApiError> {
    let is_result = |refusal: &ProcessorRefusal| call.refusal_as_result(refusal).is_some();
    // Every attempt carries the key's deadline: a holder that stalls past it, and sends then,
    // is refused by the processor, which stores nothing (`Lease::call_deadline`).
    let sending = processor.until(lease.call_deadline());
    let outcome = client::until_known(C::WHAT, earlier, is_result, || {
        call.send(&sending, &downstream_key)
    });
    match outcome.await {
        ProcessorOutcome::Done(answer) => record(&processor, lease, call, answer).await,
        ProcessorOutcome::NotDone(refusal) => {
            if let Some(result) = call.refusal_as_result(&refusal) {
                return refuse(lease, &result).await;
            }
            // Nothing was made, and no call with the downstream key can have been made
            // (`until_known` says unknown otherwise): the retry may start afresh, as after any
            // failure of ours.
            if !lease.clear_recovery_point().await? {
                return Ok(lease.lost());
            }
            Err(refused_problem(C::WHAT, &refusal).into())
        }
        ProcessorOutcome::Unknown(reason) => {
            tracing::warn!(%reason, downstream_key, "the {}'s outcome is unknown", C::WHAT);
            Err(unknown_problem(C::WHAT).into())
        }
    }
}

/// Records the processor's answer with the call's own [`ProcessorCall::record`] and, once that
/// committed, applies the processor's events that arrived about its object before (kept by the
/// intake, see [`ProcessorClient::recorded`]). Every recording of an answer comes here: a fresh
/// request's, a retry's, the recovery job's and an operator's settling of a held key.
///
/// Every one of them looks, a fresh request too: the processor's outbox sends an event as soon as
/// its charge or refund commits, and it often arrives before idempay's recording of the answer
/// commits (the intake parks it then). Looking after the commit costs one indexed read, and with
/// the intake's own look after it parks, one of the two sees the other: no event waits for the
/// sweep, and reconcile does not name one meanwhile. The sweep is left for a recording that fails
/// to apply them, or whose instance dies first.
pub async fn record<C: ProcessorCall>(
    processor: &ProcessorClient,
    lease: Lease,
    call: C,
    answer: C::Answer,
) -> Result<Completion, ApiError> {
    let object = C::object(&answer).to_owned();
    let completion = call.record(lease, answer).await?;
    if completion.committed() {
        processor.recorded(&object).await;
    }
    Ok(completion)
}

/// Registers a call's resumer from the call's type: its point, the versions of its state it reads,
/// its [`resume`] and its [`settle_held`], nothing to write by hand, so the registration cannot
/// name one point and resume another.
pub trait CallResumers {
    /// Resumes keys suspended at `C`'s recovery point, in a version of [`ProcessorCall::VERSIONS`],
    /// with [`resume`], and settles keys held there with [`settle_held`].
    #[must_use]
    fn unit<C: ProcessorCall>(self, processor: &ProcessorClient) -> Self;
}

impl CallResumers for Resumers {
    fn unit<C: ProcessorCall>(self, processor: &ProcessorClient) -> Self {
        let resuming = processor.clone();
        let settling = processor.clone();
        self.on(C::POINT, C::VERSIONS, move |lease| {
            resume::<C>(resuming.clone(), lease)
        })
        .settled_by(C::POINT, move |lease| {
            settle_held::<C>(settling.clone(), lease)
        })
    }
}

/// idempay's answer when the processor refused the `what` before acting on it: nothing happened,
/// and the key was released for a fresh retry.
/// The cause (the processor's address, the connection's error) is logged with the key where the
/// call is counted (`downstream::metrics`), never told the client.
fn refused_problem(what: &str, refusal: &ProcessorRefusal) -> Problem {
    let what_happened = match refusal.status {
        None => format!("The processor could not be reached, so the {what} was not sent"),
        Some(status) => format!("The processor refused the {what} before making it ({status})"),
    };
    Problem::new(
        ProblemKind::ProcessorUnavailable,
        format!(
            "{what_happened}. Nothing happened; retry with the same Idempotency-Key (a retry \
             after the Retry-After delay usually succeeds once the processor is back)."
        ),
    )
    .retry_after(client::RETRY_AFTER)
}

/// idempay's answer when the processor's answer about the `what` did not arrive: the key is kept,
/// and the retry (or the recovery job) asks again with the same downstream key.
fn unknown_problem(what: &str) -> Problem {
    Problem::new(
        ProblemKind::ProcessorOutcomeUnknown,
        format!(
            "The processor's answer about the {what} did not arrive, so whether it happened is not \
             known yet. The key is kept: retry with the same Idempotency-Key, and the {what} the \
             processor made, if any, is recorded and answered, never made twice."
        ),
    )
    .retry_after(client::RETRY_AFTER)
}

/// The answer a held key completes with when an operator's settle found that the processor made no
/// `what` under its downstream key: final, stored and replayed like any result, so the client
/// knows that nothing happened and that only a new key tries the intent again.
fn nothing_made_problem(what: &str) -> Problem {
    Problem::new(
        ProblemKind::ProcessorMadeNothing,
        format!(
            "The processor's answer about the {what} never arrived, and an operator settled the \
             request from the processor's ledger: it made no {what} under this request. Nothing \
             happened. To try again, send the request with a new Idempotency-Key."
        ),
    )
}
