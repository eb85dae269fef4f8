//! What each step may do, judged from the state: whether a client may send, what a request finds
//! when it reserves, what `until_known` makes of the attempts, whether a call may still act, and
//! where the world comes to rest once faults stop (the liveness check). `protocol` takes the steps
//! these rules allow.

use stateright::Model;

use crate::config::Defect;
use crate::state::{
    Age, Answer, Attempt, ClientPhase, DisputeSeen, DownstreamKey, Grant, Instance, Intent, KeyRow,
    KeySlot, Lease, State, Status, Step, Stored, Work,
};
use crate::steps::{Action, Protocol};

/// What a request finds when it reserves its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// It holds the key now and executes.
    Execute(Grant),
    /// It answers at once (a replay, 409, 422).
    Answer(Answer),
    /// A capture or cancel of a payment no longer `requires_capture`: the key is reserved and
    /// completed with that refusal.
    Refuse,
    /// The key's work is past the recovery window: the request holds it for an operator (409).
    HoldNow,
}

/// What `until_known` makes of the attempts so far (src/downstream/client.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Unknown, with attempts left: ask again with the same downstream key.
    AskAgain,
    /// The processor's answer is the key's result: the charge (made, captured or voided), or its
    /// refusal of a capture or void (`Stored::Refused`), stored alike.
    Done(Stored),
    /// Certainly not done: nothing with the downstream key can have reached the processor.
    NotDone,
    /// Unknown, and this request's attempts are over.
    Unknown,
}

impl Protocol {
    pub(crate) fn has(&self, defect: Defect) -> bool {
        self.config.has(defect)
    }

    /// Whether the intent's client may send its request now: not once its key expired, and an
    /// intent that reuses a key only after the intent before it on that key has its answer.
    pub(crate) fn may_send(&self, state: &State, intent: Intent) -> bool {
        let intents = &self.config.size.intents;
        let key = intents[usize::from(intent)].key;
        let payment_known = match intents[usize::from(intent)].kind.releases() {
            None => true,
            Some(of) => matches!(
                state.clients[usize::from(of)].phase,
                ClientPhase::Answered(Stored::Charged(_))
            ),
        };
        state.clients[usize::from(intent)].phase != ClientPhase::Gone
            && payment_known
            && intents[..usize::from(intent)]
                .iter()
                .zip(&state.clients)
                .filter(|(spec, _)| spec.key == key)
                .all(|(_, client)| client.phase != ClientPhase::Retrying)
    }

    /// Whether idempay recorded a capture or a cancel on the payment of intent `of`: it no
    /// longer `requires_capture`.
    pub(crate) fn released(&self, state: &State, of: Intent) -> bool {
        state
            .releases
            .iter()
            .any(|&intent| self.config.size.kind(intent).releases() == Some(of))
    }

    /// The decision of `Idempotency::decide` and `decide_existing`: the fingerprint first, then
    /// the key's state.
    pub(crate) fn decide(&self, state: &State, intent: Intent) -> Decision {
        let key = self.config.size.intents[usize::from(intent)].key;
        let Some(row) = state.row(key) else {
            // A capture or cancel checks its payment first (`held` in src/payments/capturing.rs).
            return match self.config.size.kind(intent).releases() {
                Some(of) if self.released(state, of) => Decision::Refuse,
                _ => Decision::Execute(Grant::Reserved),
            };
        };
        if row.intent != intent && !self.has(Defect::FingerprintIgnoresPayload) {
            return Decision::Answer(Answer::Mismatch);
        }
        match row.status {
            Status::Completed(stored) => Decision::Answer(self.replay(state, stored)),
            Status::Held | Status::InProgress(Lease::By(_)) => Decision::Answer(Answer::TryLater),
            Status::InProgress(Lease::Ended) if self.resumable(row) => {
                Decision::Execute(Grant::TakenOver)
            }
            Status::InProgress(Lease::Ended) => Decision::HoldNow,
        }
    }

    /// A completed key's answer: its stored response, byte for byte (`StoredResponse::replay`).
    /// Rendered again from the payment as it is now, it shows what was recorded on it since.
    pub(crate) fn replay(&self, state: &State, stored: Stored) -> Answer {
        match (stored, state.processor.dispute) {
            (Stored::Charged(charge), Some(dispute))
                if self.has(Defect::ReplayRerendered)
                    && dispute.charge == charge
                    && state.dispute == DisputeSeen::Recorded =>
            {
                Answer::Rerendered(charge)
            }
            _ => Answer::Result(stored),
        }
    }

    /// Whether a suspended key may be resumed: within the recovery window (`store::take_over`
    /// and `claim_recoverable` compare its age), unless suspension has no bound.
    pub(crate) fn resumable(&self, row: &KeyRow) -> bool {
        row.age == Age::Fresh || self.has(Defect::UnboundedSuspension)
    }

    /// What a takeover believes of the calls before it (`EarlierCalls::of`).
    pub(crate) fn earlier_calls_possible(&self) -> bool {
        !self.has(Defect::TakeoverBelievesNoEarlierCall)
    }

    /// `until_known`'s judgement of the last attempt.
    pub(crate) fn verdict(&self, work: &Work) -> Option<Verdict> {
        let Step::Answered(attempt) = work.step else {
            return None;
        };
        Some(match attempt {
            Attempt::Charged(charge) => Verdict::Done(Stored::Charged(charge)),
            // Under the processor's own key for this downstream key: the first answer to it.
            Attempt::NotHeld => Verdict::Done(Stored::Refused),
            Attempt::Unknown if work.attempts < self.config.size.attempts => Verdict::AskAgain,
            Attempt::Unknown => Verdict::Unknown,
            // A refusal speaks of its own attempt only: after one that may have gone through,
            // the outcome stays unknown and the downstream key is kept.
            Attempt::Refused if work.maybe_sent => Verdict::Unknown,
            Attempt::Refused => Verdict::NotDone,
        })
    }

    /// Whether the instance may (again) call the processor.
    pub(crate) fn may_call(&self, work: &Work) -> bool {
        work.step == Step::Ready || self.verdict(work) == Some(Verdict::AskAgain)
    }

    /// Whether the instance's next step is to send its call: at once, or after the check of its
    /// lease when that is a step of its own.
    pub(crate) fn sends_next(&self, work: &Work) -> bool {
        if self.has(Defect::LeaseCheckedBeforeSend) {
            work.step == Step::Checked
        } else {
            self.may_call(work)
        }
    }

    /// Whether a holder is stalled before its first send: it took the key and has not sent yet.
    /// Hours may pass over such a holder, unlike over a call on the network. (A holder stalled
    /// before a later attempt adds nothing: its earlier call may have charged, which only makes
    /// the operator's settle find a charge.)
    pub(crate) fn stalled_before_send(&self, work: &Work) -> bool {
        self.config.size.stalls && matches!(work.step, Step::Ready | Step::Checked)
    }

    /// Whether the processor refuses a call with `downstream_key` because its deadline passed:
    /// the call carries its recovery point's time plus the recovery window, and the processor
    /// checks it in the transaction that would act. A key is held only past its window, and the
    /// processor forgets a key only later still, so once a key is held no call under its
    /// downstream key acts: what an operator's settle reads stays true. Without a window (the
    /// unbounded suspension) there is no deadline either.
    pub(crate) fn past_deadline(&self, state: &State, downstream_key: DownstreamKey) -> bool {
        let no_deadline = self.has(Defect::UnboundedSuspension)
            || self.has(Defect::NoCallDeadline)
            || self.has(Defect::LeaseCheckedBeforeSend);
        // A downstream key whose row is gone was released before any call with it could have
        // been made, or expired with no holder and no call left: nothing calls with it again.
        !no_deadline
            && state
                .keys
                .iter()
                .flatten()
                .any(|row| row.downstream_key == downstream_key && row.age == Age::PastWindow)
    }

    /// Whether the processor may have forgotten `downstream_key`: it keeps its keys far longer
    /// than any call takes, and longer than the recovery window, by when the recovery job held
    /// every key still suspended. Without that bound, a suspended key may outlive the processor's
    /// memory of it.
    pub(crate) fn forgettable(&self, state: &State, downstream_key: DownstreamKey) -> bool {
        state.processor.keys.contains_key(&downstream_key)
            && !state.in_flight(downstream_key)
            && state.keys.iter().enumerate().all(|(slot, row)| match row {
                Some(row) if row.downstream_key == downstream_key => {
                    row.age == Age::PastWindow
                        && match row.status {
                            Status::InProgress(_) => {
                                self.has(Defect::UnboundedSuspension)
                                    && row.suspended()
                                    && !state.worked_on(slot as KeySlot)
                            }
                            Status::Completed(_) | Status::Held => true,
                        }
                }
                _ => true,
            })
    }

    /// Whether the world has come to rest once the faults stopped: no step is left but faults
    /// (crashes, refusals, lost answers, a live holder's lease running out), a client's request
    /// (the clients may all have gone), and hours passing. What the liveness properties check is
    /// that every such state is a finished one: since every step that goes on is a step of the
    /// model, each state's way to rest is itself checked, and a rest that is not finished is a
    /// counterexample. Hours are left out so that a key the recovery job could resume within its
    /// window may not wait for an operator instead.
    pub fn at_rest(&self, state: &State) -> bool {
        // Most states go on for plain reasons, found without listing their steps: a working
        // instance always has one (send, wait for its answer or time out, resolve; the processor
        // restarts first if down), and the processor answers a call on the network.
        let working = state
            .instances
            .iter()
            .any(|instance| matches!(instance, Instance::Working(_)));
        if working || !state.processor.up || !state.network.is_empty() {
            return false;
        }
        let mut actions = Vec::new();
        self.actions(state, &mut actions);
        !actions.into_iter().any(|action| {
            self.goes_on_without_faults(state, action) && self.next_state(state, action).is_some()
        })
    }

    /// Whether `action` is a step the world still takes once faults stop: the processor answers
    /// every call, a holder works on, a dead holder's lease runs out, the jobs and an operator do
    /// their part.
    pub(crate) fn goes_on_without_faults(&self, state: &State, action: Action) -> bool {
        match action {
            Action::CheckLease { .. }
            | Action::Call { .. }
            | Action::Resolve { .. }
            | Action::RestartProcessor
            | Action::DeliverEvent
            | Action::ApplyParked
            | Action::RecoveryClaims { .. }
            | Action::HoldOverdue { .. }
            | Action::OperatorSettles { .. } => true,
            Action::Deliver { answer_lost, .. } => !answer_lost,
            // Only a call the processor's crash dropped is never answered.
            Action::TimeOut { instance } => !state
                .network
                .iter()
                .any(|call| call.reply_to == Some(instance)),
            // A lease whose holder no longer works on the key (it died, or moved on).
            Action::LeaseRunsOut { key } => match state.row(key).map(|row| row.status) {
                Some(Status::InProgress(Lease::By(holder))) => {
                    state.work(holder).is_none_or(|work| work.key != key)
                }
                _ => false,
            },
            Action::Request { .. }
            | Action::CallRefused { .. }
            | Action::CrashInstance { .. }
            | Action::CrashProcessor
            | Action::ProcessorForgets { .. }
            | Action::OpenDispute { .. }
            | Action::WindowPasses { .. }
            | Action::Expire { .. } => false,
        }
    }
}
