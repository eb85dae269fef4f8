//! The fingerprint of a request: SHA-256 over its target and a canonical form of its JSON body, so
//! the same key with a different payload (or sent to another resource under the same route, such as
//! a refund of another payment) is recognised, while a retry that serialises the same object
//! differently (key order, whitespace, `4200` or `42e2`) is the same request. Beside it, one digest
//! per top-level member ([`FieldDigests`]) lets a mismatch name the members that changed without
//! the request itself being stored.
//!
//! A fingerprint outlives the release that made it: each key records the [`FingerprintVersion`] it
//! was made with, and a request carries its fingerprint under every version this release computes
//! ([`Fingerprints`]), so a retry of a key made before a change of the fingerprint's inputs is
//! compared under the version it was made with, never refused as another payload.

use std::collections::BTreeMap;
use std::fmt;

use axum::http::Uri;
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use crate::decimal::Decimal;
use crate::fields::FieldDigests;

/// SHA-256 of the canonical JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

/// Deeper documents are refused, as serde_json refuses them when it parses into a value.
const MAX_DEPTH: usize = 128;

impl Fingerprint {
    /// Fingerprints a request to `target` (its path, e.g. `/v1/payments/pay_…/refunds`) with the
    /// JSON text of its body, in its canonical form: objects with their keys sorted and without
    /// insignificant whitespace, strings with serde_json's escapes, and every number in one form
    /// per value, read from its decimal text (`4200`, `4200.0` and `42e2` are all `4200`), so a
    /// retry from another JSON library is the same request. Fails on text that is not JSON.
    pub fn of_json(target: &str, body: &[u8]) -> Result<Self, serde_json::Error> {
        Self::digest(target, body, None)
    }

    /// Fingerprints a request as [`Fingerprint::of_json`] does, and digests each top-level member
    /// of its body on the way, from the same canonical text: no second walk of the document.
    pub fn with_fields(
        target: &str,
        body: &[u8],
    ) -> Result<(Self, FieldDigests), serde_json::Error> {
        let mut fields = FieldDigests::default();
        let fingerprint = Self::digest(target, body, Some(&mut fields))?;
        Ok((fingerprint, fields))
    }

    fn digest(
        target: &str,
        body: &[u8],
        fields: Option<&mut FieldDigests>,
    ) -> Result<Self, serde_json::Error> {
        Ok(hash(target, &canonical(body, fields)?))
    }

    /// Fingerprints a request whose body is not JSON: its raw bytes, together with its media type
    /// (`None` when it came without one), so the same bytes sent as another type are another
    /// request. The media type is compared in its normal form: type, subtype and parameter names
    /// in lower case, no whitespace around `;` (`Text/Plain; charset=utf-8` is
    /// `text/plain;charset=utf-8`). A leading zero byte keeps these digests apart from those of
    /// JSON bodies, whose canonical text never starts with one.
    pub fn of_bytes(target: &str, content_type: Option<&str>, body: &[u8]) -> Self {
        let mut hash = Sha256::new();
        hash.update(target.as_bytes());
        hash.update(b"\n\0");
        hash.update(content_type.map(media_type).unwrap_or_default().as_bytes());
        hash.update(b"\n");
        hash.update(body);
        Self(hash.finalize().into())
    }

    /// Fingerprints a parsed body, as [`Fingerprint::of_json`] does its text.
    pub fn of_request(target: &str, body: &Value) -> Self {
        let text = serde_json::to_vec(body).expect("a JSON value always serializes");
        Self::of_json(target, &text).expect("a JSON value's text is JSON")
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Rebuilds a stored fingerprint; anything but 32 bytes is not one.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }
}

/// What a fingerprint was computed over, recorded with every key (its `fingerprint_version`; none
/// on the keys of the releases before versions, which are version 1). A change of what is hashed is
/// a new version, never a change of an existing one: the keys made under the old one are still
/// compared under it, and a release that meets a version it does not compute leaves the key alone
/// (it cannot tell a retry from another payload) rather than refuse it as a mismatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FingerprintVersion(i16);

impl FingerprintVersion {
    /// The body with the target each entry point chose before versions: the path alone for the
    /// extractors ([`Idempotent`](crate::Idempotent), and services that fingerprint with
    /// [`Target::of`]), the path and query for [`IdempotencyLayer`](crate::IdempotencyLayer).
    pub const V1: Self = Self(1);
    /// The body with the request's path and query, whatever the entry point: a query is part of
    /// what the request names (`POST /captures?amount=100` and `?amount=200` are two intents).
    pub const V2: Self = Self(2);
    /// The version new keys are made with.
    pub const CURRENT: Self = Self::V2;
    /// Every version this release computes, oldest first.
    pub const KNOWN: [Self; 2] = [Self::V1, Self::V2];

    /// The version a key's `fingerprint_version` column names: none is version 1.
    pub(crate) fn stored(column: Option<i16>) -> Self {
        column.map_or(Self::V1, Self)
    }

    /// The version as the column stores it.
    pub fn get(self) -> i16 {
        self.0
    }

    fn index(self) -> Option<usize> {
        Self::KNOWN.iter().position(|known| *known == self)
    }
}

impl fmt::Display for FingerprintVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The target of a request (what it names besides its body), as each version of the fingerprint
/// reads it.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// Version 1's: what the entry point hashed before versions.
    pub before_versions: &'a str,
    /// Version 2's: the path and the query, as the request line has them.
    pub path_and_query: &'a str,
}

impl<'a> Target<'a> {
    /// The target of a request to `uri` taken by an extractor, whose version 1 was the path
    /// alone.
    pub fn of(uri: &'a Uri) -> Self {
        Self {
            before_versions: uri.path(),
            path_and_query: uri
                .path_and_query()
                .map_or(uri.path(), |target| target.as_str()),
        }
    }

    /// The same target under every version: a request without a query, or one under
    /// [`IdempotencyLayer`](crate::IdempotencyLayer), whose version 1 already read the query.
    pub fn same(target: &'a str) -> Self {
        Self {
            before_versions: target,
            path_and_query: target,
        }
    }

    fn of_version(self, version: FingerprintVersion) -> &'a str {
        match version.index() {
            Some(0) => self.before_versions,
            _ => self.path_and_query,
        }
    }
}

/// A request's fingerprint under each version this release computes: the current one is recorded
/// with a new key, and a key made under an older one is compared under that one. A request rebuilt
/// from its key's row (the recovery job's) has only the fingerprint the row holds.
/// None by default: a request not fingerprinted yet, which matches no stored fingerprint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fingerprints([Option<Fingerprint>; FingerprintVersion::KNOWN.len()]);

/// How a request's fingerprints compare with the one a key's row holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Comparison {
    /// The same request: equal under the version the key was made with.
    Same,
    /// Another payload (or a stored fingerprint that does not read as one).
    Differs,
    /// The key was made under a version this release does not compute: it cannot tell.
    UnknownVersion(FingerprintVersion),
}

impl Fingerprints {
    /// A request with a JSON body, under every version (see [`Fingerprint::with_fields`]); the
    /// body is made canonical once, and the members' digests do not depend on the version.
    pub fn of_json(
        target: Target<'_>,
        body: &[u8],
    ) -> Result<(Self, FieldDigests), serde_json::Error> {
        let mut fields = FieldDigests::default();
        let canonical = canonical(body, Some(&mut fields))?;
        Ok((
            Self::each(target, |target| hash(target, &canonical)),
            fields,
        ))
    }

    /// A request whose body is not JSON, under every version (see [`Fingerprint::of_bytes`]).
    pub fn of_bytes(target: Target<'_>, content_type: Option<&str>, body: &[u8]) -> Self {
        Self::each(target, |target| {
            Fingerprint::of_bytes(target, content_type, body)
        })
    }

    /// A parsed body, under every version (see [`Fingerprint::of_request`]).
    pub fn of_request(target: Target<'_>, body: &Value) -> Self {
        let text = serde_json::to_vec(body).expect("a JSON value always serializes");
        Self::of_json(target, &text)
            .expect("a JSON value's text is JSON")
            .0
    }

    /// The one fingerprint a key's row holds, for work rebuilt from the row.
    pub fn stored(version: FingerprintVersion, fingerprint: Fingerprint) -> Self {
        let mut each = [None; FingerprintVersion::KNOWN.len()];
        if let Some(index) = version.index() {
            each[index] = Some(fingerprint);
        }
        Self(each)
    }

    fn each(target: Target<'_>, hash: impl Fn(&str) -> Fingerprint) -> Self {
        let mut each = [None; FingerprintVersion::KNOWN.len()];
        let mut last: Option<(&str, Fingerprint)> = None;
        for (slot, version) in each.iter_mut().zip(FingerprintVersion::KNOWN) {
            let target = target.of_version(version);
            let fingerprint = match last {
                // A target no version changes is hashed once.
                Some((hashed, fingerprint)) if hashed == target => fingerprint,
                _ => hash(target),
            };
            last = Some((target, fingerprint));
            *slot = Some(fingerprint);
        }
        Self(each)
    }

    /// The fingerprint under `version`, if this request has one.
    pub fn of_version(&self, version: FingerprintVersion) -> Option<Fingerprint> {
        self.0[version.index()?]
    }

    /// The newest version this request has a fingerprint of, and that fingerprint: what a new key
    /// records.
    pub fn current(&self) -> Option<(FingerprintVersion, Fingerprint)> {
        FingerprintVersion::KNOWN
            .iter()
            .rev()
            .find_map(|version| Some((*version, self.of_version(*version)?)))
    }

    /// Compares the request with a key's stored fingerprint (`None` when the row's bytes are no
    /// fingerprint), under the version the key was made with.
    pub fn compare(&self, stored: Option<(FingerprintVersion, Fingerprint)>) -> Comparison {
        let Some((version, stored)) = stored else {
            return Comparison::Differs;
        };
        if version.index().is_none() {
            return Comparison::UnknownVersion(version);
        }
        match self.of_version(version) {
            Some(mine) if mine == stored => Comparison::Same,
            Some(_) => Comparison::Differs,
            // A request rebuilt from another row's version: not this key's request.
            None => Comparison::Differs,
        }
    }
}

/// The canonical text of a JSON body, its members digested into `fields` on the way.
fn canonical(body: &[u8], fields: Option<&mut FieldDigests>) -> Result<Vec<u8>, serde_json::Error> {
    let document: &RawValue = serde_json::from_slice(body)?;
    let mut canonical = Vec::with_capacity(body.len());
    write_canonical(document, &mut canonical, 0, fields)?;
    Ok(canonical)
}

/// SHA-256 of a target and a canonical body.
fn hash(target: &str, canonical: &[u8]) -> Fingerprint {
    let mut hash = Sha256::new();
    hash.update(target.as_bytes());
    hash.update(b"\n");
    hash.update(canonical);
    Fingerprint(hash.finalize().into())
}

/// A `Content-Type` in its normal form, for [`Fingerprint::of_bytes`].
fn media_type(content_type: &str) -> String {
    let mut parts = content_type.split(';').map(str::trim);
    let mut normal = parts.next().unwrap_or_default().to_ascii_lowercase();
    for parameter in parts.filter(|parameter| !parameter.is_empty()) {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        normal.push(';');
        normal.push_str(&name.trim().to_ascii_lowercase());
        normal.push('=');
        normal.push_str(value.trim());
    }
    normal
}

/// Writes `value` in its canonical form. Each level is read from the text of its parent, as
/// [`RawValue`]s that keep every number's digits as they were sent. When `fields` is given and
/// `value` is an object, each member's canonical text is digested into it as it is written.
fn write_canonical(
    value: &RawValue,
    out: &mut Vec<u8>,
    depth: usize,
    mut fields: Option<&mut FieldDigests>,
) -> Result<(), serde_json::Error> {
    if depth > MAX_DEPTH {
        return Err(serde::de::Error::custom(
            "the JSON document is nested too deeply",
        ));
    }
    let text = value.get().trim();
    match text.as_bytes().first() {
        Some(b'{') => {
            let members: BTreeMap<String, &RawValue> = serde_json::from_str(text)?;
            out.push(b'{');
            for (index, (key, member)) in members.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, key)?;
                out.push(b':');
                let start = out.len();
                write_canonical(member, out, depth + 1, None)?;
                if let Some(fields) = fields.as_deref_mut() {
                    fields.digest(key, &out[start..])?;
                }
            }
            out.push(b'}');
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text)?;
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_canonical(item, out, depth + 1, None)?;
            }
            out.push(b']');
        }
        Some(b'"') => {
            let string: String = serde_json::from_str(text)?;
            serde_json::to_writer(&mut *out, &string)?;
        }
        Some(b'-' | b'0'..=b'9') => match Decimal::parse(text) {
            Some(number) => out.extend_from_slice(number.canonical().as_bytes()),
            // An exponent beyond i64: kept as sent, which is still a JSON number of its own value,
            // so it cannot be taken for another.
            None => out.extend_from_slice(text.as_bytes()),
        },
        // `true`, `false`, `null`.
        _ => out.extend_from_slice(text.as_bytes()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint(json: &str) -> Fingerprint {
        Fingerprint::of_json("/v1/payments", json.as_bytes()).unwrap()
    }

    #[test]
    fn raw_bytes_are_fingerprinted_with_their_media_type_in_its_normal_form() {
        let raw = |content_type: Option<&str>, body: &str| {
            Fingerprint::of_bytes("/echo", content_type, body.as_bytes())
        };
        let plain = raw(Some("text/plain; charset=utf-8"), "hello");
        assert_eq!(plain, raw(Some("Text/Plain;Charset=utf-8"), "hello"));
        assert_ne!(plain, raw(Some("text/plain; charset=utf-8"), "hello!"));
        assert_ne!(plain, raw(Some("text/csv; charset=utf-8"), "hello"));
        assert_ne!(plain, raw(None, "hello"));
        // The same text as JSON is another request.
        assert_ne!(
            Fingerprint::of_bytes("/echo", Some("text/plain"), b"{}"),
            Fingerprint::of_json("/echo", b"{}").unwrap()
        );
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
    fn equal_numbers_written_differently_hash_equal() {
        let integer = fingerprint(r#"{"amount":4200,"currency":"eur"}"#);
        for amount in ["4200.0", "4.2e3", "42E2", "4200.000", "42e+2", "420000e-2"] {
            let json = format!(r#"{{"amount":{amount},"currency":"eur"}}"#);
            assert_eq!(fingerprint(&json), integer, "{amount}");
        }
        assert_eq!(fingerprint("[-0]"), fingerprint("[0.0]"));
        assert_eq!(fingerprint("[42.50]"), fingerprint("[4.25e1]"));
    }

    #[test]
    fn numbers_are_compared_by_their_digits_not_as_floats() {
        assert_ne!(
            fingerprint(r#"{"amount":4200}"#),
            fingerprint(r#"{"amount":4200.0000000000001}"#)
        );
        assert_ne!(
            fingerprint("[9007199254740993]"),
            fingerprint("[9007199254740992]")
        );
        assert_ne!(fingerprint("[1e400]"), fingerprint("[1e401]"));
    }

    #[test]
    fn a_body_that_is_not_json_has_no_fingerprint() {
        for body in ["", "{", "[1,]", "{\"a\":1} x", "01"] {
            assert!(
                Fingerprint::of_json("/v1/payments", body.as_bytes()).is_err(),
                "{body:?}"
            );
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(Fingerprint::of_json("/v1/payments", deep.as_bytes()).is_err());
    }

    fn fields(json: &str) -> FieldDigests {
        Fingerprint::with_fields("/v1/payments", json.as_bytes())
            .unwrap()
            .1
    }

    #[test]
    fn each_version_hashes_its_own_target_and_a_key_is_compared_under_its_version() {
        let uri: Uri = "/v1/payments?source=checkout".parse().unwrap();
        let (each, fields) =
            Fingerprints::of_json(Target::of(&uri), br#"{ "b": 2, "a": 1 }"#).unwrap();
        // Version 1: the path alone, as the extractors hashed it before versions; version 2: the
        // path and the query.
        let v1 = Fingerprint(Sha256::digest(b"/v1/payments\n{\"a\":1,\"b\":2}").into());
        let v2 =
            Fingerprint(Sha256::digest(b"/v1/payments?source=checkout\n{\"a\":1,\"b\":2}").into());
        assert_eq!(each.of_version(FingerprintVersion::V1), Some(v1));
        assert_eq!(each.of_version(FingerprintVersion::V2), Some(v2));
        assert_eq!(each.current(), Some((FingerprintVersion::V2, v2)));
        assert_eq!(fields, self::fields(r#"{"a":1,"b":2}"#));
        // A key made under version 1 (a release before versions) is this request; the same bytes
        // said to be version 2 are another payload; a version this release does not compute is
        // neither.
        let v1_key = Some((FingerprintVersion::V1, v1));
        assert_eq!(each.compare(v1_key), Comparison::Same);
        let mislabelled = Some((FingerprintVersion::V2, v1));
        assert_eq!(each.compare(mislabelled), Comparison::Differs);
        let later = FingerprintVersion(3);
        assert_eq!(
            each.compare(Some((later, v2))),
            Comparison::UnknownVersion(later)
        );
        assert_eq!(each.compare(None), Comparison::Differs);
        // Without a query, both versions are the one hash; the layer read the query in both.
        let bare: Uri = "/v1/payments".parse().unwrap();
        let body = serde_json::json!({ "a": 1, "b": 2 });
        let plain = Fingerprints::of_request(Target::of(&bare), &body);
        assert_eq!(plain.of_version(FingerprintVersion::V1), Some(v1));
        assert_eq!(plain.of_version(FingerprintVersion::V2), Some(v1));
        let guarded =
            Fingerprints::of_request(Target::same(uri.path_and_query().unwrap().as_str()), &body);
        assert_eq!(guarded.of_version(FingerprintVersion::V1), Some(v2));
        // A request rebuilt from its row has only the row's.
        let stored = Fingerprints::stored(FingerprintVersion::V1, v1);
        assert_eq!(stored.current(), Some((FingerprintVersion::V1, v1)));
        assert_eq!(
            stored.compare(Some((FingerprintVersion::V2, v2))),
            Comparison::Differs
        );
    }

    #[test]
    fn the_canonical_text_has_one_comma_between_members_and_items_and_none_before_the_first() {
        let expected = hash(
            "/v1/payments",
            br#"{"a":[1,2,3],"b":{"x":[true,null],"y":"s"},"c":[]}"#,
        );
        assert_eq!(
            fingerprint(r#"{ "c": [], "b": {"y":"s","x":[true, null]}, "a": [1, 2, 3] }"#),
            expected
        );
    }

    #[test]
    fn a_document_nested_as_deep_as_the_limit_is_read_and_one_level_deeper_is_refused() {
        let arrays = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
        let objects =
            |levels: usize| format!("{}1{}", r#"{"a":"#.repeat(levels), "}".repeat(levels));
        for nest in [arrays, objects] {
            let deepest = nest(MAX_DEPTH);
            assert!(Fingerprint::of_json("/t", deepest.as_bytes()).is_ok());
            let refused = Fingerprint::of_json("/t", nest(MAX_DEPTH + 1).as_bytes())
                .unwrap_err()
                .to_string();
            assert_eq!(refused, "the JSON document is nested too deeply");
        }
    }

    #[test]
    fn a_target_both_versions_read_alike_is_hashed_once() {
        let hashed = std::cell::Cell::new(0);
        let count = |target: &str| {
            hashed.set(hashed.get() + 1);
            hash(target, b"{}")
        };
        let each = Fingerprints::each(Target::same("/v1/payments"), count);
        assert_eq!(hashed.get(), 1);
        assert_eq!(
            each.of_version(FingerprintVersion::V1),
            each.of_version(FingerprintVersion::V2)
        );
        let uri: Uri = "/v1/payments?a=1".parse().unwrap();
        Fingerprints::each(Target::of(&uri), count);
        assert_eq!(hashed.get(), 3, "two targets, two hashes");
    }

    #[test]
    fn a_media_type_s_empty_parameters_are_dropped_and_the_rest_kept_in_lower_case() {
        assert_eq!(
            media_type("Text/Plain; ;Charset=UTF-8;"),
            "text/plain;charset=UTF-8"
        );
    }

    #[test]
    fn a_stored_fingerprint_is_32_bytes_and_its_version_is_the_column_s_number() {
        let bytes = [7u8; 32];
        assert_eq!(
            Fingerprint::from_slice(&bytes).map(|f| *f.as_bytes()),
            Some(bytes)
        );
        assert_eq!(Fingerprint::from_slice(&bytes[..31]), None);
        assert_eq!(
            (FingerprintVersion::V1.get(), FingerprintVersion::V2.get()),
            (1, 2)
        );
        assert_eq!(FingerprintVersion::stored(None), FingerprintVersion::V1);
        assert_eq!(FingerprintVersion::stored(Some(2)).to_string(), "2");
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
