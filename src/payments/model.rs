//! The payment resource and the types its request is parsed into: once a [`NewPayment`] exists,
//! every field in it is valid.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::currency::Currency;
use crate::http::error::Problem;
use crate::metadata::Metadata;
use idempotency::decimal::Decimal;
use service::ids::PublicId;
use service::vocabulary::{stored, vocabulary};

/// The largest amount accepted, in minor units (999 999.99 in a two-decimal currency).
pub const MAX_AMOUNT: i64 = 99_999_999;
const MAX_ORDER_LEN: usize = 255;
const MAX_DESCRIPTION_LEN: usize = 1000;

/// An amount in the currency's minor units (cents for `eur`), never a float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Box<RawValue>", into = "i64")]
pub struct Amount(i64);

/// JSON has one number type: `4200.0` and `42e2` are the integer 4200, as JSON Schema sees them
/// too. The number is read from its text, not through a float that would round
/// `4200.0000000000001` to 4200: a fraction, however small, is refused, never rounded.
impl TryFrom<Box<RawValue>> for Amount {
    type Error = String;

    fn try_from(raw: Box<RawValue>) -> Result<Self, Self::Error> {
        let text = raw.get().trim();
        let number =
            Decimal::parse(text).ok_or_else(|| format!("amount must be a number, got {text}"))?;
        if !number.is_integer() {
            return Err(format!(
                "amount must be an integer in minor units, got {text}"
            ));
        }
        match number.to_i64() {
            Some(minor_units) => Self::try_from(minor_units),
            None => Err(format!(
                "amount must be an integer from 1 to {MAX_AMOUNT} in minor units, got {text}"
            )),
        }
    }
}

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

/// Text fields are stored as PostgreSQL text, which cannot hold a NUL character.
pub fn reject_nul(field: &str, text: &str) -> Result<(), String> {
    if text.contains('\0') {
        Err(format!("{field} must not contain the NUL character"))
    } else {
        Ok(())
    }
}

/// The merchant's reference for the order being paid.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OrderRef(String);

impl TryFrom<String> for OrderRef {
    type Error = String;

    fn try_from(order: String) -> Result<Self, Self::Error> {
        reject_nul("order", &order)?;
        if order.chars().count() <= MAX_ORDER_LEN {
            Ok(Self(order))
        } else {
            Err(format!("order must be at most {MAX_ORDER_LEN} characters"))
        }
    }
}

impl From<OrderRef> for String {
    fn from(order: OrderRef) -> Self {
        order.0
    }
}

/// A free-text description shown to the merchant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Description(String);

impl TryFrom<String> for Description {
    type Error = String;

    fn try_from(description: String) -> Result<Self, Self::Error> {
        reject_nul("description", &description)?;
        if description.chars().count() <= MAX_DESCRIPTION_LEN {
            Ok(Self(description))
        } else {
            Err(format!(
                "description must be at most {MAX_DESCRIPTION_LEN} characters"
            ))
        }
    }
}

impl From<Description> for String {
    fn from(description: Description) -> Self {
        description.0
    }
}

vocabulary! {
    /// The test payment methods of the simulated processor, which decide the outcome as Stripe's test
    /// cards do: `pm_card_visa` succeeds, `pm_card_chargeDeclined` is declined (402) and
    /// `pm_card_slow` succeeds after a delay, its key in progress meanwhile. `pm_card_visa` when absent.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ToSchema)]
    pub enum PaymentMethod: "payment method" {
        /// Always succeeds.
        #[default]
        CardVisa => "pm_card_visa",
        /// Always declined: the payment is recorded as `declined` and the answer is 402.
        CardChargeDeclined => "pm_card_chargeDeclined",
        /// Succeeds after `IDEMPAY_SLOW_CHARGE`, so the key stays in progress meanwhile.
        CardSlow => "pm_card_slow",
    }
}

/// A payment to create. Unknown fields are refused, so a typo is not silently ignored.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "amount": 4200, "currency": "eur", "order": "cmd_9182" }))]
pub struct NewPayment {
    /// The amount in the currency's minor units (cents for `eur`).
    #[schema(value_type = i64, minimum = 1, maximum = 99_999_999, example = 4200)]
    pub amount: Amount,
    #[schema(inline)]
    pub currency: Currency,
    /// The merchant's reference for the order being paid.
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 255, pattern = "^[^\\u0000]*$", example = "cmd_9182")]
    pub order: Option<OrderRef>,
    /// A free-text description.
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 1000, pattern = "^[^\\u0000]*$")]
    pub description: Option<Description>,
    // `pm_card_visa` when absent.
    #[serde(default)]
    #[schema(inline)]
    pub payment_method: PaymentMethod,
    // `automatic` when absent.
    #[serde(default)]
    #[schema(inline)]
    pub capture_method: CaptureMethod,
    /// Key–value pairs of the merchant's own, returned with the payment and in its events.
    #[serde(default)]
    pub metadata: Metadata,
}

vocabulary! {
    /// When the money is taken: `automatic` charges at once (the default); `manual` authorizes now,
    /// holding the amount on the card (`requires_capture`), and takes it when
    /// `POST /v1/payments/{id}/capture` is called (all or part of it), or releases it on
    /// `POST /v1/payments/{id}/cancel`. An authorization not captured within the processor's limit
    /// (7 days by default) is released by the processor, and the payment becomes `canceled`. On a
    /// payment, absent from the replay of one stored before manual capture existed (automatic).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ToSchema)]
    pub enum CaptureMethod: "capture method" {
        #[default]
        Automatic => "automatic",
        Manual => "manual",
    }
}

/// `cancellation_reason` as a string of [`CancellationReason`]'s names or `null`, one schema: not
/// utoipa's `oneOf` of the enum and `{"type": "null"}`, which code generators read as a union.
fn cancellation_reason_or_null() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let names = CancellationReason::ALL
        .iter()
        .map(|reason| serde_json::Value::from(reason.as_str()))
        .chain([serde_json::Value::Null]);
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .enum_values(Some(names))
        .build()
}

vocabulary! {
    /// Why a payment was canceled: one of Stripe's reasons a merchant gives, or `expired` when the
    /// processor released an authorization nobody captured in time.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum CancellationReason: "cancellation reason" {
        Duplicate => "duplicate",
        Fraudulent => "fraudulent",
        RequestedByCustomer => "requested_by_customer",
        Abandoned => "abandoned",
        Expired => "expired",
    }
}

service::public_id!(
    /// A payment id: `pay_` followed by 24 random base62 characters.
    pub PaymentId, "pay", 24, "a payment id"
);

vocabulary! {
    /// The state of a payment: `succeeded` or `declined` when charged, `refunded` once refunded in
    /// full (a partial refund leaves it `succeeded`), `failed` when the processor reported a failure.
    /// A manual payment is `requires_capture` once authorized, then `succeeded` when captured or
    /// `canceled` when its authorization was released.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum PaymentStatus: "payment status" {
        Succeeded => "succeeded",
        Declined => "declined",
        Refunded => "refunded",
        Failed => "failed",
        RequiresCapture => "requires_capture",
        Canceled => "canceled",
    }
}

/// A payment, as the API returns it.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "id": "pay_U5PgTqA02dYsv3cLANIGkqIs",
    "object": "payment",
    "amount": 4200,
    "currency": "eur",
    "status": "succeeded",
    "payment_method": "pm_card_visa",
    "capture_method": "automatic",
    "order": "cmd_9182",
    "description": null,
    "amount_captured": 4200,
    "amount_capturable": 0,
    "amount_refunded": 0,
    "amount_disputed": 0,
    "charge": "ch_3MmlLrLkdIwHu7ix0snN0B15",
    "created_at": "2026-11-29T19:03:59.647850Z",
    "canceled_at": null,
    "cancellation_reason": null,
    "metadata": { "order_id": "6735" }
}))]
pub struct Payment {
    /// The payment's id, `pay_` followed by 24 characters.
    #[schema(value_type = String, pattern = "^pay_[0-9A-Za-z]{24}$")]
    pub id: PaymentId,
    /// Always `payment`, so a client can tell resources apart.
    #[schema(value_type = String, pattern = "^payment$")]
    pub object: &'static str,
    /// The amount in minor units.
    #[schema(minimum = 1, maximum = 99_999_999)]
    pub amount: i64,
    /// The lowercase ISO 4217 currency code.
    #[schema(pattern = "^[a-z]{3}$")]
    pub currency: String,
    #[schema(inline)]
    pub status: PaymentStatus,
    #[schema(inline)]
    pub payment_method: PaymentMethod,
    // Absent from a replay of a payment stored before manual capture existed (the type's
    // description says so: a field's own would turn the inline enum into an `allOf`).
    #[schema(inline, required = false)]
    pub capture_method: CaptureMethod,
    /// The merchant's order reference.
    pub order: Option<String>,
    pub description: Option<String>,
    /// How much the processor took, in minor units: the amount of an automatic payment that
    /// succeeded, what the capture took of a manual one, 0 before a capture, after a cancel and
    /// for a decline. Refunds and disputes apply to it. Absent from a replay of a payment stored
    /// before manual capture existed (then the whole amount).
    #[schema(minimum = 0, required = false)]
    pub amount_captured: i64,
    /// How much a capture may still take, in minor units: the amount while `requires_capture`,
    /// 0 otherwise. Absent from a replay of a payment stored before manual capture existed (0).
    #[schema(minimum = 0, required = false)]
    pub amount_capturable: i64,
    /// How much of the amount has been refunded, in minor units.
    #[schema(minimum = 0)]
    pub amount_refunded: i64,
    /// How much of the amount is disputed by the cardholder, in minor units: never more than
    /// `amount_captured − amount_refunded` (a dispute over more is recorded and flagged for review,
    /// and this takes only what fits). What remains refundable is
    /// `amount_captured − amount_refunded − amount_disputed`.
    #[schema(minimum = 0)]
    pub amount_disputed: i64,
    /// The processor's charge this payment records, `ch_…` (declined charges too).
    #[schema(value_type = Option<String>, pattern = "^ch_[0-9A-Za-z]+$", example = "ch_3MmlLrLkdIwHu7ix0snN0B15")]
    pub charge: Option<String>,
    /// When the payment was created: taken just before it was written, on the database's clock,
    /// not when its transaction committed. Lists are ordered by it.
    pub created_at: DateTime<Utc>,
    /// When the payment was canceled; `null` unless `canceled`.
    pub canceled_at: Option<DateTime<Utc>>,
    /// Why it was canceled; `null` unless `canceled`, or when no reason was given.
    #[schema(schema_with = cancellation_reason_or_null)]
    pub cancellation_reason: Option<CancellationReason>,
    /// The merchant's key–value pairs, as sent; `{}` when none were.
    pub metadata: Metadata,
}

impl Payment {
    /// Where the payment can be fetched.
    pub fn location(&self) -> String {
        format!("/v1/payments/{}", self.id)
    }
}

/// No payment `id` for this account: the 404 of a route's path, as a stored result.
pub(crate) fn payment_not_found(id: &str) -> Problem {
    PaymentId::no_such(id).into()
}

/// `sqlx::query_as!` into a [`PaymentRow`], with a payment's columns written here once: `$before`
/// is the statement up to them (`"SELECT"`, `"UPDATE … RETURNING"`), `$after` the rest
/// (`"FROM payments WHERE …"`, or `""`). The whole statement is still checked at compile time; the
/// caller has `PaymentRow`, `Json` and `Metadata` in scope.
macro_rules! payment_query {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            PaymentRow,
            $before
                + r#" id, amount, currency, status, payment_method, order_ref, description,
                      amount_refunded, amount_disputed, charge, created_at,
                      metadata AS "metadata: Json<Metadata>", capture_method, amount_captured,
                      amount_capturable, canceled_at, cancellation_reason "#
                + $after
            $(, $arg)*
        )
    };
}
pub(crate) use payment_query;

/// A `payments` row, as the queries read it.
pub(crate) struct PaymentRow {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub payment_method: String,
    pub order_ref: Option<String>,
    pub description: Option<String>,
    pub amount_refunded: i64,
    pub amount_disputed: i64,
    pub charge: Option<String>,
    pub created_at: DateTime<Utc>,
    pub metadata: sqlx::types::Json<Metadata>,
    pub capture_method: String,
    /// NULL on the payments recorded before manual capture: the whole amount, or 0 for a decline.
    pub amount_captured: Option<i64>,
    pub amount_capturable: i64,
    pub canceled_at: Option<DateTime<Utc>>,
    pub cancellation_reason: Option<String>,
}

impl PaymentRow {
    /// The payment this row holds; a decoding error if its status or payment method is none
    /// the API knows.
    pub fn parse(self) -> Result<Payment, sqlx::Error> {
        let status = stored(&self.status)?;
        Ok(Payment {
            id: PaymentId(self.id),
            object: "payment",
            amount: self.amount,
            currency: self.currency,
            status,
            payment_method: stored(&self.payment_method)?,
            capture_method: stored(&self.capture_method)?,
            order: self.order_ref,
            description: self.description,
            amount_captured: self.amount_captured.unwrap_or(match status {
                PaymentStatus::Declined => 0,
                _ => self.amount,
            }),
            amount_capturable: self.amount_capturable,
            amount_refunded: self.amount_refunded,
            amount_disputed: self.amount_disputed,
            charge: self.charge,
            created_at: self.created_at,
            canceled_at: self.canceled_at,
            cancellation_reason: self
                .cancellation_reason
                .as_deref()
                .map(stored)
                .transpose()?,
            metadata: self.metadata.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(status: &str, payment_method: &str) -> PaymentRow {
        PaymentRow {
            id: "pay_U5PgTqA02dYsv3cLANIGkqIs".to_owned(),
            amount: 4200,
            currency: "eur".to_owned(),
            status: status.to_owned(),
            payment_method: payment_method.to_owned(),
            order_ref: None,
            description: None,
            amount_refunded: 0,
            amount_disputed: 0,
            charge: None,
            created_at: Utc::now(),
            metadata: sqlx::types::Json(Metadata::default()),
            capture_method: "automatic".to_owned(),
            amount_captured: None,
            amount_capturable: 0,
            canceled_at: None,
            cancellation_reason: None,
        }
    }

    #[test]
    fn a_stored_status_or_payment_method_that_is_none_of_ours_is_an_error() {
        for status in PaymentStatus::ALL {
            let payment = row(status.as_str(), "pm_card_slow").parse().unwrap();
            assert_eq!(payment.status, *status);
            assert_eq!(payment.payment_method, PaymentMethod::CardSlow);
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
        for method in PaymentMethod::ALL {
            assert_eq!(
                serde_json::to_value(method).unwrap(),
                serde_json::Value::from(method.as_str())
            );
        }
        let unknown = row("authorized", "pm_card_visa").parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown payment status `authorized`"),
            "{unknown}"
        );
        // Neither is read as something near it: not `declined` for `Declined`, nor the Visa card
        // for another method.
        assert!(row("Declined", "pm_card_visa").parse().is_err());
        let unknown = row("succeeded", "pm_card_amex").parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown payment method `pm_card_amex`"),
            "{unknown}"
        );
    }

    fn parse(json: &str) -> Result<NewPayment, String> {
        serde_json::from_str(json).map_err(|error| error.to_string())
    }

    #[test]
    fn a_minimal_payment_defaults_to_the_visa_test_card() {
        let payment = parse(r#"{"amount": 4200, "currency": "eur"}"#).unwrap();
        assert_eq!(payment.amount, Amount(4200));
        assert_eq!(payment.payment_method, PaymentMethod::CardVisa);
    }

    #[test]
    fn amounts_outside_the_range_are_refused() {
        for amount in [
            "0",
            "-1",
            "100000000",
            "42.5",
            "\"42\"",
            "1e20",
            "18446744073709551616",
        ] {
            let json = format!(r#"{{"amount": {amount}, "currency": "eur"}}"#);
            assert!(parse(&json).is_err(), "{amount} was accepted");
        }
        assert!(parse(r#"{"amount": 99999999, "currency": "eur"}"#).is_ok());
        let whole = parse(r#"{"amount": 4200.0, "currency": "eur"}"#).unwrap();
        assert_eq!(whole.amount, Amount(4200));
        let exponent = parse(r#"{"amount": 1e3, "currency": "eur"}"#).unwrap();
        assert_eq!(exponent.amount, Amount(1000));
    }

    #[test]
    fn an_amount_is_read_from_its_digits_so_a_tiny_fraction_is_refused_not_rounded() {
        for amount in ["4200.0000000000001", "4200.5", "42.00001e2", "1e-400"] {
            let error =
                parse(&format!(r#"{{"amount": {amount}, "currency": "eur"}}"#)).expect_err(amount);
            assert!(
                error.contains("amount must be an integer in minor units"),
                "{amount}: {error}"
            );
        }
        for amount in ["4200", "4200.0", "4.2e3", "42E2", "4200.000", "420000e-2"] {
            let payment = parse(&format!(r#"{{"amount": {amount}, "currency": "eur"}}"#)).unwrap();
            assert_eq!(payment.amount, Amount(4200), "{amount}");
        }
    }

    #[test]
    fn an_amount_survives_a_round_trip_through_a_json_value() {
        let value = serde_json::json!({ "amount": 4200, "currency": "eur" });
        let payment: NewPayment = serde_json::from_value(value).unwrap();
        assert_eq!(payment.amount, Amount(4200));
        let again: NewPayment =
            serde_json::from_value(serde_json::to_value(&payment).unwrap()).unwrap();
        assert_eq!(again.amount, Amount(4200));
    }

    #[test]
    fn text_with_a_nul_character_is_refused() {
        assert!(parse(r#"{"amount": 1, "currency": "eur", "order": "a\u0000b"}"#).is_err());
        assert!(parse(r#"{"amount": 1, "currency": "eur", "description": "\u0000"}"#).is_err());
    }

    #[test]
    fn unknown_fields_and_unknown_methods_are_refused() {
        let error = parse(r#"{"amount": 1, "currency": "eur", "amont": 2}"#).unwrap_err();
        assert!(error.contains("unknown field `amont`"), "{error}");
        let error =
            parse(r#"{"amount": 1, "currency": "eur", "payment_method": "pm_x"}"#).unwrap_err();
        assert!(error.contains("pm_card_visa"), "{error}");
    }

    #[test]
    fn a_field_given_twice_is_refused() {
        assert!(parse(r#"{"amount": 1, "amount": 2, "currency": "eur"}"#).is_err());
    }

    #[test]
    fn order_and_description_lengths_are_bounded_in_characters() {
        let order = "é".repeat(255);
        assert!(
            parse(&format!(
                r#"{{"amount":1,"currency":"eur","order":"{order}"}}"#
            ))
            .is_ok()
        );
        let order = "é".repeat(256);
        assert!(
            parse(&format!(
                r#"{{"amount":1,"currency":"eur","order":"{order}"}}"#
            ))
            .is_err()
        );
        let text = "d".repeat(1001);
        assert!(
            parse(&format!(
                r#"{{"amount":1,"currency":"eur","description":"{text}"}}"#
            ))
            .is_err()
        );
    }

    #[test]
    fn payment_ids_have_their_prefix_and_length() {
        let id = PaymentId::generate();
        assert_eq!(PaymentId::parse(id.as_str()), Some(id));
        assert_eq!(PaymentId::parse("pay_123"), None);
        assert_eq!(PaymentId::parse("acct_aaaaaaaaaaaaaaaaaaaaaaaa"), None);
    }
}
