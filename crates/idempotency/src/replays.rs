//! Completed keys this instance saw, answered from memory: no round trip for a replay.

use std::sync::Arc;
use std::time::Instant;

use quick_cache::sync::Cache;

use crate::{
    Answer, Comparison, FieldDigests, Fingerprint, FingerprintVersion, KeyedRequest, Refusal,
    StoredResponse, mismatched_fields,
};

/// Completed responses kept in memory at most; each is a few hundred bytes.
pub(crate) const CACHED_REPLAYS: usize = 10_000;

/// A completed key's response, served without a round trip to the database. It is safe to keep:
/// a completed row never changes until it expires, and the entry is dropped before that.
#[derive(Clone)]
pub(crate) struct CachedReplay {
    /// The key's fingerprint, under the version it was made with.
    fingerprint: (FingerprintVersion, Fingerprint),
    fields: Option<FieldDigests>,
    /// The exact digest of the request that completed or replayed the key, when it had one: a
    /// retry with the same bytes is answered without fingerprinting its body.
    exact: Option<Fingerprint>,
    response: StoredResponse,
    /// No later than the key's `expires_at`, on this instance's monotonic clock.
    until: Instant,
}

/// The completed keys this instance keeps, at most [`CACHED_REPLAYS`]; its clones share them, and
/// each entry is shared, not copied, with the replays it answers.
#[derive(Clone)]
pub(crate) struct Replays(Arc<Cache<String, Arc<CachedReplay>>>);

impl Default for Replays {
    fn default() -> Self {
        Self(Arc::new(Cache::new(CACHED_REPLAYS)))
    }
}

impl Replays {
    /// How many keys are kept.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Answers a key this instance saw completed without asking the database: the stored
    /// response, or 422 for another payload. `None` when the key is not cached (or has expired).
    /// The same bytes as the cached request's are the same request; other bytes are fingerprinted
    /// here (which may refuse the body) and compared.
    pub(crate) fn decide(&self, request: &mut KeyedRequest) -> Result<Option<Answer>, Refusal> {
        let key = cache_key(request);
        let Some(cached) = self.0.get(&key) else {
            return Ok(None);
        };
        if cached.until <= Instant::now() {
            self.0.remove(&key);
            return Ok(None);
        }
        if request.exact.is_some() && request.exact == cached.exact {
            return Ok(Some(Answer::Replay(cached.response.clone())));
        }
        request.digest()?;
        Ok(Some(
            match request.fingerprints.compare(Some(cached.fingerprint)) {
                Comparison::Same => Answer::Replay(cached.response.clone()),
                Comparison::Differs => {
                    let fields = mismatched_fields(cached.fields.as_ref(), request.fields.as_ref());
                    Answer::Mismatch(fields)
                }
                // Never cached: this release computes the version of every key it completed.
                Comparison::UnknownVersion(_) => return Ok(None),
            },
        ))
    }

    /// Keeps the response of the key `request` completed or replayed, whose fingerprint is
    /// `fingerprint`.
    pub(crate) fn remember(
        &self,
        request: &KeyedRequest,
        fingerprint: (FingerprintVersion, Fingerprint),
        response: &StoredResponse,
        until: Instant,
    ) {
        self.0.insert(
            cache_key(request),
            Arc::new(CachedReplay {
                fingerprint,
                // The request's digests are the stored ones: its fingerprint is the stored one.
                fields: request.fields.clone(),
                exact: request.exact,
                response: response.clone(),
                until,
            }),
        );
    }
}

/// Keys are cached per scope, as they are stored.
fn cache_key(request: &KeyedRequest) -> String {
    format!("{}\n{}", request.scope.as_str(), request.key.as_str())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::{Method, StatusCode, Uri};
    use bytes::Bytes;

    use super::*;
    use crate::{IdempotencyKey, Scope};

    fn request(body: &'static str) -> KeyedRequest {
        KeyedRequest::of_json(
            Scope::new("acct_1", &Method::POST, "/v1/payments"),
            IdempotencyKey::parse(b"k1").unwrap(),
            Uri::from_static("/v1/payments"),
            Bytes::from_static(body.as_bytes()),
        )
    }

    #[test]
    fn the_same_bytes_are_answered_without_fingerprinting_the_body_and_other_bytes_are_compared() {
        let replays = Replays::default();
        let mut first = request(r#"{"amount":4200,"currency":"eur"}"#);
        first.digest().unwrap();
        let stored = StoredResponse::raw(StatusCode::CREATED, Bytes::from_static(b"{}"));
        let fingerprint = first.fingerprints.current().unwrap();
        let until = Instant::now() + Duration::from_secs(60);
        replays.remember(&first, fingerprint, &stored, until);

        let mut resent = request(r#"{"amount":4200,"currency":"eur"}"#);
        let answer = replays.decide(&mut resent).unwrap();
        assert!(matches!(answer, Some(Answer::Replay(_))), "{answer:?}");
        assert!(resent.undigested.is_some(), "answered by its bytes alone");

        let mut rewritten = request(r#"{ "currency": "eur", "amount": 42e2 }"#);
        let answer = replays.decide(&mut rewritten).unwrap();
        assert!(matches!(answer, Some(Answer::Replay(_))), "{answer:?}");
        assert!(
            rewritten.undigested.is_none(),
            "fingerprinted to be compared"
        );

        let mut other = request(r#"{"amount":1,"currency":"eur"}"#);
        let answer = replays.decide(&mut other).unwrap();
        assert!(matches!(answer, Some(Answer::Mismatch(_))), "{answer:?}");
    }
}
