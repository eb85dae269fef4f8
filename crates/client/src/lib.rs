//! The client half of idempay: a typed client for its payment API that keeps one idempotency key
//! per business intent and reuses it on every retry, so "at least once" on the wire becomes
//! "exactly once" in the ledger. A crate of its own, so a merchant adds it without the server.
//!
//! It retries when no answer came (connection errors, resets, timeouts), on 409 (the key is still
//! in progress), on 429 and on 5xx (nothing was stored), with exponential backoff and full jitter,
//! never sooner than the server's `Retry-After`; never on any other 4xx, which is final. Replays
//! are surfaced. Only the deadline ends the retries, and it outlasts a lease: a key held by an
//! instance that died answers 409 until the lease runs out, then the retry takes it over.
//!
//! A call ends in one of four ways, each its own [`ClientError`] (and, for `idempay pay` and
//! `idempay refund`, its own exit code): an answer (`Ok`, or [`ClientError::Api`] for a final
//! refusal), [`ClientError::OutcomeUnknown`] when the deadline ran out after the request may have
//! reached the server (retry later with the same key: never with a new one, which could charge
//! twice), or [`ClientError::Unreachable`] when no attempt could even connect (nothing was sent).
//! `idempay pay --help` lists the exit codes.

mod retry;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use retry::{AttemptResult, RetryPolicy};

/// One HTTP attempt of a call, as reported to an observer.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub number: u32,
    pub result: AttemptResult,
    /// Why no answer came, when none did.
    pub error: Option<String>,
    /// How long the client waits before the next attempt, if it makes one.
    pub retry_in: Option<Duration>,
}

type Observer = Arc<dyn Fn(&Attempt) + Send + Sync>;

/// A client for one account of the payment API.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base_url: String,
    api_key: String,
    policy: RetryPolicy,
    observer: Option<Observer>,
    new_key_per_attempt: bool,
    unreachable_reads_final: bool,
}

/// A successful answer, with how it came about.
#[derive(Clone, Debug)]
pub struct Answer<T> {
    pub value: T,
    pub status: u16,
    /// The server answered from its store: an earlier attempt had been executed.
    pub replayed: bool,
    pub attempts: u32,
    /// The key the call used on every attempt (the last one, with `new_key_per_attempt`).
    pub idempotency_key: Option<String>,
    /// The body exactly as received.
    pub raw: Vec<u8>,
}

/// An RFC 9457 problem document, as the API sends them.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Members of some kinds, such as `payment` and `decline_code` of a declined card.
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
}

/// Why a call did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API refused the request with a final answer (a 4xx other than 409 and 429).
    #[error("{} ({}): {}", .problem.title, .problem.status, .problem.detail)]
    Api {
        problem: Box<Problem>,
        replayed: bool,
        attempts: u32,
        idempotency_key: Option<String>,
        raw: Vec<u8>,
    },
    /// The deadline ran out with no final answer, and the request may have reached the server:
    /// it may have been executed, may still be running, or may not have been. Only the same key
    /// finds out; a new one could execute it a second time.
    #[error(
        "outcome unknown after {attempts} attempts (last: {last}): retry later with the same key"
    )]
    OutcomeUnknown {
        attempts: u32,
        idempotency_key: Option<String>,
        /// What the last attempt got, e.g. `HTTP 409` or why no answer came.
        last: String,
    },
    /// No attempt could connect before the deadline: the request never left, nothing happened.
    #[error("not sent: no connection in {attempts} attempts: {last_error}")]
    Unreachable { attempts: u32, last_error: String },
    /// An answer the API does not document.
    #[error("unexpected answer {status}: {body}")]
    Unexpected { status: u16, body: String },
}

/// A payment to create.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NewPayment {
    pub amount: i64,
    pub currency: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    /// `manual` authorizes only: the money is taken by [`Client::capture_payment`] or released by
    /// [`Client::cancel_payment`]. `automatic` (charged at once) when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_method: Option<String>,
    /// The merchant's own key–value pairs (at most 50), returned with the payment.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// A refund to make; without `amount`, what remains.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NewRefund {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// A payment, as the API returns it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Payment {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub payment_method: String,
    pub order: Option<String>,
    pub description: Option<String>,
    pub amount_refunded: i64,
    pub amount_disputed: i64,
    /// What was taken; absent from a replay of a payment stored before manual capture existed.
    #[serde(default)]
    pub amount_captured: Option<i64>,
    /// What a capture may still take (while `requires_capture`).
    #[serde(default)]
    pub amount_capturable: i64,
    pub created_at: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A refund, as the API returns it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Refund {
    pub id: String,
    pub payment: String,
    pub amount: i64,
    pub reason: Option<String>,
    pub status: String,
    pub created_at: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// A page of a list.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub has_more: bool,
}

impl Client {
    pub fn new(base_url: impl Into<String>, api_key: impl Into<String>) -> Self {
        Self {
            http: reqwest::Client::new(),
            base_url: base_url.into().trim_end_matches('/').to_owned(),
            api_key: api_key.into(),
            policy: RetryPolicy::default(),
            observer: None,
            new_key_per_attempt: false,
            unreachable_reads_final: false,
        }
    }

    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Calls `observer` after every attempt, e.g. to log it.
    pub fn on_attempt(mut self, observer: impl Fn(&Attempt) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Opens a new connection for every attempt instead of reusing one, so each attempt meets the
    /// network on its own (as through a proxy that cuts connections).
    pub fn with_fresh_connections(mut self) -> Self {
        self.http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default();
        self
    }

    /// Ends a read (`GET`) at its first connection that could not be made, with
    /// [`ClientError::Unreachable`], instead of retrying until the deadline: for a person at a
    /// terminal, to whom a wrong URL or a stopped server is better said at once. Writes keep
    /// retrying: their key makes a retry safe, and an intent is not dropped for a server that
    /// restarts.
    pub fn with_unreachable_reads_final(mut self) -> Self {
        self.unreachable_reads_final = true;
        self
    }

    /// **Wrong on purpose**: a new key for every attempt, as a client that forgets the intent does.
    /// It exists to show, in `idempay demo --naive`, the duplicate charges the key prevents.
    pub fn with_new_key_per_attempt(mut self) -> Self {
        self.new_key_per_attempt = true;
        self
    }

    /// Creates a payment; `key` names the intent (a new UUID v4 when `None`), reused on every retry.
    pub async fn create_payment(
        &self,
        payment: &NewPayment,
        key: Option<String>,
    ) -> Result<Answer<Payment>, ClientError> {
        let body = serde_json::to_value(payment).expect("a payment serializes");
        self.call(
            Method::POST,
            "/v1/payments",
            Some(intent_key(key)),
            Some(body),
        )
        .await
    }

    /// Refunds a payment, part or all; the key works as for payments.
    pub async fn refund_payment(
        &self,
        payment: &str,
        refund: &NewRefund,
        key: Option<String>,
    ) -> Result<Answer<Refund>, ClientError> {
        let body = serde_json::to_value(refund).expect("a refund serializes");
        let path = format!("/v1/payments/{payment}/refunds");
        self.call(Method::POST, &path, Some(intent_key(key)), Some(body))
            .await
    }

    /// Captures a manual payment: `amount` of its authorization, all of it when `None`; the key
    /// works as for payments (one per capture intent).
    pub async fn capture_payment(
        &self,
        payment: &str,
        amount: Option<i64>,
        key: Option<String>,
    ) -> Result<Answer<Payment>, ClientError> {
        let body = match amount {
            Some(amount) => serde_json::json!({ "amount_to_capture": amount }),
            None => serde_json::json!({}),
        };
        let path = format!("/v1/payments/{payment}/capture");
        self.call(Method::POST, &path, Some(intent_key(key)), Some(body))
            .await
    }

    /// Cancels a manual payment, releasing its authorization, for `reason` when given.
    pub async fn cancel_payment(
        &self,
        payment: &str,
        reason: Option<&str>,
        key: Option<String>,
    ) -> Result<Answer<Payment>, ClientError> {
        let body = match reason {
            Some(reason) => serde_json::json!({ "cancellation_reason": reason }),
            None => serde_json::json!({}),
        };
        let path = format!("/v1/payments/{payment}/cancel");
        self.call(Method::POST, &path, Some(intent_key(key)), Some(body))
            .await
    }

    pub async fn get_payment(&self, id: &str) -> Result<Answer<Payment>, ClientError> {
        self.call(Method::GET, &format!("/v1/payments/{id}"), None, None)
            .await
    }

    /// What became of an idempotency key of the account, on every route it was used on.
    pub async fn get_idempotency_key(&self, key: &str) -> Result<Answer<Value>, ClientError> {
        let path = format!("/v1/idempotency_keys/{}", path_segment(key));
        self.call(Method::GET, &path, None, None).await
    }

    /// A page of payments, newest first, after `starting_after` when given.
    pub async fn list_payments(
        &self,
        limit: u8,
        starting_after: Option<&str>,
    ) -> Result<Answer<Page<Payment>>, ClientError> {
        let mut path = format!("/v1/payments?limit={limit}");
        if let Some(cursor) = starting_after {
            path.push_str(&format!("&starting_after={cursor}"));
        }
        self.call(Method::GET, &path, None, None).await
    }

    /// One call: attempts until an answer is final or the deadline leaves no time for another.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        mut key: Option<String>,
        body: Option<Value>,
    ) -> Result<Answer<T>, ClientError> {
        let started = Instant::now();
        let mut number = 0;
        let mut may_have_been_sent = false;
        loop {
            number += 1;
            if self.new_key_per_attempt && number > 1 {
                key = key.map(|_| uuid::Uuid::new_v4().to_string());
            }
            let timeout = self.policy.attempt_timeout(started.elapsed());
            let outcome = self
                .attempt(method.clone(), path, key.as_deref(), body.as_ref(), timeout)
                .await;
            let result = match &outcome {
                Ok(received) => AttemptResult::Status {
                    status: received.status,
                    retry_after: received.retry_after,
                },
                Err(failed) => failed.result,
            };
            may_have_been_sent |= result.may_have_been_sent();
            let final_read = self.unreachable_reads_final
                && method == Method::GET
                && result == AttemptResult::NotSent;
            let delay = (result.is_retryable() && !final_read)
                .then(|| self.policy.delay(number, result, &mut rand::rng()))
                .filter(|delay| self.policy.allows(started.elapsed(), *delay));
            if let Some(observer) = &self.observer {
                observer(&Attempt {
                    number,
                    result,
                    error: outcome.as_ref().err().map(|failed| failed.error.clone()),
                    retry_in: delay,
                });
            }
            match (outcome, delay) {
                (_, Some(delay)) => tokio::time::sleep(delay).await,
                (Ok(received), None) if !result.is_retryable() => {
                    return received.finish(number, key);
                }
                (outcome, None) if may_have_been_sent => {
                    let last = match outcome {
                        Ok(received) => format!("HTTP {}", received.status),
                        Err(failed) => failed.error,
                    };
                    return Err(ClientError::OutcomeUnknown {
                        attempts: number,
                        idempotency_key: key,
                        last,
                    });
                }
                (outcome, None) => {
                    return Err(ClientError::Unreachable {
                        attempts: number,
                        last_error: outcome.err().map(|failed| failed.error).unwrap_or_default(),
                    });
                }
            }
        }
    }

    /// One attempt. `Err` means no complete answer arrived.
    async fn attempt(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Received, Failed> {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base_url))
            .bearer_auth(&self.api_key)
            .timeout(timeout);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|error| Failed::of(&error))?;
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let retry_after = header("retry-after")
            .and_then(|seconds| seconds.parse().ok())
            .map(Duration::from_secs);
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        // A response cut off in its body is no answer either.
        let raw = response.bytes().await.map_err(|error| Failed::of(&error))?;
        Ok(Received {
            status,
            retry_after,
            replayed,
            raw: raw.to_vec(),
        })
    }
}

/// An attempt without a complete answer.
struct Failed {
    /// [`AttemptResult::NotSent`] or [`AttemptResult::NoAnswer`].
    result: AttemptResult,
    error: String,
}

impl Failed {
    fn of(error: &reqwest::Error) -> Self {
        // A connection never made carried no request; any other failure may have come after it
        // was sent (a reset, a timeout).
        let result = if error.is_connect() {
            AttemptResult::NotSent
        } else {
            AttemptResult::NoAnswer
        };
        Self {
            result,
            error: describe(error),
        }
    }
}

/// A complete response.
struct Received {
    status: u16,
    retry_after: Option<Duration>,
    replayed: bool,
    raw: Vec<u8>,
}

impl Received {
    fn finish<T: DeserializeOwned>(
        self,
        attempts: u32,
        idempotency_key: Option<String>,
    ) -> Result<Answer<T>, ClientError> {
        let unexpected = || ClientError::Unexpected {
            status: self.status,
            body: String::from_utf8_lossy(&self.raw).into_owned(),
        };
        if (200..300).contains(&self.status) {
            let value = serde_json::from_slice(&self.raw).map_err(|_| unexpected())?;
            return Ok(Answer {
                value,
                status: self.status,
                replayed: self.replayed,
                attempts,
                idempotency_key,
                raw: self.raw,
            });
        }
        let problem = serde_json::from_slice(&self.raw).map_err(|_| unexpected())?;
        Err(ClientError::Api {
            problem: Box::new(problem),
            replayed: self.replayed,
            attempts,
            idempotency_key,
            raw: self.raw,
        })
    }
}

fn intent_key(key: Option<String>) -> String {
    key.unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// The error with its causes: reqwest's own message alone rarely says what happened.
fn describe(error: &reqwest::Error) -> String {
    let mut text = if error.is_timeout() {
        "timed out".to_owned()
    } else {
        error.to_string()
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `text` as one path segment: every byte but RFC 3986's unreserved characters percent-encoded,
/// so a key holding `/`, `?`, `%` or `#` names itself.
fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
