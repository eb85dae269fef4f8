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
}
