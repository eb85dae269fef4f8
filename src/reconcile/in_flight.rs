//! What the processor has that idempay's first snapshot does not record, accounted for: recorded
//! since ([`Later`], idempay's ledger read again after the processor's), in flight (a key in
//! progress sent its downstream key), or a difference.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use sqlx::PgPool;

use super::Difference;
use super::ledgers::{Ours, Theirs};
use crate::downstream::{CaptureState, Charge, Dispute, ProcessorRefund};
use crate::payments::PaymentStatus;

/// Something the processor made that idempay is still recording: the key that asked for it is in
/// progress (its request still running, or suspended within the recovery window, to be resumed
/// by a retry or the recovery job). Not a difference; said, since it may become one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// A charge made under the downstream key of a key in progress: its payment is not recorded yet.
    Charge {
        charge: String,
        amount: i64,
        scope: String,
        key: String,
    },
    /// A capture or a void of an authorization made under the downstream key of a key in
    /// progress: the payment still `requires_capture` here.
    Release {
        charge: String,
        /// `captured` or `voided`: what the processor did.
        made: &'static str,
        scope: String,
        key: String,
    },
    /// A refund made under the downstream key of a key in progress: not recorded yet.
    Refund {
        processor_refund: String,
        amount: i64,
        scope: String,
        key: String,
    },
}

impl fmt::Display for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Charge {
                charge,
                amount,
                scope,
                key,
            } => write!(
                f,
                "charge {charge} ({amount}) in flight: key {key:?} ({scope}), which asked for it, \
                 is in progress; its payment is not recorded yet"
            ),
            Self::Release {
                charge,
                made,
                scope,
                key,
            } => write!(
                f,
                "charge {charge} {made} in flight: key {key:?} ({scope}), which asked for it, is \
                 in progress; its payment still requires capture here"
            ),
            Self::Refund {
                processor_refund,
                amount,
                scope,
                key,
            } => write!(
                f,
                "processor refund {processor_refund} ({amount}) in flight: key {key:?} ({scope}), \
                 which asked for it, is in progress; its refund is not recorded yet"
            ),
        }
    }
}

/// What the processor has that idempay's snapshot does not record: made since, or still being
/// recorded, or never recorded at all ([`Accounted`] tells them apart).
pub(super) struct Unrecorded<'a> {
    charges: Vec<&'a Charge>,
    /// Authorizations the processor captured or voided (or released) whose payment still
    /// `requires_capture` here: recorded since, in flight, or a difference the comparison shows.
    releases: Vec<&'a Charge>,
    refunds: Vec<&'a ProcessorRefund>,
    disputes: Vec<&'a Dispute>,
}

impl<'a> Unrecorded<'a> {
    pub(super) fn of(ours: &Ours, theirs: &'a Theirs) -> Self {
        let payments: BTreeSet<&str> = ours.payments.iter().map(|p| p.charge.as_str()).collect();
        let refunds: BTreeSet<&str> = ours
            .refunds
            .iter()
            .map(|r| r.processor_refund.as_str())
            .collect();
        let disputes: BTreeSet<&str> = ours.disputes.iter().map(|d| d.id.as_str()).collect();
        let held: BTreeSet<&str> = ours
            .payments
            .iter()
            .filter(|p| p.status == PaymentStatus::RequiresCapture)
            .map(|p| p.charge.as_str())
            .collect();
        Self {
            releases: theirs
                .charges
                .iter()
                .filter(|c| {
                    held.contains(c.id.as_str()) && c.capture_state != CaptureState::RequiresCapture
                })
                .collect(),
            charges: theirs
                .charges
                .iter()
                .filter(|c| !payments.contains(c.id.as_str()))
                .collect(),
            refunds: theirs
                .refunds
                .iter()
                .filter(|r| !refunds.contains(r.id.as_str()))
                .collect(),
            disputes: theirs
                .disputes
                .iter()
                .filter(|d| !disputes.contains(d.id.as_str()))
                .collect(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.charges.is_empty()
            && self.releases.is_empty()
            && self.refunds.is_empty()
            && self.disputes.is_empty()
    }
}

/// The downstream key a capture or a void of `charge` was made under.
fn release_key(charge: &Charge) -> Option<&str> {
    charge
        .capture_idempotency_key
        .as_deref()
        .or(charge.void_idempotency_key.as_deref())
}

/// idempay's ledger read again, after the processor's, for what the first snapshot did not
/// record: which of those it records now, and the keys in progress under whose downstream keys the
/// rest were made. Read then, every key that asked for one of them exists (a key is reserved, and
/// its downstream key recorded, before the call), unless it was released or deleted: a charge of
/// such a key is a difference.
#[derive(Default)]
pub(super) struct Later {
    charges: BTreeSet<String>,
    refunds: BTreeSet<String>,
    disputes: BTreeSet<String>,
    /// The keys in progress, by downstream key: their scope and key.
    in_progress: BTreeMap<String, (String, String)>,
}

impl Later {
    pub(super) async fn read(pool: &PgPool, unrecorded: &Unrecorded<'_>) -> anyhow::Result<Self> {
        let ids = |ids: Vec<&str>| ids.into_iter().map(str::to_owned).collect::<Vec<_>>();
        let charges = ids(unrecorded.charges.iter().map(|c| c.id.as_str()).collect());
        let refunds = ids(unrecorded.refunds.iter().map(|r| r.id.as_str()).collect());
        let disputes = ids(unrecorded.disputes.iter().map(|d| d.id.as_str()).collect());
        let downstream_keys = ids(unrecorded
            .charges
            .iter()
            .filter_map(|c| c.idempotency_key.as_deref())
            .chain(
                unrecorded
                    .refunds
                    .iter()
                    .filter_map(|r| r.idempotency_key.as_deref()),
            )
            .chain(unrecorded.releases.iter().filter_map(|c| release_key(c)))
            .collect());
        let mut tx = idempotency::connections::begin(pool).await?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let charges = sqlx::query_scalar!(
            r#"SELECT charge AS "charge!" FROM payments WHERE charge = ANY($1)"#,
            &charges,
        )
        .fetch_all(&mut *tx)
        .await?;
        let refunds = sqlx::query_scalar!(
            r#"SELECT processor_refund AS "processor_refund!" FROM refunds
               WHERE processor_refund = ANY($1)"#,
            &refunds,
        )
        .fetch_all(&mut *tx)
        .await?;
        let disputes = sqlx::query_scalar!("SELECT id FROM disputes WHERE id = ANY($1)", &disputes)
            .fetch_all(&mut *tx)
            .await?;
        let in_progress = sqlx::query!(
            r#"
            SELECT scope, idem_key, downstream_key AS "downstream_key!" FROM idempotency_keys
            WHERE status = 'in_progress' AND downstream_key = ANY($1)
            "#,
            &downstream_keys,
        )
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Self {
            charges: charges.into_iter().collect(),
            refunds: refunds.into_iter().collect(),
            disputes: disputes.into_iter().collect(),
            in_progress: in_progress
                .into_iter()
                .map(|key| (key.downstream_key, (key.scope, key.idem_key)))
                .collect(),
        })
    }

    /// The key in progress that `downstream_key` was sent by, if any.
    fn key_in_progress(&self, downstream_key: Option<&str>) -> Option<(String, String)> {
        self.in_progress.get(downstream_key?).cloned()
    }
}

/// The processor's objects the first snapshot did not record, accounted for: those recorded
/// since or in flight (left out of the figures compared, as the snapshot's figures do not count
/// them), and the others, each a difference.
#[derive(Default)]
pub(super) struct Accounted<'a> {
    /// Ids of the charges, refunds and disputes recorded since the snapshot or in flight.
    pub(super) since: BTreeSet<&'a str>,
    pub(super) in_flight: Vec<InFlight>,
    pub(super) differences: Vec<Difference>,
}

impl<'a> Accounted<'a> {
    pub(super) fn of(unrecorded: &Unrecorded<'a>, later: &Later) -> Self {
        let mut accounted = Self::default();
        for charge in &unrecorded.charges {
            if later.charges.contains(&charge.id) {
                accounted.since.insert(&charge.id);
            } else if let Some((scope, key)) =
                later.key_in_progress(charge.idempotency_key.as_deref())
            {
                accounted.since.insert(&charge.id);
                accounted.in_flight.push(InFlight::Charge {
                    charge: charge.id.clone(),
                    amount: charge.amount,
                    scope,
                    key,
                });
            } else {
                accounted
                    .differences
                    .push(Difference::ChargeWithoutPayment {
                        charge: charge.id.clone(),
                        amount: charge.amount,
                    });
            }
        }
        for refund in &unrecorded.refunds {
            if later.refunds.contains(&refund.id) {
                accounted.since.insert(&refund.id);
            } else if let Some((scope, key)) =
                later.key_in_progress(refund.idempotency_key.as_deref())
            {
                accounted.since.insert(&refund.id);
                accounted.in_flight.push(InFlight::Refund {
                    processor_refund: refund.id.clone(),
                    amount: refund.amount,
                    scope,
                    key,
                });
            } else {
                accounted.differences.push(Difference::RefundWithoutRecord {
                    processor_refund: refund.id.clone(),
                    amount: refund.amount,
                });
            }
        }
        // A capture or void whose key is still in progress: the payment's capture figures are
        // left out of the comparison (`since` holds the charge), as a charge's whole payment is.
        // Without such a key, the comparison shows the difference.
        for charge in &unrecorded.releases {
            if let Some((scope, key)) = later.key_in_progress(release_key(charge)) {
                accounted.since.insert(&charge.id);
                accounted.in_flight.push(InFlight::Release {
                    charge: charge.id.clone(),
                    made: match charge.capture_state {
                        CaptureState::Captured => "captured",
                        _ => "voided",
                    },
                    scope,
                    key,
                });
            }
        }
        // A dispute is recorded by the processor's event, which no key of idempay's asks for:
        // recorded since, or a difference (its event not applied yet, or lost).
        for dispute in &unrecorded.disputes {
            if later.disputes.contains(&dispute.id) {
                accounted.since.insert(&dispute.id);
            } else {
                accounted
                    .differences
                    .push(Difference::DisputeWithoutRecord {
                        dispute: dispute.id.clone(),
                        charge: dispute.charge.clone(),
                        amount: dispute.amount,
                    });
            }
        }
        accounted
    }
}
