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
    /// A processor event delivered again.
    Redelivered,
    /// A key taken over from a holder whose lease lapsed (by a retry or a recovery job).
    Takeover,
    /// A key resumed by a recovery job.
    Recovery,
    /// A request whose client hung up before its answer (and tried again).
    HungUp,
    /// A slow database link struck: the database's answers late on every process's link.
    SlowDatabase,
}

pub const KINDS: [Seen; 16] = [
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
    Seen::Redelivered,
    Seen::Takeover,
    Seen::Recovery,
    Seen::HungUp,
    Seen::SlowDatabase,
];

/// What every default run must have met at least once: the work, and the faults each schedule
/// plans. Early events, database restarts, declines and cancels depend on draws that a run's handful
/// of schedules may all miss; they are counted, not required.
const REQUIRED: [Seen; 11] = [
    Seen::Paid,
    Seen::Refunded,
    Seen::Disputed,
    Seen::Captured,
    Seen::ProcessorKilled,
    Seen::Paused,
    Seen::Redelivered,
    Seen::Takeover,
    Seen::Recovery,
    Seen::HungUp,
    Seen::SlowDatabase,
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
            Self::Redelivered => "redeliv",
            Self::Takeover => "takeover",
            Self::Recovery => "recovery",
            Self::HungUp => "hang-up",
            Self::SlowDatabase => "slow-db",
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

/// The kinds a run must meet that its schedules, all together, never met.
pub fn missing(rows: &[(u64, Counts)]) -> Vec<&'static str> {
    let mut total = Counts::default();
    for (_, counts) in rows {
        total.add(counts);
    }
    REQUIRED
        .iter()
        .filter(|kind| total.get(**kind) == 0)
        .map(|kind| kind.label())
        .collect()
}
