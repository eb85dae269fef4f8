//! What is checked: the size of the world (how many clients, keys, instances, attempts and faults)
//! and which known defects are switched on. A defect is a mistake the real code once made or could
//! make; with its switch on, the checker must find a counterexample.

use std::fmt;

/// A client's business intent: one payment, sent under one idempotency key, retried with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IntentSpec {
    /// The key the client sends (an index into the key slots).
    pub key: u8,
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
}

impl Size {
    /// The size the tests check in debug builds, in a second or so: one key, its first intent
    /// and the intent that reuses it after expiry, two instances, no crash of the processor.
    pub fn small() -> Self {
        Self {
            name: "small",
            intents: vec![IntentSpec { key: 0 }, IntentSpec { key: 0 }],
            keys: 1,
            instances: 2,
            attempts: 2,
            downstream_keys: 3,
            instance_crashes: 1,
            processor_crashes: 0,
            disputes: 1,
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
            intents: vec![IntentSpec { key: 0 }, IntentSpec { key: 0 }],
            keys: 1,
            instances: 2,
            attempts: 3,
            downstream_keys: 5,
            instance_crashes: 2,
            processor_crashes: 1,
            disputes: 1,
        }
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} intents on {} keys, {} instances, {} attempts per request, {} downstream keys, \
             {} instance crash(es), {} processor crash(es), {} dispute(s)",
            self.name,
            self.intents.len(),
            self.keys,
            self.instances,
            self.attempts,
            self.downstream_keys,
            self.instance_crashes,
            self.processor_crashes,
            self.disputes
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
}

impl Defect {
    pub const ALL: [Defect; 5] = [
        Defect::RefusalAfterUnknownBelieved,
        Defect::TakeoverBelievesNoEarlierCall,
        Defect::UnboundedSuspension,
        Defect::UnfencedCompletion,
        Defect::EarlyEventAcknowledged,
    ];

    /// The name given on the command line (`--defect NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Defect::RefusalAfterUnknownBelieved => "refusal-after-unknown-believed",
            Defect::TakeoverBelievesNoEarlierCall => "takeover-believes-no-earlier-call",
            Defect::UnboundedSuspension => "unbounded-suspension",
            Defect::UnfencedCompletion => "unfenced-completion",
            Defect::EarlyEventAcknowledged => "early-event-acknowledged",
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
