//! What must hold in every reachable state (`always`), and what must happen in some (`sometimes`,
//! so that a model which allows nothing fails). Each is a plain function of the state, named by
//! the sentence the checker prints.

use crate::config::Config;
use crate::state::{Attempt, DisputeSeen, Grant, Instance, KeyRow, State, Status, Step, Stored};

pub const ONE_CHARGE_PER_INTENT: &str = "one charge per intent";
pub const REPLAY_EQUALS_FIRST_ANSWER: &str = "a replay equals the first answer";
pub const CHANGED_PAYLOAD_NEVER_EXECUTES: &str = "a changed payload never executes";
pub const EVERY_CHARGE_RECORDED_OR_KEPT: &str = "every charge is recorded or its key held";
pub const NO_COMPLETION_CONTRADICTED: &str =
    "no key completes with a result the processor contradicts";
pub const NO_ACKNOWLEDGED_EVENT_LOST: &str = "no acknowledged event is lost";

pub const A_TAKEOVER: &str = "a takeover";
pub const A_RECOVERY_RESUME: &str = "a resume by the recovery job";
pub const A_HOLD: &str = "a hold";
pub const A_REUSE_AFTER_EXPIRY: &str = "a reuse after expiry";
pub const AN_EARLY_EVENT_PARKED: &str = "an early event parked";

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

/// A client that has its result never gets another one for the same key.
pub fn replay_equals_first_answer(state: &State) -> bool {
    state.clients.iter().all(|client| !client.contradicted)
}

/// Every charge is for the payload whose key made its downstream key: a request whose payload
/// differs from its key's never reaches the processor under that key.
pub fn changed_payload_never_executes(state: &State) -> bool {
    state
        .processor
        .ledger
        .iter()
        .all(|charge| state.downstream_keys[usize::from(charge.downstream_key)] == charge.intent)
}

/// Every charge is a payment in idempay, or the key whose downstream key made it is kept: in
/// progress (being worked on, or suspended for a retry or the recovery job) or held for an
/// operator. A charge under a key that was released, completed otherwise or expired is lost.
pub fn every_charge_recorded_or_kept(state: &State) -> bool {
    state
        .processor
        .ledger
        .iter()
        .enumerate()
        .all(|(id, charge)| {
            state.payments.iter().any(|&paid| usize::from(paid) == id)
                || state.keys.iter().flatten().any(|row| {
                    row.downstream_key == charge.downstream_key
                        && matches!(row.status, Status::InProgress(_) | Status::Held)
                })
        })
}

/// A completed key's result is what the processor's ledger says of its downstream key: the
/// charge made under it, or nothing when the key says nothing was made.
pub fn no_completion_contradicted(state: &State) -> bool {
    state.keys.iter().flatten().all(|row| match row.status {
        Status::Completed(Stored::Charged(charge)) => {
            state.processor.ledger[usize::from(charge)].downstream_key == row.downstream_key
        }
        Status::Completed(Stored::MadeNothing) => !state
            .processor
            .ledger
            .iter()
            .any(|charge| charge.downstream_key == row.downstream_key),
        Status::InProgress(_) | Status::Held => true,
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
