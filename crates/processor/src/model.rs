//! The processor's resources, in the shape its clients read them (the client deserializes the same
//! types), and the requests that create them, parsed so that once one exists it is valid.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use service::vocabulary::{stored, vocabulary};

/// The most one charge may be, in minor units: a card network's bound, not a client's.
const MAX_AMOUNT: i64 = 99_999_999;

/// An amount of money in the currency's minor units (cents for `eur`), 1 to 99,999,999
/// (`MAX_AMOUNT`): what is charged, refunded or disputed. An integer in JSON; a fraction is refused, never rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "i64")]
pub struct Amount(i64);

impl TryFrom<i64> for Amount {
    type Error = String;

    fn try_from(minor_units: i64) -> Result<Self, Self::Error> {
        if (1..=MAX_AMOUNT).contains(&minor_units) {
            Ok(Self(minor_units))
        } else {
            Err(format!(
                "amount must be an integer from 1 to {MAX_AMOUNT} in minor units, got {minor_units}"
            ))
        }
    }
}

impl From<Amount> for i64 {
    fn from(amount: Amount) -> Self {
        amount.0
    }
}

/// A currency code as ISO 4217 has it, in lowercase (`eur`): three letters. Which currencies a
/// merchant may use is the merchant's service's to say (idempay checks its list before it calls);
/// the processor records what it charged in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Currency(String);

impl TryFrom<String> for Currency {
    type Error = String;

    fn try_from(code: String) -> Result<Self, Self::Error> {
        if code.len() == 3 && code.bytes().all(|b| b.is_ascii_lowercase()) {
            Ok(Self(code))
        } else {
            Err(format!(
                "`{code}` is not a currency code of three lowercase letters (such as `eur`)"
            ))
        }
    }
}

impl Currency {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

vocabulary! {
    /// The test cards, which decide a charge's outcome as Stripe's test payment methods do.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum PaymentMethod: "payment method" {
        /// Always succeeds.
        #[default]
        CardVisa => "pm_card_visa",
        /// Always declined: the charge is recorded as `declined` and answered 402.
        CardChargeDeclined => "pm_card_chargeDeclined",
        /// Succeeds after `IDEMPAY_SLOW_CHARGE`.
        CardSlow => "pm_card_slow",
    }
}

/// A charge to make. Unknown fields are refused. `pm_card_visa` when no method is given.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCharge {
    pub amount: Amount,
    pub currency: Currency,
    #[serde(default)]
    pub payment_method: PaymentMethod,
    /// `false` authorizes only: the money is held on the card until a capture takes it (all or
    /// part) or a void releases it, and an authorization not captured within the processor's
    /// `IDEMPAY_PROCESSOR_AUTHORIZATION_TTL` expires. `true` when absent, as charges always were.
    #[serde(default = "captured_at_once")]
    pub capture: bool,
}

fn captured_at_once() -> bool {
    true
}

/// A capture of an authorized charge: all of it when no amount is given; the rest is released.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewCapture {
    #[serde(default)]
    pub amount: Option<Amount>,
}

/// A void of an authorized charge: nothing to say but the charge, in the path.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewVoid {}

vocabulary! {
    /// Where a charge's money is: taken (`captured`), held on the card (`requires_capture`), or
    /// released, by a void (`voided`) or because nobody captured it in time (`expired`). A declined
    /// charge is `captured` of nothing: it never held money.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum CaptureState: "capture state" {
        #[default]
        Captured => "captured",
        RequiresCapture => "requires_capture",
        Voided => "voided",
        Expired => "expired",
    }
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

vocabulary! {
    /// What became of a charge: a decline is a result, recorded like a success.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ChargeStatus: "charge status" {
        Succeeded => "succeeded",
        Declined => "declined",
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
    /// Whether the money was taken, is held, or was released. `captured` in answers stored before
    /// authorizations existed, when every charge was.
    #[serde(default)]
    pub capture_state: CaptureState,
    /// What was taken: the amount of a charge captured at once, what a capture took of an
    /// authorization, 0 while one is held or once it was released (and for a decline). Absent from
    /// answers stored before authorizations existed: then the whole amount, or 0 for a decline.
    #[serde(default)]
    pub amount_captured: Option<i64>,
    /// The `Idempotency-Key` its capture was made under, once captured by a capture: how a client
    /// that lost the answer to its capture learns that this one is its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_idempotency_key: Option<String>,
    /// The `Idempotency-Key` its void was made under, once voided, as for a capture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub void_idempotency_key: Option<String>,
    /// The `Idempotency-Key` the charge was made under (by idempay, its downstream key): how
    /// `GET /v1/charges?idempotency_key=…` finds it, and how `idempay reconcile` tells a charge
    /// whose payment is still being recorded. Absent from a charge read from a stored answer made
    /// before charges carried it.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
}

vocabulary! {
    /// The state of a refund at the processor: made when it is recorded; `failed` when the card
    /// network gave it back later (the amount is the charge's again).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum RefundStatus: "processor refund status" {
        Succeeded => "succeeded",
        Failed => "failed",
    }
}

vocabulary! {
    /// The types of the events the processor sends (to `IDEMPAY_PROCESSOR_WEBHOOK_URL`), each
    /// written to its outbox with the change it announces.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum ProcessorEventType: "processor event type" {
        ChargeSucceeded => "charge.succeeded",
        ChargeDeclined => "charge.declined",
        ChargeRefunded => "charge.refunded",
        ChargeDisputeCreated => "charge.dispute.created",
        ChargeRefundFailed => "charge.refund.failed",
        ChargeCaptured => "charge.captured",
        ChargeVoided => "charge.voided",
        ChargeExpired => "charge.expired",
        ChargeDisputeUpdated => "charge.dispute.updated",
        ChargeDisputeClosed => "charge.dispute.closed",
    }
}

impl ProcessorEventType {
    /// The event that announces a charge with this result.
    pub fn of_charge(status: ChargeStatus) -> Self {
        match status {
            ChargeStatus::Succeeded => Self::ChargeSucceeded,
            ChargeStatus::Declined => Self::ChargeDeclined,
        }
    }
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
    /// The `Idempotency-Key` the refund was made under, as for a [`Charge`].
    #[serde(default)]
    pub idempotency_key: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A dispute opened on a charge (with `"object": "dispute"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispute {
    /// `dp_…`
    pub id: String,
    pub charge: String,
    pub amount: i64,
    /// Where it stands; `needs_response` in answers stored before disputes had outcomes.
    #[serde(default)]
    pub status: DisputeStatus,
    pub created_at: DateTime<Utc>,
}

vocabulary! {
    /// A dispute's lifecycle, as Stripe's: opened (`needs_response`), evidence submitted
    /// (`under_review`), then closed by the cardholder's bank, `won` (the money comes back to the
    /// charge) or `lost` (it stays with the cardholder).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub enum DisputeStatus: "dispute status" {
        #[default]
        NeedsResponse => "needs_response",
        UnderReview => "under_review",
        Won => "won",
        Lost => "lost",
    }
}

impl DisputeStatus {
    /// Whether the bank has decided: nothing changes a closed dispute.
    pub fn is_closed(self) -> bool {
        matches!(self, Self::Won | Self::Lost)
    }
}

/// How a test closes a dispute, as the cardholder's bank decides it.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisputeClosing {
    pub outcome: DisputeOutcome,
}

/// The bank's decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeOutcome {
    Won,
    Lost,
}

/// A resource with its `object` member, as the API sends it: the types stay free of a constant
/// field, and the client reads them back ignoring it.
#[derive(Serialize)]
pub(crate) struct Tagged<'a, T> {
    object: &'static str,
    #[serde(flatten)]
    resource: &'a T,
}

pub(crate) fn tagged<'a, T>(object: &'static str, resource: &'a T) -> Tagged<'a, T> {
    Tagged { object, resource }
}

service::public_id!(
    /// A charge's id: `ch_` and 24 base62 characters.
    pub ChargeId, "ch", 24, "a charge id"
);

service::public_id!(
    /// A refund's id at the processor: `pyr_` and 24 base62 characters.
    pub RefundId, "pyr", 24, "a refund id"
);

service::public_id!(
    /// A dispute's id: `dp_` and 24 base62 characters.
    pub DisputeId, "dp", 24, "a dispute id"
);

/// A `processor_charges` row.
pub(crate) struct ChargeRow {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub payment_method: String,
    pub decline_code: Option<String>,
    pub amount_refunded: i64,
    pub capture_state: String,
    pub amount_captured: Option<i64>,
    pub capture_key: Option<String>,
    pub void_key: Option<String>,
    pub idempotency_key: String,
    pub created_at: DateTime<Utc>,
}

impl ChargeRow {
    /// The charge this row holds; a decoding error if its status is unknown.
    pub(crate) fn parse(self) -> Result<Charge, sqlx::Error> {
        let status = stored(&self.status)?;
        Ok(Charge {
            id: self.id,
            amount: self.amount,
            currency: self.currency,
            status,
            payment_method: self.payment_method,
            decline_code: self.decline_code,
            amount_refunded: self.amount_refunded,
            capture_state: stored(&self.capture_state)?,
            // NULL on the charges made before authorizations, each captured at once.
            amount_captured: Some(self.amount_captured.unwrap_or(match status {
                ChargeStatus::Succeeded => self.amount,
                ChargeStatus::Declined => 0,
            })),
            capture_idempotency_key: self.capture_key,
            void_idempotency_key: self.void_key,
            idempotency_key: Some(self.idempotency_key),
            created_at: self.created_at,
        })
    }
}

/// A `processor_disputes` row.
pub(crate) struct DisputeRow {
    pub id: String,
    pub charge: String,
    pub amount: i64,
    pub status: String,
    pub created_at: DateTime<Utc>,
}

impl DisputeRow {
    /// The dispute this row holds; a decoding error if its status is unknown.
    pub(crate) fn parse(self) -> Result<Dispute, sqlx::Error> {
        Ok(Dispute {
            id: self.id,
            charge: self.charge,
            amount: self.amount,
            status: stored(&self.status)?,
            created_at: self.created_at,
        })
    }
}

/// A `processor_refunds` row.
pub(crate) struct RefundRow {
    pub id: String,
    pub charge_id: String,
    pub amount: i64,
    pub status: String,
    pub idempotency_key: String,
    pub created_at: DateTime<Utc>,
}

impl RefundRow {
    /// The refund this row holds; a decoding error if its status is unknown.
    pub(crate) fn parse(self) -> Result<ProcessorRefund, sqlx::Error> {
        Ok(ProcessorRefund {
            id: self.id,
            charge: self.charge_id,
            amount: self.amount,
            status: stored(&self.status)?,
            idempotency_key: Some(self.idempotency_key),
            created_at: self.created_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_charge_or_refund_status_that_is_none_of_ours_is_an_error() {
        let charge = |status: &str| ChargeRow {
            id: "ch_1".to_owned(),
            amount: 100,
            currency: "eur".to_owned(),
            status: status.to_owned(),
            payment_method: "pm_card_visa".to_owned(),
            decline_code: None,
            amount_refunded: 0,
            capture_state: "captured".to_owned(),
            amount_captured: Some(100),
            capture_key: None,
            void_key: None,
            idempotency_key: "idk_1".to_owned(),
            created_at: Utc::now(),
        };
        let refund = |status: &str| RefundRow {
            id: "pyr_1".to_owned(),
            charge_id: "ch_1".to_owned(),
            amount: 5,
            status: status.to_owned(),
            idempotency_key: "idk_2".to_owned(),
            created_at: Utc::now(),
        };
        for status in ChargeStatus::ALL {
            assert_eq!(charge(status.as_str()).parse().unwrap().status, *status);
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
        for status in RefundStatus::ALL {
            assert_eq!(refund(status.as_str()).parse().unwrap().status, *status);
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
        // Neither is taken for `succeeded`, as they once were.
        let unknown = charge("pending").parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown charge status `pending`"),
            "{unknown}"
        );
        let unknown = refund("FAILED").parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown processor refund status `FAILED`"),
            "{unknown}"
        );
    }

    #[test]
    fn an_amount_is_a_positive_integer_and_a_currency_three_lowercase_letters() {
        let new = |body: &str| serde_json::from_str::<NewCharge>(body);
        let charge = new(r#"{"amount": 4200, "currency": "eur"}"#).unwrap();
        assert_eq!(i64::from(charge.amount), 4200);
        assert_eq!(charge.payment_method, PaymentMethod::CardVisa);
        for refused in [
            r#"{"amount": 0, "currency": "eur"}"#,
            r#"{"amount": 42.5, "currency": "eur"}"#,
            r#"{"amount": 100000000, "currency": "eur"}"#,
            r#"{"amount": 1, "currency": "EUR"}"#,
            r#"{"amount": 1, "currency": "euro"}"#,
            r#"{"amount": 1, "currency": "eur", "payment_method": "pm_card_unknown"}"#,
        ] {
            assert!(new(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn ids_have_their_own_prefixes_and_are_recognised() {
        assert!(ChargeId::fits(ChargeId::generate().as_str()));
        assert!(RefundId::fits(RefundId::generate().as_str()));
        assert!(DisputeId::fits(DisputeId::generate().as_str()));
        assert!(RefundId::generate().as_str().starts_with("pyr_"));
        assert!(!ChargeId::fits("ch_short"));
        assert!(!RefundId::fits(ChargeId::generate().as_str()));
        assert!(!ChargeId::fits("chx_aaaaaaaaaaaaaaaaaaaaaaaa"));
    }

    #[test]
    fn a_charge_is_sent_with_its_object_and_read_back_without_it() {
        let charge = Charge {
            id: ChargeId::generate().into(),
            amount: 4200,
            currency: "eur".into(),
            status: ChargeStatus::Declined,
            payment_method: "pm_card_chargeDeclined".into(),
            decline_code: Some("generic_decline".into()),
            amount_refunded: 0,
            capture_state: CaptureState::Captured,
            amount_captured: Some(0),
            capture_idempotency_key: None,
            void_idempotency_key: None,
            idempotency_key: Some("idk_1".into()),
            created_at: Utc::now(),
        };
        let json = serde_json::to_value(tagged("charge", &charge)).unwrap();
        assert_eq!(json["object"], "charge");
        assert_eq!(json["status"], "declined");
        assert_eq!(serde_json::from_value::<Charge>(json).unwrap(), charge);
    }
}
