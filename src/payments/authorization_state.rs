//! The recovery states of a manual payment's capture (`payment.capture_requested`) and cancel
//! (`payment.cancel_requested`), recorded on the key before the call to the processor and read by
//! whichever release resumes it: formats kept across releases, with types of their own (never
//! the API's request types) and a version, like a charge's (charge_state.rs). Golden fixtures
//! live in `tests/fixtures/recovery_states/payment.capture_requested/` and
//! `…/payment.cancel_requested/`.
//!
//! - **Version 1**: the fields below, with `"version": 1`.

use serde::{Deserialize, Serialize};

use idempotency::StateVersion;

/// The version this release writes.
const V1: StateVersion = StateVersion::FIRST;

/// Every version read, oldest first; the last is written.
pub const VERSIONS: &[StateVersion] = &[V1];

/// What resuming a capture needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureState {
    /// Always 1: the format's version, read by the mechanism before this type.
    version: u16,
    pub account: String,
    /// The payment captured, `pay_…`.
    pub payment: String,
    /// The processor's authorized charge, `ch_…`.
    pub charge: String,
    /// What the capture takes, in minor units; the rest of the authorization is released.
    pub amount: i64,
}

/// What resuming a cancel needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelState {
    /// Always 1: the format's version, read by the mechanism before this type.
    version: u16,
    pub account: String,
    /// The payment canceled, `pay_…`.
    pub payment: String,
    /// The processor's authorized charge, `ch_…`, voided.
    pub charge: String,
    /// The merchant's reason, as the API spells it; `None` when none was given.
    pub reason: Option<String>,
}

impl CaptureState {
    pub fn new(account: String, payment: String, charge: String, amount: i64) -> Self {
        Self {
            version: V1.get(),
            account,
            payment,
            charge,
            amount,
        }
    }

    /// The state recorded in `version`, as this release works with it.
    pub fn read(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        match version.get() {
            1 => Ok(Self::deserialize(state)?),
            other => anyhow::bail!("no reader for version {other}"),
        }
    }
}

impl CancelState {
    pub fn new(account: String, payment: String, charge: String, reason: Option<String>) -> Self {
        Self {
            version: V1.get(),
            account,
            payment,
            charge,
            reason,
        }
    }

    /// The state recorded in `version`, as this release works with it.
    pub fn read(version: StateVersion, state: &serde_json::Value) -> anyhow::Result<Self> {
        match version.get() {
            1 => Ok(Self::deserialize(state)?),
            other => anyhow::bail!("no reader for version {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPTURE_V1: &str =
        include_str!("../../tests/fixtures/recovery_states/payment.capture_requested/v1.json");
    const CANCEL_V1: &str =
        include_str!("../../tests/fixtures/recovery_states/payment.cancel_requested/v1.json");

    /// What this release writes is byte for byte the newest fixture: a change of either format
    /// without a new version (and its fixture) fails here.
    #[test]
    fn today_s_code_writes_exactly_the_newest_capture_and_cancel_fixtures() {
        assert_eq!(VERSIONS.last(), Some(&V1));
        let capture = CaptureState::new(
            "acct_FixtureAccount01".to_owned(),
            "pay_FixtureChargePayment0001".to_owned(),
            "ch_FixtureCharge01".to_owned(),
            3000,
        );
        assert_eq!(
            serde_json::to_string(&capture).unwrap(),
            CAPTURE_V1.trim_end()
        );
        let cancel = CancelState::new(
            "acct_FixtureAccount01".to_owned(),
            "pay_FixtureChargePayment0001".to_owned(),
            "ch_FixtureCharge01".to_owned(),
            Some("requested_by_customer".to_owned()),
        );
        assert_eq!(
            serde_json::to_string(&cancel).unwrap(),
            CANCEL_V1.trim_end()
        );
        for state in [CAPTURE_V1, CANCEL_V1] {
            let value: serde_json::Value = serde_json::from_str(state).unwrap();
            assert_eq!(StateVersion::of(&value), Some(V1));
        }
    }

    #[test]
    fn a_state_that_is_not_what_its_version_says_is_refused() {
        let mut extra: serde_json::Value = serde_json::from_str(CAPTURE_V1).unwrap();
        extra["release"] = serde_json::Value::from(100);
        assert!(CaptureState::read(V1, &extra).is_err());
        let capture: serde_json::Value = serde_json::from_str(CAPTURE_V1).unwrap();
        assert!(CancelState::read(V1, &capture).is_err());
        assert!(CaptureState::read(StateVersion::new(2), &capture).is_err());
    }
}
