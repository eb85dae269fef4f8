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
