//! The refund resource, as the API returns it and as its row is read: the routes of `mod.rs` and
//! the refund's work in `refunding.rs` both build it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use utoipa::ToSchema;

use crate::metadata::Metadata;
use service::vocabulary::{stored, vocabulary};

service::public_id!(
    /// A refund's id: `re_` and 24 base62 characters. Anything else names no refund, and is not
    /// worth a query.
    pub RefundId, "re", 24, "a refund id"
);

vocabulary! {
    /// The state of a refund: `succeeded` when made, `failed` if the processor later reported it
    /// failed (the amount is refundable again).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum RefundStatus: "refund status" {
        Succeeded => "succeeded",
        Failed => "failed",
    }
}

/// A refund, as the API returns it.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "id": "re_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
    "object": "refund",
    "payment": "pay_U5PgTqA02dYsv3cLANIGkqIs",
    "amount": 1000,
    "reason": "requested_by_customer",
    "status": "succeeded",
    "processor_refund": "pyr_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
    "created_at": "2026-11-29T19:05:12.118230Z"
}))]
pub struct Refund {
    /// The refund's id, `re_` followed by 24 characters.
    #[schema(pattern = "^re_[0-9A-Za-z]{24}$")]
    pub id: String,
    /// Always `refund`.
    #[schema(value_type = String, pattern = "^refund$")]
    pub object: &'static str,
    /// The refunded payment.
    pub payment: String,
    /// The refunded amount, in minor units.
    #[schema(minimum = 1)]
    pub amount: i64,
    pub reason: Option<String>,
    #[schema(inline)]
    pub status: RefundStatus,
    /// The processor's refund this one records.
    #[schema(example = "pyr_Jx8bq2LkR5Vn0Ww3Zt7YcA1d")]
    pub processor_refund: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The merchant's key–value pairs, as sent; `{}` when none were.
    pub metadata: Metadata,
}

impl Refund {
    pub fn location(&self) -> String {
        format!("/v1/refunds/{}", self.id)
    }
}

/// A `refunds` row, as the queries read it.
pub(crate) struct RefundRow {
    pub id: String,
    pub payment_id: String,
    pub amount: i64,
    pub reason: Option<String>,
    pub status: String,
    pub processor_refund: Option<String>,
    pub created_at: DateTime<Utc>,
    pub metadata: Json<Metadata>,
}

impl RefundRow {
    /// The refund this row holds; a decoding error if its status is none the API knows.
    pub fn parse(self) -> Result<Refund, sqlx::Error> {
        Ok(Refund {
            id: self.id,
            object: "refund",
            payment: self.payment_id,
            amount: self.amount,
            reason: self.reason,
            status: stored(&self.status)?,
            processor_refund: self.processor_refund,
            created_at: self.created_at,
            metadata: self.metadata.0,
        })
    }
}
