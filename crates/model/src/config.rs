//! What is checked: the size of the world (how many clients, keys, instances, attempts and faults)
//! and which known defects are switched on. A defect is a mistake the real code once made or could
//! make; with its switch on, the checker must find a counterexample.

use std::fmt;

/// What an intent asks of idempay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `POST /v1/payments`: a charge at the processor (an authorization, in a size whose intents
    /// capture or cancel it).
    Pay,
    /// `POST /v1/payments/{id}/capture` of the payment of intent `of`, sent once that intent has
    /// its payment.
    Capture { of: u8 },
    /// `POST /v1/payments/{id}/cancel` of the payment of intent `of`: its authorization voided.
    Cancel { of: u8 },
}

impl Kind {
    /// The intent whose payment a capture or cancel releases; none for a payment.
    pub fn releases(self) -> Option<u8> {
        match self {
            Kind::Pay => None,
            Kind::Capture { of } | Kind::Cancel { of } => Some(of),
        }
    }
}

/// A client's business intent: one payment, capture or cancel, sent under one idempotency key,
/// retried with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IntentSpec {
    /// The key the client sends (an index into the key slots).
    pub key: u8,
    pub kind: Kind,
}

impl IntentSpec {
    const fn pay(key: u8) -> Self {
        Self {
            key,
            kind: Kind::Pay,
        }
    }
}

/// How big the world is. Every bound is explicit so the state space stays finite.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Size {
    /// The name printed with the results.
    pub name: &'static str,
    /// The clients' intents, in the order a key is used: a later intent on an earlier intent's key
    /// reuses it, and is sent only once the earlier one was answered (a merchant that reuses a key
    /// after its time to live), so it meets the old key (a mismatch) or an expired one (reuse).
    pub intents: Vec<IntentSpec>,
    /// How many key slots there are (each intent's `key` is below this).
    pub keys: u8,
    /// How many idempay instances serve requests (each serves one at a time).
    pub instances: u8,
    /// How many times one request calls the processor while its outcome is unknown
    /// (`ATTEMPTS` in src/downstream/client.rs, fewer here).
    pub attempts: u8,
    /// How many downstream keys may be made in all: each fresh reservation makes one.
    pub downstream_keys: u8,
    /// How many times an idempay instance may crash (and restart).
    pub instance_crashes: u8,
    /// How many times the processor may crash (and restart).
    pub processor_crashes: u8,
    /// How many disputes the cardholders' banks open at the processor (0 or 1), each on a charge
    /// it made, whose event (`charge.dispute.created`) it delivers to idempay.
    pub disputes: u8,
    /// Whether hours may pass while a holder is stalled between taking its key and sending its
    /// call (its lease run out): the recovery window passes, the key is held and settled, and the
    /// holder wakes after all that and sends.
    pub stalls: bool,
}

impl Size {
    /// The size the tests check in debug builds, in a second or so: one key, its first intent
    /// and the intent that reuses it after expiry, two instances, no crash of the processor.
    pub fn small() -> Self {
        Self {
            name: "small",
            intents: vec![IntentSpec::pay(0), IntentSpec::pay(0)],
            keys: 1,
            instances: 2,
            attempts: 2,
            downstream_keys: 3,
            instance_crashes: 1,
            processor_crashes: 0,
            disputes: 1,
            stalls: true,
        }
    }

    /// The size `make model` checks: the small one with a third attempt per request, more
    /// downstream keys, two crashes of an instance and one of the processor. A second key with an
    /// intent of its own multiplies the states (over ten minutes) without a new interleaving: keys
    /// share nothing but the instances and the processor, and two intents on one key already
    /// contend for both.
    pub fn full() -> Self {
        Self {
            name: "full",
            intents: vec![IntentSpec::pay(0), IntentSpec::pay(0)],
            keys: 1,
            instances: 2,
            attempts: 3,
            downstream_keys: 5,
            instance_crashes: 2,
            processor_crashes: 1,
            disputes: 1,
            stalls: true,
        }
    }

    /// Authorize now, capture later: a manual payment, then a capture and a cancel of it under
    /// keys of their own, racing each other through two instances to the processor, whose
    /// charge's lock lets one of them through. Both sizes above already check each key's own
    /// lifecycle at length; this one checks what a release adds: the processor's refusal as a
    /// stored result, a capture made but unrecorded, and one release per authorization.
    pub fn capture() -> Self {
        Self {
            name: "capture",
            intents: vec![
                IntentSpec::pay(0),
                IntentSpec {
                    key: 1,
                    kind: Kind::Capture { of: 0 },
                },
                IntentSpec {
                    key: 2,
                    kind: Kind::Cancel { of: 0 },
                },
            ],
            keys: 3,
            instances: 2,
            attempts: 2,
            downstream_keys: 3,
            instance_crashes: 0,
            processor_crashes: 0,
            disputes: 0,
            // A stall is a key's own lifecycle, checked at the other sizes; here it adds a third
            // to the states of three keys.
            stalls: false,
        }
    }

    /// The kind of `intent`.
    pub fn kind(&self, intent: u8) -> Kind {
        self.intents[usize::from(intent)].kind
    }

    /// Whether some intent captures or cancels a payment.
    pub fn releases(&self) -> bool {
        self.intents.iter().any(|spec| spec.kind != Kind::Pay)
    }

    /// Whether some intent reuses an earlier intent's key.
    pub fn reuses_keys(&self) -> bool {
        self.intents.iter().enumerate().any(|(n, spec)| {
            self.intents[..n]
                .iter()
                .any(|earlier| earlier.key == spec.key)
        })
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} intents on {} keys, {} instances, {} attempts per request, {} downstream keys, \
             {} instance crash(es), {} processor crash(es), {} dispute(s){}",
            self.name,
            self.intents.len(),
            self.keys,
            self.instances,
            self.attempts,
            self.downstream_keys,
            self.instance_crashes,
            self.processor_crashes,
            self.disputes,
            if self.stalls { ", stalled holders" } else { "" }
        )
    }
}

/// A known way to get the protocol wrong. Each is off by default; on, it must be caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Defect {
    /// A refused connection is believed even after an attempt with the same downstream key may
    /// have reached the processor (an unknown outcome before it): the key is released, and the
    /// retry reserves it anew with a new downstream key.
    RefusalAfterUnknownBelieved,
    /// A takeover (a retry's or the recovery job's) believes no call was made before it
    /// (`EarlierCalls::None` instead of `Possible`), so a refusal releases the key.
    TakeoverBelievesNoEarlierCall,
    /// Suspension has no bound: no key is held past the recovery window, and suspended keys are
    /// resumed after the processor forgot their downstream key.
    UnboundedSuspension,
    /// The completion is not fenced by the lease's token: a request that lost its lease still
    /// records its payment.
    UnfencedCompletion,
    /// The intake acknowledges an event about a charge idempay has not recorded yet (200
    /// `ignored`) instead of keeping it: the processor delivers it no more, and the dispute is
    /// lost.
    EarlyEventAcknowledged,
    /// The processor captures or voids an authorization that is no longer held (no check under
    /// its charge's lock): a capture and a cancel that both passed idempay's check both go
    /// through.
    ProcessorReleasesTwice,
    /// The recovery job never claims a key suspended at the charge's recovery point (its claim
    /// names a point the charge does not record, or a version of its state no resumer reads): a
    /// key whose client stopped retrying waits out the window for an operator.
    RecoverySkipsPoint,
    /// The recording's look for parked events and the sweep look them up by idempay's payment id,
    /// while the intake parks them under the processor's charge id: a parked event is kept, and
    /// never applied.
    ParkedEventNeverFound,
    /// The fingerprint leaves the payload out (the route and the key only): a request with another
    /// payload under a used key is taken for a retry of the first, and answered its result.
    FingerprintIgnoresPayload,
    /// A replay renders the payment as it is now instead of returning the stored response: once a
    /// dispute is recorded on it, a retry gets another answer than the first.
    ReplayRerendered,
    /// A request whose attempts all ended unknown believes the call failed and completes the key
    /// with the final "made nothing" (a time-out taken for a failure): a call that charged, or
    /// still will, is contradicted by the key.
    UnknownStoredAsMadeNothing,
    /// Today's code: the settle of a held capture or cancel whose authorization another key
    /// released gives up ("settle it by hand", `made_on_charge` in src/payments/capturing.rs),
    /// though nothing was made under its key and nothing can be: the key stays held for a person.
    SettleGivesUpOnReleased,
    /// The code before calls carried a deadline (`Call-Deadline`): the processor checks none. A holder stalled between
    /// taking the key and sending its call (its lease run out) wakes after the window, the hold
    /// and an operator's settle, and its call still acts.
    NoCallDeadline,
    /// That code with the tempting fix: the holder checks that its lease still holds before
    /// each attempt, and then sends. The check and the send are two steps; the stall falls between
    /// them.
    LeaseCheckedBeforeSend,
}

impl Defect {
    pub const ALL: [Defect; 14] = [
        Defect::RefusalAfterUnknownBelieved,
        Defect::TakeoverBelievesNoEarlierCall,
        Defect::UnboundedSuspension,
        Defect::UnfencedCompletion,
        Defect::EarlyEventAcknowledged,
        Defect::ProcessorReleasesTwice,
        Defect::RecoverySkipsPoint,
        Defect::ParkedEventNeverFound,
        Defect::FingerprintIgnoresPayload,
        Defect::ReplayRerendered,
        Defect::UnknownStoredAsMadeNothing,
        Defect::SettleGivesUpOnReleased,
        Defect::NoCallDeadline,
        Defect::LeaseCheckedBeforeSend,
    ];

    /// The name given on the command line (`--defect NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Defect::RefusalAfterUnknownBelieved => "refusal-after-unknown-believed",
            Defect::TakeoverBelievesNoEarlierCall => "takeover-believes-no-earlier-call",
            Defect::UnboundedSuspension => "unbounded-suspension",
            Defect::UnfencedCompletion => "unfenced-completion",
            Defect::EarlyEventAcknowledged => "early-event-acknowledged",
            Defect::ProcessorReleasesTwice => "processor-releases-twice",
            Defect::RecoverySkipsPoint => "recovery-skips-point",
            Defect::ParkedEventNeverFound => "parked-event-never-found",
            Defect::FingerprintIgnoresPayload => "fingerprint-ignores-payload",
            Defect::ReplayRerendered => "replay-rerendered",
            Defect::UnknownStoredAsMadeNothing => "unknown-stored-as-made-nothing",
            Defect::SettleGivesUpOnReleased => "settle-gives-up-on-released",
            Defect::NoCallDeadline => "no-call-deadline",
            Defect::LeaseCheckedBeforeSend => "lease-checked-before-send",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|defect| defect.name() == name)
    }
}

/// A size and the defects switched on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub size: Size,
    pub defects: Vec<Defect>,
}

impl Config {
    /// The protocol as the real code runs it, at `size`.
    pub fn correct(size: Size) -> Self {
        Self {
            size,
            defects: Vec::new(),
        }
    }

    pub fn with(mut self, defect: Defect) -> Self {
        self.defects.push(defect);
        self
    }

    pub fn has(&self, defect: Defect) -> bool {
        self.defects.contains(&defect)
    }
}
