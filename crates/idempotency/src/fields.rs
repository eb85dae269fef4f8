//! The digest of each top-level member of a request body, beside its fingerprint
//! ([`crate::Fingerprint::with_fields`]): what lets a mismatch (422) name the members that changed
//! without the request itself being stored.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// The digest of each top-level member of a request body: member name → hex SHA-256 of the
/// member's canonical value. Two requests whose fingerprints differ differ in the members whose
/// digests differ (or that only one of them has); a body that is not an object has none. The
/// values themselves are never kept, only their digests.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct FieldDigests(BTreeMap<String, String>);

impl FieldDigests {
    /// Digests the top-level member `name` from its canonical text and, when it is an object (a
    /// payment's `metadata`), each of its own members, under their JSON pointers
    /// (`/metadata/order_id`): a mismatch can then name the one entry that changed. A member's
    /// name is kept as it is, a nested one as a pointer, which starts with `/`.
    pub(crate) fn digest(&mut self, name: &str, canonical: &[u8]) -> Result<(), serde_json::Error> {
        self.0
            .insert(name.to_owned(), hex::encode(Sha256::digest(canonical)));
        if canonical.first() == Some(&b'{') {
            // Canonical text has no whitespace: each member's raw text is its canonical text.
            let members: BTreeMap<String, &RawValue> = serde_json::from_slice(canonical)?;
            for (member, value) in members {
                let digest = hex::encode(Sha256::digest(value.get().as_bytes()));
                self.0
                    .insert(format!("{}{}", pointer(name), pointer(&member)), digest);
            }
        }
        Ok(())
    }

    /// The JSON pointers (RFC 6901) of the members that differ between two bodies, a member
    /// present in one and absent from the other included, sorted. A member that is an object in
    /// both is named by the entries that differ in it (`/metadata/order_id`), where both bodies'
    /// digests have them (those stored before nested digests existed do not).
    pub fn mismatched(&self, other: &Self) -> Vec<String> {
        let differs = |name: &&String| self.0.get(*name) != other.0.get(*name);
        let mut names: Vec<&String> = self
            .0
            .keys()
            .chain(other.0.keys().filter(|name| !self.0.contains_key(*name)))
            .filter(|name| !is_nested(name))
            .filter(differs)
            .collect();
        names.sort();
        let mut pointers = Vec::new();
        for name in names {
            let parent = pointer(name);
            let prefix = format!("{parent}/");
            let entries = |digests: &Self| {
                digests
                    .0
                    .keys()
                    .filter(|key| key.starts_with(&prefix))
                    .count()
            };
            let objects_in_both = self.0.contains_key(name)
                && other.0.contains_key(name)
                && (entries(self) > 0 || self.0.get(name) == Some(&empty_object()))
                && (entries(other) > 0 || other.0.get(name) == Some(&empty_object()));
            if !objects_in_both {
                pointers.push(parent);
                continue;
            }
            let mut nested: Vec<&String> = self
                .0
                .keys()
                .chain(other.0.keys().filter(|key| !self.0.contains_key(*key)))
                .filter(|key| key.starts_with(&prefix))
                .filter(differs)
                .collect();
            nested.sort();
            pointers.extend(nested.into_iter().cloned());
        }
        pointers
    }
}

/// The pointers of the top-level members in which a request differs from the stored one. `None`
/// when either side has no digests (a key reserved before they were recorded), or when no member
/// differs: then the request went to another resource under the same route (a refund of another
/// payment), which the list cannot name.
pub(crate) fn mismatched_fields(
    stored: Option<&FieldDigests>,
    sent: Option<&FieldDigests>,
) -> Option<Vec<String>> {
    let fields = stored?.mismatched(sent?);
    (!fields.is_empty()).then_some(fields)
}

/// Whether a digest is of a member's member, named by its pointer, not of a top-level member.
fn is_nested(name: &str) -> bool {
    name.starts_with('/')
}

/// The digest of `{}`: an object without members, which has no nested digests to compare.
fn empty_object() -> String {
    hex::encode(Sha256::digest(b"{}"))
}

/// The JSON pointer of a top-level member: `/` and its name, with `~` written `~0` and `/` written
/// `~1` (RFC 6901, section 3).
fn pointer(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> FieldDigests {
        crate::Fingerprint::with_fields("/v1/payments", json.as_bytes())
            .unwrap()
            .1
    }

    #[test]
    fn field_digests_name_the_members_that_differ_as_sorted_escaped_pointers() {
        let stored = fields(r#"{"amount":4200,"currency":"eur","a/b":1,"m~n":1,"order":"x"}"#);
        let sent = fields(r#"{"order":"x","currency":"usd","amount":42e2,"a/b":2,"m~n":2}"#);
        assert_eq!(stored.mismatched(&sent), ["/a~1b", "/currency", "/m~0n"]);
        // A member present in one body and absent from the other differs, whichever has it.
        let added =
            fields(r#"{"amount":4200,"currency":"eur","a/b":1,"m~n":1,"order":"x","z":null}"#);
        assert_eq!(stored.mismatched(&added), ["/z"]);
        assert_eq!(added.mismatched(&stored), ["/z"]);
        // The same value in another notation, key order or spacing is the same member.
        assert!(
            fields(r#"{"amount":4200,"n":{"b":1,"a":2}}"#)
                .mismatched(&fields(r#"{ "n": {"a":2.0,"b":1}, "amount": 42e2 }"#))
                .is_empty()
        );
        assert_eq!(fields("[1,2]"), FieldDigests::default());
    }

    #[test]
    fn a_member_that_is_an_object_in_both_bodies_is_named_by_its_entries_that_differ() {
        let stored = fields(r#"{"amount":1,"metadata":{"order_id":"6735","channel":"web"}}"#);
        let changed = fields(r#"{"amount":1,"metadata":{"channel":"web","order_id":"6736"}}"#);
        assert_eq!(stored.mismatched(&changed), ["/metadata/order_id"]);
        let added =
            fields(r#"{"amount":1,"metadata":{"order_id":"6735","channel":"web","a/b":""}}"#);
        assert_eq!(stored.mismatched(&added), ["/metadata/a~1b"]);
        // From none to some: the entries added.
        let none = fields(r#"{"amount":1,"metadata":{}}"#);
        assert_eq!(
            none.mismatched(&stored),
            ["/metadata/channel", "/metadata/order_id"]
        );
        // An object on one side only, or a member absent: the member itself.
        let text = fields(r#"{"amount":1,"metadata":"x"}"#);
        assert_eq!(stored.mismatched(&text), ["/metadata"]);
        let absent = fields(r#"{"amount":1}"#);
        assert_eq!(stored.mismatched(&absent), ["/metadata"]);
        // Digests stored before nested ones existed: the member itself.
        let mut old = stored.clone();
        old.0.retain(|name, _| !is_nested(name));
        assert_eq!(old.mismatched(&changed), ["/metadata"]);
        assert!(stored.mismatched(&stored.clone()).is_empty());
    }

    #[test]
    fn the_fields_named_for_a_mismatch_are_those_that_differ_and_none_when_none_can_be_named() {
        let stored = fields(r#"{"amount":4200,"currency":"eur"}"#);
        let sent = fields(r#"{"amount":4300,"currency":"eur"}"#);
        assert_eq!(
            mismatched_fields(Some(&stored), Some(&sent)),
            Some(vec!["/amount".to_owned()])
        );
        assert_eq!(
            mismatched_fields(Some(&stored), Some(&stored.clone())),
            None
        );
        assert_eq!(mismatched_fields(None, Some(&sent)), None);
        assert_eq!(mismatched_fields(Some(&stored), None), None);
    }

    #[test]
    fn a_field_digest_is_the_sha256_of_the_members_canonical_text_and_the_fingerprint_is_unchanged()
    {
        let (whole, digests) =
            crate::Fingerprint::with_fields("/v1/payments", br#"{"b":{"y":1e1,"x":1},"a":1}"#)
                .unwrap();
        assert_eq!(
            whole,
            crate::Fingerprint::of_json("/v1/payments", br#"{"a":1,"b":{"x":1,"y":10}}"#).unwrap()
        );
        let expected = hex::encode(Sha256::digest(br#"{"x":1,"y":10}"#));
        assert_eq!(digests.0.get("b"), Some(&expected));
        // Values are never stored: only names and digests.
        assert!(!serde_json::to_string(&digests).unwrap().contains("\"x\""));
    }
}
