//! The recovery state of a payment (`payment.charge_requested`), recorded on its key before the
//! charge and read by whichever release resumes the key: a format kept across releases, so it has
//! its own types (never the API's request type, whose changes it would otherwise follow) and a
//! version. Every version a release may still meet is read here; the newest is written. Golden
//! fixtures of each live in `tests/fixtures/recovery_states/payment.charge_requested/`.
//!
//! - **Version 1**, written before versions (none in the state): the account, the payment id, and
//!   the API's `NewPayment` as it serialized then, under `request`.
//! - **Version 2**: the same facts, flat, with `"version": 2`, in types of the state's own.
//! - **Version 3**: adds `capture_method` (`automatic`, `manual`): whether the charge authorizes
//!   only. Versions 1 and 2 are automatic, as every payment was then.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::CaptureMethod;
use super::{NewPayment, PaymentId};
use crate::accounts::AccountId;
use idempotency::StateVersion;

const V2: StateVersion = StateVersion::new(2);
/// The version this release writes.
const V3: StateVersion = StateVersion::new(3);

/// Every version read, oldest first; the last is written.
pub const VERSIONS: &[StateVersion] = &[StateVersion::FIRST, V2, V3];

/// What resuming a payment needs: the charge to ask for, and the payment to record of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChargeState {
    /// Always 3: the format's version, read by the mechanism before this type.
    version: u16,
    /// The account the payment is recorded for.
    pub account: String,
    /// The payment's id, chosen before the charge, so every attempt records the same payment.
    pub payment: String,
    /// In the currency's minor units.
    pub amount: i64,
    pub currency: String,
    pub payment_method: String,
    /// `automatic`, or `manual`: the charge only authorizes, and a capture takes the money later.
    pub capture_method: String,
    pub order: Option<String>,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

/// Version 2: version 3 without `capture_method`, automatic.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V2State {
    #[allow(
        dead_code,
        reason = "read by the mechanism, checked by the field's presence"
    )]
    version: u16,
    account: String,
    payment: String,
    amount: i64,
    currency: String,
    payment_method: String,
    order: Option<String>,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
}

impl From<V2State> for ChargeState {
    fn from(v2: V2State) -> Self {
        Self {
            version: V3.get(),
            account: v2.account,
            payment: v2.payment,
            amount: v2.amount,
            currency: v2.currency,
            payment_method: v2.payment_method,
            capture_method: CaptureMethod::Automatic.as_str().to_owned(),
            order: v2.order,
            description: v2.description,
            metadata: v2.metadata,
        }
    }
}

impl ChargeState {
    /// The state of a new payment: the request, converted once, here, from the API's type.
    pub fn new(account: &AccountId, payment: &PaymentId, request: NewPayment) -> Self {
        Self {
            version: V3.get(),
            account: account.as_str().to_owned(),
            payment: payment.as_str().to_owned(),
            amount: i64::from(request.amount),
            currency: request.currency.as_str().to_owned(),
            payment_method: request.payment_method.as_str().to_owned(),
            capture_method: request.capture_method.as_str().to_owned(),
            order: request.order.map(String::from),
            description: request.description.map(String::from),
            metadata: request.metadata.into_pairs(),
        }
    }

    /// The state as the key records it.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::to_value(self)
    }

    /// The state recorded in `version`, as this release works with it.
    pub fn read(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        match version.get() {
            1 => Ok(V1::deserialize(state)?.into()),
            2 => Ok(V2State::deserialize(state)?.into()),
            3 => Ok(Self::deserialize(state)?),
            other => anyhow::bail!("no reader for version {other}"),
        }
    }
}

/// Version 1, as the releases before versions wrote it.
#[derive(Deserialize)]
struct V1 {
    account: String,
    payment: String,
    request: RequestV1,
}

/// The API's `NewPayment` as it serialized when version 1 was written, with its defaults then.
#[derive(Deserialize)]
struct RequestV1 {
    amount: i64,
    currency: String,
    #[serde(default)]
    order: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default = "visa")]
    payment_method: String,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

/// Version 1's payment method when the request named none.
fn visa() -> String {
    "pm_card_visa".to_owned()
}

impl From<V1> for ChargeState {
    fn from(v1: V1) -> Self {
        Self {
            version: V3.get(),
            account: v1.account,
            payment: v1.payment,
            amount: v1.request.amount,
            currency: v1.request.currency,
            payment_method: v1.request.payment_method,
            capture_method: CaptureMethod::Automatic.as_str().to_owned(),
            order: v1.request.order,
            description: v1.request.description,
            metadata: v1.request.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_FIXTURE: &str =
        include_str!("../../tests/fixtures/recovery_states/payment.charge_requested/v1.json");
    const V2_FIXTURE: &str =
        include_str!("../../tests/fixtures/recovery_states/payment.charge_requested/v2.json");
    const V3_FIXTURE: &str =
        include_str!("../../tests/fixtures/recovery_states/payment.charge_requested/v3.json");

    /// The request every fixture records, as a client sent it.
    const REQUEST: &str = r#"{"amount":4200,"currency":"eur","order":"cmd_9182",
        "description":"Two espressos","payment_method":"pm_card_visa",
        "metadata":{"order_id":"6735","channel":"web"}}"#;

    fn fixture(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    /// What this release writes is byte for byte the newest fixture: a change of the format
    /// without a new version (and its fixture) fails here.
    #[test]
    fn today_s_code_writes_exactly_the_newest_charge_state_fixture() {
        assert_eq!(VERSIONS.last(), Some(&V3));
        let newest = fixture(V3_FIXTURE);
        let account: AccountId = serde_json::from_value(newest["account"].clone()).unwrap();
        let payment = PaymentId::parse(newest["payment"].as_str().unwrap()).unwrap();
        let request: NewPayment = serde_json::from_str(REQUEST).unwrap();
        let written = ChargeState::new(&account, &payment, request);
        assert_eq!(
            serde_json::to_string(&written).unwrap(),
            V3_FIXTURE.trim_end()
        );
        assert_eq!(StateVersion::of(&written.to_value().unwrap()), Some(V3));
    }

    /// The state the releases before versions wrote (version 1, the API's request nested) reads
    /// as the same charge and payment as the newest version.
    #[test]
    fn every_charge_state_fixture_reads_as_the_same_charge() {
        let v1 = fixture(V1_FIXTURE);
        assert_eq!(StateVersion::of(&v1), Some(StateVersion::FIRST));
        let read = ChargeState::read(StateVersion::FIRST, &v1).unwrap();
        assert_eq!(read, ChargeState::read(V2, &fixture(V2_FIXTURE)).unwrap());
        assert_eq!(read, ChargeState::read(V3, &fixture(V3_FIXTURE)).unwrap());
        assert_eq!(read.capture_method, "automatic");
        assert_eq!(read.payment, "pay_FixtureChargePayment0001");
        assert_eq!(read.metadata["order_id"], "6735");
        // Its defaults then: an order, a description and metadata absent, the Visa card.
        let bare = serde_json::json!({
            "account": "acct_FixtureAccount01",
            "payment": "pay_FixtureChargePayment0002",
            "request": { "amount": 1500, "currency": "usd" },
        });
        let bare = ChargeState::read(StateVersion::FIRST, &bare).unwrap();
        assert_eq!(
            (
                bare.payment_method.as_str(),
                bare.order,
                bare.metadata.len()
            ),
            ("pm_card_visa", None, 0)
        );
    }

    #[test]
    fn a_state_that_is_not_what_its_version_says_is_refused() {
        // Version 2's type refuses a field it does not know: a format changed without a new
        // version is never half read.
        let mut extra = fixture(V2_FIXTURE);
        extra["capture_method"] = serde_json::Value::from("manual");
        assert!(ChargeState::read(V2, &extra).is_err());
        assert!(ChargeState::read(V2, &fixture(V1_FIXTURE)).is_err());
        assert!(ChargeState::read(V3, &fixture(V2_FIXTURE)).is_err());
        assert!(ChargeState::read(StateVersion::new(4), &fixture(V3_FIXTURE)).is_err());
    }
}
