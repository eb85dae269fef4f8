//! The state of the whole world at one moment: the clients, idempay's key table and payments, its
//! instances' requests in flight, the network between idempay and the processor, and the
//! processor's own keys and ledger. Small indexes stand for ids: the checker hashes every state,
//! so the fewer and smaller its parts, the more states it can visit.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{Config, Kind};

/// An intent (and its client): an index into `Size::intents`.
pub type Intent = u8;
/// A key slot: an index into `State::keys`.
pub type KeySlot = u8;
/// An idempay instance: an index into `State::instances`. It is also the lease's token: an
/// instance serves one request at a time, so it holds at most one lease it believes in.
pub type InstanceId = u8;
/// A downstream key: an index into `State::downstream_keys`.
pub type DownstreamKey = u8;
/// A charge at the processor: an index into `Processor::ledger`.
pub type ChargeId = u8;

/// What a key completes with, and what its replays answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stored {
    /// The payment, recorded with this charge.
    Charged(ChargeId),
    /// The final 409 `processor-made-nothing` an operator's settle stores.
    MadeNothing,
    /// The 409 `payment-unexpected-state` of a capture or cancel whose payment was no longer
    /// `requires_capture`: idempay's check found it released, or the processor refused under its
    /// charge's lock.
    Refused,
}

/// What a client gets back from one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// A result: the first request's, or its replay.
    Result(Stored),
    /// The payment of this charge rendered as it is now, its dispute recorded on it: what a replay
    /// that re-renders (a defect) answers instead of the stored response.
    Rerendered(ChargeId),
    /// 422: another payload under this key.
    Mismatch,
    /// 409 in flight, 409 held, or 503 (refused, outcome unknown): retry later.
    TryLater,
}

/// Where a client is with its intent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientPhase {
    /// No result yet: it (re)tries.
    Retrying,
    /// It has its result; a retry (its answer lost on the way) must get the same again.
    Answered(Stored),
    /// Its key expired: it sends the key no more (the documented time to live of a key).
    Gone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub phase: ClientPhase,
    /// A later answer differed from the first result: what "a replay equals the first answer"
    /// forbids.
    pub contradicted: bool,
}

/// The lease of a key in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lease {
    /// Held by this instance, renewed by its heartbeat.
    By(InstanceId),
    /// Run out: its holder died, was too slow, or suspended the key (a 503 after an unknown
    /// outcome). Anyone may take it over, within the recovery window.
    Ended,
}

/// How far a key's recovery point is from its creation, in the two moments that matter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Age {
    /// Within the recovery window: it may be resumed.
    Fresh,
    /// Past the recovery window (but within the processor's memory of its downstream key, until
    /// the processor forgets it): held for an operator, never resumed.
    PastWindow,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    InProgress(Lease),
    Completed(Stored),
    /// Held for an operator (`idempay keys settle`).
    Held,
}

/// A row of idempay's `idempotency_keys`, with its recovery point ("charge requested").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeyRow {
    /// The fingerprint: the intent whose payload reserved it.
    pub intent: Intent,
    pub downstream_key: DownstreamKey,
    pub status: Status,
    pub age: Age,
}

impl KeyRow {
    /// In progress with its lease run out: what a takeover and the recovery job look for.
    pub fn suspended(&self) -> bool {
        self.status == Status::InProgress(Lease::Ended)
    }
}

/// Whether a call with a key's downstream key may have reached the processor before this lease
/// (`EarlierCalls` in crates/idempotency/src/recovery.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EarlierCalls {
    None,
    Possible,
}

/// How an instance came to hold a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Grant {
    /// It reserved the key (the unique constraint let its insert through).
    Reserved,
    /// A client's retry took over a key whose lease ran out.
    TakenOver,
    /// The recovery job claimed a suspended key; no client waits for this answer.
    Recovery,
}

/// The answer to one attempt at the processor call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempt {
    /// The processor charged, captured or voided (or replayed that answer for this downstream
    /// key): the charge it answers with.
    Charged(ChargeId),
    /// The processor refused a capture or void: the authorization is no longer held (400
    /// `charge-not-capturable`, or replayed for this downstream key).
    NotHeld,
    /// The connection was refused before anything was sent.
    Refused,
    /// No answer in time: the call may or may not have been made.
    Unknown,
}

/// Where an instance is in its request's unit of work (src/downstream/call.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// The key is held at its recovery point; the call is next.
    Ready,
    /// The holder found its lease still its own just now; the send is next (only with
    /// `Defect::LeaseCheckedBeforeSend`, whose check and send are two steps).
    Checked,
    /// The call is on the network; the instance waits for its answer.
    Awaiting,
    /// The last attempt's answer, for `until_known` to judge.
    Answered(Attempt),
}

/// One request's work on a key, held under a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Work {
    pub key: KeySlot,
    /// The payload it executes: the request's, which the key's fingerprint matched.
    pub intent: Intent,
    pub grant: Grant,
    pub downstream_key: DownstreamKey,
    /// Whether an attempt with the downstream key may have reached the processor: an earlier
    /// holder's (`EarlierCalls::Possible`) or one of this request's with an unknown outcome.
    pub maybe_sent: bool,
    pub attempts: u8,
    pub step: Step,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Instance {
    Idle,
    Working(Work),
}

/// A charge request on its way to the processor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Call {
    pub downstream_key: DownstreamKey,
    pub intent: Intent,
    /// The instance waiting for its answer; none once it stopped waiting (a delayed call).
    pub reply_to: Option<InstanceId>,
}

/// A charge in the processor's ledger, which it never forgets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Charge {
    pub downstream_key: DownstreamKey,
    pub intent: Intent,
}

/// A capture or void the processor made of a charge's authorization, under a downstream key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Release {
    pub charge: ChargeId,
    pub downstream_key: DownstreamKey,
    /// The capture or cancel intent whose key made the downstream key.
    pub intent: Intent,
}

/// What the processor answered under one of its idempotency keys, replayed for every repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The charge made, captured or voided.
    Made(ChargeId),
    /// The capture or void refused: the authorization was no longer held.
    NotHeld,
}

/// A dispute the processor holds on one of its charges, and its event to idempay: sent until
/// idempay acknowledges it (any 2xx), then never again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dispute {
    pub charge: ChargeId,
    pub acknowledged: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Processor {
    pub up: bool,
    /// Its own idempotency keys: what it answered for each downstream key it still remembers.
    pub keys: BTreeMap<DownstreamKey, Reply>,
    pub ledger: Vec<Charge>,
    /// The captures and voids it made, which it never forgets either.
    pub releases: Vec<Release>,
    pub dispute: Option<Dispute>,
}

/// What idempay holds of the dispute's event (`processed_events`, `parked_events`, `disputes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DisputeSeen {
    /// Not received, or received and dropped.
    Nothing,
    /// Parked: its charge was not recorded when it came; applied once it is.
    Parked,
    /// Recorded on the payment of its charge.
    Recorded,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub clients: Vec<Client>,
    /// idempay's key table: one slot per key, empty while the key is unused, released or expired.
    pub keys: Vec<Option<KeyRow>>,
    /// idempay's payments: the charges recorded, each with the key that completed.
    pub payments: Vec<ChargeId>,
    /// The captures and cancels idempay recorded on its payments (`succeeded` or `canceled`),
    /// each with the key that completed: the intents that asked.
    pub releases: Vec<Intent>,
    /// Every downstream key made so far, with the intent whose key made it.
    pub downstream_keys: Vec<Intent>,
    pub instances: Vec<Instance>,
    /// Calls sent and not yet delivered, refused by a crash, or dropped.
    pub network: BTreeSet<Call>,
    pub processor: Processor,
    /// What idempay holds of the processor's dispute.
    pub dispute: DisputeSeen,
    pub instance_crashes: u8,
    pub processor_crashes: u8,
}

impl State {
    pub fn initial(config: &Config) -> Self {
        let size = &config.size;
        Self {
            clients: vec![
                Client {
                    phase: ClientPhase::Retrying,
                    contradicted: false,
                };
                size.intents.len()
            ],
            keys: vec![None; usize::from(size.keys)],
            payments: Vec::new(),
            releases: Vec::new(),
            downstream_keys: Vec::new(),
            instances: vec![Instance::Idle; usize::from(size.instances)],
            network: BTreeSet::new(),
            processor: Processor {
                up: true,
                keys: BTreeMap::new(),
                ledger: Vec::new(),
                releases: Vec::new(),
                dispute: None,
            },
            dispute: DisputeSeen::Nothing,
            instance_crashes: 0,
            processor_crashes: 0,
        }
    }

    pub fn row(&self, key: KeySlot) -> Option<&KeyRow> {
        self.keys[usize::from(key)].as_ref()
    }

    pub fn row_mut(&mut self, key: KeySlot) -> Option<&mut KeyRow> {
        self.keys[usize::from(key)].as_mut()
    }

    pub fn work(&self, instance: InstanceId) -> Option<&Work> {
        match &self.instances[usize::from(instance)] {
            Instance::Working(work) => Some(work),
            Instance::Idle => None,
        }
    }

    /// Whether some instance is working on `key`.
    pub fn worked_on(&self, key: KeySlot) -> bool {
        self.instances
            .iter()
            .any(|instance| matches!(instance, Instance::Working(work) if work.key == key))
    }

    /// The processor's charge of `intent`'s payment, which idempay records.
    pub fn payment_of(&self, intent: Intent) -> Option<ChargeId> {
        self.payments
            .iter()
            .copied()
            .find(|&charge| self.processor.ledger[usize::from(charge)].intent == intent)
    }

    /// What the processor made under a held key's downstream key, as `settle_held` reads it: the
    /// charge, or the capture or void of the authorization (`made_on_charge`), or nothing, or, for
    /// a capture or cancel whose authorization another key released, the refusal the processor
    /// would answer it (nothing was made under this key, and no capture or void can be any more).
    /// None when the tool leaves it to a person: two charges under one downstream key.
    pub fn made_under(&self, kind: Kind, row: &KeyRow) -> Option<Stored> {
        let processor = &self.processor;
        match kind.releases() {
            None => {
                let made: Vec<usize> = (0..processor.ledger.len())
                    .filter(|&id| processor.ledger[id].downstream_key == row.downstream_key)
                    .collect();
                match made.as_slice() {
                    [] => Some(Stored::MadeNothing),
                    [charge] => Some(Stored::Charged(ChargeId::try_from(*charge).ok()?)),
                    _ => None,
                }
            }
            Some(of) => {
                let charge = self.payment_of(of)?;
                let mut releases = processor
                    .releases
                    .iter()
                    .filter(|release| release.charge == charge);
                match releases.next() {
                    None => Some(Stored::MadeNothing),
                    Some(release) if release.downstream_key == row.downstream_key => {
                        Some(Stored::Charged(charge))
                    }
                    Some(_) => Some(Stored::Refused),
                }
            }
        }
    }

    /// Whether a call with `downstream_key` is still on the network.
    pub fn in_flight(&self, downstream_key: DownstreamKey) -> bool {
        self.network
            .iter()
            .any(|call| call.downstream_key == downstream_key)
    }

    /// Hands a client one answer: its first result is kept, and any later result that differs
    /// from it is a contradiction. A client whose key expired listens no more.
    pub fn answer(&mut self, intent: Intent, answer: Answer) {
        let client = &mut self.clients[usize::from(intent)];
        match (client.phase, answer) {
            (ClientPhase::Gone, _) => {}
            (ClientPhase::Retrying, Answer::Result(stored)) => {
                client.phase = ClientPhase::Answered(stored)
            }
            (ClientPhase::Retrying, Answer::Rerendered(charge)) => {
                client.phase = ClientPhase::Answered(Stored::Charged(charge))
            }
            (ClientPhase::Retrying, _) => {}
            (ClientPhase::Answered(first), Answer::Result(later)) => {
                if later != first {
                    client.contradicted = true;
                }
            }
            // The body differs from any stored one: the dispute was recorded after the payment.
            (ClientPhase::Answered(_), Answer::Rerendered(_)) => client.contradicted = true,
            // A 409 or 503 after the result answers a request the client sent before it and
            // stopped waiting for; a request sent after the result finds the key completed.
            (ClientPhase::Answered(_), _) => {}
        }
    }
}
