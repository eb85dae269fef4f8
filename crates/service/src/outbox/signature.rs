//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256>` over
//! `"{webhook-id}.{webhook-timestamp}.{body}"`, with `whsec_…` secrets. The MAC is the
//! `standardwebhooks` crate's (the specification's own Rust library): it computes it once per
//! secret and compares every `v1,` entry to it in constant time. What this module adds is
//! cheap refusal before any MAC (missing headers, a timestamp out of tolerance, too many
//! entries) and a list of secrets, so one can be rotated without refusing a delivery.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use standardwebhooks::{Webhook, WebhookError};

/// How far a delivery's timestamp may be from our clock: older deliveries could be replays of a
/// captured request. The crate checks the same five minutes again, against the same clock.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The most entries `webhook-signature` may carry. A sender sends one per secret it signs with:
/// one, two while it rotates. The crate compares every entry with the MAC it computed, so a
/// header over this cap is refused before any MAC is computed, however long it is.
pub const MAX_SIGNATURES: usize = 8;

/// The longest `webhook-id` accepted, in bytes (a header value is ASCII).
pub const MAX_ID_LEN: usize = 255;

const PREFIX: &str = "whsec_";

/// One secret shared with the processor: `whsec_` followed by base64.
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

    /// The `webhook-signature` value for a delivery, `v1,<base64>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<String, NotUtf8> {
        self.webhook()
            .sign(id, timestamp, body)
            .map_err(|_| NotUtf8)
    }

    fn webhook(&self) -> Webhook {
        // `from_bytes` takes any key; it returns a `Result` only to look like `Webhook::new`.
        Webhook::from_bytes(self.0.clone()).expect("standardwebhooks takes a key of any bytes")
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(whsec_…)")
    }
}

/// The secrets of `IDEMPAY_WEBHOOK_SECRET`, space separated: a delivery signed with any of them
/// is accepted, and events are signed with the first. To rotate, list the new secret after the
/// old one on the receiver, then first on the sender, then drop the old one.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecrets(Vec<WebhookSecret>);

impl WebhookSecrets {
    /// Parses a space-separated list of `whsec_…` secrets: at least one, each valid.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let members: Vec<&str> = raw.split_whitespace().collect();
        if members.is_empty() {
            return Err("list at least one `whsec_…` secret, separated by spaces".to_owned());
        }
        let count = members.len();
        members
            .into_iter()
            .enumerate()
            .map(|(index, member)| {
                WebhookSecret::parse(member)
                    .map_err(|error| format!("secret {} of {count}: {error}", index + 1))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// One new random secret.
    pub fn generate() -> Self {
        Self(vec![WebhookSecret::generate()])
    }

    /// The secret events are signed with: the first.
    pub fn signing(&self) -> &WebhookSecret {
        &self.0[0]
    }

    /// The list in its shareable form, as `IDEMPAY_WEBHOOK_SECRET` takes it.
    pub fn expose(&self) -> String {
        let exposed: Vec<String> = self.0.iter().map(WebhookSecret::expose).collect();
        exposed.join(" ")
    }

    /// Signs with the first secret.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<String, NotUtf8> {
        self.signing().sign(id, timestamp, body)
    }

    /// Verifies a delivery against each secret in turn and returns its event id. Everything that
    /// costs no MAC is checked first, once.
    pub fn verify(&self, headers: &HeaderMap, body: &[u8]) -> Result<String, Rejection> {
        let id = precheck(headers, SystemTime::now())?;
        for secret in &self.0 {
            match secret.webhook().verify(body, headers) {
                Ok(()) => return Ok(id.to_owned()),
                Err(WebhookError::InvalidSignature) => {}
                Err(other) => return Err(Rejection::from(other)),
            }
        }
        Err(Rejection::BadSignature)
    }
}

impl From<WebhookSecret> for WebhookSecrets {
    fn from(secret: WebhookSecret) -> Self {
        Self(vec![secret])
    }
}

impl fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WebhookSecrets({} × whsec_…)", self.0.len())
    }
}

/// Standard Webhooks signs text: a body that is not UTF-8 has no signature (and is no JSON).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("a webhook body must be UTF-8 to be signed")]
pub struct NotUtf8;

/// Why a delivery is not accepted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("the {0} header is missing or malformed")]
    MissingHeader(&'static str),
    #[error("webhook-signature carries more than {MAX_SIGNATURES} signatures")]
    TooManySignatures,
    #[error("the webhook-timestamp is more than {}s away from now", TOLERANCE.as_secs())]
    OutOfTolerance,
    #[error("the body is not UTF-8, so no signature covers it")]
    NotUtf8,
    #[error("no signature in webhook-signature matches")]
    BadSignature,
}

impl From<WebhookError> for Rejection {
    /// The crate's verdicts, for what `precheck` has not already refused.
    fn from(error: WebhookError) -> Self {
        match error {
            WebhookError::MissingHeader("id") | WebhookError::InvalidHeader("id") => {
                Self::MissingHeader("webhook-id")
            }
            WebhookError::InvalidTimestamp
            | WebhookError::MissingHeader("timestamp")
            | WebhookError::InvalidHeader("timestamp") => Self::MissingHeader("webhook-timestamp"),
            WebhookError::TimestampTooOldError | WebhookError::FutureTimestampError => {
                Self::OutOfTolerance
            }
            WebhookError::InvalidPayload => Self::NotUtf8,
            WebhookError::MissingHeader(_)
            | WebhookError::InvalidHeader(_)
            | WebhookError::InvalidSecret(_)
            | WebhookError::InvalidSignature => Self::BadSignature,
        }
    }
}

/// The checks that cost no MAC, in the order a sender would fix them: the id (bounded, it is
/// the primary key of the processed events), the timestamp (which also keeps out the extreme
/// values the crate's own arithmetic would overflow on), then the number of signatures.
fn precheck(headers: &HeaderMap, now: SystemTime) -> Result<&str, Rejection> {
    let header = |name: &'static str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .filter(|value| !value.is_empty())
            .ok_or(Rejection::MissingHeader(name))
    };
    let id = header("webhook-id")?;
    if id.len() > MAX_ID_LEN {
        return Err(Rejection::MissingHeader("webhook-id"));
    }
    let timestamp: i64 = header("webhook-timestamp")?
        .parse()
        .map_err(|_| Rejection::MissingHeader("webhook-timestamp"))?;
    let signatures = header("webhook-signature").map_err(|_| Rejection::BadSignature)?;
    if !within_tolerance(timestamp, now) {
        return Err(Rejection::OutOfTolerance);
    }
    // The crate looks at every space-separated entry: this is how many it will see.
    if signatures.split(' ').count() > MAX_SIGNATURES {
        return Err(Rejection::TooManySignatures);
    }
    Ok(id)
}

fn within_tolerance(timestamp: i64, now: SystemTime) -> bool {
    let now = now.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
    });
    timestamp.abs_diff(now) <= TOLERANCE.as_secs()
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

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    fn at(timestamp: i64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(timestamp.unsigned_abs())
    }

    fn one() -> WebhookSecrets {
        WebhookSecrets::generate()
    }

    #[test]
    fn matches_the_standard_webhooks_reference_vector() {
        // The example of the Standard Webhooks specification.
        let secret = WebhookSecret::parse(SECRET).unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signature = secret
            .sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
            .unwrap();
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_signed_delivery_verifies() {
        let secrets = one();
        let now = now();
        let signature = secrets.sign("evt_1", now, b"{}").unwrap();
        let verified = secrets.verify(&headers("evt_1", now, &signature), b"{}");
        assert_eq!(verified, Ok("evt_1".to_owned()));
    }

    #[test]
    fn any_of_several_signatures_may_match() {
        let secrets = one();
        let now = now();
        let good = secrets.sign("evt_1", now, b"{}").unwrap();
        let both = format!("v1,AAAA {good}");
        assert!(secrets.verify(&headers("evt_1", now, &both), b"{}").is_ok());
    }

    #[test]
    fn a_changed_body_id_or_secret_fails() {
        let secrets = one();
        let now = now();
        let signature = secrets.sign("evt_1", now, b"{}").unwrap();
        let tampered = secrets.verify(&headers("evt_1", now, &signature), b"{ }");
        assert_eq!(tampered, Err(Rejection::BadSignature));
        let other_id = secrets.verify(&headers("evt_2", now, &signature), b"{}");
        assert_eq!(other_id, Err(Rejection::BadSignature));
        let forged = one().verify(&headers("evt_1", now, &signature), b"{}");
        assert_eq!(forged, Err(Rejection::BadSignature));
    }

    #[test]
    fn timestamps_more_than_five_minutes_away_are_refused() {
        // The exact boundary, on the check made before any MAC.
        assert!(within_tolerance(1_000, at(1_300)));
        assert!(within_tolerance(1_000, at(700)));
        assert!(!within_tolerance(1_000, at(1_301)));
        assert!(!within_tolerance(1_000, at(699)));
        assert!(!within_tolerance(i64::MIN, at(1_000)), "no overflow");
        // And through `verify`, where the crate checks the same five minutes against the clock:
        // a few seconds inside the tolerance pass it too.
        let secrets = one();
        for (offset, accepted) in [(-290, true), (290, true), (-310, false), (310, false)] {
            let then = now() + offset;
            let signature = secrets.sign("evt_1", then, b"{}").unwrap();
            let verified = secrets.verify(&headers("evt_1", then, &signature), b"{}");
            assert_eq!(verified.is_ok(), accepted, "{offset}: {verified:?}");
            if !accepted {
                assert_eq!(verified, Err(Rejection::OutOfTolerance));
            }
        }
    }

    #[test]
    fn a_header_over_the_cap_is_refused_even_with_the_right_signature_in_it() {
        let secrets = one();
        let now = now();
        let good = secrets.sign("evt_1", now, b"{}").unwrap();
        let at_cap = format!("{} {good}", ["v1,AAAA"; MAX_SIGNATURES - 1].join(" "));
        let verified = secrets.verify(&headers("evt_1", now, &at_cap), b"{}");
        assert_eq!(verified, Ok("evt_1".to_owned()));
        let over_cap = format!("{} {good}", ["v1,AAAA"; MAX_SIGNATURES].join(" "));
        let refused = secrets.verify(&headers("evt_1", now, &over_cap), b"{}");
        assert_eq!(refused, Err(Rejection::TooManySignatures));
        // Empty entries count: the crate would look at each of them too.
        let spaces = format!("{good}{}", " ".repeat(MAX_SIGNATURES));
        let refused = secrets.verify(&headers("evt_1", now, &spaces), b"{}");
        assert_eq!(refused, Err(Rejection::TooManySignatures));
    }

    #[test]
    fn missing_headers_and_a_body_that_is_not_utf8_are_told_apart() {
        let secrets = one();
        let now = now();
        let signature = secrets.sign("evt_1", now, b"{}").unwrap();
        let complete = headers("evt_1", now, &signature);
        for (name, rejection) in [
            ("webhook-id", Rejection::MissingHeader("webhook-id")),
            (
                "webhook-timestamp",
                Rejection::MissingHeader("webhook-timestamp"),
            ),
            ("webhook-signature", Rejection::BadSignature),
        ] {
            let mut headers = complete.clone();
            headers.remove(name);
            assert_eq!(secrets.verify(&headers, b"{}"), Err(rejection), "{name}");
        }
        assert_eq!(
            secrets.verify(&complete, b"{\"\xff\"}"),
            Err(Rejection::NotUtf8)
        );
        assert_eq!(secrets.sign("evt_1", now, b"\xff"), Err(NotUtf8));
    }

    #[test]
    fn any_listed_secret_verifies_and_the_first_signs() {
        let (old, new) = (WebhookSecret::generate(), WebhookSecret::generate());
        let secrets =
            WebhookSecrets::parse(&format!("{}  {}", new.expose(), old.expose())).unwrap();
        let now = now();
        for secret in [&old, &new] {
            let signature = secret.sign("evt_1", now, b"{}").unwrap();
            let verified = secrets.verify(&headers("evt_1", now, &signature), b"{}");
            assert_eq!(verified, Ok("evt_1".to_owned()));
        }
        assert_eq!(secrets.signing(), &new);
        assert_eq!(
            secrets.sign("evt_1", now, b"{}"),
            new.sign("evt_1", now, b"{}")
        );
        let stranger = WebhookSecret::generate().sign("evt_1", now, b"{}").unwrap();
        let refused = secrets.verify(&headers("evt_1", now, &stranger), b"{}");
        assert_eq!(refused, Err(Rejection::BadSignature));
        assert_eq!(WebhookSecrets::parse(&secrets.expose()).unwrap(), secrets);
    }

    #[test]
    fn a_list_of_secrets_needs_one_and_names_the_bad_member() {
        assert!(WebhookSecrets::parse("").is_err());
        assert!(WebhookSecrets::parse("   ").is_err());
        let good = WebhookSecret::generate().expose();
        let error = WebhookSecrets::parse(&format!("{good} whsec_c2hvcnQ=")).unwrap_err();
        assert_eq!(
            error,
            "secret 2 of 2: a webhook secret needs at least 16 bytes"
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
