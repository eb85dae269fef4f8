//! Fault injection: what a real processor does to its clients now and then, on demand, so that
//! idempay's handling of each can be tested. Faults apply to charges, refunds, captures and voids;
//! `GET`/`PUT /v1/test/faults` read and change them at run time (fault_routes.rs).
//!
//! - **Lose answers**: the effect commits, then the connection is closed with no response at all.
//!   The client sees a transport error after sending and cannot tell whether anything happened.
//!   Only a first execution's answer is lost; a replay is answered, so a retry with the same key
//!   learns the result.
//! - **Fail**: 503 before anything is charged.
//! - **Latency**: a delay before the effect, inside the key's lease (a timeout shorter than it
//!   gives up while the charge still happens).

use std::time::Duration;

use clap::Args;

/// A probability from 0 (never) to 1 (always).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fraction(f64);

impl Fraction {
    pub const NEVER: Self = Self(0.0);
    pub const ALWAYS: Self = Self(1.0);

    pub fn parse(raw: &str) -> Result<Self, String> {
        let value: f64 = raw
            .trim()
            .parse()
            .map_err(|_| format!("`{raw}` is not a number from 0 to 1"))?;
        if (0.0..=1.0).contains(&value) {
            Ok(Self(value))
        } else {
            Err(format!("{value} is not from 0 to 1"))
        }
    }

    pub fn value(self) -> f64 {
        self.0
    }

    /// Draws once: true with this probability.
    pub fn happens(self) -> bool {
        self.0 > 0.0 && rand::random::<f64>() < self.0
    }
}

/// The faults the processor injects.
#[derive(Args, Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// The fraction of charges and refunds whose answer is lost: committed, then the connection is
    /// closed without a response.
    #[arg(long, env = "IDEMPAY_PROCESSOR_LOSE_ANSWERS", default_value = "0", value_parser = Fraction::parse)]
    pub lose_answers: Fraction,

    /// The fraction of charges and refunds refused with 503 before anything happens.
    #[arg(long, env = "IDEMPAY_PROCESSOR_FAIL", default_value = "0", value_parser = Fraction::parse)]
    pub fail: Fraction,

    /// A delay added to every charge and refund, before its effect.
    #[arg(long, env = "IDEMPAY_PROCESSOR_LATENCY", default_value = "0s", value_parser = service::settings::any_length("IDEMPAY_PROCESSOR_LATENCY"))]
    pub latency: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fraction_is_from_zero_to_one_and_its_ends_are_certain() {
        assert!(Fraction::parse("1.5").is_err());
        assert!(Fraction::parse("-0.1").is_err());
        assert!(Fraction::parse("x").is_err());
        assert_eq!(Fraction::parse("0.25"), Ok(Fraction(0.25)));
        assert!((0..1000).all(|_| Fraction::ALWAYS.happens()));
        assert!((0..1000).all(|_| !Fraction::NEVER.happens()));
    }
}
