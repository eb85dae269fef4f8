//! The simulated payment processor. It decides the outcome from the test payment method, as
//! Stripe's test cards do, so every path of the API can be tried without a real card network.

use std::time::Duration;

use super::model::{PaymentMethod, PaymentStatus};

/// What the processor answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChargeOutcome {
    Succeeded,
    Declined { decline_code: &'static str },
}

impl ChargeOutcome {
    pub fn status(self) -> PaymentStatus {
        match self {
            Self::Succeeded => PaymentStatus::Succeeded,
            Self::Declined { .. } => PaymentStatus::Declined,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Processor {
    slow_charge: Duration,
}

impl Processor {
    pub fn new(slow_charge: Duration) -> Self {
        Self { slow_charge }
    }

    /// Charges the payment method. Like a real processor call it may take a while, so it runs
    /// outside any database transaction.
    pub async fn charge(&self, method: PaymentMethod) -> ChargeOutcome {
        match method {
            PaymentMethod::CardVisa => ChargeOutcome::Succeeded,
            PaymentMethod::CardChargeDeclined => ChargeOutcome::Declined {
                decline_code: "generic_decline",
            },
            PaymentMethod::CardSlow => {
                tokio::time::sleep(self.slow_charge).await;
                ChargeOutcome::Succeeded
            }
        }
    }
}
