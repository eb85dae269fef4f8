//! The recovery state of a refund (`refund.refund_requested`), recorded on its key before the call
//! to the processor and read by whichever release resumes the key: a format kept across releases,
//! with its own types and a version, like a payment's (payments/charge_state.rs). Golden fixtures
//! of each version live in `tests/fixtures/recovery_states/refund.refund_requested/`.
//!
//! - **Version 1**, written before versions: the fields below, without `version` (and, before
//!   refunds carried metadata, without `metadata`).
//! - **Version 2**: the same fields with `"version": 2`, so that a later change says what it is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use idempotency::StateVersion;

/// The version this release writes.
const V2: StateVersion = StateVersion::new(2);

/// Every version read, oldest first; the last is written.
pub const VERSIONS: &[StateVersion] = &[StateVersion::FIRST, V2];

/// What resuming a refund needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundState {
    /// Always 2: the format's version, read by the mechanism before this type.
    version: u16,
    pub account: String,
    /// The payment refunded.
    pub payment: String,
    /// The processor's charge the refund goes back through.
    pub charge: String,
    /// In the currency's minor units.
    pub amount: i64,
    pub reason: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// The refund's id, chosen before the call, so every attempt records the same refund.
    pub refund: String,
}

/// A refund's facts, to make its state of.
pub struct Refund {
    pub account: String,
    pub payment: String,
    pub charge: String,
    pub amount: i64,
    pub reason: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub refund: String,
}

impl RefundState {
    pub fn new(refund: Refund) -> Self {
        Self {
            version: V2.get(),
            account: refund.account,
            payment: refund.payment,
            charge: refund.charge,
            amount: refund.amount,
            reason: refund.reason,
            metadata: refund.metadata,
            refund: refund.refund,
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
            2 => Ok(Self::deserialize(state)?),
            other => anyhow::bail!("no reader for version {other}"),
        }
    }
}

/// Version 1, as the releases before versions wrote it.
#[derive(Deserialize)]
struct V1 {
    account: String,
    payment: String,
    charge: String,
    amount: i64,
    reason: Option<String>,
    /// Absent from a state recorded before refunds carried metadata: none.
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    refund: String,
}

impl From<V1> for RefundState {
    fn from(v1: V1) -> Self {
        Self::new(Refund {
            account: v1.account,
            payment: v1.payment,
            charge: v1.charge,
            amount: v1.amount,
            reason: v1.reason,
            metadata: v1.metadata,
            refund: v1.refund,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1_FIXTURE: &str =
        include_str!("../../tests/fixtures/recovery_states/refund.refund_requested/v1.json");
    const V2_FIXTURE: &str =
        include_str!("../../tests/fixtures/recovery_states/refund.refund_requested/v2.json");

    fn fixture(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    /// What this release writes is byte for byte the newest fixture.
    #[test]
    fn today_s_code_writes_exactly_the_newest_refund_state_fixture() {
        assert_eq!(VERSIONS.last(), Some(&V2));
        let written = RefundState::new(Refund {
            account: "acct_FixtureAccount01".to_owned(),
            payment: "pay_FixtureChargePayment0001".to_owned(),
            charge: "ch_FixtureCharge01".to_owned(),
            amount: 1200,
            reason: Some("requested_by_customer".to_owned()),
            metadata: BTreeMap::from([("ticket".to_owned(), "T-1".to_owned())]),
            refund: "re_FixtureRefundRefund00001".to_owned(),
        });
        assert_eq!(
            serde_json::to_string(&written).unwrap(),
            V2_FIXTURE.trim_end()
        );
        assert_eq!(StateVersion::of(&written.to_value().unwrap()), Some(V2));
    }

    #[test]
    fn every_refund_state_fixture_reads_as_the_same_refund() {
        let v1 = fixture(V1_FIXTURE);
        assert_eq!(StateVersion::of(&v1), Some(StateVersion::FIRST));
        let read = RefundState::read(StateVersion::FIRST, &v1).unwrap();
        assert_eq!(read, RefundState::read(V2, &fixture(V2_FIXTURE)).unwrap());
        // Before refunds carried metadata: none.
        let mut older = v1;
        older.as_object_mut().unwrap().remove("metadata");
        let older = RefundState::read(StateVersion::FIRST, &older).unwrap();
        assert!(older.metadata.is_empty());
        let mut extra = fixture(V2_FIXTURE);
        extra["instant"] = serde_json::Value::Bool(true);
        assert!(RefundState::read(V2, &extra).is_err());
    }
}
