//! The `Idempotency-Key` header, parsed once: holding an [`IdempotencyKey`] means it is valid.

use std::fmt;

/// The longest key accepted, as Stripe does.
pub const MAX_KEY_LEN: usize = 255;

/// A client's idempotency key: 1 to 255 visible ASCII characters.
///
/// It may arrive bare (`abc`, as Stripe's clients send it) or as an RFC 8941 sf-string (`"abc"`, as
/// the IETF draft specifies); both name the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why a header value is not a key. The message is shown to the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key header is required on this request")]
    Missing,
    #[error("send the Idempotency-Key header once")]
    Repeated,
    #[error("the Idempotency-Key must not be empty")]
    Empty,
    #[error("the Idempotency-Key must be at most {MAX_KEY_LEN} characters")]
    TooLong,
    #[error("the Idempotency-Key must consist of visible ASCII characters")]
    NotVisibleAscii,
    #[error("the Idempotency-Key is not a valid quoted string (RFC 8941 sf-string)")]
    BadQuoting,
}

impl IdempotencyKey {
    /// Parses a header value, bare or quoted.
    pub fn parse(raw: &[u8]) -> Result<Self, KeyError> {
        let key = match raw {
            [b'"', ..] => unquote(raw)?,
            _ => raw.to_vec(),
        };
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.iter().all(u8::is_ascii_graphic) {
            return Err(KeyError::NotVisibleAscii);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(KeyError::TooLong);
        }
        // Visible ASCII only, so the bytes are valid UTF-8.
        Ok(Self(
            String::from_utf8(key).map_err(|_| KeyError::NotVisibleAscii)?,
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Decodes an RFC 8941 sf-string: a quoted run of printable ASCII where `"` and `\` are escaped by
/// a backslash. Parameters (`"abc";x=1`) are not part of a key and are refused.
fn unquote(raw: &[u8]) -> Result<Vec<u8>, KeyError> {
    let mut key = Vec::with_capacity(raw.len());
    let mut chars = raw.iter().skip(1);
    while let Some(&c) = chars.next() {
        match c {
            b'"' => {
                return if chars.next().is_none() {
                    Ok(key)
                } else {
                    Err(KeyError::BadQuoting)
                };
            }
            b'\\' => match chars.next() {
                Some(&escaped @ (b'"' | b'\\')) => key.push(escaped),
                _ => return Err(KeyError::BadQuoting),
            },
            0x20..=0x7e => key.push(c),
            _ => return Err(KeyError::NotVisibleAscii),
        }
    }
    Err(KeyError::BadQuoting)
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<String, KeyError> {
        IdempotencyKey::parse(raw.as_bytes()).map(|key| key.0)
    }

    #[test]
    fn a_uuid_is_a_key() {
        let uuid = "5f0c8b1e-2a3d-4c6f-9b21-7d0e4a9c1f88";
        assert_eq!(parse(uuid).unwrap(), uuid);
    }

    #[test]
    fn bare_and_quoted_forms_are_the_same_key() {
        assert_eq!(
            IdempotencyKey::parse(b"\"abc\"").unwrap().to_string(),
            "abc"
        );
        assert_eq!(parse("abc").unwrap(), parse("\"abc\"").unwrap());
        assert_eq!(parse(r#""a\"b\\c""#).unwrap(), r#"a"b\c"#);
    }

    #[test]
    fn a_bare_key_may_contain_quotes_after_its_first_character() {
        assert_eq!(parse(r#"a"b"#).unwrap(), r#"a"b"#);
    }

    #[test]
    fn empty_keys_are_refused_in_both_forms() {
        assert_eq!(parse(""), Err(KeyError::Empty));
        assert_eq!(parse("\"\""), Err(KeyError::Empty));
    }

    #[test]
    fn keys_longer_than_255_characters_are_refused() {
        assert!(parse(&"k".repeat(255)).is_ok());
        assert_eq!(parse(&"k".repeat(256)), Err(KeyError::TooLong));
        assert_eq!(
            parse(&format!("\"{}\"", "k".repeat(256))),
            Err(KeyError::TooLong)
        );
    }

    #[test]
    fn spaces_control_characters_and_non_ascii_are_refused() {
        assert_eq!(parse("a b"), Err(KeyError::NotVisibleAscii));
        assert_eq!(parse("\"a b\""), Err(KeyError::NotVisibleAscii));
        assert_eq!(parse("a\tb"), Err(KeyError::NotVisibleAscii));
        assert_eq!(
            IdempotencyKey::parse("clé".as_bytes()),
            Err(KeyError::NotVisibleAscii)
        );
        assert_eq!(
            IdempotencyKey::parse(b"\"\xff\""),
            Err(KeyError::NotVisibleAscii)
        );
    }

    #[test]
    fn malformed_sf_strings_are_refused() {
        assert_eq!(parse("\"abc"), Err(KeyError::BadQuoting));
        assert_eq!(parse("\"abc\";x=1"), Err(KeyError::BadQuoting));
        assert_eq!(parse(r#""a\b""#), Err(KeyError::BadQuoting));
        assert_eq!(parse("\""), Err(KeyError::BadQuoting));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// What an sf-string writes for `key`: quotes around it, `"` and `\` escaped.
    fn quoted(key: &str) -> String {
        format!("\"{}\"", key.replace('\\', "\\\\").replace('"', "\\\""))
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused_without_panicking(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = IdempotencyKey::parse(&raw);
        }

        #[test]
        fn a_bare_key_and_its_quoted_form_are_the_same_key(key in "[!#-~][!-~]{0,254}") {
            let bare = IdempotencyKey::parse(key.as_bytes()).unwrap();
            let quoted = IdempotencyKey::parse(quoted(&key).as_bytes()).unwrap();
            prop_assert_eq!(bare.as_str(), key.as_str());
            prop_assert_eq!(bare, quoted);
        }

        /// Every key of the valid alphabet (visible ASCII, 1 to 255 characters) is accepted as
        /// itself. One that starts with `"` is read as an sf-string, so it is written quoted here.
        #[test]
        fn every_key_of_one_to_255_visible_characters_is_accepted_as_itself(
            key in "[!-~]{1,255}"
        ) {
            let sent = if key.starts_with('"') { quoted(&key) } else { key.clone() };
            let parsed = IdempotencyKey::parse(sent.as_bytes());
            prop_assert_eq!(parsed.as_ref().map(IdempotencyKey::as_str), Ok(key.as_str()));
        }

        /// Any bytes at all, mostly invalid but with valid keys and near misses mixed in: a bare
        /// value is accepted exactly when it is 1 to 255 visible characters, and then as itself;
        /// whatever is accepted, bare or quoted, is such a key, and reads the same when quoted.
        #[test]
        fn any_bytes_are_accepted_or_refused_consistently(raw in any_header_value()) {
            let parsed = IdempotencyKey::parse(&raw);
            if raw.first() != Some(&b'"') {
                let valid = (1..=MAX_KEY_LEN).contains(&raw.len())
                    && raw.iter().all(u8::is_ascii_graphic);
                prop_assert_eq!(parsed.is_ok(), valid, "{:?}", parsed);
            }
            if let Ok(key) = parsed {
                prop_assert!((1..=MAX_KEY_LEN).contains(&key.as_str().len()));
                prop_assert!(key.as_str().bytes().all(|b| b.is_ascii_graphic()));
                if raw.first() != Some(&b'"') {
                    prop_assert_eq!(key.as_str().as_bytes(), raw.as_slice());
                }
                let again = IdempotencyKey::parse(quoted(key.as_str()).as_bytes());
                prop_assert_eq!(again, Ok(key));
            }
        }
    }

    /// Header values of every kind: arbitrary bytes, valid keys bare and quoted, keys one byte too
    /// long, and valid keys with one byte replaced by an arbitrary one.
    fn any_header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..300),
            "[!-~]{1,255}".prop_map(String::into_bytes),
            "[!-~]{1,255}".prop_map(|key| quoted(&key).into_bytes()),
            "[!-~]{256}".prop_map(String::into_bytes),
            ("[!-~]{1,255}", any::<prop::sample::Index>(), any::<u8>()).prop_map(
                |(key, at, byte)| {
                    let mut raw = key.into_bytes();
                    let at = at.index(raw.len());
                    raw[at] = byte;
                    raw
                }
            ),
        ]
    }
}
