//! `metadata`: the merchant's own key–value pairs on a payment or a refund, as Stripe has them. The
//! API stores them and returns them and never reads them; they are part of the request, so they
//! are part of its fingerprint (another `metadata` under the same key is a 422 naming the keys
//! that differ, `/metadata/order_id`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// At most this many keys, as Stripe allows.
pub const MAX_KEYS: usize = 50;
/// At most this many characters in a key.
const MAX_KEY_CHARS: usize = 40;
/// At most this many characters in a value.
const MAX_VALUE_CHARS: usize = 500;

/// Up to 50 keys of up to 40 characters, each with a string value of up to 500 characters.
/// Returned as sent, keys in sorted order; `{}` when none were sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<MetadataKey, MetadataValue>")]
pub struct Metadata(BTreeMap<String, String>);

impl ToSchema for Metadata {}

/// Written by hand: the bounds on keys (`propertyNames`) are beyond what the derive can say, and
/// a schema that leaves them out lets a client send what is then refused.
impl utoipa::PartialSchema for Metadata {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let text = |min: Option<usize>, max: usize| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(min)
                .max_length(Some(max))
                .pattern(Some("^[^\\u0000]*$"))
        };
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "The merchant's own key–value pairs: up to 50 keys of 1 to 40 characters, each \
                 with a string of up to 500 characters.",
            ))
            .max_properties(Some(MAX_KEYS))
            .property_names(Some(text(Some(1), MAX_KEY_CHARS)))
            .additional_properties(Some(text(None, MAX_VALUE_CHARS)))
            .examples([serde_json::json!({ "order_id": "6735", "channel": "web" })])
            .into()
    }
}

impl Metadata {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, for a format of their own (a recovery state).
    pub fn into_pairs(self) -> BTreeMap<String, String> {
        self.0
    }

    /// Pairs a recovery state kept: they were checked when the request that sent them was
    /// accepted, and are recorded as they were, whatever the limits are now.
    pub fn kept(pairs: BTreeMap<String, String>) -> Self {
        Self(pairs)
    }
}

impl TryFrom<BTreeMap<MetadataKey, MetadataValue>> for Metadata {
    type Error = String;

    fn try_from(pairs: BTreeMap<MetadataKey, MetadataValue>) -> Result<Self, Self::Error> {
        if pairs.len() > MAX_KEYS {
            return Err(format!(
                "metadata has {} keys, more than the {MAX_KEYS} allowed",
                pairs.len()
            ));
        }
        Ok(Self(
            pairs
                .into_iter()
                .map(|(key, value)| (key.0, value.0))
                .collect(),
        ))
    }
}

/// A key: 1 to 40 characters, no NUL (PostgreSQL's text cannot hold one). Each key and value is
/// its own type, so that a refusal is reported at its own place (`/metadata/order_id`).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
struct MetadataKey(String);

impl TryFrom<String> for MetadataKey {
    type Error = String;

    fn try_from(key: String) -> Result<Self, Self::Error> {
        let chars = key.chars().count();
        if chars == 0 || chars > MAX_KEY_CHARS || key.contains('\0') {
            return Err(format!(
                "a metadata key has 1 to {MAX_KEY_CHARS} characters and no NUL, got {chars}"
            ));
        }
        Ok(Self(key))
    }
}

/// A value: a string of at most 500 characters, no NUL.
#[derive(Debug, Deserialize)]
#[serde(try_from = "String")]
struct MetadataValue(String);

impl TryFrom<String> for MetadataValue {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        let chars = value.chars().count();
        if chars > MAX_VALUE_CHARS || value.contains('\0') {
            return Err(format!(
                "a metadata value has at most {MAX_VALUE_CHARS} characters and no NUL, got {chars}"
            ));
        }
        Ok(Self(value))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: serde_json::Value) -> Result<Metadata, String> {
        serde_json::from_value(value).map_err(|error| error.to_string())
    }

    #[test]
    fn up_to_50_string_pairs_are_kept_as_sent_and_returned_in_key_order() {
        let metadata = parse(json!({ "b": "2", "a": "" })).unwrap();
        assert_eq!(
            serde_json::to_value(&metadata).unwrap(),
            json!({ "a": "", "b": "2" })
        );
        let fifty: serde_json::Map<String, serde_json::Value> =
            (0..50).map(|n| (format!("k{n}"), json!("v"))).collect();
        assert!(parse(serde_json::Value::Object(fifty)).is_ok());
    }

    #[test]
    fn too_many_keys_long_keys_or_values_and_other_types_are_refused() {
        let many: serde_json::Map<String, serde_json::Value> =
            (0..51).map(|n| (format!("k{n}"), json!("v"))).collect();
        for refused in [
            serde_json::Value::Object(many),
            json!({ "": "v" }),
            json!({ "k".repeat(41): "v" }),
            json!({ "k": "v".repeat(501) }),
            json!({ "k": 1 }),
            json!({ "k": null }),
            json!({ "k": { "nested": "v" } }),
            json!({ "k": "a\u{0}b" }),
            json!(["k", "v"]),
        ] {
            assert!(parse(refused.clone()).is_err(), "{refused}");
        }
        assert!(parse(json!({ "k".repeat(40): "v".repeat(500) })).is_ok());
    }
}
