//! The processor's resources, in the shape its clients read them (the client deserializes the same
//! types), and the requests that create them, parsed so that once one exists it is valid.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids;
use crate::payments::{Amount, Currency, PaymentMethod};

/// The length of the random part of every processor id.
const ID_LEN: usize = 24;

/// A charge to make. Unknown fields are refused. `pm_card_visa` when no method is given.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCharge {
    pub amount: Amount,
    pub currency: Currency,
    #[serde(default)]
    pub payment_method: PaymentMethod,
}

/// A refund to make: all that remains refundable when no amount is given.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRefund {
    #[serde(default)]
    pub amount: Option<Amount>,
}

/// A dispute to open, as a cardholder's bank would.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewDispute {
    pub amount: Amount,
}

/// What became of a charge: a decline is a result, recorded like a success.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    Succeeded,
    Declined,
}

impl ChargeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Declined => "declined",
        }
    }

    /// The column's value; its CHECK constraint admits no other.
    pub(super) fn from_stored(status: &str) -> Self {
        if status == "declined" {
            Self::Declined
        } else {
            Self::Succeeded
        }
    }
}

/// A charge, as `GET /v1/charges/{id}` answers it (with `"object": "charge"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// `ch_…`
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: ChargeStatus,
    pub payment_method: String,
    /// Why the charge was declined; `None` when it succeeded.
    pub decline_code: Option<String>,
    pub amount_refunded: i64,
    pub created_at: DateTime<Utc>,
}

/// The state of a refund at the processor: made when it is recorded; `failed` when the card
/// network gave it back later (the amount is the charge's again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundStatus {
    Succeeded,
    Failed,
}

/// A refund, as the processor lists it (with `"object": "refund"`). Its id is `pyr_…`, apart from
/// idempay's own refunds (`re_…`), so a log line never leaves in doubt whose refund it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessorRefund {
    /// `pyr_…`
    pub id: String,
    /// The refunded charge, `ch_…`.
    pub charge: String,
    pub amount: i64,
    pub status: RefundStatus,
    pub created_at: DateTime<Utc>,
}

/// A dispute opened on a charge (with `"object": "dispute"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispute {
    /// `dp_…`
    pub id: String,
    pub charge: String,
    pub amount: i64,
    pub created_at: DateTime<Utc>,
}

/// A resource with its `object` member, as the API sends it: the types stay free of a constant
/// field, and the client reads them back ignoring it.
#[derive(Serialize)]
pub(super) struct Tagged<'a, T> {
    object: &'static str,
    #[serde(flatten)]
    resource: &'a T,
}

pub(super) fn tagged<'a, T>(object: &'static str, resource: &'a T) -> Tagged<'a, T> {
    Tagged { object, resource }
}

/// The kinds of id the processor hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IdKind {
    Charge,
    Refund,
    Dispute,
}

impl IdKind {
    fn prefix(self) -> &'static str {
        match self {
            Self::Charge => "ch",
            Self::Refund => "pyr",
            Self::Dispute => "dp",
        }
    }

    pub(super) fn generate(self) -> String {
        ids::generate(self.prefix(), ID_LEN)
    }

    /// Whether `raw` has this kind's shape; anything else names nothing and is not worth a query.
    pub(super) fn is(self, raw: &str) -> bool {
        raw.strip_prefix(self.prefix())
            .and_then(|rest| rest.strip_prefix('_'))
            .is_some_and(|random| {
                random.len() == ID_LEN && random.bytes().all(|b| b.is_ascii_alphanumeric())
            })
    }
}

/// A `processor_charges` row.
pub(super) struct ChargeRow {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub payment_method: String,
    pub decline_code: Option<String>,
    pub amount_refunded: i64,
    pub created_at: DateTime<Utc>,
}

impl From<ChargeRow> for Charge {
    fn from(row: ChargeRow) -> Self {
        Self {
            id: row.id,
            amount: row.amount,
            currency: row.currency,
            status: ChargeStatus::from_stored(&row.status),
            payment_method: row.payment_method,
            decline_code: row.decline_code,
            amount_refunded: row.amount_refunded,
            created_at: row.created_at,
        }
    }
}

/// A `processor_refunds` row.
pub(super) struct RefundRow {
    pub id: String,
    pub charge_id: String,
    pub amount: i64,
    pub status: String,
    pub created_at: DateTime<Utc>,
}

impl From<RefundRow> for ProcessorRefund {
    fn from(row: RefundRow) -> Self {
        Self {
            id: row.id,
            charge: row.charge_id,
            amount: row.amount,
            status: if row.status == "failed" {
                RefundStatus::Failed
            } else {
                RefundStatus::Succeeded
            },
            created_at: row.created_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_their_own_prefixes_and_are_recognised() {
        for kind in [IdKind::Charge, IdKind::Refund, IdKind::Dispute] {
            let id = kind.generate();
            assert!(kind.is(&id), "{id}");
        }
        assert!(IdKind::Refund.generate().starts_with("pyr_"));
        assert!(!IdKind::Charge.is("ch_short"));
        assert!(!IdKind::Refund.is(&IdKind::Charge.generate()));
        assert!(!IdKind::Charge.is("chx_aaaaaaaaaaaaaaaaaaaaaaaa"));
    }

    #[test]
    fn a_charge_is_sent_with_its_object_and_read_back_without_it() {
        let charge = Charge {
            id: IdKind::Charge.generate(),
            amount: 4200,
            currency: "eur".into(),
            status: ChargeStatus::Declined,
            payment_method: "pm_card_chargeDeclined".into(),
            decline_code: Some("generic_decline".into()),
            amount_refunded: 0,
            created_at: Utc::now(),
        };
        let json = serde_json::to_value(tagged("charge", &charge)).unwrap();
        assert_eq!(json["object"], "charge");
        assert_eq!(json["status"], "declined");
        assert_eq!(serde_json::from_value::<Charge>(json).unwrap(), charge);
    }
}
