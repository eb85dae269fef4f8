//! The sections of the comparison, each adding its differences: payments against charges (with
//! the figures a squeezed dispute or what was recorded since changes), refunds, disputes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::Difference;
use super::ledgers::{OurDispute, OurRefund, Ours, Theirs};
use crate::downstream::{
    CaptureState, Charge, ChargeStatus, Dispute, DisputeStatus as ProcessorDisputeStatus,
    ProcessorRefund, RefundStatus,
};
use crate::payments::PaymentStatus;
use crate::refunds::RefundStatus as OurRefundStatus;

/// Each payment against its charge: the amount, the currency, the outcome, what was refunded (the
/// charge's `amount_refunded`) and what is disputed (the sum of the processor's disputes of the
/// charge), leaving out what the processor made since the snapshot was read or is still being
/// recorded (`since`), which the payment's figures do not count yet. Charges no payment records
/// are [`Accounted`] for apart.
pub(super) fn payments_against_charges(
    ours: &Ours,
    theirs: &Theirs,
    since: &BTreeSet<&str>,
    differences: &mut Vec<Difference>,
) {
    let by_charge: BTreeMap<&str, &Charge> =
        theirs.charges.iter().map(|c| (c.id.as_str(), c)).collect();
    let mut refunded_since: BTreeMap<&str, i64> = BTreeMap::new();
    for refund in theirs
        .refunds
        .iter()
        .filter(|r| since.contains(r.id.as_str()))
    {
        if refund.status == RefundStatus::Succeeded {
            *refunded_since.entry(refund.charge.as_str()).or_default() += refund.amount;
        }
    }
    let mut disputed: BTreeMap<&str, Disputed> = BTreeMap::new();
    // A won dispute gave its amount back: it is disputed no more, on either ledger.
    for dispute in theirs
        .disputes
        .iter()
        .filter(|d| d.status != ProcessorDisputeStatus::Won)
    {
        let charge = disputed.entry(dispute.charge.as_str()).or_default();
        if since.contains(dispute.id.as_str()) {
            charge.since += dispute.amount;
        } else {
            charge.recorded += dispute.amount;
        }
    }
    for payment in &ours.payments {
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
        let refunded = Figure::less(
            charge.amount_refunded,
            refunded_since.get(charge.id.as_str()).copied().unwrap_or(0),
        );
        let disputed = disputed
            .get(charge.id.as_str())
            .copied()
            .unwrap_or_default();
        let disputed = Figure::less(disputed.recorded + disputed.since, disputed.since);
        // What the disputes hold on our side is derived (`payments::disputed`): those not won, at
        // most what was captured and not refunded. A dispute over more than remained is recorded
        // in full and flagged `needs_review`; the payment's figure takes only what fits, and so
        // is compared here.
        let disputed = disputed.capped(payment.amount_captured - payment.amount_refunded);
        let figures = [
            (
                "amount",
                payment.amount.to_string(),
                charge.amount.to_string(),
            ),
            (
                "currency",
                payment.currency.clone(),
                charge.currency.clone(),
            ),
            (
                "outcome",
                outcome.as_str().to_owned(),
                charge.status.as_str().to_owned(),
            ),
            (
                "capture",
                captured(payment.status).to_owned(),
                released(charge.capture_state).to_owned(),
            ),
            (
                "amount_captured",
                payment.amount_captured.to_string(),
                charge
                    .amount_captured
                    .unwrap_or(match charge.status {
                        ChargeStatus::Succeeded => charge.amount,
                        ChargeStatus::Declined => 0,
                    })
                    .to_string(),
            ),
            (
                "amount_capturable",
                payment.amount_capturable.to_string(),
                match charge.capture_state {
                    CaptureState::RequiresCapture => charge.amount,
                    _ => 0,
                }
                .to_string(),
            ),
            (
                "cancellation_reason",
                released_by(payment.status, payment.expired).to_owned(),
                match charge.capture_state {
                    CaptureState::Voided => "void",
                    CaptureState::Expired => "expired",
                    _ => "none",
                }
                .to_owned(),
            ),
            (
                "amount_refunded",
                payment.amount_refunded.to_string(),
                refunded.expected().to_string(),
            ),
            (
                "amount_disputed",
                payment.amount_disputed.to_string(),
                disputed.expected().to_string(),
            ),
        ];
        // A capture or void in flight (its key in progress): the payment still requires capture
        // here, and its capture figures are left out until it is recorded.
        let releasing = since.contains(charge.id.as_str());
        for (field, ours, expected) in figures {
            let capture_figure = matches!(
                field,
                "capture" | "amount_captured" | "amount_capturable" | "cancellation_reason"
            );
            if releasing && capture_figure {
                continue;
            }
            if ours != expected {
                let processor = match field {
                    "amount_refunded" => refunded.to_string(),
                    "amount_disputed" => disputed.to_string(),
                    _ => expected,
                };
                differences.push(Difference::Mismatch {
                    payment: payment.id.clone(),
                    charge: charge.id.clone(),
                    field,
                    ours,
                    processor,
                });
            }
        }
    }
}

/// Where a payment's money is, as the processor's capture states name it: held while it
/// `requires_capture`, released once `canceled`, taken otherwise (a decline took nothing, and its
/// charge is `captured` of nothing).
fn captured(status: PaymentStatus) -> &'static str {
    match status {
        PaymentStatus::RequiresCapture => "requires_capture",
        PaymentStatus::Canceled => "released",
        _ => "captured",
    }
}

/// How a canceled payment's money was released, as the processor's capture states tell it apart:
/// by the processor's expiry (`cancellation_reason` `expired`) or by a void (any other reason).
fn released_by(status: PaymentStatus, expired: bool) -> &'static str {
    match (status, expired) {
        (PaymentStatus::Canceled, true) => "expired",
        (PaymentStatus::Canceled, false) => "void",
        _ => "none",
    }
}

/// A charge's capture state, its two ways of releasing the money as one: idempay's payment is
/// `canceled` either way.
fn released(state: CaptureState) -> &'static str {
    match state {
        CaptureState::Captured => "captured",
        CaptureState::RequiresCapture => "requires_capture",
        CaptureState::Voided | CaptureState::Expired => "released",
    }
}

/// The processor's disputes of one charge: the amounts the snapshot records, and those it does
/// not because they were recorded since.
#[derive(Clone, Copy, Debug, Default)]
struct Disputed {
    recorded: i64,
    since: i64,
}

/// A figure of the processor's (a refunded or disputed amount), as a payment must show it: less
/// what the payment's snapshot could not count yet, and for the disputes, no more than what was
/// captured and not refunded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Figure {
    processor: i64,
    since: i64,
    cap: Option<i64>,
}

impl Figure {
    fn less(processor: i64, since: i64) -> Self {
        Self {
            processor,
            since,
            cap: None,
        }
    }

    fn capped(self, cap: i64) -> Self {
        Self {
            cap: Some(cap),
            ..self
        }
    }

    fn expected(self) -> i64 {
        let counted = self.processor - self.since;
        self.cap.map_or(counted, |cap| counted.min(cap))
    }
}

/// The processor's figure, and what makes the expected one differ from it.
impl fmt::Display for Figure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.processor)?;
        if self.since > 0 {
            write!(f, " (less {} recorded since or in flight)", self.since)?;
        }
        if let Some(cap) = self.cap.filter(|&cap| cap < self.processor - self.since) {
            write!(f, " (at most the {cap} captured and not refunded)")?;
        }
        Ok(())
    }
}

/// Each refund against the processor's refund it names (its outcome, its charge and its amount).
/// The processor's refunds no refund records are [`Accounted`] for apart.
pub(super) fn refunds_against_theirs(
    ours: &[OurRefund],
    theirs: &[ProcessorRefund],
    differences: &mut Vec<Difference>,
) {
    let by_refund: BTreeMap<&str, &ProcessorRefund> =
        theirs.iter().map(|r| (r.id.as_str(), r)).collect();
    for refund in ours {
        let detail = match by_refund.get(refund.processor_refund.as_str()) {
            None => format!(
                "names processor refund {}, which the processor does not have",
                refund.processor_refund
            ),
            Some(theirs)
                if (theirs.status == RefundStatus::Failed)
                    != (refund.status == OurRefundStatus::Failed) =>
            {
                format!(
                    "is {} here, {:?} at the processor",
                    refund.status, theirs.status
                )
            }
            Some(theirs) if refund.charge.as_deref() != Some(theirs.charge.as_str()) => format!(
                "is of charge {} here (its payment's), {} at the processor",
                refund.charge.as_deref().unwrap_or("(none)"),
                theirs.charge
            ),
            Some(theirs) if theirs.amount != refund.amount => format!(
                "amount is {} here, {} at the processor",
                refund.amount, theirs.amount
            ),
            Some(_) => continue,
        };
        differences.push(Difference::RefundMismatch {
            refund: refund.id.clone(),
            detail,
        });
    }
}

/// Each dispute against the processor's dispute of the same id (its charge, amount and where it
/// stands: a dispute flagged `needs_review` is compared in full, as recorded). The processor's disputes no dispute
/// records (one whose event was never applied) are [`Accounted`] for apart.
pub(super) fn disputes_against_theirs(
    ours: &[OurDispute],
    theirs: &[Dispute],
    differences: &mut Vec<Difference>,
) {
    let by_dispute: BTreeMap<&str, &Dispute> = theirs.iter().map(|d| (d.id.as_str(), d)).collect();
    for dispute in ours {
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
            Some(theirs) if theirs.status.as_str() != dispute.status.as_str() => format!(
                "is {} here, {} at the processor",
                dispute.status, theirs.status
            ),
            Some(_) => continue,
        };
        differences.push(Difference::DisputeMismatch {
            dispute: dispute.id.clone(),
            detail,
        });
    }
}
