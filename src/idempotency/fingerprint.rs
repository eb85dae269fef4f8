//! The fingerprint of a request: SHA-256 over its target and a canonical form of its JSON body, so
//! the same key with a different payload (or sent to another resource under the same route, such as
//! a refund of another payment) is recognised, while a retry that serialises the same object
//! differently (key order, whitespace) is the same request.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// SHA-256 of the canonical JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// Fingerprints a request to `target` (its path, e.g. `/v1/payments/pay_…/refunds`) with a
    /// parsed JSON body. Objects are written with their keys sorted (serde_json's map is ordered by
    /// key) and without insignificant whitespace; strings and numbers in their shortest form.
    pub fn of_request(target: &str, body: &Value) -> Self {
        let canonical = serde_json::to_vec(body).expect("a JSON value always serializes");
        let mut hash = Sha256::new();
        hash.update(target.as_bytes());
        hash.update(b"\n");
        hash.update(&canonical);
        Self(hash.finalize().into())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Rebuilds a stored fingerprint; anything but 32 bytes is not one.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(json: &str) -> Fingerprint {
        Fingerprint::of_request("/v1/payments", &serde_json::from_str(json).unwrap())
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint() {
        assert_eq!(
            fingerprint(r#"{"amount":4200,"currency":"eur","order":"cmd_1"}"#),
            fingerprint("{ \"order\" : \"cmd_1\",\n  \"currency\": \"eur\", \"amount\": 4200 }"),
        );
    }

    #[test]
    fn nested_objects_are_canonical_too() {
        assert_eq!(
            fingerprint(r#"{"a":{"y":1,"x":[{"q":1,"p":2}]}}"#),
            fingerprint(r#"{"a":{"x":[{"p":2,"q":1}],"y":1}}"#),
        );
    }

    #[test]
    fn escapes_that_spell_the_same_string_hash_equal() {
        assert_eq!(
            fingerprint(r#"{"a":"\u0065"}"#),
            fingerprint(r#"{"a":"e"}"#)
        );
    }

    #[test]
    fn a_different_payload_has_a_different_fingerprint() {
        let base = fingerprint(r#"{"amount":4200,"currency":"eur"}"#);
        assert_ne!(base, fingerprint(r#"{"amount":4201,"currency":"eur"}"#));
        assert_ne!(base, fingerprint(r#"{"amount":"4200","currency":"eur"}"#));
        assert_ne!(
            base,
            fingerprint(r#"{"amount":4200,"currency":"eur","order":null}"#)
        );
    }

    #[test]
    fn array_order_is_significant() {
        assert_ne!(fingerprint("[1,2]"), fingerprint("[2,1]"));
    }

    #[test]
    fn the_same_body_sent_to_another_target_differs() {
        let body = serde_json::json!({ "amount": 10 });
        assert_ne!(
            Fingerprint::of_request("/v1/payments/pay_a/refunds", &body),
            Fingerprint::of_request("/v1/payments/pay_b/refunds", &body),
        );
    }

    #[test]
    fn the_fingerprint_is_the_sha256_of_target_and_canonical_text() {
        let expected: [u8; 32] = Sha256::digest(b"/v1/payments\n{\"a\":1,\"b\":2}").into();
        assert_eq!(fingerprint(r#"{ "b": 2, "a": 1 }"#).as_bytes(), &expected);
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::{Map, Value};

    use super::*;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// The same document written with its object keys in reverse order and with spaces.
    fn reordered(value: &Value) -> String {
        match value {
            Value::Object(map) => {
                let members: Vec<String> = map
                    .iter()
                    .rev()
                    .map(|(key, value)| {
                        format!("{} : {}", Value::String(key.clone()), reordered(value))
                    })
                    .collect();
                format!("{{ {} }}", members.join(" , "))
            }
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(reordered).collect();
                format!("[ {} ]", items.join(" , "))
            }
            other => other.to_string(),
        }
    }

    proptest! {
        #[test]
        fn reordered_and_respaced_json_hashes_equal(value in json()) {
            let reparsed: Value = serde_json::from_str(&reordered(&value)).unwrap();
            prop_assert_eq!(
                Fingerprint::of_request("/v1/payments", &value),
                Fingerprint::of_request("/v1/payments", &reparsed)
            );
        }

        #[test]
        fn different_json_hashes_differ(a in json(), b in json()) {
            prop_assume!(a != b);
            prop_assert_ne!(
                Fingerprint::of_request("/v1/payments", &a),
                Fingerprint::of_request("/v1/payments", &b)
            );
        }

        #[test]
        fn an_added_member_changes_the_hash(mut map in proptest::collection::btree_map("[a-z]{1,6}", any::<i64>(), 0..6)) {
            let before = Value::Object(map.iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect::<Map<_, _>>());
            map.insert("zzzzzzz".to_owned(), 1);
            let after = Value::Object(map.iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect::<Map<_, _>>());
            prop_assert_ne!(
                Fingerprint::of_request("/v1/payments", &before),
                Fingerprint::of_request("/v1/payments", &after)
            );
        }
    }
}
