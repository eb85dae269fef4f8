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
//! settled), or a difference: idempay's ledger is read again for those alone ([`Later`]), after
//! the processor's, when every key that asked for one of them exists already. In flight is said,
//! not counted as a difference; a charge no key accounts for is one.
//!
//! A key held for an operator (its call to the processor unsettled past the recovery window) is a
//! difference too: the ledgers cannot agree until someone settles it (`idempay keys settle`); and
//! so is a processor's event parked for an object idempay has not recorded.

use std::fmt;

use sqlx::PgPool;

use crate::config::ProcessorLink;
use crate::disputes::DisputeStatus;
use crate::downstream::ProcessorClient;
use crate::downstream::link::Linked;
use crate::payments::PaymentStatus;
use crate::refunds::RefundStatus as OurRefundStatus;
use crate::webhooks;
use processor::{Charge, Dispute, ProcessorRefund};
use service::vocabulary::stored;

mod in_flight;
mod sections;

pub use in_flight::InFlight;
use in_flight::{Accounted, Later, Unrecorded};
use sections::{disputes_against_theirs, payments_against_charges, refunds_against_theirs};

/// Reconciles against the processor `link` names or, without a URL, against the processor
/// embedded in this database (as `serve` runs it), started on a loopback port for the purpose.
pub async fn run(pool: &PgPool, link: &ProcessorLink) -> anyhow::Result<Report> {
    let processor = Linked::to(pool, link.client()?, link.timeout).await?;
    let report = reconcile(pool, &processor.client).await;
    processor.stop().await?;
    report
}

/// One way the two ledgers disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Difference {
    /// The processor charged, and no payment records it.
    ChargeWithoutPayment { charge: String, amount: i64 },
    /// A payment names a charge the processor does not have.
    PaymentWithoutCharge { payment: String, charge: String },
    /// The payment and its charge disagree on a figure or the outcome.
    Mismatch {
        payment: String,
        charge: String,
        field: &'static str,
        ours: String,
        processor: String,
    },
    /// The processor refunded, and no refund records it.
    RefundWithoutRecord {
        processor_refund: String,
        amount: i64,
    },
    /// A refund names a processor refund that does not exist, or differs from it.
    RefundMismatch { refund: String, detail: String },
    /// A dispute was opened at the processor, and no dispute records it.
    DisputeWithoutRecord {
        dispute: String,
        charge: String,
        amount: i64,
    },
    /// A dispute of a charged payment is not the processor's, or differs from it.
    DisputeMismatch { dispute: String, detail: String },
    /// A key whose call to the processor stayed unsettled past the recovery window: nothing
    /// resumes it by itself, and an operator settles it with the processor's ledger (which may
    /// hold a charge or refund under its downstream key, also named above if so).
    KeyHeld {
        scope: String,
        key: String,
        downstream_key: Option<String>,
        since: chrono::DateTime<chrono::Utc>,
    },
    /// A processor's event about a charge or refund that idempay has not recorded, kept since
    /// `since` to be applied once it is: one whose object is never recorded waits for good.
    EventParked {
        event: String,
        kind: String,
        object: String,
        since: chrono::DateTime<chrono::Utc>,
    },
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ChargeWithoutPayment { charge, amount } => {
                write!(f, "charge {charge} ({amount}) has no payment")
            }
            Self::PaymentWithoutCharge { payment, charge } => {
                write!(
                    f,
                    "payment {payment} names charge {charge}, which the processor does not have"
                )
            }
            Self::Mismatch {
                payment,
                charge,
                field,
                ours,
                processor,
            } => write!(
                f,
                "payment {payment} / charge {charge}: {field} is {ours} here, {processor} at the processor"
            ),
            Self::RefundWithoutRecord {
                processor_refund,
                amount,
            } => write!(
                f,
                "processor refund {processor_refund} ({amount}) has no refund"
            ),
            Self::RefundMismatch { refund, detail } => write!(f, "refund {refund}: {detail}"),
            Self::DisputeWithoutRecord {
                dispute,
                charge,
                amount,
            } => write!(
                f,
                "processor dispute {dispute} ({amount}) of charge {charge} has no dispute"
            ),
            Self::DisputeMismatch { dispute, detail } => write!(f, "dispute {dispute}: {detail}"),
            Self::KeyHeld {
                scope,
                key,
                downstream_key,
                since,
            } => write!(
                f,
                "key {key:?} ({scope}) held for an operator since {}: its call to the processor \
                 with downstream key {} has no known outcome; settle it with \
                 `idempay keys settle {key:?} --account {}` (ops/runbooks.md)",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                downstream_key.as_deref().unwrap_or("(none)"),
                scope
                    .split_once(':')
                    .map_or(scope.as_str(), |(account, _)| account),
            ),
            Self::EventParked {
                event,
                kind,
                object,
                since,
            } => write!(
                f,
                "event {event} ({kind}) parked since {}: waits for {object}, which idempay has \
                 not recorded",
                since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ),
        }
    }
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

/// A key suspended at its recovery point (in progress, no request holding it).
#[derive(Debug)]
pub struct SuspendedKey {
    scope: String,
    idem_key: String,
    recovery_point: String,
    downstream_key: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    recoveries: i32,
}

impl fmt::Display for SuspendedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "warning: key {:?} ({}) suspended at {} since {} ({} recovery attempts): its call to \
             the processor with downstream key {} has no known outcome yet; a retry or the \
             recovery job settles it, or it is held at the end of the recovery window",
            self.idem_key,
            self.scope,
            self.recovery_point,
            self.created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            self.recoveries,
            self.downstream_key.as_deref().unwrap_or("(none)"),
        )
    }
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

/// The processor's ledger, as its list API gives it.
struct Theirs {
    charges: Vec<Charge>,
    refunds: Vec<ProcessorRefund>,
    disputes: Vec<Dispute>,
}

impl Theirs {
    async fn read(processor: &ProcessorClient) -> anyhow::Result<Self> {
        Ok(Self {
            charges: processor.charges().await?,
            refunds: processor.refunds().await?,
            disputes: processor.disputes().await?,
        })
    }
}

/// idempay's ledger: the rows that name an object of the processor's, and the keys whose call to
/// it is held for an operator.
struct Ours {
    payments: Vec<OurPayment>,
    refunds: Vec<OurRefund>,
    disputes: Vec<OurDispute>,
    held: Vec<HeldKey>,
    suspended: Vec<SuspendedKey>,
}

/// A key held for an operator (`status = 'held'`).
struct HeldKey {
    scope: String,
    idem_key: String,
    downstream_key: Option<String>,
    held_at: chrono::DateTime<chrono::Utc>,
}

/// A payment with the charge that recorded it.
struct OurPayment {
    id: String,
    charge: String,
    amount: i64,
    currency: String,
    status: PaymentStatus,
    amount_refunded: i64,
    amount_disputed: i64,
}

/// A refund with the processor's refund that made it, and its payment's charge. (A refund carries
/// no currency, here or at the processor: it is in its charge's, whose currency is its payment's.)
struct OurRefund {
    id: String,
    processor_refund: String,
    charge: Option<String>,
    amount: i64,
    status: OurRefundStatus,
}

/// A dispute of a charged payment, by the processor's dispute id, with that payment's charge.
struct OurDispute {
    id: String,
    charge: String,
    amount: i64,
    status: DisputeStatus,
}

impl Ours {
    /// The whole ledger in one snapshot (on Citus, one per node, each holding whole accounts: a
    /// payment is read with its refunds and disputes), so that a payment's figures and the rows
    /// they sum are of one moment.
    async fn read(pool: &PgPool) -> anyhow::Result<Self> {
        let mut tx = pool.begin().await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        // A status none of ours is an error, not a difference to report.
        let payments = sqlx::query!(
            r#"
            SELECT id, charge AS "charge!", amount, currency, status, amount_refunded,
                   amount_disputed
            FROM payments WHERE charge IS NOT NULL
            "#
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurPayment {
                status: stored(&row.status)?,
                id: row.id,
                charge: row.charge,
                amount: row.amount,
                currency: row.currency,
                amount_refunded: row.amount_refunded,
                amount_disputed: row.amount_disputed,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        let refunds = sqlx::query!(
            r#"
            SELECT r.id, r.processor_refund AS "processor_refund!", r.amount, r.status, p.charge
            FROM refunds r
            JOIN payments p ON p.account_id = r.account_id AND p.id = r.payment_id
            WHERE r.processor_refund IS NOT NULL
            "#
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurRefund {
                status: stored(&row.status)?,
                id: row.id,
                processor_refund: row.processor_refund,
                charge: row.charge,
                amount: row.amount,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        // A dispute is recorded under the processor's id for it (`data.dispute` of its event); one
        // of a payment with no charge has nothing at the processor to be compared with.
        let disputes = sqlx::query!(
            r#"
            SELECT d.id, p.charge AS "charge!", d.amount, d.status
            FROM disputes d
            JOIN payments p ON p.account_id = d.account_id AND p.id = d.payment_id
            WHERE p.charge IS NOT NULL
            "#
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurDispute {
                status: stored(&row.status)?,
                id: row.id,
                charge: row.charge,
                amount: row.amount,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        let held = sqlx::query_as!(
            HeldKey,
            r#"
            SELECT scope, idem_key, downstream_key, held_at AS "held_at!"
            FROM idempotency_keys WHERE status = 'held'
            ORDER BY held_at
            "#
        )
        .fetch_all(&mut *tx)
        .await?;
        let suspended = sqlx::query_as!(
            SuspendedKey,
            r#"
            SELECT scope, idem_key, recovery_point AS "recovery_point!", downstream_key,
                   created_at, recoveries
            FROM idempotency_keys
            WHERE status = 'in_progress' AND recovery_point IS NOT NULL AND locked_until <= now()
            ORDER BY created_at
            "#
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Self {
            payments,
            refunds,
            disputes,
            held,
            suspended,
        })
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
    differences.extend(parked.into_iter().map(|event| Difference::EventParked {
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
