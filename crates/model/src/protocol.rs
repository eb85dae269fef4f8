//! The protocol as a stateright state machine: every step any part of the world can take, and
//! what it changes. A step is atomic when the real code does it in one statement or one
//! transaction (a reservation, a takeover, a fenced completion); what the real code does in
//! several (send a call, wait, resolve its outcome) is several steps, so the checker interleaves
//! everything else between them.

use stateright::{Model, Property};

use crate::config::{Config, Defect, Kind};
use crate::properties as props;
use crate::rules::{Decision, Verdict};
use crate::state::{
    Age, Answer, Attempt, Call, Charge, ChargeId, ClientPhase, Dispute, DisputeSeen, DownstreamKey,
    Grant, Instance, InstanceId, Intent, KeyRow, KeySlot, Lease, Release, Reply, State, Status,
    Step, Stored, Work,
};

pub use crate::steps::{Action, Protocol};

impl Protocol {
    pub fn new(config: Config) -> Self {
        Self { config }
    }

    /// The instance's request is over: it answers its client (the recovery job has none).
    fn finish(state: &mut State, instance: InstanceId, work: &Work, answer: Answer) {
        state.instances[usize::from(instance)] = Instance::Idle;
        if work.grant != Grant::Recovery {
            state.answer(work.intent, answer);
        }
    }

    /// The answer of a request whose lease was taken from it: the winner's result, or 409.
    fn after_lost_lease(state: &State, key: KeySlot) -> Answer {
        match state.row(key).map(|row| row.status) {
            Some(Status::Completed(stored)) => Answer::Result(stored),
            _ => Answer::TryLater,
        }
    }

    /// Whether `instance` still holds the lease of its work's key: the fence of every write.
    fn fenced(state: &State, instance: InstanceId, work: &Work) -> bool {
        state
            .row(work.key)
            .is_some_and(|row| row.status == Status::InProgress(Lease::By(instance)))
    }

    fn resolve(&self, state: &mut State, instance: InstanceId, work: Work) -> Option<()> {
        let verdict = self.verdict(&work)?;
        let holds = Self::fenced(state, instance, &work);
        match verdict {
            Verdict::AskAgain => return None,
            // One transaction: the payment, capture, cancel or refusal and the key's completion
            // (`idempotency_complete`, fenced by the token; without the fence, a loser records
            // too).
            Verdict::Done(stored) => {
                let unfenced =
                    self.has(Defect::UnfencedCompletion) && state.row(work.key).is_some();
                if holds || unfenced {
                    state.row_mut(work.key)?.status = Status::Completed(stored);
                    if let Stored::Charged(charge) = stored {
                        self.record(state, work.intent, charge);
                    }
                    Self::finish(state, instance, &work, Answer::Result(stored));
                } else {
                    let answer = Self::after_lost_lease(state, work.key);
                    Self::finish(state, instance, &work, answer);
                }
            }
            // Nothing was made: the recovery point is cleared and the key released (a DELETE
            // fenced by the token), so the retry starts afresh with a new downstream key.
            Verdict::NotDone => {
                if holds {
                    state.keys[usize::from(work.key)] = None;
                }
                Self::finish(state, instance, &work, Answer::TryLater);
            }
            // Unknown taken for a failure: the key completes as if an operator had found nothing.
            Verdict::Unknown if self.has(Defect::UnknownStoredAsMadeNothing) => {
                if holds {
                    state.row_mut(work.key)?.status = Status::Completed(Stored::MadeNothing);
                }
                let answer = Self::after_lost_lease(state, work.key);
                Self::finish(state, instance, &work, answer);
            }
            // 503: the key stays in progress at its recovery point, its lease ended, for the
            // client's retry or the recovery job.
            Verdict::Unknown => {
                if holds {
                    state.row_mut(work.key)?.status = Status::InProgress(Lease::Ended);
                }
                Self::finish(state, instance, &work, Answer::TryLater);
            }
        }
        Some(())
    }

    /// What idempay records when its key completes with the processor's answer: the payment of
    /// the charge, or the capture or cancel on the payment.
    fn record(&self, state: &mut State, intent: Intent, charge: ChargeId) {
        match self.config.size.kind(intent) {
            Kind::Pay => state.payments.push(charge),
            Kind::Capture { .. } | Kind::Cancel { .. } => state.releases.push(intent),
        }
    }

    /// The processor's `create_charge`, `capture` and `void`: one answer per idempotency key it
    /// remembers. A capture or void takes the charge's lock and refuses an authorization that is
    /// no longer held (unless that check is the defect left out).
    fn deliver(&self, state: &mut State, call: Call, answer_lost: bool) -> Option<()> {
        if !state.processor.up || !state.network.remove(&call) {
            return None;
        }
        if self.past_deadline(state, call.downstream_key) {
            // Refused before anything is made, and nothing stored under the key. (`Call` refuses
            // a call sent past its deadline at once; hours never pass over a call on the
            // network, so this is the processor's check written out, not a path of its own.)
            Self::answer_attempt(state, call, answer_lost, Attempt::Refused);
            return Some(());
        }
        let kind = self.config.size.kind(call.intent);
        let releases_twice = self.has(Defect::ProcessorReleasesTwice);
        let processor = &mut state.processor;
        let reply = match processor.keys.get(&call.downstream_key) {
            Some(&reply) => reply,
            None => {
                let reply = match kind.releases() {
                    None => {
                        let charge = ChargeId::try_from(processor.ledger.len()).ok()?;
                        processor.ledger.push(Charge {
                            downstream_key: call.downstream_key,
                            intent: call.intent,
                        });
                        Reply::Made(charge)
                    }
                    Some(of) => {
                        let charge = processor
                            .ledger
                            .iter()
                            .position(|charge| charge.intent == of)
                            .and_then(|charge| ChargeId::try_from(charge).ok())?;
                        let held = !processor
                            .releases
                            .iter()
                            .any(|release| release.charge == charge);
                        if held || releases_twice {
                            processor.releases.push(Release {
                                charge,
                                downstream_key: call.downstream_key,
                                intent: call.intent,
                            });
                            Reply::Made(charge)
                        } else {
                            Reply::NotHeld
                        }
                    }
                };
                processor.keys.insert(call.downstream_key, reply);
                reply
            }
        };
        let attempt = match reply {
            Reply::Made(charge) => Attempt::Charged(charge),
            Reply::NotHeld => Attempt::NotHeld,
        };
        Self::answer_attempt(state, call, answer_lost, attempt);
        Some(())
    }

    /// The answer reaches its sender if it still waits for it (a sender that stopped waiting left
    /// the call without one).
    fn answer_attempt(state: &mut State, call: Call, answer_lost: bool, attempt: Attempt) {
        if let (Some(instance), false) = (call.reply_to, answer_lost)
            && let Instance::Working(work) = &mut state.instances[usize::from(instance)]
            && work.step == Step::Awaiting
            && work.downstream_key == call.downstream_key
        {
            work.step = Step::Answered(attempt);
        }
    }

    /// A call whose sender stopped waiting (timed out, or died) may still arrive: delayed.
    fn orphan_calls_of(state: &mut State, instance: InstanceId) {
        let calls: Vec<Call> = state
            .network
            .iter()
            .filter(|call| call.reply_to == Some(instance))
            .copied()
            .collect();
        for call in calls {
            state.network.remove(&call);
            state.network.insert(Call {
                reply_to: None,
                ..call
            });
        }
    }

    fn request(&self, state: &mut State, intent: Intent, instance: InstanceId) -> Option<()> {
        let key = self.config.size.intents[usize::from(intent)].key;
        let work = match self.decide(state, intent) {
            Decision::Answer(answer) => {
                state.answer(intent, answer);
                return Some(());
            }
            Decision::Refuse => {
                let downstream_key = DownstreamKey::try_from(state.downstream_keys.len()).ok()?;
                state.downstream_keys.push(intent);
                state.keys[usize::from(key)] = Some(KeyRow {
                    intent,
                    downstream_key,
                    status: Status::Completed(Stored::Refused),
                    age: Age::Fresh,
                });
                state.answer(intent, Answer::Result(Stored::Refused));
                return Some(());
            }
            Decision::HoldNow => {
                state.row_mut(key)?.status = Status::Held;
                state.answer(intent, Answer::TryLater);
                return Some(());
            }
            // The reservation records the recovery point with a new downstream key, in the same
            // statement (`KeyedRequest::starting_at`).
            Decision::Execute(Grant::Reserved) => {
                let downstream_key = DownstreamKey::try_from(state.downstream_keys.len()).ok()?;
                state.downstream_keys.push(intent);
                state.keys[usize::from(key)] = Some(KeyRow {
                    intent,
                    downstream_key,
                    status: Status::InProgress(Lease::By(instance)),
                    age: Age::Fresh,
                });
                Work {
                    key,
                    intent,
                    grant: Grant::Reserved,
                    downstream_key,
                    maybe_sent: false,
                    attempts: 0,
                    step: Step::Ready,
                }
            }
            // One conditional UPDATE installs this request's token; the key keeps its downstream
            // key, which an earlier holder may have sent.
            Decision::Execute(grant) => {
                let row = state.row_mut(key)?;
                row.status = Status::InProgress(Lease::By(instance));
                Work {
                    key,
                    intent,
                    grant,
                    downstream_key: row.downstream_key,
                    maybe_sent: self.earlier_calls_possible(),
                    attempts: 0,
                    step: Step::Ready,
                }
            }
        };
        state.instances[usize::from(instance)] = Instance::Working(work);
        Some(())
    }

    fn instance_actions(&self, state: &State, instance: InstanceId, actions: &mut Vec<Action>) {
        let Some(work) = state.work(instance) else {
            for intent in 0..self.config.size.intents.len() as Intent {
                if self.may_send(state, intent) {
                    actions.push(Action::Request { intent, instance });
                }
            }
            for key in 0..self.config.size.keys {
                if !self.has(Defect::RecoverySkipsPoint)
                    && state
                        .row(key)
                        .is_some_and(|row| row.suspended() && self.resumable(row))
                {
                    actions.push(Action::RecoveryClaims { key, instance });
                }
            }
            return;
        };
        if self.has(Defect::LeaseCheckedBeforeSend) && self.may_call(work) {
            actions.push(Action::CheckLease { instance });
        }
        if self.sends_next(work) {
            if state.processor.up {
                actions.push(Action::Call { instance });
            }
            actions.push(Action::CallRefused { instance });
        }
        match work.step {
            Step::Awaiting => actions.push(Action::TimeOut { instance }),
            Step::Answered(_) if !self.may_call(work) => actions.push(Action::Resolve { instance }),
            Step::Ready | Step::Checked | Step::Answered(_) => {}
        }
        if state.instance_crashes < self.config.size.instance_crashes {
            actions.push(Action::CrashInstance { instance });
        }
    }

    /// The dispute's steps: opened on a charge the processor made (at most `Size::disputes`),
    /// its event delivered while the processor is up and until acknowledged (a delivery whose
    /// acknowledgment is lost is sent again, and idempay's intake answers a duplicate as it
    /// answered the first, so that is the same step again), a parked event applied once a
    /// payment records its charge.
    fn event_actions(&self, state: &State, actions: &mut Vec<Action>) {
        match state.processor.dispute {
            None if self.config.size.disputes > 0 => {
                for charge in 0..state.processor.ledger.len() {
                    if let Ok(charge) = ChargeId::try_from(charge) {
                        actions.push(Action::OpenDispute { charge });
                    }
                }
            }
            None => {}
            Some(dispute) => {
                if !dispute.acknowledged && state.processor.up {
                    actions.push(Action::DeliverEvent);
                }
                if state.dispute == DisputeSeen::Parked
                    && state.payments.contains(&dispute.charge)
                    && !self.has(Defect::ParkedEventNeverFound)
                {
                    actions.push(Action::ApplyParked);
                }
            }
        }
    }

    fn key_actions(&self, state: &State, key: KeySlot, actions: &mut Vec<Action>) {
        let Some(row) = state.row(key) else {
            return;
        };
        // Hours pass only while no call with the key's downstream key is on the network (calls
        // have deadlines of seconds, far shorter than a key's time to live or the recovery window)
        // and no request works on the key, but one stalled before its send: a holder whose lease
        // ran out may be paused (a stopped process, a starved task, a statement that hung) for
        // any time, and its timers only fire once it runs again.
        let quiet = !state.worked_on(key) && !state.in_flight(row.downstream_key);
        let stalled_only = !state.in_flight(row.downstream_key)
            && state.instances.iter().all(|instance| match instance {
                Instance::Working(work) if work.key == key => self.stalled_before_send(work),
                Instance::Working(_) | Instance::Idle => true,
            });
        match row.status {
            Status::InProgress(Lease::By(_)) => actions.push(Action::LeaseRunsOut { key }),
            Status::InProgress(Lease::Ended) => {
                if row.age == Age::Fresh && stalled_only {
                    actions.push(Action::WindowPasses { key });
                }
                if row.age == Age::PastWindow && !self.has(Defect::UnboundedSuspension) {
                    actions.push(Action::HoldOverdue { key });
                }
            }
            Status::Completed(_) if quiet => actions.push(Action::Expire { key }),
            Status::Completed(_) => {}
            Status::Held => actions.push(Action::OperatorSettles { key }),
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(&self.config)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for instance in 0..self.config.size.instances {
            self.instance_actions(state, instance, actions);
        }
        for key in 0..self.config.size.keys {
            self.key_actions(state, key, actions);
        }
        if state.processor.up {
            for &call in &state.network {
                actions.push(Action::Deliver {
                    call,
                    answer_lost: false,
                });
                if call.reply_to.is_some() {
                    actions.push(Action::Deliver {
                        call,
                        answer_lost: true,
                    });
                }
            }
            if state.processor_crashes < self.config.size.processor_crashes {
                actions.push(Action::CrashProcessor);
            }
        } else {
            actions.push(Action::RestartProcessor);
        }
        for &downstream_key in state.processor.keys.keys() {
            if self.forgettable(state, downstream_key) {
                actions.push(Action::ProcessorForgets { downstream_key });
            }
        }
        self.event_actions(state, actions);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Request { intent, instance } => self.request(&mut state, intent, instance)?,
            Action::CheckLease { instance } => {
                let work = *state.work(instance)?;
                if Self::fenced(&state, instance, &work) {
                    let Instance::Working(work) = &mut state.instances[usize::from(instance)]
                    else {
                        return None;
                    };
                    work.step = Step::Checked;
                } else {
                    // The lease is another's: this request stops, as after a completion that
                    // found it lost.
                    let answer = Self::after_lost_lease(&state, work.key);
                    Self::finish(&mut state, instance, &work, answer);
                }
            }
            Action::Call { instance } => {
                let refused = self.past_deadline(&state, state.work(instance)?.downstream_key);
                let Instance::Working(work) = &mut state.instances[usize::from(instance)] else {
                    return None;
                };
                if refused {
                    // A call past its deadline changes nothing at the processor whenever it
                    // arrives: its sending and its refusal are taken as one step (a lost refusal
                    // would leave its sender as unsure, and as fenced out, as this one).
                    work.attempts += 1;
                    work.step = Step::Answered(Attempt::Refused);
                    return Some(state);
                }
                work.attempts += 1;
                work.step = Step::Awaiting;
                let call = Call {
                    downstream_key: work.downstream_key,
                    intent: work.intent,
                    reply_to: Some(instance),
                };
                state.network.insert(call);
            }
            Action::CallRefused { instance } => {
                let Instance::Working(work) = &mut state.instances[usize::from(instance)] else {
                    return None;
                };
                work.attempts += 1;
                work.step = Step::Answered(Attempt::Refused);
            }
            Action::TimeOut { instance } => {
                let Instance::Working(work) = &mut state.instances[usize::from(instance)] else {
                    return None;
                };
                work.step = Step::Answered(Attempt::Unknown);
                // The call may have reached the processor: from now on a refusal proves nothing
                // (unless this defect forgets it).
                if !self.has(Defect::RefusalAfterUnknownBelieved) {
                    work.maybe_sent = true;
                }
                Self::orphan_calls_of(&mut state, instance);
            }
            Action::Resolve { instance } => {
                let work = *state.work(instance)?;
                self.resolve(&mut state, instance, work)?;
            }
            Action::CrashInstance { instance } => {
                state.instances[usize::from(instance)] = Instance::Idle;
                state.instance_crashes += 1;
                Self::orphan_calls_of(&mut state, instance);
            }
            Action::LeaseRunsOut { key } => {
                state.row_mut(key)?.status = Status::InProgress(Lease::Ended);
            }
            Action::Deliver { call, answer_lost } => self.deliver(&mut state, call, answer_lost)?,
            Action::CrashProcessor => {
                state.processor.up = false;
                state.processor_crashes += 1;
                state.network.clear();
            }
            Action::RestartProcessor => state.processor.up = true,
            Action::ProcessorForgets { downstream_key } => {
                state.processor.keys.remove(&downstream_key);
            }
            Action::OpenDispute { charge } => {
                state.processor.dispute = Some(Dispute {
                    charge,
                    acknowledged: false,
                });
            }
            Action::DeliverEvent => {
                let dispute = state.processor.dispute.as_mut()?;
                dispute.acknowledged = true;
                state.dispute = if state.payments.contains(&dispute.charge) {
                    DisputeSeen::Recorded
                } else if self.has(Defect::EarlyEventAcknowledged) {
                    DisputeSeen::Nothing
                } else {
                    DisputeSeen::Parked
                };
            }
            Action::ApplyParked => state.dispute = DisputeSeen::Recorded,
            Action::RecoveryClaims { key, instance } => {
                let row = state.row_mut(key)?;
                row.status = Status::InProgress(Lease::By(instance));
                let work = Work {
                    key,
                    intent: row.intent,
                    grant: Grant::Recovery,
                    downstream_key: row.downstream_key,
                    maybe_sent: self.earlier_calls_possible(),
                    attempts: 0,
                    step: Step::Ready,
                };
                state.instances[usize::from(instance)] = Instance::Working(work);
            }
            Action::WindowPasses { key } => state.row_mut(key)?.age = Age::PastWindow,
            Action::HoldOverdue { key } => state.row_mut(key)?.status = Status::Held,
            Action::Expire { key } => {
                let row = state.keys[usize::from(key)].take()?;
                state.clients[usize::from(row.intent)].phase = ClientPhase::Gone;
            }
            Action::OperatorSettles { key } => {
                let row = *state.row(key)?;
                let stored = state.made_under(self.config.size.kind(row.intent), &row)?;
                if stored == Stored::Refused && self.has(Defect::SettleGivesUpOnReleased) {
                    return None;
                }
                state.row_mut(key)?.status = Status::Completed(stored);
                if let Stored::Charged(charge) = stored {
                    self.record(&mut state, row.intent, charge);
                }
            }
        }
        Some(state)
    }

    /// The properties that speak of this size: a size without a reused key, a dispute, or a
    /// capture and cancel would never see their examples.
    fn properties(&self) -> Vec<Property<Self>> {
        let size = &self.config.size;
        let mut properties = vec![
            Property::always(props::ONE_CHARGE_PER_INTENT, |model: &Self, state| {
                props::one_charge_per_intent(&model.config, state)
            }),
            Property::always(props::REPLAY_EQUALS_FIRST_ANSWER, |_, state| {
                props::replay_equals_first_answer(state)
            }),
            Property::always(
                props::CHANGED_PAYLOAD_NEVER_EXECUTES,
                |model: &Self, state| props::changed_payload_never_executes(&model.config, state),
            ),
            Property::always(props::EVERY_CHARGE_RECORDED_OR_KEPT, |_, state| {
                props::every_charge_recorded_or_kept(state)
            }),
            Property::always(props::NO_COMPLETION_CONTRADICTED, |model: &Self, state| {
                props::no_completion_contradicted(&model.config, state)
            }),
            Property::sometimes(props::A_TAKEOVER, |_, state| props::a_takeover(state)),
            Property::sometimes(props::A_RECOVERY_RESUME, |_, state| {
                props::a_recovery_resume(state)
            }),
            Property::sometimes(props::A_HOLD, |_, state| props::a_hold(state)),
            Property::always(props::EVERY_KEY_COMPLETES, |model: &Self, state| {
                props::every_key_completes(state, || model.at_rest(state))
            }),
            Property::sometimes(props::AN_OPERATOR_SETTLES, |_, state| {
                props::an_operator_settles(state)
            }),
            Property::sometimes(props::A_KEY_FORGOTTEN, |_, state| {
                props::a_key_forgotten(state)
            }),
            Property::sometimes(props::A_DELAYED_CALL_CHARGES, |model: &Self, state| {
                props::a_delayed_call_charges(state, |downstream_key| {
                    model.past_deadline(state, downstream_key)
                })
            }),
        ];
        if size.disputes > 0 {
            properties.push(Property::always(
                props::NO_ACKNOWLEDGED_EVENT_LOST,
                |_, state| props::no_acknowledged_event_lost(state),
            ));
            properties.push(Property::always(
                props::EVERY_EVENT_APPLIED,
                |model: &Self, state| props::every_event_applied(state, || model.at_rest(state)),
            ));
            properties.push(Property::sometimes(
                props::AN_EARLY_EVENT_PARKED,
                |_, state| props::an_early_event_parked(state),
            ));
        }
        if size.reuses_keys() {
            properties.push(Property::sometimes(
                props::A_REUSE_AFTER_EXPIRY,
                |model: &Self, state| props::a_reuse_after_expiry(&model.config, state),
            ));
        }
        if size.releases() {
            properties.push(Property::always(
                props::ONE_RELEASE_PER_AUTHORIZATION,
                |model: &Self, state| props::one_release_per_authorization(&model.config, state),
            ));
            properties.push(Property::sometimes(props::A_RELEASE_REFUSED, |_, state| {
                props::a_release_refused(state)
            }));
            properties.push(Property::sometimes(
                props::A_CAPTURE_RECORDED,
                |model: &Self, state| props::a_capture_recorded(&model.config, state),
            ));
        }
        properties
    }

    fn within_boundary(&self, state: &State) -> bool {
        state.downstream_keys.len() <= usize::from(self.config.size.downstream_keys)
    }
}
