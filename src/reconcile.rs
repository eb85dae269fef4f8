//! `idempay reconcile`: idempay's ledger against the processor's. Every charge at the processor
//! must be recorded by exactly one payment, for the same amount, currency, outcome, refunded and
//! disputed amounts; every refund by exactly one refund, of the same charge, and every dispute by
//! exactly one dispute, for the same amount; anything else is a difference, and a difference is a
//! bug (or money taken without a record). The processor is read through its list API, as an
//! operator would.
//!
//! [`reconcile`] reads idempay's ledger in one snapshot, then the processor's, then compares them
//! one section at a time (payments with charges, refunds, disputes), each section a function adding
//! its differences: another check is another section. The order makes the comparison consistent
//! while both keep changing: the processor makes a charge (or refund, or dispute) before idempay
//! records it, and never deletes one, so whatever idempay's snapshot names is in the processor's
//! ledger read after it. What the processor has and the snapshot does not is either recorded
//! since, or in flight (the key that asked for it is still in progress, its outcome being
//! settled), or a difference: idempay's ledger is read again for those alone (`Later`), after
//! the processor's, when every key that asked for one of them exists already. In flight is said,
//! not counted as a difference; a charge no key accounts for is one.
//!
//! A key held for an operator (its call to the processor unresolved past the recovery window) is a
//! difference too: the ledgers cannot agree until someone settles it (`idempay keys settle`); and
//! so is a processor's event parked for an object idempay has not recorded.

use std::collections::HashSet;

use sqlx::PgPool;

use crate::config::ProcessorLink;
use crate::downstream::ProcessorClient;
use crate::downstream::link::Linked;
use crate::webhooks;

mod difference;
mod in_flight;
mod ledgers;
mod sections;

pub use difference::Difference;
pub use in_flight::InFlight;
use in_flight::{Accounted, Later, Unrecorded};
pub use ledgers::SuspendedKey;
use ledgers::{Ours, Theirs};
use sections::{disputes_against_theirs, payments_against_charges, refunds_against_theirs};

/// Reconciles against the processor `link` names or, without a URL, against the processor
/// embedded in this database (as `serve` runs it), started on a loopback port for the purpose.
pub async fn run(pool: &PgPool, link: &ProcessorLink) -> anyhow::Result<Report> {
    let processor = Linked::to(pool, link.client()?, link.timeout).await?;
    let report = reconcile(pool, &processor.client).await;
    processor.stop().await?;
    report
}

/// What a reconciliation found.
#[derive(Debug, Default)]
pub struct Report {
    pub charges: usize,
    pub payments: usize,
    pub refunds: usize,
    pub disputes: usize,
    pub differences: Vec<Difference>,
    pub in_flight: Vec<InFlight>,
    /// Keys whose call to the processor has an unknown outcome, waiting for their client's retry
    /// or the recovery job: no difference yet (either settles them), but one an operator watches,
    /// since a key still suspended at the end of the recovery window is held.
    pub suspended: Vec<SuspendedKey>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty()
    }

    /// The line printed after the differences, if any: what was compared, and how many
    /// differences.
    pub fn summary(&self) -> String {
        let counted = [
            (self.charges, "charges"),
            (self.payments, "payments"),
            (self.refunds, "refunds"),
            (self.disputes, "disputes"),
        ]
        .map(|(count, what)| format!("{count} {what}"));
        let (last, first) = counted.split_last().expect("four counts");
        let in_flight = match self.in_flight.len() {
            0 => String::new(),
            count => format!(", {count} in flight"),
        };
        format!(
            "reconciled {} and {last}: {} difference(s){in_flight}",
            first.join(", "),
            self.differences.len()
        )
    }
}

/// Compares every payment, refund and dispute with the processor's charges, refunds and disputes.
pub async fn reconcile(pool: &PgPool, processor: &ProcessorClient) -> anyhow::Result<Report> {
    // idempay's ledger first: see the module's comment.
    let ours = Ours::read(pool).await?;
    let theirs = Theirs::read(processor).await?;
    let unrecorded = Unrecorded::of(&ours, &theirs);
    let later = if unrecorded.is_empty() {
        Later::default()
    } else {
        Later::read(pool, &unrecorded).await?
    };
    let accounted = Accounted::of(&unrecorded, &later);
    let mut differences = Vec::new();
    payments_against_charges(&ours, &theirs, &accounted.since, &mut differences);
    refunds_against_theirs(&ours.refunds, &theirs.refunds, &mut differences);
    disputes_against_theirs(&ours.disputes, &theirs.disputes, &mut differences);
    differences.extend(accounted.differences);
    differences.extend(ours.held.into_iter().map(|key| Difference::KeyHeld {
        scope: key.scope,
        key: key.idem_key,
        downstream_key: key.downstream_key,
        since: key.held_at,
    }));
    let parked = webhooks::parked::waiting(pool).await?;
    let recorded: HashSet<&str> = ours
        .payments
        .iter()
        .map(|payment| payment.charge.as_str())
        .chain(
            ours.refunds
                .iter()
                .map(|refund| refund.processor_refund.as_str()),
        )
        .collect();
    differences.extend(parked.into_iter().map(|event| Difference::EventParked {
        object_recorded: recorded.contains(event.object.as_str()),
        event: event.id,
        kind: event.kind,
        object: event.object,
        since: event.received_at,
    }));
    Ok(Report {
        charges: theirs.charges.len(),
        payments: ours.payments.len(),
        refunds: ours.refunds.len(),
        disputes: ours.disputes.len(),
        differences,
        in_flight: accounted.in_flight,
        suspended: ours.suspended,
    })
}
