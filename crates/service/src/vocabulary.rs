//! Closed vocabularies: the enums whose values are stored or sent as strings (statuses, event
//! types, outcomes). [`vocabulary!`] declares each enum with its names, once, and derives `as_str`,
//! `ALL`, serde's traits under the same names, and a `FromStr` that refuses any other string with
//! [`Unknown`]: a stored value that is none of them is an error, never taken for a default.

/// A string that is none of a vocabulary's names.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}`")]
pub struct Unknown {
    /// The vocabulary, in words: "payment status".
    pub what: &'static str,
    pub value: String,
}

impl Unknown {
    pub fn new(what: &'static str, value: &str) -> Self {
        Self {
            what,
            value: value.to_owned(),
        }
    }
}

/// A column read back with a value its type does not know is a decoding error, as sqlx reports
/// one of its own types'.
impl From<Unknown> for sqlx::Error {
    fn from(unknown: Unknown) -> Self {
        sqlx::Error::Decode(Box::new(unknown))
    }
}

/// Reads a stored `value` of a vocabulary: [`Unknown`], as a decoding error, when it is none.
pub fn stored<T: std::str::FromStr<Err = Unknown>>(value: &str) -> Result<T, sqlx::Error> {
    value.parse().map_err(sqlx::Error::from)
}

/// Declares a closed vocabulary once: the enum, and each variant's name as it is stored and
/// sent.
///
/// ```ignore
/// vocabulary! {
///     /// Where a payment stands.
///     #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
///     pub enum PaymentStatus: "payment status" {
///         Succeeded => "succeeded",
///         RequiresCapture => "requires_capture",
///     }
/// }
/// ```
///
/// gives the enum with its attributes and its variants' (docs, `#[default]`), `ALL` (in this
/// order), `as_str`, `parse_listing_all` (a refusal that lists the names), `Display`, a `FromStr` that refuses any other string with [`Unknown`] (its
/// words name the vocabulary: "payment status"), and serde's `Serialize` and `Deserialize` under
/// the same names: each name is written once, and what derives from serde (an OpenAPI schema)
/// reads it too. The caller derives neither serde trait itself.
///
/// Exported at the crate's root under a hidden name, and named here: `use
/// service::vocabulary::vocabulary` from any crate, whose `$crate` paths still find [`Unknown`].
#[doc(hidden)]
#[macro_export]
macro_rules! __vocabulary {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident: $what:literal {
            // Each name a token tree, not a `literal` fragment: forwarded as it is, so that the
            // derives that read `#[serde(rename)]` (utoipa's schema) see a plain string.
            $($(#[$variant_meta:meta])* $variant:ident => $text:tt),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(::serde::Serialize, ::serde::Deserialize)]
        $vis enum $name {
            $($(#[$variant_meta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every value, in the order of its declaration.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The value's name, as it is stored and sent.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// `raw` as a value, or why not in words that list every value: what a list's filter
            /// answers (`unknown payment status `paid`; one of succeeded, failed`).
            pub fn parse_listing_all(raw: &str) -> Result<Self, String> {
                raw.parse().map_err(|unknown: $crate::vocabulary::Unknown| {
                    format!("{unknown}; one of {}", [$($text),+].join(", "))
                })
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::vocabulary::Unknown;

            fn from_str(raw: &str) -> Result<Self, Self::Err> {
                match raw {
                    $($text => Ok(Self::$variant),)+
                    _ => Err($crate::vocabulary::Unknown::new($what, raw)),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub use crate::__vocabulary as vocabulary;

#[cfg(test)]
mod tests {
    use super::*;

    vocabulary! {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Colour: "colour" {
            Red => "red",
            /// Two words.
            DarkBlue => "dark_blue",
        }
    }

    #[test]
    fn every_name_reads_back_and_any_other_is_refused_naming_the_vocabulary() {
        for colour in Colour::ALL {
            assert_eq!(colour.as_str().parse::<Colour>(), Ok(*colour));
        }
        assert_eq!(Colour::DarkBlue.to_string(), "dark_blue");
        let unknown = "Red".parse::<Colour>().unwrap_err();
        assert_eq!(unknown.to_string(), "unknown colour `Red`");
        assert_eq!(
            Colour::parse_listing_all("Red"),
            Err("unknown colour `Red`; one of red, dark_blue".to_owned())
        );
        let decoded = stored::<Colour>("green").unwrap_err();
        assert!(matches!(decoded, sqlx::Error::Decode(_)), "{decoded}");
        assert!(
            decoded.to_string().contains("unknown colour `green`"),
            "{decoded}"
        );
        // serde's names are the vocabulary's.
        assert_eq!(
            serde_json::to_string(&Colour::DarkBlue).unwrap(),
            "\"dark_blue\""
        );
        assert_eq!(
            serde_json::from_str::<Colour>("\"dark_blue\"").unwrap(),
            Colour::DarkBlue
        );
        assert!(serde_json::from_str::<Colour>("\"DarkBlue\"").is_err());
    }
}
