//! Public identifiers in the payment-industry shape: a type prefix and random base62 characters
//! (`pay_…`, `acct_…`), so an id says what it names and cannot be guessed from another.

use rand::Rng;
use rand::distr::Alphanumeric;

/// `prefix_` followed by `len` random base62 characters from a cryptographically secure generator
/// seeded by the operating system.
pub fn generate(prefix: &str, len: usize) -> String {
    let random: String = rand::rng()
        .sample_iter(Alphanumeric)
        .take(len)
        .map(char::from)
        .collect();
    format!("{prefix}_{random}")
}

/// Whether `raw` has the shape [`generate`] gives: `prefix_` and `len` base62 characters. Anything
/// else names nothing of that kind, so its look-up can be skipped.
pub fn has_shape(raw: &str, prefix: &str, len: usize) -> bool {
    raw.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('_'))
        .is_some_and(|random| {
            random.len() == len && random.bytes().all(|b| b.is_ascii_alphanumeric())
        })
}

/// An id of one kind of object, as a route reads it from its path ([`from_path`]): what the kind is
/// called, and which strings can be one. `public_id!` implements it; a kind whose ids another
/// service chooses implements it by hand.
pub trait PublicId: Sized {
    /// What an id of this kind names, as a 404 says it: `payment`, `webhook endpoint`.
    fn object() -> &'static str;

    /// The id `raw` is, if it can be one of this kind; anything else names nothing, and is not
    /// worth a query.
    fn parse(raw: &str) -> Option<Self>;

    /// The 404 of `raw`, whether it cannot be an id of this kind or names no such object the
    /// caller may see: the two read alike, so a 404 tells nobody which ids exist.
    fn no_such(raw: &str) -> NoSuch {
        NoSuch(format!("No {} `{raw}`.", Self::object()))
    }
}

/// A path that names no object of the kind it asks for: a 404, whose detail this holds. Each
/// service answers it as its own `not-found` problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSuch(pub String);

impl std::fmt::Display for NoSuch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The id of a route's `{id}`, of the kind `T`: what each service's `PathId<T>` extractor reads,
/// and rejects as its own problem. A segment that cannot be decoded (not UTF-8) or cannot be such
/// an id is [`NoSuch`], found before the handler runs: before a query, and before an idempotency
/// key is reserved.
pub async fn from_path<T: PublicId, S: Send + Sync>(
    parts: &mut axum::http::request::Parts,
    state: &S,
) -> Result<T, NoSuch> {
    use axum::extract::{FromRequestParts, Path};
    let Path(raw) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|rejection| NoSuch(format!("No such resource: {}.", rejection.body_text())))?;
    T::parse(&raw).ok_or_else(|| T::no_such(&raw))
}

/// What an id of a `public_id!` kind names, from its description: "a webhook endpoint id" gives
/// "webhook endpoint".
#[doc(hidden)]
pub fn object_of(what: &'static str) -> &'static str {
    let named = what
        .strip_prefix("an ")
        .or_else(|| what.strip_prefix("a "))
        .unwrap_or(what);
    named.strip_suffix(" id").unwrap_or(named)
}

/// Declares a public id's newtype: `public_id!(PaymentId, "pay", 24, "a payment id")` makes a
/// `PaymentId` that holds only what [`generate`] could have made with that prefix and length.
/// `generate`, `parse` (`None` for any other shape, so a look-up of it can be skipped), `fits`,
/// `as_str`, `Display` and [`PublicId`] (so a route reads it from its path, [`from_path`]); it
/// serialises as its string and deserialises only from a string of its shape, the error naming
/// the id (`"a payment id"`) and the shape.
#[macro_export]
macro_rules! public_id {
    ($(#[$meta:meta])* $vis:vis $name:ident, $prefix:literal, $len:literal, $what:literal) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        $vis struct $name(String);

        impl $name {
            /// A new id, random.
            pub fn generate() -> Self {
                Self($crate::ids::generate($prefix, $len))
            }

            /// The id `raw` names, if it has the shape; anything else names nothing of this kind.
            pub fn parse(raw: &str) -> Option<Self> {
                Self::fits(raw).then(|| Self(raw.to_owned()))
            }

            /// Whether `raw` has this id's shape.
            pub fn fits(raw: &str) -> bool {
                $crate::ids::has_shape(raw, $prefix, $len)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl $crate::ids::PublicId for $name {
            fn object() -> &'static str {
                $crate::ids::object_of($what)
            }

            fn parse(raw: &str) -> Option<Self> {
                // The inherent `parse`: an inherent method comes before a trait's.
                $name::parse(raw)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(raw: String) -> Result<Self, String> {
                if Self::fits(&raw) {
                    Ok(Self(raw))
                } else {
                    Err(format!(
                        "must be {}, `{}_` and {} letters or digits; got `{raw}`",
                        $what, $prefix, $len
                    ))
                }
            }
        }

        impl $crate::ids::__serde::Serialize for $name {
            fn serialize<S: $crate::ids::__serde::Serializer>(
                &self,
                serializer: S,
            ) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(&self.0)
            }
        }

        impl<'de> $crate::ids::__serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::ids::__serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<Self, D::Error> {
                let raw = <String as $crate::ids::__serde::Deserialize>::deserialize(deserializer)?;
                Self::try_from(raw).map_err(<D::Error as $crate::ids::__serde::de::Error>::custom)
            }
        }
    };
}

#[doc(hidden)]
pub use serde as __serde;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_id_has_its_shape_and_nothing_else_does() {
        let id = generate("pay", 24);
        assert!(has_shape(&id, "pay", 24));
        assert!(
            !has_shape(&id, "pa", 25),
            "the prefix ends at the underscore"
        );
        assert!(!has_shape(&id, "re", 24));
        assert!(!has_shape(&id[..id.len() - 1], "pay", 24));
        assert!(!has_shape(&format!("{id}x"), "pay", 24));
        assert!(!has_shape("pay_U5PgTqA02dYsv3cLANIG-kqI", "pay", 24));
        assert!(!has_shape("payU5PgTqA02dYsv3cLANIGkqIs", "pay", 23));
    }

    public_id!(
        /// An id for the test.
        TestId, "tst", 8, "a test id"
    );

    #[test]
    fn a_public_id_holds_its_shape_only_and_reads_and_writes_as_its_string() {
        let id = TestId::generate();
        assert!(TestId::fits(id.as_str()));
        assert_eq!(TestId::parse(id.as_str()), Some(id.clone()));
        assert_eq!(TestId::parse("tst_short"), None);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{id}\""));
        assert_eq!(serde_json::from_str::<TestId>(&json).unwrap(), id);
        let refused = serde_json::from_str::<TestId>("\"pay_aaaaaaaa\"").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("must be a test id, `tst_` and 8 letters or digits; got `pay_aaaaaaaa`"),
            "{refused}"
        );
        assert_eq!(String::from(id.clone()), id.to_string());
    }

    #[test]
    fn a_public_id_names_its_object_in_a_404() {
        assert_eq!(TestId::object(), "test");
        assert_eq!(object_of("a webhook endpoint id"), "webhook endpoint");
        assert_eq!(object_of("an event id"), "event");
        assert_eq!(TestId::no_such("tst_x").to_string(), "No test `tst_x`.");
        assert_eq!(<TestId as PublicId>::parse("tst_short"), None);
    }
}
