//! How idempay calls the processor: one attempt per call, with the caller's downstream key, and
//! an answer in three outcomes, not two. "Not done" is only said when it is certain (the
//! connection was refused before a byte was sent, or a 4xx that means nothing happened): anything
//! else after sending is "unknown", and the caller asks again with the same key, which the
//! processor answers with the first result.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::metrics::{self, CallOutcome, Operation};
use idempotency::EarlierCalls;
use processor::deadline::{self, CALL_DEADLINE};
use processor::problem::ProblemKind as ProcessorProblem;
use processor::{Charge, Dispute, ProcessorRefund};

/// The largest page the processor serves.
const PAGE: usize = 100;

/// A charge to ask for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChargeRequest {
    pub amount: i64,
    pub currency: String,
    pub payment_method: String,
    /// `false` authorizes only: the money is held until [`ProcessorClient::capture`] or
    /// [`ProcessorClient::void`].
    pub capture: bool,
}

/// Why the processor certainly did nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessorRefusal {
    /// What happened, to log or to tell the caller's own client (the problem's `detail`, when the
    /// processor sent one).
    pub reason: String,
    /// The processor's status, `None` when it was never reached.
    pub status: Option<u16>,
    /// The problem's `type` (`/problems/refund-exceeds-payment`…), when it sent one.
    pub problem_type: Option<String>,
}

impl ProcessorRefusal {
    /// Whether the processor refused the refund itself (nothing left to refund, a declined
    /// charge): a business answer to store as the result, not an outage to retry.
    pub fn is_refund_refused(&self) -> bool {
        matches!(
            self.problem(),
            Some(ProcessorProblem::RefundExceedsPayment | ProcessorProblem::PaymentNotRefundable)
        )
    }

    /// Whether the processor refused a capture or void of an authorization (captured, voided or
    /// expired meanwhile, or less held than asked): its answer about the charge, a result.
    pub fn is_authorization_refused(&self) -> bool {
        matches!(
            self.problem(),
            Some(ProcessorProblem::ChargeNotCapturable | ProcessorProblem::ChargeNotVoidable)
        )
    }

    /// The kind of problem the processor answered with, of its own catalogue; `None` when it sent
    /// no `type`, or one of no kind it has.
    pub fn problem(&self) -> Option<ProcessorProblem> {
        ProcessorProblem::from_type_uri(self.problem_type.as_deref()?)
    }
}

impl std::fmt::Display for ProcessorRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(f, "{status}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

/// What became of one call. Three outcomes, not two.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessorOutcome<T> {
    /// The processor answered with a result: a charge (succeeded, or declined: the 402 read into
    /// a [`Charge`]), a refund.
    Done(T),
    /// Definitely nothing happened: the connection was refused before anything was sent, or a 4xx
    /// that says so (400, 401, 403, 404, 422, the refund-beyond-the-charge refusal…).
    NotDone(ProcessorRefusal),
    /// Maybe it happened: a timeout, a connection dropped after sending, a 5xx, a 409 (the same key
    /// in flight at the processor), a 429, a body that does not parse. Ask again with the same key.
    Unknown(String),
}

impl<T> ProcessorOutcome<T> {
    /// Counts and times the call this ended, as its outcome counts (`declined`: the processor's
    /// answer is a decline, a charge read back after a 402), with the cause of one that did not
    /// succeed.
    fn record(&self, operation: Operation, downstream_key: &str, started: Instant, declined: bool) {
        let (counted, cause): (CallOutcome, Option<&dyn std::fmt::Display>) = match self {
            Self::Done(_) if declined => (CallOutcome::Declined, None),
            Self::Done(_) => (CallOutcome::Succeeded, None),
            Self::NotDone(refusal) if refusal.status.is_none() => {
                (CallOutcome::NotSent, Some(refusal))
            }
            Self::NotDone(refusal) => (CallOutcome::Declined, Some(refusal)),
            Self::Unknown(cause) => (CallOutcome::Unknown, Some(cause)),
        };
        metrics::record(operation, downstream_key, started, counted, cause);
    }
}

/// How often one request asks about a call whose outcome it does not know, with the same key,
/// before it answers 503 and leaves the rest to the client's retry or the recovery job.
const ATTEMPTS: u32 = 3;
/// The pause before the first repeat; it doubles for each further one.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// What a 503 about the processor suggests: by then its outcome is usually known, and the retry is
/// answered from it.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The longest one request (or one resume of the recovery job) asks the processor about one call
/// when each answer is lost: its three attempts (`ATTEMPTS`) each cut off at `timeout`, and the pauses between
/// them. The recovery window is checked against it at start (`config::check_recovery_window`).
pub fn longest_asking(timeout: Duration) -> Duration {
    let pauses = (0..ATTEMPTS - 1)
        .map(|repeat| FIRST_PAUSE * 2u32.pow(repeat))
        .fold(Duration::ZERO, Duration::saturating_add);
    timeout.saturating_mul(ATTEMPTS).saturating_add(pauses)
}

/// Makes one request's attempts at a call, `what` (`charge`, `refund`): an unknown outcome is asked
/// again with the same key (the call itself holds it), done is final.
///
/// "Not done" is final only while no attempt with the downstream key may have reached the
/// processor: `earlier` says whether one before this request may have (an earlier holder of the
/// key), and every unknown outcome of this request's own attempts says so too. After that, a
/// refused connection or a 4xx says nothing about the earlier attempt, which may have charged: the
/// outcome stays unknown and the key keeps its downstream key. Only a refusal the call takes for
/// its result (`is_result`: the processor's answer about the key itself, such as a refund it
/// refused, which it would have answered with the first result had that one been made) is final
/// whatever came before.
pub async fn until_known<T, F, Fut>(
    what: &str,
    earlier: EarlierCalls,
    is_result: impl Fn(&ProcessorRefusal) -> bool,
    mut call: F,
) -> ProcessorOutcome<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ProcessorOutcome<T>>,
{
    let mut maybe_sent = earlier == EarlierCalls::Possible;
    let mut pause = FIRST_PAUSE;
    let mut attempt = 1;
    loop {
        match call().await {
            ProcessorOutcome::Unknown(reason) if attempt < ATTEMPTS => {
                tracing::info!(%reason, attempt, "{what} outcome unknown; asking again");
                maybe_sent = true;
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            ProcessorOutcome::NotDone(refusal) if maybe_sent && !is_result(&refusal) => {
                return ProcessorOutcome::Unknown(format!(
                    "{refusal}, after an earlier attempt with the same key that may have reached \
                     the processor"
                ));
            }
            outcome => return outcome,
        }
    }
}

/// The processor's API, for idempay.
#[derive(Clone, Debug)]
pub struct ProcessorClient {
    http: reqwest::Client,
    base: Url,
    api_key: String,
    /// Wrong on purpose, for the demo: a new key for every call instead of the downstream key.
    new_key_per_call: bool,
    /// What is done once idempay recorded an object the processor made; nothing unless set.
    when_recorded: Option<WhenRecorded>,
    /// The `Call-Deadline` every keyed call carries, once set ([`ProcessorClient::until`]).
    deadline: Option<DateTime<Utc>>,
}

/// What idempay does once it recorded a charge or refund the processor made (its id): apply the
/// processor's events that arrived about it before it was recorded, which the intake keeps. The
/// intake sits above the domains that record objects, so they cannot call it: the assembly
/// (app.rs) gives the client this, and every recording of an answer runs it (`call::record`).
#[derive(Clone)]
pub struct WhenRecorded(Arc<dyn Fn(String) -> BoxFuture<'static, ()> + Send + Sync>);

impl WhenRecorded {
    pub fn new<F, Fut>(then: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self(Arc::new(move |object| Box::pin(then(object))))
    }
}

impl std::fmt::Debug for WhenRecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WhenRecorded")
    }
}

/// The members of a problem document the client reads.
#[derive(Debug, Default, Deserialize)]
struct ProblemBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    detail: Option<String>,
    charge: Option<String>,
}

/// A page of a list.
#[derive(Deserialize)]
struct Page<T> {
    data: Vec<T>,
    has_more: bool,
}

/// What a list item needs to be paged from (and named by).
pub trait Listed {
    fn id(&self) -> &str;
}

impl Listed for Charge {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Listed for ProcessorRefund {
    fn id(&self) -> &str {
        &self.id
    }
}

impl Listed for Dispute {
    fn id(&self) -> &str {
        &self.id
    }
}

/// How long a pooled connection to the processor may sit idle before it is dropped: well within
/// the processor's closing of idle keep-alive connections (its header read timeout, 10 s). One
/// reused just as the server closes it fails after the request was sent ("connection closed
/// before message completed"): an outcome unknown for nothing, seen after a demo's idle wait.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

impl ProcessorClient {
    /// A client of the processor at `base_url` (`http://127.0.0.1:8081`) that gives every call
    /// `timeout` in all, connecting included. It goes straight to `base_url` and ignores proxy
    /// variables (`HTTP_PROXY`, …): the processor is configured by its address, and a proxy set in
    /// the environment for something else would otherwise see every charge and its API key.
    pub fn new(base_url: &str, api_key: String, timeout: Duration) -> anyhow::Result<Self> {
        let mut base = Url::parse(base_url)?;
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .no_proxy()
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .build()?,
            base,
            api_key,
            new_key_per_call: false,
            when_recorded: None,
            deadline: None,
        })
    }

    /// Runs `then` each time idempay recorded an object this processor made.
    #[must_use]
    pub fn when_recorded(mut self, then: WhenRecorded) -> Self {
        self.when_recorded = Some(then);
        self
    }

    /// What follows the recording of `object`, a charge or refund this processor made. It cannot
    /// fail the recording, which committed: it logs its own failures.
    pub async fn recorded(&self, object: &str) {
        if let Some(WhenRecorded(then)) = &self.when_recorded {
            then(object.to_owned()).await;
        }
    }

    /// Sends a new key with every call instead of the downstream key it is given: what a service
    /// that does not pass its own key downstream does. Wrong on purpose, so that `idempay demo`
    /// can show the double charges the downstream key prevents; never in production.
    #[must_use]
    pub fn with_a_new_key_per_call(mut self) -> Self {
        self.new_key_per_call = true;
        self
    }

    /// This client, its keyed calls carrying `deadline` (the key's `Lease::call_deadline`): the
    /// processor refuses one that reaches it later, storing nothing (its `deadline.rs`).
    #[must_use]
    pub fn until(&self, deadline: DateTime<Utc>) -> Self {
        Self {
            deadline: Some(deadline),
            ..self.clone()
        }
    }

    /// A keyed `POST` to `path`: its `Idempotency-Key`, and its `Call-Deadline` when set.
    fn keyed_post(&self, path: &str, downstream_key: &str) -> reqwest::RequestBuilder {
        let request = self
            .request(Method::POST, path)
            .header("idempotency-key", self.key_for(downstream_key));
        match self.deadline {
            Some(deadline) => request.header(CALL_DEADLINE, deadline::header_value(deadline)),
            None => request,
        }
    }

    /// The key a call sends.
    fn key_for(&self, downstream_key: &str) -> String {
        if self.new_key_per_call {
            format!("naive_{}", uuid::Uuid::new_v4().simple())
        } else {
            downstream_key.to_owned()
        }
    }

    /// Replaces the faults the processor injects (its `PUT /v1/test/faults`): `lose_answers` and
    /// `fail` are fractions from 0 to 1.
    pub async fn set_faults(&self, lose_answers: f64, fail: f64) -> anyhow::Result<()> {
        self.request(Method::PUT, "v1/test/faults")
            .json(&serde_json::json!({ "lose_answers": lose_answers, "fail": fail }))
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// One attempt to charge, with `Idempotency-Key: downstream_key`.
    pub async fn charge(
        &self,
        downstream_key: &str,
        request: &ChargeRequest,
    ) -> ProcessorOutcome<Charge> {
        let started = Instant::now();
        let (outcome, declined) = self.charge_once(downstream_key, request).await;
        outcome.record(Operation::Charge, downstream_key, started, declined);
        outcome
    }

    /// One charge, and whether its answer is a decline.
    async fn charge_once(
        &self,
        downstream_key: &str,
        request: &ChargeRequest,
    ) -> (ProcessorOutcome<Charge>, bool) {
        let sent = self
            .keyed_post("v1/charges", downstream_key)
            .json(request)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) => return (transport(&error), false),
        };
        if response.status() != StatusCode::PAYMENT_REQUIRED {
            return (answered(response).await, false);
        }
        // A decline names its charge; the charge itself is read back, a safe read that a retry of
        // the same key (answered with the same 402) repeats if it fails.
        let problem: ProblemBody = match response.json().await {
            Ok(problem) => problem,
            Err(error) => {
                return (
                    ProcessorOutcome::Unknown(format!("an unreadable decline: {error}")),
                    false,
                );
            }
        };
        let Some(id) = problem.charge else {
            return (
                ProcessorOutcome::Unknown("a decline that names no charge".to_owned()),
                false,
            );
        };
        match self.get::<Charge>(&format!("v1/charges/{id}")).await {
            Ok(charge) => (ProcessorOutcome::Done(charge), true),
            Err(error) => (
                ProcessorOutcome::Unknown(format!("declined charge {id} unreadable: {error:#}")),
                false,
            ),
        }
    }

    /// One attempt to refund `charge` (all that remains when `amount` is `None`), with
    /// `Idempotency-Key: downstream_key`.
    pub async fn refund(
        &self,
        downstream_key: &str,
        charge: &str,
        amount: Option<i64>,
    ) -> ProcessorOutcome<ProcessorRefund> {
        let path = format!("v1/charges/{charge}/refunds");
        let body = serde_json::json!({ "amount": amount });
        self.keyed(Operation::Refund, &path, downstream_key, &body)
            .await
    }

    /// One attempt to capture the authorized `charge` (all of it when `amount` is `None`), with
    /// `Idempotency-Key: downstream_key`.
    pub async fn capture(
        &self,
        downstream_key: &str,
        charge: &str,
        amount: Option<i64>,
    ) -> ProcessorOutcome<Charge> {
        let path = format!("v1/charges/{charge}/capture");
        let body = serde_json::json!({ "amount": amount });
        self.keyed(Operation::Capture, &path, downstream_key, &body)
            .await
    }

    /// One attempt to void the authorized `charge`, with `Idempotency-Key: downstream_key`.
    pub async fn void(&self, downstream_key: &str, charge: &str) -> ProcessorOutcome<Charge> {
        let path = format!("v1/charges/{charge}/void");
        self.keyed(
            Operation::Void,
            &path,
            downstream_key,
            &serde_json::json!({}),
        )
        .await
    }

    /// One keyed `POST` of `body` to `path`, counted and timed as `operation`.
    async fn keyed<T: DeserializeOwned>(
        &self,
        operation: Operation,
        path: &str,
        downstream_key: &str,
        body: &serde_json::Value,
    ) -> ProcessorOutcome<T> {
        let started = Instant::now();
        let sent = self
            .keyed_post(path, downstream_key)
            .json(body)
            .send()
            .await;
        let outcome = match sent {
            Ok(response) => answered(response).await,
            Err(error) => transport(&error),
        };
        outcome.record(operation, downstream_key, started, false);
        outcome
    }

    /// Charge `id` as a capture or void under `downstream_key` left it (what it made is read from
    /// the charge: `capture_idempotency_key`, `void_idempotency_key`): the processor answers 409
    /// (an error here) while that capture or void is still being made, so the charge read is
    /// final for the key.
    pub async fn charge_after(&self, id: &str, downstream_key: &str) -> anyhow::Result<Charge> {
        self.get(&under_key(&format!("v1/charges/{id}"), downstream_key))
            .await
    }

    /// Every charge, all pages, newest first: for reconciliation.
    pub async fn charges(&self) -> anyhow::Result<Vec<Charge>> {
        self.all("v1/charges").await
    }

    /// Every refund, all pages, newest first: for reconciliation.
    pub async fn refunds(&self) -> anyhow::Result<Vec<ProcessorRefund>> {
        self.all("v1/refunds").await
    }

    /// Every dispute, all pages, newest first: for reconciliation.
    pub async fn disputes(&self) -> anyhow::Result<Vec<Dispute>> {
        self.all("v1/disputes").await
    }

    /// The charges made under the idempotency key `downstream_key`, newest first (one, or none):
    /// a read, safe to repeat and safe after the processor forgot the key, unlike asking for the
    /// charge again, which it would then make a second time.
    pub async fn charges_made_under(&self, downstream_key: &str) -> anyhow::Result<Vec<Charge>> {
        self.all(&under_key("v1/charges", downstream_key)).await
    }

    /// The refunds made under the idempotency key `downstream_key`, as for charges.
    pub async fn refunds_made_under(
        &self,
        downstream_key: &str,
    ) -> anyhow::Result<Vec<ProcessorRefund>> {
        self.all(&under_key("v1/refunds", downstream_key)).await
    }

    /// Every page of the list at `path` (which may carry a filter of its own).
    async fn all<T: DeserializeOwned + Listed>(&self, path: &str) -> anyhow::Result<Vec<T>> {
        let mut items: Vec<T> = Vec::new();
        loop {
            let separator = if path.contains('?') { '&' } else { '?' };
            let mut query = format!("{path}{separator}limit={PAGE}");
            if let Some(last) = items.last() {
                query.push_str(&format!("&starting_after={}", last.id()));
            }
            let page: Page<T> = self.get(&query).await?;
            items.extend(page.data);
            if !page.has_more {
                return Ok(items);
            }
        }
    }

    /// Reads `path`, asking again after a 503 (a read is safe to repeat): a processor whose
    /// database just restarted answers 503 until its pool has shed the connections from before
    /// the restart, one per request, and a reconciliation should wait for that rather than fail.
    /// At most [`READ_ATTEMPTS`] tries, a second apart.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        for attempt in 1.. {
            let response = self.request(Method::GET, path).send().await?;
            let status = response.status();
            if status == StatusCode::SERVICE_UNAVAILABLE && attempt < READ_ATTEMPTS {
                tokio::time::sleep(READ_PAUSE).await;
                continue;
            }
            if !status.is_success() {
                anyhow::bail!(
                    "GET {path} answered {status}: {}",
                    response.text().await.unwrap_or_default()
                );
            }
            return Ok(response.json().await?);
        }
        unreachable!("the attempts end with an answer or an error")
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let url = self.base.join(path).unwrap_or_else(|_| self.base.clone());
        self.http.request(method, url).bearer_auth(&self.api_key)
    }
}

/// `path` narrowed to what was made under `key`, the key encoded for a query string.
fn under_key(path: &str, key: &str) -> String {
    let encoded: String = key
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect();
    format!("{path}?idempotency_key={encoded}")
}

/// How often a read for reconciliation is sent before a 503 is its answer, and the pause between.
const READ_ATTEMPTS: u32 = 10;
const READ_PAUSE: Duration = Duration::from_secs(1);

/// A call that got no response. Only a failure to connect proves that nothing was sent.
fn transport<T>(error: &reqwest::Error) -> ProcessorOutcome<T> {
    let reason = chain(error);
    if error.is_connect() {
        ProcessorOutcome::NotDone(ProcessorRefusal {
            reason: format!("the processor could not be reached: {reason}"),
            status: None,
            problem_type: None,
        })
    } else {
        ProcessorOutcome::Unknown(format!("no answer from the processor: {reason}"))
    }
}

/// The error with its causes: "error sending request" alone says nothing of why.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}

/// A response, read into one of the outcomes.
async fn answered<T: DeserializeOwned>(response: reqwest::Response) -> ProcessorOutcome<T> {
    let status = response.status();
    let body = match response.bytes().await {
        Ok(body) => body,
        Err(error) => {
            return ProcessorOutcome::Unknown(format!(
                "{status}, then the body broke off: {error}"
            ));
        }
    };
    classify(status, &body)
}

/// What a status and its body say happened.
fn classify<T: DeserializeOwned>(status: StatusCode, body: &[u8]) -> ProcessorOutcome<T> {
    if status.is_success() {
        return match serde_json::from_slice(body) {
            Ok(result) => ProcessorOutcome::Done(result),
            Err(error) => {
                ProcessorOutcome::Unknown(format!("{status} with an unreadable body: {error}"))
            }
        };
    }
    let problem: ProblemBody = serde_json::from_slice(body).unwrap_or_default();
    let reason = problem
        .detail
        .clone()
        .unwrap_or_else(|| format!("the processor answered {status}"));
    match status {
        // In flight under the same key, or slow down: either may still happen.
        StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS => ProcessorOutcome::Unknown(reason),
        status if status.is_client_error() => ProcessorOutcome::NotDone(ProcessorRefusal {
            reason,
            status: Some(status.as_u16()),
            problem_type: problem.kind,
        }),
        _ => ProcessorOutcome::Unknown(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refund_is_refused_by_the_processor_s_two_problem_types_and_no_other() {
        let refusal = |problem_type: Option<&str>| ProcessorRefusal {
            reason: "refused".into(),
            status: Some(400),
            problem_type: problem_type.map(str::to_owned),
        };
        for refused in [
            "/problems/refund-exceeds-payment",
            "/problems/payment-not-refundable",
        ] {
            assert!(refusal(Some(refused)).is_refund_refused(), "{refused}");
        }
        assert_eq!(
            refusal(Some("/problems/refund-exceeds-payment")).problem(),
            Some(ProcessorProblem::RefundExceedsPayment)
        );
        for other in [
            None,
            Some("/problems/invalid-request"),
            Some("/problems/refund-exceeds"),
            Some("refund-exceeds-payment"),
        ] {
            assert!(!refusal(other).is_refund_refused(), "{other:?}");
        }
        assert_eq!(refusal(Some("/problems/unheard-of")).problem(), None);
    }

    fn outcome(status: u16, body: &str) -> ProcessorOutcome<ProcessorRefund> {
        classify(StatusCode::from_u16(status).unwrap(), body.as_bytes())
    }

    #[test]
    fn a_result_is_done_and_an_unreadable_one_is_unknown() {
        let refund = r#"{"id":"pyr_1","object":"refund","charge":"ch_1","amount":5,"status":"succeeded","created_at":"2026-11-30T10:00:00Z"}"#;
        assert!(matches!(outcome(201, refund), ProcessorOutcome::Done(r) if r.charge == "ch_1"));
        assert!(matches!(outcome(201, "{"), ProcessorOutcome::Unknown(_)));
        assert!(matches!(
            outcome(200, "<html>"),
            ProcessorOutcome::Unknown(_)
        ));
    }

    #[test]
    fn a_client_error_is_not_done_with_the_problem_s_type_and_detail() {
        let problem = r#"{"type":"/problems/refund-exceeds-payment","title":"t","status":400,"detail":"Nothing was refunded."}"#;
        let ProcessorOutcome::NotDone(refusal) = outcome(400, problem) else {
            panic!("400 is not done");
        };
        assert_eq!(refusal.status, Some(400));
        assert_eq!(
            refusal.problem_type.as_deref(),
            Some("/problems/refund-exceeds-payment")
        );
        assert_eq!(refusal.reason, "Nothing was refunded.");
        for status in [401, 403, 404, 422] {
            assert!(
                matches!(outcome(status, ""), ProcessorOutcome::NotDone(_)),
                "{status}"
            );
        }
    }

    #[test]
    fn in_flight_throttled_and_server_errors_are_unknown() {
        for status in [409, 429, 500, 502, 503, 504, 302] {
            assert!(
                matches!(outcome(status, ""), ProcessorOutcome::Unknown(_)),
                "{status}"
            );
        }
    }

    /// Runs `until_known` over scripted answers, one per attempt.
    async fn known_after(
        earlier: EarlierCalls,
        answers: Vec<ProcessorOutcome<()>>,
    ) -> ProcessorOutcome<()> {
        let answers = std::sync::Mutex::new(answers.into_iter());
        until_known(
            "refund",
            earlier,
            ProcessorRefusal::is_refund_refused,
            || {
                let next = answers
                    .lock()
                    .unwrap()
                    .next()
                    .expect("an answer per attempt");
                async move { next }
            },
        )
        .await
    }

    fn refused(problem_type: Option<&str>) -> ProcessorOutcome<()> {
        ProcessorOutcome::NotDone(ProcessorRefusal {
            reason: "connection refused".into(),
            status: None,
            problem_type: problem_type.map(str::to_owned),
        })
    }

    #[tokio::test]
    async fn not_done_is_final_only_when_no_attempt_with_the_key_may_have_reached_the_processor() {
        let unknown = || ProcessorOutcome::Unknown("timed out".into());
        // The first attempt with a key this request made: a refusal is believed.
        assert!(matches!(
            known_after(EarlierCalls::None, vec![refused(None)]).await,
            ProcessorOutcome::NotDone(_)
        ));
        // After this request's own attempt timed out, or an earlier holder's: it is not.
        assert!(matches!(
            known_after(EarlierCalls::None, vec![unknown(), refused(None)]).await,
            ProcessorOutcome::Unknown(reason) if reason.contains("earlier attempt")
        ));
        assert!(matches!(
            known_after(EarlierCalls::Possible, vec![refused(None)]).await,
            ProcessorOutcome::Unknown(_)
        ));
        // The processor's own answer about the key is final whatever came before.
        assert!(matches!(
            known_after(
                EarlierCalls::Possible,
                vec![refused(Some("/problems/refund-exceeds-payment"))]
            )
            .await,
            ProcessorOutcome::NotDone(_)
        ));
        assert!(matches!(
            known_after(EarlierCalls::Possible, vec![ProcessorOutcome::Done(())]).await,
            ProcessorOutcome::Done(())
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_done() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let client = ProcessorClient::new(
            &format!("http://127.0.0.1:{port}"),
            "pk".into(),
            Duration::from_secs(5),
        )
        .unwrap();
        let request = ChargeRequest {
            capture: true,
            amount: 1,
            currency: "eur".into(),
            payment_method: "pm_card_visa".into(),
        };
        assert!(matches!(
            client.charge("k", &request).await,
            ProcessorOutcome::NotDone(ProcessorRefusal { status: None, .. })
        ));
    }
}
