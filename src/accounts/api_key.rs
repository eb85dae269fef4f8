//! Secret API keys: `sk_` followed by 40 random base62 characters (about 238 bits).

use sha2::{Digest, Sha256};

use service::ids;

const PREFIX: &str = "sk";
const RANDOM_CHARS: usize = 40;

/// A secret API key. It is shown once, at creation; the database keeps only [`ApiKey::hash`].
/// `Debug` does not print it, so it cannot leak into logs by accident.
pub struct ApiKey(String);

impl ApiKey {
    pub(super) fn generate() -> Self {
        Self(ids::generate(PREFIX, RANDOM_CHARS))
    }

    /// Accepts what has the shape of a key; whether it belongs to an account is the lookup's job.
    pub fn parse(raw: &str) -> Option<Self> {
        ids::has_shape(raw, PREFIX, RANDOM_CHARS).then(|| Self(raw.to_owned()))
    }

    /// What is stored and looked up: SHA-256 of the key. A slow password hash is not needed, since
    /// the key is random with high entropy, and a fast one keeps authentication cheap.
    pub fn hash(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }

    /// The secret, for showing it to its owner once.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(sk_…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_parses_and_hashes_stably() {
        let key = ApiKey::generate();
        let parsed = ApiKey::parse(key.expose()).unwrap();
        assert_eq!(parsed.hash(), key.hash());
        assert_ne!(ApiKey::generate().hash(), key.hash());
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert!(ApiKey::parse("").is_none());
        assert!(ApiKey::parse("sk_short").is_none());
        assert!(ApiKey::parse(&format!("pk_{}", "a".repeat(40))).is_none());
        assert!(ApiKey::parse(&format!("sk_{}!", "a".repeat(39))).is_none());
    }

    #[test]
    fn debug_output_hides_the_secret() {
        let key = ApiKey::generate();
        assert!(!format!("{key:?}").contains(key.expose()));
    }
}
