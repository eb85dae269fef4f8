//! `idempay reconcile`: idempay's ledger against the processor's. Every charge at the processor
//! must be recorded by exactly one payment, for the same amount, outcome, refunded and disputed
//! amounts; every refund by exactly one refund, and every dispute by exactly one dispute, for the
//! same amount; anything else is a difference, and a difference is a bug (or money taken without a
//! record). The processor is read through its list API, as an operator would.
//!
//! [`reconcile`] reads both ledgers once, then compares them one section at a time (payments with
//! charges, refunds, disputes), each section a function adding its differences: another check is
//! another section. A key held for an operator (its call to the processor unsettled past the
//! recovery window) is a difference too: the ledgers cannot agree until someone settles it; and so
//! is a processor's event parked for an object idempay has not recorded.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sqlx::PgPool;

use crate::config::ProcessorLink;
use crate::downstream::ProcessorClient;
use crate::downstream::link::Linked;
use crate::payments::PaymentStatus;
use crate::refunds::RefundStatus as OurRefundStatus;
use crate::webhooks;
use processor::{Charge, ChargeStatus, Dispute, ProcessorRefund, RefundStatus};
use service::vocabulary::stored;

/// Reconciles against the processor `link` names or, without a URL, against the processor
/// embedded in this database (as `serve` runs it), started on a loopback port for the purpose.
pub async fn run(pool: &PgPool, link: &ProcessorLink) -> anyhow::Result<Report> {
    let processor = Linked::to(pool, link).await?;
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
        format!(
            "reconciled {} and {last}: {} difference(s)",
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
    status: PaymentStatus,
    amount_refunded: i64,
    amount_disputed: i64,
}

/// A refund with the processor's refund that made it.
struct OurRefund {
    id: String,
    processor_refund: String,
    amount: i64,
    status: OurRefundStatus,
}

/// A dispute of a charged payment, by the processor's dispute id, with that payment's charge.
struct OurDispute {
    id: String,
    charge: String,
    amount: i64,
}

impl Ours {
    async fn read(pool: &PgPool) -> anyhow::Result<Self> {
        // A status none of ours is an error, not a difference to report.
        let payments = sqlx::query!(
            r#"
            SELECT id, charge AS "charge!", amount, status, amount_refunded, amount_disputed
            FROM payments WHERE charge IS NOT NULL
            "#
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurPayment {
                status: stored(&row.status)?,
                id: row.id,
                charge: row.charge,
                amount: row.amount,
                amount_refunded: row.amount_refunded,
                amount_disputed: row.amount_disputed,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        let refunds = sqlx::query!(
            r#"
            SELECT id, processor_refund AS "processor_refund!", amount, status
            FROM refunds WHERE processor_refund IS NOT NULL
            "#
        )
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|row| {
            Ok(OurRefund {
                status: stored(&row.status)?,
                id: row.id,
                processor_refund: row.processor_refund,
                amount: row.amount,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
        // A dispute is recorded under the processor's id for it (`data.dispute` of its event); one
        // of a payment with no charge has nothing at the processor to be compared with.
        let disputes = sqlx::query_as!(
            OurDispute,
            r#"
            SELECT d.id, p.charge AS "charge!", d.amount
            FROM disputes d
            JOIN payments p ON p.account_id = d.account_id AND p.id = d.payment_id
            WHERE p.charge IS NOT NULL
            "#
        )
        .fetch_all(pool)
        .await?;
        let held = sqlx::query_as!(
            HeldKey,
            r#"
            SELECT scope, idem_key, downstream_key, held_at AS "held_at!"
            FROM idempotency_keys WHERE status = 'held'
            ORDER BY held_at
            "#
        )
        .fetch_all(pool)
        .await?;
        Ok(Self {
            payments,
            refunds,
            disputes,
            held,
        })
    }
}

/// Compares every payment, refund and dispute with the processor's charges, refunds and disputes.
pub async fn reconcile(pool: &PgPool, processor: &ProcessorClient) -> anyhow::Result<Report> {
    let theirs = Theirs::read(processor).await?;
    let ours = Ours::read(pool).await?;
    let mut differences = Vec::new();
    payments_against_charges(&ours, &theirs, &mut differences);
    refunds_against_theirs(&ours.refunds, &theirs.refunds, &mut differences);
    disputes_against_theirs(&ours.disputes, &theirs.disputes, &mut differences);
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
    })
}

/// Each payment against its charge: the amount, the outcome, what was refunded (the charge's
/// `amount_refunded`) and what is disputed (the sum of the processor's disputes of the charge);
/// and each charge recorded by a payment.
fn payments_against_charges(ours: &Ours, theirs: &Theirs, differences: &mut Vec<Difference>) {
    let by_charge: BTreeMap<&str, &Charge> =
        theirs.charges.iter().map(|c| (c.id.as_str(), c)).collect();
    let mut disputed: BTreeMap<&str, i64> = BTreeMap::new();
    for dispute in &theirs.disputes {
        *disputed.entry(dispute.charge.as_str()).or_default() += dispute.amount;
    }
    let mut recorded = BTreeSet::new();
    for payment in &ours.payments {
        recorded.insert(payment.charge.as_str());
        let Some(charge) = by_charge.get(payment.charge.as_str()) else {
            differences.push(Difference::PaymentWithoutCharge {
                payment: payment.id.clone(),
                charge: payment.charge.clone(),
            });
            continue;
        };
        // `refunded` and `failed` are later states of a succeeded charge.
        let outcome = if payment.status == PaymentStatus::Declined {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Succeeded
        };
        let charge_disputed = disputed.get(charge.id.as_str()).copied().unwrap_or(0);
        let figures = [
            (
                "amount",
                payment.amount.to_string(),
                charge.amount.to_string(),
            ),
            (
                "outcome",
                outcome.as_str().to_owned(),
                charge.status.as_str().to_owned(),
            ),
            (
                "amount_refunded",
                payment.amount_refunded.to_string(),
                charge.amount_refunded.to_string(),
            ),
            (
                "amount_disputed",
                payment.amount_disputed.to_string(),
                charge_disputed.to_string(),
            ),
        ];
        for (field, ours, theirs) in figures {
            if ours != theirs {
                differences.push(Difference::Mismatch {
                    payment: payment.id.clone(),
                    charge: charge.id.clone(),
                    field,
                    ours,
                    processor: theirs,
                });
            }
        }
    }
    for charge in &theirs.charges {
        if !recorded.contains(charge.id.as_str()) {
            differences.push(Difference::ChargeWithoutPayment {
                charge: charge.id.clone(),
                amount: charge.amount,
            });
        }
    }
}

/// Each refund against the processor's refund it names (its outcome and amount), and each of the
/// processor's refunds recorded by a refund.
fn refunds_against_theirs(
    ours: &[OurRefund],
    theirs: &[ProcessorRefund],
    differences: &mut Vec<Difference>,
) {
    let by_refund: BTreeMap<&str, &ProcessorRefund> =
        theirs.iter().map(|r| (r.id.as_str(), r)).collect();
    let mut recorded = BTreeSet::new();
    for refund in ours {
        recorded.insert(refund.processor_refund.as_str());
        match by_refund.get(refund.processor_refund.as_str()) {
            None => differences.push(Difference::RefundMismatch {
                refund: refund.id.clone(),
                detail: format!(
                    "names processor refund {}, which the processor does not have",
                    refund.processor_refund
                ),
            }),
            Some(theirs)
                if (theirs.status == RefundStatus::Failed)
                    != (refund.status == OurRefundStatus::Failed) =>
            {
                differences.push(Difference::RefundMismatch {
                    refund: refund.id.clone(),
                    detail: format!(
                        "is {} here, {:?} at the processor",
                        refund.status, theirs.status
                    ),
                });
            }
            Some(theirs) if theirs.amount != refund.amount => {
                differences.push(Difference::RefundMismatch {
                    refund: refund.id.clone(),
                    detail: format!(
                        "amount is {} here, {} at the processor",
                        refund.amount, theirs.amount
                    ),
                });
            }
            Some(_) => {}
        }
    }
    for theirs in theirs {
        if !recorded.contains(theirs.id.as_str()) {
            differences.push(Difference::RefundWithoutRecord {
                processor_refund: theirs.id.clone(),
                amount: theirs.amount,
            });
        }
    }
}

/// Each dispute against the processor's dispute of the same id (its charge and amount: a dispute
/// flagged `needs_review` is compared in full, as recorded), and each of the processor's disputes
/// recorded by a dispute: one whose event was never applied shows here.
fn disputes_against_theirs(
    ours: &[OurDispute],
    theirs: &[Dispute],
    differences: &mut Vec<Difference>,
) {
    let by_dispute: BTreeMap<&str, &Dispute> = theirs.iter().map(|d| (d.id.as_str(), d)).collect();
    let mut recorded = BTreeSet::new();
    for dispute in ours {
        recorded.insert(dispute.id.as_str());
        let detail = match by_dispute.get(dispute.id.as_str()) {
            None => "the processor has no such dispute".to_owned(),
            Some(theirs) if theirs.charge != dispute.charge => format!(
                "is of charge {} here, {} at the processor",
                dispute.charge, theirs.charge
            ),
            Some(theirs) if theirs.amount != dispute.amount => format!(
                "amount is {} here, {} at the processor",
                dispute.amount, theirs.amount
            ),
            Some(_) => continue,
        };
        differences.push(Difference::DisputeMismatch {
            dispute: dispute.id.clone(),
            detail,
        });
    }
    for theirs in theirs {
        if !recorded.contains(theirs.id.as_str()) {
            differences.push(Difference::DisputeWithoutRecord {
                dispute: theirs.id.clone(),
                charge: theirs.charge.clone(),
                amount: theirs.amount,
            });
        }
    }
}
