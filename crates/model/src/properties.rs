//! What must hold in every reachable state (`always`), and what must happen in some (`sometimes`,
//! so that a model which allows nothing fails). Each is a plain function of the state, named by
//! the sentence the checker prints.

use crate::config::{Config, Kind};
use crate::state::{
    Age, Attempt, ClientPhase, DisputeSeen, DownstreamKey, Grant, Instance, KeyRow, Reply, State,
    Status, Step, Stored,
};

pub const ONE_CHARGE_PER_INTENT: &str = "one charge per intent";
pub const REPLAY_EQUALS_FIRST_ANSWER: &str = "a replay equals the first answer";
pub const CHANGED_PAYLOAD_NEVER_EXECUTES: &str =
    "a changed payload never executes or gets another's result";
pub const EVERY_CHARGE_RECORDED_OR_KEPT: &str = "every charge is recorded or its key kept";
pub const NO_COMPLETION_CONTRADICTED: &str =
    "no key completes with a result the processor contradicts";
pub const NO_ACKNOWLEDGED_EVENT_LOST: &str = "no acknowledged event is lost";
pub const ONE_RELEASE_PER_AUTHORIZATION: &str =
    "one capture per capture intent, one release per authorization";
pub const EVERY_KEY_COMPLETES: &str = "once faults stop, every key completes";
pub const EVERY_EVENT_APPLIED: &str =
    "once faults stop, every event of a recorded charge is applied";

pub const A_TAKEOVER: &str = "a takeover";
pub const A_RECOVERY_RESUME: &str = "a resume by the recovery job";
pub const A_HOLD: &str = "a hold";
pub const A_REUSE_AFTER_EXPIRY: &str = "a reuse after expiry";
pub const AN_EARLY_EVENT_PARKED: &str = "an early event parked";
pub const A_RELEASE_REFUSED: &str = "a capture or cancel refused by the processor";
pub const A_CAPTURE_RECORDED: &str = "a capture recorded";
pub const AN_OPERATOR_SETTLES: &str = "an operator's settle completes a held key";
pub const A_KEY_FORGOTTEN: &str = "the processor forgets a downstream key";
pub const A_DELAYED_CALL_CHARGES: &str = "a delayed call charges";

/// At most one charge at the processor, and at most one payment in idempay, for each intent.
pub fn one_charge_per_intent(config: &Config, state: &State) -> bool {
    (0..config.size.intents.len()).all(|intent| {
        let charges = state
            .processor
            .ledger
            .iter()
            .filter(|charge| usize::from(charge.intent) == intent)
            .count();
        let payments = state
            .payments
            .iter()
            .filter(|&&charge| {
                usize::from(state.processor.ledger[usize::from(charge)].intent) == intent
            })
            .count();
        charges <= 1 && payments <= 1
    })
}

/// At the processor and in idempay, each capture or cancel intent releases the authorization at
/// most once (one capture per capture intent), and each authorization is released at most once:
/// captured or voided, never both, never twice.
pub fn one_release_per_authorization(config: &Config, state: &State) -> bool {
    let intents = 0..config.size.intents.len() as u8;
    let per_intent = intents.clone().all(|intent| {
        let made = state
            .processor
            .releases
            .iter()
            .filter(|release| release.intent == intent)
            .count();
        let recorded = state.releases.iter().filter(|&&n| n == intent).count();
        made <= 1 && recorded <= 1
    });
    let per_authorization = intents.clone().all(|of| {
        let made = state
            .processor
            .releases
            .iter()
            .filter(|release| state.processor.ledger[usize::from(release.charge)].intent == of)
            .count();
        let recorded = state
            .releases
            .iter()
            .filter(|&&n| config.size.kind(n).releases() == Some(of))
            .count();
        made <= 1 && recorded <= 1
    });
    per_intent && per_authorization
}

/// A client that has its result never gets another one for the same key.
pub fn replay_equals_first_answer(state: &State) -> bool {
    state.clients.iter().all(|client| !client.contradicted)
}

/// Every charge is for the payload whose key made its downstream key: a request whose payload
/// differs from its key's never reaches the processor under that key. And no client is answered
/// with a charge of another intent's: the clients reuse a key only once its first intent has its
/// answer, so a reused key is met completed (or gone), and what a wrong fingerprint lets through
/// there is the first intent's result, not an execution.
pub fn changed_payload_never_executes(config: &Config, state: &State) -> bool {
    let made_by = |downstream_key: u8| state.downstream_keys[usize::from(downstream_key)];
    let own_results = state.clients.iter().enumerate().all(|(intent, client)| {
        let ClientPhase::Answered(Stored::Charged(charge)) = client.phase else {
            return true;
        };
        let paid_by = state.processor.ledger[usize::from(charge)].intent;
        // A capture or cancel answers with the charge it released.
        let expected = config
            .size
            .kind(intent as u8)
            .releases()
            .unwrap_or(intent as u8);
        paid_by == expected
    });
    own_results
        && state
            .processor
            .ledger
            .iter()
            .all(|charge| made_by(charge.downstream_key) == charge.intent)
        && state
            .processor
            .releases
            .iter()
            .all(|release| made_by(release.downstream_key) == release.intent)
}

/// Every charge is a payment in idempay, and every capture or void is recorded on its payment, or
/// the key whose downstream key made it is kept: in progress (being worked on, or suspended for a
/// retry or the recovery job), held for an operator, or completed. One under a key that was
/// released or expired is lost. A completed key that does not record it contradicts the
/// processor: that is the next property's to say, so that each defect is found by one of them.
pub fn every_charge_recorded_or_kept(state: &State) -> bool {
    let kept = |downstream_key| {
        state.keys.iter().flatten().any(|row| {
            row.downstream_key == downstream_key
                && matches!(
                    row.status,
                    Status::InProgress(_) | Status::Held | Status::Completed(_)
                )
        })
    };
    let charges = state
        .processor
        .ledger
        .iter()
        .enumerate()
        .all(|(id, charge)| {
            state.payments.iter().any(|&paid| usize::from(paid) == id)
                || kept(charge.downstream_key)
        });
    let releases =
        state.processor.releases.iter().all(|release| {
            state.releases.contains(&release.intent) || kept(release.downstream_key)
        });
    charges && releases
}

/// A completed key's result is what the processor's ledgers say of its downstream key: the
/// charge, capture or void made under it, or nothing when the key says nothing was made or that
/// the processor refused.
pub fn no_completion_contradicted(config: &Config, state: &State) -> bool {
    let processor = &state.processor;
    state.keys.iter().flatten().all(|row| {
        let charged = |charge: u8| match config.size.kind(row.intent) {
            Kind::Pay => processor.ledger[usize::from(charge)].downstream_key == row.downstream_key,
            Kind::Capture { .. } | Kind::Cancel { .. } => {
                processor.releases.iter().any(|release| {
                    release.charge == charge && release.downstream_key == row.downstream_key
                })
            }
        };
        let made_nothing = || {
            !processor
                .ledger
                .iter()
                .any(|charge| charge.downstream_key == row.downstream_key)
                && !processor
                    .releases
                    .iter()
                    .any(|release| release.downstream_key == row.downstream_key)
        };
        match row.status {
            Status::Completed(Stored::Charged(charge)) => charged(charge),
            Status::Completed(Stored::MadeNothing | Stored::Refused) => made_nothing(),
            Status::InProgress(_) | Status::Held => true,
        }
    })
}

/// An event idempay acknowledged is kept: applied, or parked until its charge is recorded. The
/// processor delivers an acknowledged event no more, so one dropped is lost for good.
pub fn no_acknowledged_event_lost(state: &State) -> bool {
    match state.processor.dispute {
        Some(dispute) if dispute.acknowledged => state.dispute != DisputeSeen::Nothing,
        _ => true,
    }
}

/// Liveness, checked where the world comes to rest once faults stop (`Protocol::at_rest`): every
/// key is completed (or released, or expired: nothing is owed under it), by its holder, a retry,
/// the recovery job, or an operator's settle of a key held past its window. `at_rest` is asked
/// only when some key is not done, since it costs the steps of the state again.
pub fn every_key_completes(state: &State, at_rest: impl FnOnce() -> bool) -> bool {
    let done = state
        .keys
        .iter()
        .flatten()
        .all(|row| matches!(row.status, Status::Completed(_)));
    done || !at_rest()
}

/// Liveness, at rest as above: the dispute's event was delivered and acknowledged, and it is
/// applied once its charge is recorded (by the recording's look or the sweep). An event whose
/// charge is not recorded at rest waits rightly: that charge is a key's, which the property
/// above speaks of.
pub fn every_event_applied(state: &State, at_rest: impl FnOnce() -> bool) -> bool {
    let waiting = match state.processor.dispute {
        None => false,
        Some(dispute) if !dispute.acknowledged => true,
        Some(dispute) => {
            state.dispute == DisputeSeen::Parked && state.payments.contains(&dispute.charge)
        }
    };
    !waiting || !at_rest()
}

/// An operator's settle completed a held key: only a settle completes a key past its window,
/// which nothing resumes (a stalled holder's call past it is refused by its deadline).
pub fn an_operator_settles(state: &State) -> bool {
    state
        .keys
        .iter()
        .flatten()
        .any(|row| row.age == Age::PastWindow && matches!(row.status, Status::Completed(_)))
}

/// The processor forgot the downstream key of one of its charges, its lifetime over.
pub fn a_key_forgotten(state: &State) -> bool {
    state
        .processor
        .ledger
        .iter()
        .any(|charge| !state.processor.keys.contains_key(&charge.downstream_key))
}

/// A call whose sender stopped waiting is on the network, and the processor, up, has nothing
/// under its key yet and will not refuse it: its delivery, a step from here, acts on it (a
/// charge, or a capture or void).
pub fn a_delayed_call_charges(
    state: &State,
    past_deadline: impl Fn(DownstreamKey) -> bool,
) -> bool {
    state.processor.up
        && state.network.iter().any(|call| {
            call.reply_to.is_none()
                && !state.processor.keys.contains_key(&call.downstream_key)
                && !past_deadline(call.downstream_key)
        })
}

/// A capture or cancel that idempay's check let through met an authorization the other one had
/// released meanwhile: the processor refused it under its charge's lock.
pub fn a_release_refused(state: &State) -> bool {
    state
        .processor
        .keys
        .values()
        .any(|&reply| reply == Reply::NotHeld)
}

/// idempay recorded a capture on its payment.
pub fn a_capture_recorded(config: &Config, state: &State) -> bool {
    state
        .releases
        .iter()
        .any(|&intent| matches!(config.size.kind(intent), Kind::Capture { .. }))
}

/// The dispute's event came before idempay recorded its charge, and waits parked.
pub fn an_early_event_parked(state: &State) -> bool {
    state.dispute == DisputeSeen::Parked
}

/// A client's retry works on a key another request left.
pub fn a_takeover(state: &State) -> bool {
    state.instances.iter().any(
        |instance| matches!(instance, Instance::Working(work) if work.grant == Grant::TakenOver),
    )
}

/// The recovery job has the processor's charge for a key no client came back for, about to
/// record it.
pub fn a_recovery_resume(state: &State) -> bool {
    state.instances.iter().any(|instance| {
        matches!(instance, Instance::Working(work)
            if work.grant == Grant::Recovery && matches!(work.step, Step::Answered(Attempt::Charged(_))))
    })
}

/// A key is held for an operator.
pub fn a_hold(state: &State) -> bool {
    state
        .keys
        .iter()
        .flatten()
        .any(|row| row.status == Status::Held)
}

/// A key completed for an intent that reused it after the first intent's row expired.
pub fn a_reuse_after_expiry(config: &Config, state: &State) -> bool {
    state.keys.iter().enumerate().any(|(slot, row)| {
        row.is_some_and(|row: KeyRow| {
            matches!(row.status, Status::Completed(_))
                && !first_on_its_key(config, row.intent, slot)
        })
    })
}

/// Whether `intent` is the first of the intents sent under key `slot`.
fn first_on_its_key(config: &Config, intent: u8, slot: usize) -> bool {
    config
        .size
        .intents
        .iter()
        .position(|spec| usize::from(spec.key) == slot)
        == Some(usize::from(intent))
}
