//! What a schedule did, counted as it happened: the work its intents got done and the faults that
//! struck. Without the counts, a schedule whose faults all missed (a kill of a process already
//! down, a pause of one not running) or whose intents all ended refused passes as well as one that
//! met them all; with them, a run prints what it exercised, and a default run that exercised
//! nothing of a kind fails ([`missing`]).

use std::fmt::Write;
use std::sync::atomic::{AtomicU32, Ordering};

/// A kind of thing a schedule can do or meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A payment answered 201.
    Paid,
    /// A payment with the declining card answered 402.
    Declined,
    /// A refund answered 201.
    Refunded,
    /// A dispute opened at the processor.
    Disputed,
    /// A manual payment's capture answered 200.
    Captured,
    /// A manual payment's cancel answered 200.
    Canceled,
    /// A dispute's event delivered before idempay recorded its charge, and acknowledged.
    EarlyEvent,
    ProcessorKilled,
    InstanceKilled,
    /// A process stopped (SIGSTOP) and continued.
    Paused,
    DatabaseRestarted,
    /// The database killed (SIGKILL) while intents were on their way, and up again.
    DatabaseCrashed,
    /// A processor event delivered again and acknowledged (2xx).
    Redelivered,
    /// A key taken over by a client's retry from a holder whose lease lapsed (the recovery
    /// job's claims are not counted here).
    Takeover,
    /// A key the recovery job resumed to an answer (not a 5xx): its claims that settled nothing
    /// are not counted.
    Recovery,
    /// A request whose client hung up before its answer (and tried again).
    HungUp,
    /// A slow database link struck: the database's answers late on every process's link.
    SlowDatabase,
    /// A key reused with another payload, answered 422.
    Reused,
    /// A payment sent by two clients at once under one key, both answered the same.
    Twins,
    /// A capture and a cancel of one authorization, one answered 200 and the other 409.
    Raced,
    /// An authorization released by the processor's expiry, its payment canceled at idempay.
    Lapsed,
    /// A key held for an operator, settled by `idempay keys settle`.
    Settled,
    /// An event of the sending account received by its merchant endpoint (each counted once).
    MerchantEvents,
}

pub const KINDS: [Seen; 23] = [
    Seen::Paid,
    Seen::Declined,
    Seen::Refunded,
    Seen::Disputed,
    Seen::Captured,
    Seen::Canceled,
    Seen::EarlyEvent,
    Seen::ProcessorKilled,
    Seen::InstanceKilled,
    Seen::Paused,
    Seen::DatabaseRestarted,
    Seen::DatabaseCrashed,
    Seen::Redelivered,
    Seen::Takeover,
    Seen::Recovery,
    Seen::HungUp,
    Seen::SlowDatabase,
    Seen::Reused,
    Seen::Twins,
    Seen::Raced,
    Seen::Lapsed,
    Seen::Settled,
    Seen::MerchantEvents,
];

/// What every default run (the regression seeds and new ones) must have met at least once: the
/// work of every kind, and every fault kind but the clean restart of the database (drawn by a
/// quarter of the schedules, and a lesser fault than the crash every new schedule draws).
const REQUIRED: [Seen; 17] = [
    Seen::Paid,
    Seen::Declined,
    Seen::Refunded,
    Seen::Disputed,
    Seen::Captured,
    Seen::Canceled,
    Seen::EarlyEvent,
    Seen::ProcessorKilled,
    Seen::InstanceKilled,
    Seen::Paused,
    Seen::DatabaseCrashed,
    Seen::Redelivered,
    Seen::Takeover,
    Seen::Recovery,
    Seen::HungUp,
    Seen::SlowDatabase,
    Seen::MerchantEvents,
];

impl Seen {
    fn label(self) -> &'static str {
        match self {
            Self::Paid => "paid",
            Self::Declined => "declined",
            Self::Refunded => "refunds",
            Self::Disputed => "disputes",
            Self::Captured => "captures",
            Self::Canceled => "cancels",
            Self::EarlyEvent => "early",
            Self::ProcessorKilled => "kill-p",
            Self::InstanceKilled => "kill-i",
            Self::Paused => "pauses",
            Self::DatabaseRestarted => "db-rst",
            Self::DatabaseCrashed => "db-crash",
            Self::Redelivered => "redeliv",
            Self::Takeover => "takeover",
            Self::Recovery => "recovery",
            Self::HungUp => "hang-up",
            Self::SlowDatabase => "slow-db",
            Self::Reused => "reused",
            Self::Twins => "twins",
            Self::Raced => "raced",
            Self::Lapsed => "lapsed",
            Self::Settled => "settled",
            Self::MerchantEvents => "merchant",
        }
    }

    fn index(self) -> usize {
        KINDS
            .iter()
            .position(|kind| *kind == self)
            .expect("every kind is listed")
    }
}

/// The counts of one schedule, added to as things happen.
#[derive(Default)]
pub struct Coverage([AtomicU32; KINDS.len()]);

impl Coverage {
    pub fn saw(&self, what: Seen) {
        self.add(what, 1);
    }

    pub fn add(&self, what: Seen, count: u32) {
        self.0[what.index()].fetch_add(count, Ordering::Relaxed);
    }

    pub fn counts(&self) -> Counts {
        Counts(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

/// The counts of a schedule once it ended, or of a whole run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts([u32; KINDS.len()]);

impl Counts {
    pub fn get(&self, what: Seen) -> u32 {
        self.0[what.index()]
    }

    pub fn add(&mut self, other: &Counts) {
        for (total, count) in self.0.iter_mut().zip(other.0) {
            *total += count;
        }
    }
}

/// The run's table: a row per seed, then the totals.
pub fn table(rows: &[(u64, Counts)]) -> String {
    let mut out = format!("{:>10}", "seed");
    for kind in KINDS {
        write!(out, " {:>8}", kind.label()).unwrap();
    }
    out.push('\n');
    let mut total = Counts::default();
    let line = |out: &mut String, name: String, counts: &Counts| {
        write!(out, "{name:>10}").unwrap();
        for kind in KINDS {
            write!(out, " {:>8}", counts.get(kind)).unwrap();
        }
        out.push('\n');
    };
    for (seed, counts) in rows {
        line(&mut out, seed.to_string(), counts);
        total.add(counts);
    }
    line(&mut out, "all".to_owned(), &total);
    out
}

/// What a run must have met and did not, each with why it was required. Every kind one of its
/// schedules drew (a fault planned, a payment planned with either card: [`drawn`]) must have
/// been met by the run, a seeded run's too: a kind drawn and never met is a plan that did not
/// happen. A default run must also meet every [`REQUIRED`] kind, drawn or not.
pub fn missing(rows: &[(u64, Counts)], drawn: &[Seen], default_run: bool) -> Vec<String> {
    let mut total = Counts::default();
    for (_, counts) in rows {
        total.add(counts);
    }
    KINDS
        .iter()
        .filter(|kind| total.get(**kind) == 0)
        .filter_map(|kind| {
            if drawn.contains(kind) {
                Some(format!("{} (drawn, never met)", kind.label()))
            } else if default_run && REQUIRED.contains(kind) {
                Some(format!("{} (required of a default run)", kind.label()))
            } else {
                None
            }
        })
        .collect()
}

/// The kinds a run's schedules drew, for a seeded run to say which it did not.
pub fn not_drawn(drawn: &[Seen]) -> Vec<&'static str> {
    KINDS
        .iter()
        .filter(|kind| !drawn.contains(kind))
        .map(|kind| kind.label())
        .collect()
}
