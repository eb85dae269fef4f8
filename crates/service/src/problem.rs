//! What every problem document (RFC 9457) of either service shares: its media type, and the
//! macro that declares a service's catalogue of kinds once. Each service keeps its own table
//! (idempay's in `http/error/catalogue.rs`, the processor's in its `problem.rs`) and its own
//! document type; the details are written as sentences by `idempotency::sentence`.

/// The media type of every problem document.
pub const PROBLEM_JSON: &str = "application/problem+json";

#[doc(hidden)]
pub use axum::http::StatusCode as __StatusCode;

/// Declares a catalogue of problem kinds once, each with its slug, status, title and, where the
/// service shows one at the kind's `type` URI, its explanation. From it come the enum, `ALL`,
/// and `status`, `type_uri` (`/problems/{slug}`, relative to the service's address), `slug`,
/// `title`, `explanation` (empty where none is declared), `from_slug` and `from_type_uri`.
#[macro_export]
macro_rules! problem_catalogue {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($kind:ident {
                slug: $slug:literal,
                status: $status:ident,
                title: $title:literal
                $(, explanation: $explanation:literal)? $(,)?
            })*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name {
            $($kind,)*
        }

        impl $name {
            /// Every kind, for documentation and tests.
            pub const ALL: &[$name] = &[$(Self::$kind,)*];

            pub fn status(self) -> $crate::problem::__StatusCode {
                match self {
                    $(Self::$kind => $crate::problem::__StatusCode::$status,)*
                }
            }

            /// The `type` URI: `/problems/{slug}`, relative to the service's address.
            pub fn type_uri(self) -> &'static str {
                match self {
                    $(Self::$kind => concat!("/problems/", $slug),)*
                }
            }

            /// The last segment of the `type` URI, which a program branches on.
            pub fn slug(self) -> &'static str {
                match self {
                    $(Self::$kind => $slug,)*
                }
            }

            pub fn title(self) -> &'static str {
                match self {
                    $(Self::$kind => $title,)*
                }
            }

            /// What the problem means and what a client should do about it, where the service
            /// shows it at the kind's `type` URI; empty where the catalogue declares none.
            pub fn explanation(self) -> &'static str {
                match self {
                    $(Self::$kind => $crate::__explanation!($($explanation)?),)*
                }
            }

            /// The kind whose `type` URI ends in `slug`.
            pub fn from_slug(slug: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|kind| kind.slug() == slug)
            }

            /// The kind whose `type` URI is `uri`, as a client reads it back.
            pub fn from_type_uri(uri: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|kind| kind.type_uri() == uri)
            }
        }
    };
}

/// A kind's explanation as declared, or none.
#[doc(hidden)]
#[macro_export]
macro_rules! __explanation {
    () => {
        ""
    };
    ($explanation:literal) => {
        $explanation
    };
}

#[cfg(test)]
mod tests {
    crate::problem_catalogue! {
        /// A catalogue for the test.
        enum Kind {
            Plain {
                slug: "plain",
                status: BAD_REQUEST,
                title: "Plain",
            }
            Explained {
                slug: "explained",
                status: CONFLICT,
                title: "Explained",
                explanation: "Why, and what to do.",
            }
        }
    }

    #[test]
    fn a_catalogue_s_kinds_are_found_by_their_slug_and_type_and_say_what_they_declare() {
        assert_eq!(Kind::ALL, &[Kind::Plain, Kind::Explained]);
        for kind in Kind::ALL {
            assert_eq!(Kind::from_slug(kind.slug()), Some(*kind));
            assert_eq!(Kind::from_type_uri(kind.type_uri()), Some(*kind));
        }
        assert_eq!(Kind::Explained.type_uri(), "/problems/explained");
        assert_eq!(Kind::Explained.status().as_u16(), 409);
        assert_eq!(Kind::Explained.explanation(), "Why, and what to do.");
        assert_eq!(Kind::Plain.explanation(), "");
        assert_eq!(Kind::Plain.title(), "Plain");
        assert_eq!(Kind::from_slug("unheard-of"), None);
    }
}
