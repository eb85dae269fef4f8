//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256>` over
//! `"{webhook-id}.{webhook-timestamp}.{body}"`, with a `whsec_…` secret. Verification happens on
//! the raw bytes, before anything parses the body, and compares in constant time.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a delivery's timestamp may be from our clock: older deliveries could be replays of a
/// captured request.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

const PREFIX: &str = "whsec_";

/// The secret shared with the processor: `whsec_` followed by base64.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let encoded = raw.strip_prefix(PREFIX).unwrap_or(raw);
        let key = STANDARD
            .decode(encoded)
            .map_err(|_| "a webhook secret is `whsec_` followed by base64".to_owned())?;
        if key.len() < 16 {
            return Err("a webhook secret needs at least 16 bytes".to_owned());
        }
        Ok(Self(key))
    }

    /// A new random secret.
    pub fn generate() -> Self {
        Self(rand::random::<[u8; 32]>().to_vec())
    }

    /// The secret in its shareable form, `whsec_…`.
    pub fn expose(&self) -> String {
        format!("{PREFIX}{}", STANDARD.encode(&self.0))
    }

    /// The `webhook-signature` value for a delivery.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let signature = self.mac(id, timestamp, body).finalize().into_bytes();
        format!("v1,{}", STANDARD.encode(signature))
    }

    fn mac(&self, id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any size");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(whsec_…)")
    }
}

/// Why a delivery is not accepted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the {0} header is missing or malformed")]
    MissingHeader(&'static str),
    #[error("the webhook-timestamp is more than {}s away from now", TOLERANCE.as_secs())]
    OutOfTolerance,
    #[error("no signature in webhook-signature matches")]
    BadSignature,
}

/// The longest `webhook-id` accepted, in bytes (a header value is ASCII).
pub const MAX_ID_LEN: usize = 255;

/// Verifies a delivery and returns its event id.
pub fn verify(
    secret: &WebhookSecret,
    headers: &HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<String, Rejection> {
    let header = |name: &'static str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .filter(|value| !value.is_empty())
            .ok_or(Rejection::MissingHeader(name))
    };
    // The id is the primary key of the processed events: bounded, like Stripe's and Svix's ids.
    let id = header("webhook-id")?;
    if id.len() > MAX_ID_LEN {
        return Err(Rejection::MissingHeader("webhook-id"));
    }
    let timestamp: i64 = header("webhook-timestamp")?
        .parse()
        .map_err(|_| Rejection::MissingHeader("webhook-timestamp"))?;
    let signatures = header("webhook-signature").map_err(|_| Rejection::BadSignature)?;

    let now = now.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
    });
    if timestamp.abs_diff(now) > TOLERANCE.as_secs() {
        return Err(Rejection::OutOfTolerance);
    }
    // Several signatures may be sent while a secret is rotated; any one that matches will do.
    let matches = signatures
        .split(' ')
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .any(|signature| {
            secret
                .mac(id, timestamp, body)
                .verify_slice(&signature)
                .is_ok()
        });
    if matches {
        Ok(id.to_owned())
    } else {
        Err(Rejection::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn headers(id: &str, timestamp: i64, signature: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", HeaderValue::from_str(id).unwrap());
        headers.insert("webhook-timestamp", HeaderValue::from(timestamp));
        headers.insert(
            "webhook-signature",
            HeaderValue::from_str(signature).unwrap(),
        );
        headers
    }

    fn at(timestamp: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(timestamp.unsigned_abs())
    }

    #[test]
    fn matches_the_standard_webhooks_reference_vector() {
        // The example of the Standard Webhooks specification.
        let secret = WebhookSecret::parse(SECRET).unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signature = secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_signed_delivery_verifies() {
        let secret = WebhookSecret::generate();
        let signature = secret.sign("evt_1", 1_000, b"{}");
        let verified = verify(
            &secret,
            &headers("evt_1", 1_000, &signature),
            b"{}",
            at(1_010),
        );
        assert_eq!(verified, Ok("evt_1".to_owned()));
    }

    #[test]
    fn any_of_several_signatures_may_match() {
        let secret = WebhookSecret::generate();
        let good = secret.sign("evt_1", 1_000, b"{}");
        let both = format!("v1,AAAA {good}");
        assert!(verify(&secret, &headers("evt_1", 1_000, &both), b"{}", at(1_000)).is_ok());
    }

    #[test]
    fn a_changed_body_id_or_secret_fails() {
        let secret = WebhookSecret::generate();
        let signature = secret.sign("evt_1", 1_000, b"{}");
        let now = at(1_000);
        let tampered = verify(&secret, &headers("evt_1", 1_000, &signature), b"{ }", now);
        assert_eq!(tampered, Err(Rejection::BadSignature));
        let other_id = verify(&secret, &headers("evt_2", 1_000, &signature), b"{}", now);
        assert_eq!(other_id, Err(Rejection::BadSignature));
        let other_secret = WebhookSecret::generate();
        let forged = verify(
            &other_secret,
            &headers("evt_1", 1_000, &signature),
            b"{}",
            now,
        );
        assert_eq!(forged, Err(Rejection::BadSignature));
    }

    #[test]
    fn timestamps_more_than_five_minutes_away_are_refused() {
        let secret = WebhookSecret::generate();
        let signature = secret.sign("evt_1", 1_000, b"{}");
        let headers = headers("evt_1", 1_000, &signature);
        assert!(verify(&secret, &headers, b"{}", at(1_300)).is_ok());
        assert_eq!(
            verify(&secret, &headers, b"{}", at(1_301)),
            Err(Rejection::OutOfTolerance)
        );
        assert_eq!(
            verify(&secret, &headers, b"{}", at(699)),
            Err(Rejection::OutOfTolerance)
        );
    }

    #[test]
    fn secrets_parse_with_or_without_their_prefix() {
        assert!(WebhookSecret::parse(SECRET).is_ok());
        assert!(WebhookSecret::parse(SECRET.trim_start_matches("whsec_")).is_ok());
        assert!(WebhookSecret::parse("whsec_not base64!").is_err());
        assert!(WebhookSecret::parse("whsec_c2hvcnQ=").is_err());
        let secret = WebhookSecret::generate();
        assert_eq!(WebhookSecret::parse(&secret.expose()).unwrap(), secret);
    }
}
