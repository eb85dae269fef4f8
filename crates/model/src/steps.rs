//! The model's vocabulary: the protocol at one size ([`Protocol`]) and every step one part of the
//! world can take ([`Action`]). `rules` judges which steps a state allows, `protocol` takes them.

use crate::config::Config;
use crate::state::{Call, ChargeId, DownstreamKey, InstanceId, Intent, KeySlot};

/// The protocol at one size, with some defects switched on.
#[derive(Clone, Debug)]
pub struct Protocol {
    pub config: Config,
}

/// One step of one part of the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    // --- clients -------------------------------------------------------------------------------
    /// A client sends (or sends again) its intent's request, and an idle instance decides on it
    /// in one statement: reserve, replay, 409, 422, take over, or hold.
    Request {
        intent: Intent,
        instance: InstanceId,
    },

    // --- idempay instances ---------------------------------------------------------------------
    /// The instance checks that its lease is still its own before an attempt (only with
    /// `Defect::LeaseCheckedBeforeSend`): the send is a step of its own after it.
    CheckLease {
        instance: InstanceId,
    },
    /// The instance sends its call to the processor with the key's downstream key.
    Call {
        instance: InstanceId,
    },
    /// The connection is refused before anything is sent (the network, or a processor that is
    /// down).
    CallRefused {
        instance: InstanceId,
    },
    /// The instance stops waiting for its call's answer: the outcome is unknown, and the call may
    /// still be on its way (delayed).
    TimeOut {
        instance: InstanceId,
    },
    /// The instance resolves its call's outcome: completes the key with the charge (fenced by its
    /// lease), releases it (nothing was done), or suspends it (unknown).
    Resolve {
        instance: InstanceId,
    },
    /// The instance dies and restarts, its request lost; its lease runs out later.
    CrashInstance {
        instance: InstanceId,
    },
    /// A lease is not renewed in time (its holder died, stalled, or its heartbeat waited too
    /// long): the key may be taken over.
    LeaseRunsOut {
        key: KeySlot,
    },

    // --- the processor -------------------------------------------------------------------------
    /// The processor handles a call: charges (captures, voids, or refuses to), or answers as its
    /// key already did. The answer may be lost on the way back.
    Deliver {
        call: Call,
        answer_lost: bool,
    },
    /// The processor dies: connections are refused, calls on the network are dropped.
    CrashProcessor,
    RestartProcessor,
    /// The processor forgets one of its idempotency keys, its lifetime over.
    ProcessorForgets {
        downstream_key: DownstreamKey,
    },
    /// A cardholder's bank disputes a charge at the processor, which queues its event.
    OpenDispute {
        charge: ChargeId,
    },
    /// The processor delivers the dispute's event and idempay's intake answers it: applied to
    /// the payment of its charge, or parked while no payment records the charge; acknowledged
    /// either way.
    DeliverEvent,
    /// A parked event is applied once its charge is recorded: by the recording's own look after
    /// it commits, or by the sweep.
    ApplyParked,

    // --- background jobs, time and the operator ------------------------------------------------
    /// The recovery job claims a suspended key within the recovery window and resumes it on an
    /// idle instance.
    RecoveryClaims {
        key: KeySlot,
        instance: InstanceId,
    },
    /// A suspended key's recovery point passes the recovery window.
    WindowPasses {
        key: KeySlot,
    },
    /// The recovery job holds a suspended key past the window for an operator.
    HoldOverdue {
        key: KeySlot,
    },
    /// The expiry job deletes a completed key past its time to live; its client is gone.
    Expire {
        key: KeySlot,
    },
    /// An operator settles a held key from the processor's ledger (`idempay keys settle`).
    OperatorSettles {
        key: KeySlot,
    },
}
