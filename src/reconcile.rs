//! `idempay reconcile`: idempay's ledger against the processor's. Every charge at the processor
//! must be recorded by exactly one payment, for the same amount and outcome, and every refund by
//! exactly one refund; anything else is a difference, and a difference is a bug (or money taken
//! without a record). The processor is read through its list API, as an operator would.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::ProcessorLink;
use crate::ids;
use crate::processor::{
    ChargeStatus, Processor, ProcessorApiKey, ProcessorClient, ProcessorSettings, RefundStatus,
};

/// Reconciles against the processor `link` names or, without a URL, against the processor
/// embedded in this database (as `serve` runs it), started on a loopback port for the purpose.
pub async fn run(pool: &PgPool, link: &ProcessorLink) -> anyhow::Result<Report> {
    if let Some(client) = link.client()? {
        return reconcile(pool, &client).await;
    }
    let api_key = ids::generate("sk_reconcile", 32);
    let settings =
        ProcessorSettings::new(ProcessorApiKey::parse(&api_key).map_err(anyhow::Error::msg)?);
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
    let processor = Processor::build(settings, pool.clone(), listener)?.sharing_expiry();
    let client = ProcessorClient::new(
        &format!("http://{}", processor.local_addr()?),
        api_key,
        link.timeout,
    )?;
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let serving =
        tokio::spawn(processor.run_until_stopped(async move { stopped.cancelled().await }));
    let report = reconcile(pool, &client).await;
    stop.cancel();
    serving.await??;
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
        }
    }
}

/// What a reconciliation found.
#[derive(Debug, Default)]
pub struct Report {
    pub charges: usize,
    pub payments: usize,
    pub refunds: usize,
    pub differences: Vec<Difference>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.differences.is_empty()
    }

    /// The line printed after the differences, if any.
    pub fn summary(&self) -> String {
        format!(
            "reconciled {} charges, {} payments and {} refunds: {} difference(s)",
            self.charges,
            self.payments,
            self.refunds,
            self.differences.len()
        )
    }
}

/// Compares every payment and refund with the processor's charges and refunds.
pub async fn reconcile(pool: &PgPool, processor: &ProcessorClient) -> anyhow::Result<Report> {
    let charges = processor.charges().await?;
    let processor_refunds = processor.refunds().await?;
    let payments = sqlx::query!(
        r#"
        SELECT id, charge AS "charge!", amount, status, amount_refunded
        FROM payments WHERE charge IS NOT NULL
        "#
    )
    .fetch_all(pool)
    .await?;
    let refunds = sqlx::query!(
        r#"
        SELECT id, processor_refund AS "processor_refund!", amount, status
        FROM refunds WHERE processor_refund IS NOT NULL
        "#
    )
    .fetch_all(pool)
    .await?;

    let mut report = Report {
        charges: charges.len(),
        payments: payments.len(),
        refunds: refunds.len(),
        differences: Vec::new(),
    };
    let by_charge: BTreeMap<&str, _> = charges.iter().map(|c| (c.id.as_str(), c)).collect();
    let mut recorded = BTreeSet::new();
    for payment in &payments {
        recorded.insert(payment.charge.as_str());
        let Some(charge) = by_charge.get(payment.charge.as_str()) else {
            report.differences.push(Difference::PaymentWithoutCharge {
                payment: payment.id.clone(),
                charge: payment.charge.clone(),
            });
            continue;
        };
        // `refunded` and `failed` are later states of a succeeded charge.
        let outcome = if payment.status == "declined" {
            ChargeStatus::Declined
        } else {
            ChargeStatus::Succeeded
        };
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
        ];
        for (field, ours, theirs) in figures {
            if ours != theirs {
                report.differences.push(Difference::Mismatch {
                    payment: payment.id.clone(),
                    charge: charge.id.clone(),
                    field,
                    ours,
                    processor: theirs,
                });
            }
        }
    }
    for charge in &charges {
        if !recorded.contains(charge.id.as_str()) {
            report.differences.push(Difference::ChargeWithoutPayment {
                charge: charge.id.clone(),
                amount: charge.amount,
            });
        }
    }

    let by_refund: BTreeMap<&str, _> = processor_refunds
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    let mut recorded = BTreeSet::new();
    for refund in &refunds {
        recorded.insert(refund.processor_refund.as_str());
        match by_refund.get(refund.processor_refund.as_str()) {
            None => report.differences.push(Difference::RefundMismatch {
                refund: refund.id.clone(),
                detail: format!(
                    "names processor refund {}, which the processor does not have",
                    refund.processor_refund
                ),
            }),
            Some(theirs)
                if (theirs.status == RefundStatus::Failed) != (refund.status == "failed") =>
            {
                report.differences.push(Difference::RefundMismatch {
                    refund: refund.id.clone(),
                    detail: format!(
                        "is {} here, {:?} at the processor",
                        refund.status, theirs.status
                    ),
                });
            }
            Some(theirs) if theirs.amount != refund.amount => {
                report.differences.push(Difference::RefundMismatch {
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
    for theirs in &processor_refunds {
        if !recorded.contains(theirs.id.as_str()) {
            report.differences.push(Difference::RefundWithoutRecord {
                processor_refund: theirs.id.clone(),
                amount: theirs.amount,
            });
        }
    }
    Ok(report)
}
