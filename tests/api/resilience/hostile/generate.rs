//! The generator: hostile requests drawn from a seeded random number generator, each with what
//! may rightly happen to it. The same seed draws the same requests.

use std::net::SocketAddr;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use service::outbox::WebhookSecrets;

use crate::support::helpers::{new_key, payment};

/// What the storm aims at: the server, two accounts' keys, payments to refund, a few keys that
/// several requests share (so replays, mismatches and 409s happen), and the webhook secret.
pub struct Target {
    pub address: SocketAddr,
    pub api_key: String,
    pub other_api_key: String,
    pub paid: Vec<String>,
    pub keys: Vec<String>,
    pub secret: WebhookSecrets,
}

/// One request as bytes, with what may rightly happen to it.
#[derive(Clone, Debug)]
pub struct Hostile {
    pub kind: &'static str,
    pub method: String,
    pub target: String,
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub body: Option<Vec<u8>>,
    /// Bytes sent as they are, instead of a request assembled from the parts above.
    pub raw: Option<Vec<u8>>,
    /// Declare this Content-Length instead of the body's length.
    pub declared_length: Option<usize>,
    /// Send the body with `Transfer-Encoding: chunked`, in pieces of this size.
    pub chunked: Option<usize>,
    /// The server may never answer (it waits for bytes that never come), or drop the connection
    /// without an answer (the request is over its limits).
    pub may_go_unanswered: bool,
    /// For the duplicate-fields test: the key, and whether the body gives a field twice.
    pub key: Option<(String, bool)>,
    /// For a webhook, its `webhook-id`.
    pub webhook_id: Option<String>,
    /// For a forged webhook (unsigned, badly signed, signed too long ago, with a timestamp no
    /// clock reads), or one of a type this release does not know: the status and problem it must
    /// be refused with, and so recorded nowhere.
    pub refused_as: Option<(u16, &'static str)>,
}

impl Hostile {
    pub fn new(kind: &'static str) -> Self {
        Self {
            kind,
            method: "GET".to_owned(),
            target: "/".to_owned(),
            headers: Vec::new(),
            body: None,
            raw: None,
            declared_length: None,
            chunked: None,
            may_go_unanswered: false,
            key: None,
            webhook_id: None,
            refused_as: None,
        }
    }

    pub fn request(mut self, method: &str, target: &str) -> Self {
        method.clone_into(&mut self.method);
        target.clone_into(&mut self.target);
        self
    }

    pub fn post(self, target: &str) -> Self {
        self.request("POST", target)
    }

    pub fn header(mut self, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.as_ref().to_vec(), value.as_ref().to_vec()));
        self
    }

    pub fn bearer(self, api_key: &str) -> Self {
        self.header("authorization", format!("Bearer {api_key}"))
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    pub fn json(self, body: impl Into<Vec<u8>>) -> Self {
        self.header("content-type", "application/json").body(body)
    }

    /// A HEAD request: its answer has a head and no body.
    pub fn is_head(&self) -> bool {
        self.raw.is_none() && self.method == "HEAD"
    }

    pub fn unanswerable(mut self) -> Self {
        self.may_go_unanswered = true;
        self
    }

    /// The bytes on the wire.
    pub fn bytes(&self) -> Vec<u8> {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let mut out = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        out.extend_from_slice(b"host: 127.0.0.1\r\nconnection: close\r\n");
        for (name, value) in &self.headers {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        let body = self.body.clone().unwrap_or_default();
        match self.chunked {
            Some(size) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                for piece in body.chunks(size.max(1)) {
                    out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    out.extend_from_slice(piece);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
            }
            None => {
                if self.body.is_some() || self.declared_length.is_some() {
                    let length = self.declared_length.unwrap_or(body.len());
                    out.extend_from_slice(format!("content-length: {length}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(&body);
            }
        }
        out
    }
}

impl std::fmt::Display for Hostile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = self.bytes();
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            .escape_debug()
            .to_string();
        write!(f, "{} bytes: {shown}", bytes.len())?;
        if bytes.len() > 300 {
            f.write_str("…")?;
        }
        Ok(())
    }
}

pub const METHODS: [&str; 12] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "post", "FOO", "GET\t",
    "BREW",
];

impl Target {
    pub fn hostile(&self, rng: &mut StdRng) -> Hostile {
        match rng.random_range(0..19) {
            0 | 1 => self.valid_payment(rng),
            2 => self.junk_headers(rng),
            3 => self.oversized_headers(rng),
            4 => self.giant_key(rng),
            5 => self.control_key(rng),
            6 => self.invalid_utf8_body(rng),
            7 => self.deep_nesting(rng),
            8 => self.huge_numbers(rng),
            9 => {
                let amount = rng.random_range(1..=99_999_999);
                let body = duplicate_fields(rng, amount);
                self.payment_with(rng, "duplicate-fields", body)
            }
            10 => self.wrong_content_type(rng),
            11 => self.truncated_body(rng),
            12 => self.chunked_body(rng),
            13 => self.random_route(rng),
            14 => self.refund(rng),
            15 => self.webhook(rng),
            16 => self.auth(rng),
            17 => self.broken_http(rng),
            _ => self.list_query(rng),
        }
    }

    pub fn key(&self, rng: &mut StdRng) -> String {
        if rng.random_bool(0.5) {
            self.keys.choose(rng).unwrap().clone()
        } else {
            new_key()
        }
    }

    pub fn api_key(&self, rng: &mut StdRng) -> &str {
        if rng.random_bool(0.8) {
            &self.api_key
        } else {
            &self.other_api_key
        }
    }

    /// A payment with a valid key and `body`, from one of the two accounts.
    pub fn payment_with(
        &self,
        rng: &mut StdRng,
        kind: &'static str,
        body: impl Into<Vec<u8>>,
    ) -> Hostile {
        Hostile::new(kind)
            .post("/v1/payments")
            .bearer(self.api_key(rng))
            .header("idempotency-key", self.key(rng))
            .json(body)
    }

    pub fn valid_payment(&self, rng: &mut StdRng) -> Hostile {
        let method = ["pm_card_visa", "pm_card_chargeDeclined", "pm_card_slow"]
            .choose(rng)
            .unwrap();
        let amount = [1, 4200, 99_999_999].choose(rng).unwrap();
        let body = format!(r#"{{"amount":{amount},"currency":"eur","payment_method":"{method}"}}"#);
        self.payment_with(rng, "valid-payment", body)
    }

    pub fn junk_headers(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "junk-headers";
        for _ in 0..rng.random_range(1..30) {
            let name: String = (0..rng.random_range(1..20))
                .map(|_| {
                    *b"abcdefghijklmnopqrstuvwxyz0123456789-_!#$%&'*+.^`|~"
                        .choose(rng)
                        .unwrap() as char
                })
                .collect();
            let value: Vec<u8> = (0..rng.random_range(0..200))
                .map(|_| rng.random_range(0x20..0x7f))
                .collect();
            request = request.header(name, value);
        }
        match rng.random_range(0..6) {
            0 => request.header("content-type", "text/plain"),
            1 => request.header("authorization", "Bearer sk_nope"),
            2 => request.header("idempotency-key", new_key()),
            3 => request.header("content-length", "3"),
            4 => request.header("host", "evil.example"),
            _ => request.header("idempotency-key", ""),
        }
    }

    pub fn oversized_headers(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "oversized-headers";
        match rng.random_range(0..4) {
            0 => {
                for i in 0..rng.random_range(90..400) {
                    request = request.header(format!("x-junk-{i}"), "1");
                }
            }
            1 => request = request.header("x-junk", "j".repeat(8 * 1024)),
            2 => {
                let size = *[100 * 1024, 600 * 1024].choose(rng).unwrap();
                request = request.header("x-junk", "j".repeat(size));
            }
            _ => {
                for _ in 0..rng.random_range(2..20) {
                    request = request.header("authorization", format!("Bearer {}", self.api_key));
                }
                return request;
            }
        }
        // Over its limits hyper may close before reading everything, and the reset can swallow
        // its answer.
        request.unanswerable()
    }

    pub fn giant_key(&self, rng: &mut StdRng) -> Hostile {
        let size = *[256, 1024, 100 * 1024].choose(rng).unwrap();
        let key = "k".repeat(size);
        Hostile::new("giant-key")
            .post("/v1/payments")
            .bearer(&self.api_key)
            .header("idempotency-key", key)
            .json(payment(4200).to_string())
    }

    pub fn control_key(&self, rng: &mut StdRng) -> Hostile {
        let keys: [&[u8]; 12] = [
            b"key\x01",
            b"\x7fkey",
            b"k\tey",
            b"key\x1b[31m",
            b"cl\xc3\xa9",
            b"\xff\xfe",
            b"\xc3\x28",
            b"\xed\xa0\x80",
            b"key\x00",
            b" padded ",
            b"\"quoted\"",
            b"\"bad\\escape\"",
        ];
        Hostile::new("control-key")
            .post("/v1/payments")
            .bearer(&self.api_key)
            .header("idempotency-key", *keys.choose(rng).unwrap())
            .json(payment(4200).to_string())
    }

    pub fn invalid_utf8_body(&self, rng: &mut StdRng) -> Hostile {
        let bodies: [&[u8]; 5] = [
            b"{\"amount\":100,\"currency\":\"eur\",\"order\":\"\xff\xfe\"}",
            b"{\"amount\":100,\"currency\":\"e\xc3\x28r\"}",
            b"{\"amount\":100,\"currency\":\"eur\",\"description\":\"\xed\xa0\x80\"}",
            b"\xef\xbb\xbf{\"amount\":100,\"currency\":\"eur\"}",
            b"{\"amount\":100,\"currency\":\"eur\",\"order\":\"\\ud800\"}",
        ];
        let body = *bodies.choose(rng).unwrap();
        self.payment_with(rng, "invalid-utf8-body", body)
    }

    pub fn deep_nesting(&self, rng: &mut StdRng) -> Hostile {
        let depth = *[200, 10_000, 30_000].choose(rng).unwrap();
        let body = match rng.random_range(0..4) {
            0 => "[".repeat(depth),
            1 => format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
            2 => format!(
                r#"{{"amount":100,"currency":"eur","order":{}1{}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            ),
            _ => format!("{}1{}", r#"{"a":"#.repeat(depth / 5), "}".repeat(depth / 5)),
        };
        self.payment_with(rng, "deep-nesting", body)
    }

    pub fn huge_numbers(&self, rng: &mut StdRng) -> Hostile {
        let amount = *[
            "1e400",
            "-1e400",
            "99999999999999999999999",
            "-99999999999999999999999",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-0",
            "0",
            "1.5",
            "1.0",
            "1e2",
            "0x10",
            "NaN",
            "Infinity",
            "00100",
            "1_000",
            "\"100\"",
            "true",
            "null",
        ]
        .choose(rng)
        .unwrap();
        let body = format!(r#"{{"amount":{amount},"currency":"eur"}}"#);
        self.payment_with(rng, "huge-numbers", body)
    }

    pub fn wrong_content_type(&self, rng: &mut StdRng) -> Hostile {
        let content_type: &[u8] = [
            b"text/plain".as_slice(),
            b"application/jsonx",
            b"application/json; charset=utf-16",
            b"application/problem+json",
            b"application/vnd.idempay+json",
            b"multipart/form-data; boundary=x",
            b"application/x-www-form-urlencoded",
            b"",
            b"json",
            b"application/json\xff",
            b"APPLICATION/JSON",
            b"application/json, text/plain",
        ]
        .choose(rng)
        .unwrap();
        Hostile::new("wrong-content-type")
            .post("/v1/payments")
            .bearer(&self.api_key)
            .header("idempotency-key", self.key(rng))
            .header("content-type", content_type)
            .body(payment(4200).to_string())
    }

    pub fn truncated_body(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "truncated-body";
        let sent = request.body.as_ref().map_or(0, Vec::len);
        let declared = sent + rng.random_range(1..10_000);
        request.body = request.body.map(|body| body[..body.len() / 2].to_vec());
        request.declared_length = Some(declared);
        if rng.random_bool(0.2) {
            request.headers.retain(|(name, _)| name != b"authorization");
        }
        request.unanswerable()
    }

    pub fn chunked_body(&self, rng: &mut StdRng) -> Hostile {
        let mut request = self.valid_payment(rng);
        request.kind = "chunked-body";
        request.chunked = Some(rng.random_range(1..20));
        match rng.random_range(0..5) {
            0 | 1 => request,
            2 => {
                // Both framings: a request-smuggling shape hyper must refuse or resolve.
                request.chunked = None;
                let body = request.body.take().unwrap_or_default();
                let mut raw = Vec::new();
                raw.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                raw.extend_from_slice(&body);
                raw.extend_from_slice(b"\r\n0\r\n\r\n");
                request.header("transfer-encoding", "chunked").body(raw)
            }
            3 => {
                request.chunked = None;
                let sizes = ["zz", "ffffffffffffffffffff", "-1", "5;ext=\"x\"", ""];
                let raw = format!("{}\r\nhello\r\n0\r\n\r\n", sizes.choose(rng).unwrap());
                request.body = None;
                let mut raw_request = request.header("transfer-encoding", "chunked");
                raw_request.raw = Some({
                    let mut bytes = raw_request.bytes();
                    bytes.extend_from_slice(raw.as_bytes());
                    bytes
                });
                raw_request
            }
            _ => {
                // The last chunk never comes.
                request.chunked = None;
                let body = request.body.take().unwrap_or_default();
                let mut raw = request.header("transfer-encoding", "chunked");
                raw.raw = Some({
                    let mut bytes = raw.bytes();
                    bytes.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
                    bytes.extend_from_slice(&body);
                    bytes.extend_from_slice(b"\r\n");
                    bytes
                });
                raw.unanswerable()
            }
        }
    }

    pub fn junk_segment(&self, rng: &mut StdRng) -> String {
        let junk = [
            "x".to_owned(),
            "pay_".to_owned(),
            "pay_000000000000000000000000".to_owned(),
            "pay_%00".to_owned(),
            "%ff%fe".to_owned(),
            "..".to_owned(),
            "%2e%2e%2fetc%2fpasswd".to_owned(),
            "'%3B--".to_owned(),
            "p".repeat(5000),
            "%F0%9F%92%B3".to_owned(),
            self.paid.choose(rng).unwrap().clone(),
            self.paid.choose(rng).unwrap().to_uppercase(),
        ];
        junk.choose(rng).unwrap().clone()
    }

    pub fn random_route(&self, rng: &mut StdRng) -> Hostile {
        let segment = self.junk_segment(rng);
        let paths = [
            format!("/v1/payments/{segment}"),
            format!("/v1/payments/{segment}/refunds"),
            "/v1/payments/x/refunds".to_owned(),
            format!("/v1/refunds/{segment}"),
            format!("/v1/payments/{segment}/refunds/{segment}"),
            "/v1/payments/".to_owned(),
            "//v1/payments".to_owned(),
            "/v1/payments?".to_owned(),
            "/V1/PAYMENTS".to_owned(),
            "/v1/webhooks/processor".to_owned(),
            "/problems/invalid-request".to_owned(),
            format!("/problems/{segment}"),
            "/openapi.json".to_owned(),
            "/docs/".to_owned(),
            "/healthz".to_owned(),
            "/readyz".to_owned(),
            "*".to_owned(),
            "http://evil.example/v1/payments".to_owned(),
        ];
        let method = METHODS.choose(rng).unwrap();
        let path = paths.choose(rng).unwrap();
        let mut request = Hostile::new("random-route").request(method, path);
        if rng.random_bool(0.7) {
            request = request.bearer(self.api_key(rng));
        }
        if rng.random_bool(0.5) {
            request = request
                .header("idempotency-key", self.key(rng))
                .json(payment(rng.random_range(1..10_000)).to_string());
        }
        request
    }

    pub fn refund(&self, rng: &mut StdRng) -> Hostile {
        let segment = if rng.random_bool(0.6) {
            self.paid.choose(rng).unwrap().clone()
        } else {
            self.junk_segment(rng)
        };
        let body = *[
            "{}",
            "",
            "null",
            r#"{"amount":1}"#,
            r#"{"amount":1e400}"#,
            r#"{"amount":-1}"#,
            r#"{"amount":9223372036854775807}"#,
            r#"{"amount":1,"amount":2}"#,
            r#"{"reason":"\u0000"}"#,
            r#"{"amount":1,"reason":"requested_by_customer","extra":1}"#,
            "[]",
            "\"\"",
        ]
        .choose(rng)
        .unwrap();
        Hostile::new("refund")
            .post(&format!("/v1/payments/{segment}/refunds"))
            .bearer(self.api_key(rng))
            .header("idempotency-key", self.key(rng))
            .json(body)
    }

    pub fn webhook(&self, rng: &mut StdRng) -> Hostile {
        let now = chrono::Utc::now().timestamp();
        let paid = self.paid.choose(rng).unwrap();
        let envelope = |kind: &str, data: &str| {
            format!(r#"{{"type":"{kind}","timestamp":"2026-01-01T00:00:00Z","data":{data}}}"#)
        };
        let drawn = rng.random_range(0..11);
        // A type this release does not know is refused, signed or not, and recorded nowhere: 503
        // with `Retry-After` when signed, for a release that knows it (the one 5xx allowed).
        let unknown_type = drawn == 10;
        let body: Vec<u8> = match drawn {
            0 => envelope(
                "dispute.created",
                &format!(r#"{{"payment":"{paid}","dispute":"dp_hostile","amount":1}}"#),
            ),
            1 => envelope(
                "dispute.created",
                &format!(r#"{{"payment":"{paid}","dispute":"dp_huge","amount":1e400}}"#),
            ),
            2 => envelope(
                "dispute.created",
                &format!(r#"{{"payment":"{paid}","dispute":"dp_negative","amount":-5}}"#),
            ),
            3 => envelope("payment.failed", r#"{"payment":"pay_%00"}"#),
            4 => envelope("refund.failed", r#"{"refund":"re_\u0000"}"#),
            5 => envelope("x".repeat(101).as_str(), "{}"),
            6 => "[".repeat(10_000),
            7 => return self.signed_webhook(b"{\"type\":\"\xff\",\"timestamp\":1,\"data\":{}}"),
            8 => envelope(
                "payment.succeeded",
                &format!(r#"{{"payment":"{paid}","payment":"pay_x"}}"#),
            ),
            9 => envelope("payment.succeeded", "null"),
            _ => envelope("unknown.type", "null"),
        }
        .into_bytes();
        let id = format!("evt_{}", rng.random_range(0..1_000_000u32));
        let mut request = Hostile::new("webhook")
            .post("/v1/webhooks/processor")
            .header("webhook-id", &id)
            .json(body.clone());
        request.webhook_id = Some(id.clone());
        let forged = |request: Hostile, status, problem| Hostile {
            kind: "forged-webhook",
            refused_as: Some((status, problem)),
            ..request
        };
        match rng.random_range(0..6) {
            // Neither timestamp nor signature.
            0 => forged(request, 400, "invalid-request"),
            1 => forged(
                request
                    .header("webhook-timestamp", now.to_string())
                    .header("webhook-signature", "v1,AAAA"),
                401,
                "webhook-signature-invalid",
            ),
            // A genuine delivery of an hour ago, replayed.
            2 => forged(
                request
                    .header("webhook-timestamp", (now - 3600).to_string())
                    .header(
                        "webhook-signature",
                        self.secret.sign(&id, now - 3600, &body).unwrap(),
                    ),
                400,
                "webhook-timestamp-out-of-range",
            ),
            3 => forged(
                request
                    .header("webhook-timestamp", "99999999999999999999")
                    .header("webhook-signature", "v1,!!!! v2,x v1,"),
                400,
                "invalid-request",
            ),
            _ => {
                let signed = request.header("webhook-timestamp", now.to_string()).header(
                    "webhook-signature",
                    self.secret.sign(&id, now, &body).unwrap(),
                );
                Hostile {
                    refused_as: unknown_type.then_some((503, "webhook-event-type-unknown")),
                    ..signed
                }
            }
        }
    }

    /// A webhook correctly signed now. Standard Webhooks signs text: a body that is not UTF-8
    /// carries the signature of its lossy decoding, the text its sender meant.
    pub fn signed_webhook(&self, body: &[u8]) -> Hostile {
        let now = chrono::Utc::now().timestamp();
        let id = new_key();
        let signature = self
            .secret
            .sign(&id, now, String::from_utf8_lossy(body).as_bytes())
            .unwrap();
        let mut request = Hostile::new("webhook")
            .post("/v1/webhooks/processor")
            .header("webhook-id", &id)
            .header("webhook-timestamp", now.to_string())
            .header("webhook-signature", signature)
            .json(body);
        request.webhook_id = Some(id);
        request
    }

    pub fn auth(&self, rng: &mut StdRng) -> Hostile {
        let random: String = (0..40)
            .map(|_| {
                *b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                    .choose(rng)
                    .unwrap() as char
            })
            .collect();
        let authorizations: Vec<Vec<u8>> = vec![
            format!("Bearer {}", self.api_key).into_bytes(),
            format!("Bearer {}", self.other_api_key).into_bytes(),
            format!("bearer {}", self.api_key).into_bytes(),
            format!("Bearer  {}", self.api_key).into_bytes(),
            format!("Bearer {} ", self.api_key).into_bytes(),
            format!("Bearer {}x", self.api_key).into_bytes(),
            format!("Bearer sk_{random}").into_bytes(),
            format!("Basic {}", self.api_key).into_bytes(),
            self.api_key.clone().into_bytes(),
            b"Bearer".to_vec(),
            b"Bearer sk_\xff\xfe".to_vec(),
            format!("Bearer {}", "s".repeat(10_000)).into_bytes(),
        ];
        let authorization = authorizations.choose(rng).unwrap();
        let request = Hostile::new("auth").header("authorization", authorization);
        if rng.random_bool(0.5) {
            request.request("GET", "/v1/payments")
        } else {
            request
                .post("/v1/payments")
                .header("idempotency-key", new_key())
                .json(payment(100).to_string())
        }
    }

    pub fn broken_http(&self, rng: &mut StdRng) -> Hostile {
        let mut garbage: Vec<u8> = (0..rng.random_range(1..300))
            .map(|_| rng.random())
            .collect();
        garbage.extend_from_slice(b"\r\n\r\n");
        let raws: Vec<Vec<u8>> = vec![
            garbage,
            b"GET / HTTP/9.9\r\nhost: x\r\n\r\n".to_vec(),
            b"GET /healthz HTTP/1.0\r\n\r\n".to_vec(),
            b"GET /healthz\r\n\r\n".to_vec(),
            format!("GET /{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(),
            b"GET /v1/payments HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n".to_vec(),
            b"GET /v1/payments HTTP/1.1\r\nhost: x\r\n : empty name\r\n\r\n".to_vec(),
            b"GET /v1/pay ments HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            b"GET /v1/payments HTTP/1.1\nhost: x\n\n".to_vec(),
            b"POST /v1/payments HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n".to_vec(),
            b"POST /v1/payments HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab".to_vec(),
            b"POST /v1/payments HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999999\r\n\r\n".to_vec(),
            b"\r\n\r\n\r\n".to_vec(),
        ];
        let mut request = Hostile::new("broken-http");
        request.raw = Some(raws.choose(rng).unwrap().clone());
        // Malformed HTTP is answered by hyper with 400, or the connection is just closed.
        request.unanswerable()
    }

    pub fn list_query(&self, rng: &mut StdRng) -> Hostile {
        let queries = [
            "limit=1e400",
            "limit=-1",
            "limit=99999999999999999999",
            "limit=1&limit=2",
            "starting_after=%00",
            "starting_after=%ff",
            "ending_before=pay_000000000000000000000000",
            "starting_after=pay_%27",
            "limit=",
            "=&&=",
            "%%%",
        ];
        let query = queries.choose(rng).unwrap();
        let path = if rng.random_bool(0.5) {
            format!("/v1/payments?{query}")
        } else {
            format!(
                "/v1/payments/{}/refunds?{query}",
                self.paid.choose(rng).unwrap()
            )
        };
        Hostile::new("list-query")
            .request("GET", &path)
            .bearer(self.api_key(rng))
    }
}

/// A payment body of `amount` that gives a field twice, spelled in one of several ways.
pub fn duplicate_fields(rng: &mut StdRng, amount: i64) -> String {
    let other = amount % 99_999_999 + 1;
    let bodies = [
        format!(r#"{{"amount":{amount},"amount":{other},"currency":"eur"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","amount":{amount}}}"#),
        format!(r#"{{"amount":{amount},"\u0061mount":{other},"currency":"eur"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","currency":"usd"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","curr\u0065ncy":"eur"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","order":"a","order":"b"}}"#),
        format!(r#"{{"amount":{amount},"currency":"eur","order":null,"order":"b"}}"#),
        format!(
            r#"{{"amount":{amount},"currency":"eur","payment_method":"pm_card_visa","payment_method":"pm_card_slow"}}"#
        ),
        format!(r#"{{ "amount" : {amount} , "amount" : {amount} , "currency" : "eur" }}"#),
    ];
    bodies.choose(rng).unwrap().clone()
}

/// A valid payment body of `amount`, its members in a random order and spacing, sometimes with the
/// slow card: every such body is the same request.
pub fn reordered_payment(rng: &mut StdRng, amount: i64) -> String {
    let mut members = [
        format!(r#""amount":{amount}"#),
        r#""currency":"eur""#.to_owned(),
        r#""payment_method":"pm_card_slow""#.to_owned(),
    ];
    let swap = rng.random_range(0..3);
    members.swap(0, swap);
    let spacing = [",", " , ", ",\n\t"].choose(rng).unwrap();
    format!("{{{}}}", members.join(spacing))
}
