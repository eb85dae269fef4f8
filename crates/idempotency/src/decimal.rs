//! JSON numbers read by their decimal text, never through `f64`: `4200`, `4200.0` and `42e2` are
//! one value, and `4200.0000000000001` is not an integer, however close a float would round it.
//! The fingerprint writes every number in one form per value; an amount refuses a fraction.

/// A JSON number as an exact decimal: `(-1)^negative × digits × 10^exponent`, where `digits` has
/// no leading or trailing zero (zero is no digits), so equal values have equal parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

/// An integer whose notation adds more zeros than this is written with an exponent in the
/// canonical form, so that a few bytes of input (`1e1000000`) cannot become a megabyte of output.
const MAX_WRITTEN_ZEROS: i64 = 64;

impl Decimal {
    /// Reads the text of a JSON number (`-?int(.frac)?([eE][+-]?exp)?`); `None` for anything else,
    /// or for an exponent beyond `i64` (no body the API accepts comes near one).
    pub fn parse(text: &str) -> Option<Self> {
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], parse_exponent(&unsigned[at + 1..])?),
            None => (unsigned, 0),
        };
        let (int, frac) = match mantissa.split_once('.') {
            Some((int, frac)) => (int, Some(frac)),
            None => (mantissa, None),
        };
        let int_is_json = int == "0" || int.starts_with(|c: char| matches!(c, '1'..='9'));
        let all_digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        if !int_is_json || !all_digits(int) || frac.is_some_and(|frac| !all_digits(frac)) {
            return None;
        }
        let frac = frac.unwrap_or("");
        let fraction_len = i64::try_from(frac.len()).ok()?;
        let digits = format!("{int}{frac}");
        let significant = digits.trim_start_matches('0');
        let trimmed = significant.trim_end_matches('0');
        let trailing_zeros = i64::try_from(significant.len() - trimmed.len()).ok()?;
        let exponent = exponent
            .checked_sub(fraction_len)?
            .checked_add(trailing_zeros)?;
        Some(if trimmed.is_empty() {
            Self::zero()
        } else {
            Self {
                negative,
                digits: trimmed.to_owned(),
                exponent,
            }
        })
    }

    fn zero() -> Self {
        Self {
            negative: false,
            digits: String::new(),
            exponent: 0,
        }
    }

    /// Whether the value is a whole number, whatever its notation (`4.2e3`, `4200.000`).
    pub fn is_integer(&self) -> bool {
        self.exponent >= 0
    }

    /// The value as an `i64`, if it is an integer within its range.
    pub fn to_i64(&self) -> Option<i64> {
        if !self.is_integer() {
            return None;
        }
        if self.digits.is_empty() {
            // Zero has no digits, which would be no number to `parse`.
            return Some(0);
        }
        let zeros = usize::try_from(self.exponent).ok()?;
        // 19 digits hold every i64; more cannot fit, and need not be written out to know it.
        if self.digits.len().checked_add(zeros)? > 19 {
            return None;
        }
        let text = format!(
            "{}{}{}",
            if self.negative { "-" } else { "" },
            self.digits,
            "0".repeat(zeros)
        );
        text.parse().ok()
    }

    /// The one JSON text of this value: an integer is written out in full (`4200`, `-7`, `0`)
    /// unless that takes more than 64 zeros (`MAX_WRITTEN_ZEROS`); any other value is its digits and
    /// an exponent (`425e-1` for 42.5). Equal values give equal text, different values different
    /// text, and the text is a JSON number of the same value.
    pub fn canonical(&self) -> String {
        let sign = if self.negative { "-" } else { "" };
        if self.digits.is_empty() {
            "0".to_owned()
        } else if (0..=MAX_WRITTEN_ZEROS).contains(&self.exponent) {
            let zeros = usize::try_from(self.exponent).unwrap_or_default();
            format!("{sign}{}{}", self.digits, "0".repeat(zeros))
        } else {
            format!("{sign}{}e{}", self.digits, self.exponent)
        }
    }
}

fn parse_exponent(text: &str) -> Option<i64> {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.strip_prefix('+').unwrap_or(text).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        Decimal::parse(text).unwrap().canonical()
    }

    #[test]
    fn an_exponent_is_digits_after_one_sign_at_most() {
        assert_eq!(parse_exponent("+12"), Some(12));
        assert_eq!(parse_exponent("-3"), Some(-3));
        for refused in ["", "+", "+-5", "-+5", "1.5", "x"] {
            assert_eq!(parse_exponent(refused), None, "{refused:?}");
        }
    }

    #[test]
    fn an_integral_value_is_written_as_that_integer_whatever_its_notation() {
        for text in [
            "4200",
            "4200.0",
            "4.2e3",
            "42E2",
            "4200.000",
            "42e+2",
            "420000e-2",
        ] {
            assert_eq!(canonical(text), "4200", "{text}");
        }
        assert_eq!(canonical("-4.2e3"), "-4200");
        for zero in ["0", "-0", "0.000", "0e10", "-0.0e-5"] {
            assert_eq!(canonical(zero), "0", "{zero}");
        }
    }

    #[test]
    fn integers_beyond_the_range_of_floats_keep_every_digit() {
        assert_eq!(
            canonical("12345678901234567890123.0"),
            "12345678901234567890123"
        );
        assert_ne!(
            canonical("9007199254740993"),
            canonical("9007199254740992"),
            "2^53 + 1 is not 2^53, though an f64 holds only the second"
        );
    }

    #[test]
    fn a_fraction_is_kept_to_its_last_digit() {
        let barely = Decimal::parse("4200.0000000000001").unwrap();
        assert!(!barely.is_integer());
        assert_eq!(barely.to_i64(), None);
        assert_eq!(barely.canonical(), "42000000000000001e-13");
        assert_eq!(canonical("42.50"), canonical("4.25e1"));
    }

    #[test]
    fn a_huge_exponent_is_not_written_out() {
        assert_eq!(canonical("1e1000000"), "1e1000000");
        assert_eq!(canonical("10e999999"), "1e1000000");
        assert_eq!(canonical("1e64").len(), 65);
    }

    #[test]
    fn integers_convert_to_i64_only_within_its_range() {
        assert_eq!(Decimal::parse("4.2e3").and_then(|d| d.to_i64()), Some(4200));
        assert_eq!(
            Decimal::parse("-9223372036854775808").and_then(|d| d.to_i64()),
            Some(i64::MIN)
        );
        assert_eq!(
            Decimal::parse("9223372036854775808").and_then(|d| d.to_i64()),
            None
        );
        assert_eq!(Decimal::parse("1e400").and_then(|d| d.to_i64()), None);
        for zero in ["0", "0.0", "-0", "0e5"] {
            assert_eq!(
                Decimal::parse(zero).and_then(|d| d.to_i64()),
                Some(0),
                "{zero}"
            );
        }
    }

    #[test]
    fn text_that_is_no_json_number_is_refused() {
        for text in [
            "",
            "-",
            "01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "1.2.3",
            "0x10",
            "\"1\"",
            "1 ",
            "NaN",
            "1e99999999999999999999",
        ] {
            assert_eq!(Decimal::parse(text), None, "{text:?}");
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// An integer written with a fraction of zeros, or with its digits shifted into an
        /// exponent, has the canonical form of the integer itself.
        #[test]
        fn every_notation_of_an_integer_is_that_integer(
            value in any::<i64>(),
            zeros in 0usize..5,
            shift in 0u32..6,
            upper in any::<bool>(),
        ) {
            let written = value.to_string();
            prop_assert_eq!(canonical_of(&written), written.clone());
            let with_fraction = format!("{written}.{}", "0".repeat(zeros.max(1)));
            prop_assert_eq!(canonical_of(&with_fraction), written.clone());
            let digits = value.unsigned_abs().to_string();
            let sign = if value < 0 { "-" } else { "" };
            let cut = digits.len().saturating_sub(shift as usize).max(1);
            let (int, frac) = digits.split_at(cut);
            let mantissa = if frac.is_empty() { int.to_owned() } else { format!("{int}.{frac}") };
            let e = if upper { 'E' } else { 'e' };
            let exponent = frac.len();
            let scientific = format!("{sign}{mantissa}{e}{exponent}");
            prop_assert_eq!(canonical_of(&scientific), written.clone());
            prop_assert_eq!(Decimal::parse(&scientific).and_then(|d| d.to_i64()), Some(value));
        }

        /// The canonical text is itself a JSON number of the same value, so it never stands for
        /// another one.
        #[test]
        fn the_canonical_text_reads_back_as_the_same_value(
            int in "-?(0|[1-9][0-9]{0,25})",
            frac in proptest::option::of("[0-9]{1,12}"),
            exponent in proptest::option::of(-80i64..80),
        ) {
            let mut text = int;
            if let Some(frac) = frac {
                text = format!("{text}.{frac}");
            }
            if let Some(exponent) = exponent {
                text = format!("{text}e{exponent}");
            }
            let value = Decimal::parse(&text).unwrap();
            prop_assert_eq!(Decimal::parse(&value.canonical()), Some(value));
        }
    }

    fn canonical_of(text: &str) -> String {
        Decimal::parse(text).unwrap().canonical()
    }
}
