//! The judge: what counts as a correct answer to a hostile request, and the tally of what the
//! storm received.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use super::generate::Hostile;
use crate::support::helpers::TestResponse;
use crate::support::raw_http::{Outcome, RawResponse};

/// Statuses hyper itself answers, with an empty body, to bytes that are not a valid HTTP request.
const TRANSPORT_STATUSES: [u16; 5] = [400, 413, 414, 431, 505];

/// What an answer to `request` must be: never 5xx but the retryable refusal it was drawn to meet;
/// an error with a body is a problem document of its own status; an error without one comes from
/// hyper refusing malformed HTTP; no answer only when none can be owed; no secret echoed.
pub fn judge(request: &Hostile, outcome: &Outcome, secrets: &[&str]) -> Result<(), String> {
    let response = match outcome {
        Outcome::Answered(response) => response,
        Outcome::NoAnswer | Outcome::Dropped(_) if request.may_go_unanswered => return Ok(()),
        Outcome::NoAnswer => return Err("no answer: the server hangs".to_owned()),
        Outcome::Dropped(why) => return Err(format!("dropped without an answer: {why}")),
        Outcome::Garbled(what) => return Err(format!("garbled answer: {what}")),
    };
    // The one 5xx owed: a retryable refusal the request was drawn to meet (an unknown event type).
    let owed = request.refused_as.map(|(status, _)| status) == Some(response.status);
    if response.status >= 500 && !owed {
        return Err(format!("a 5xx answer: {response:?}"));
    }
    if let Some((status, problem)) = request.refused_as {
        let kind = serde_json::from_slice::<Value>(&response.body)
            .ok()
            .and_then(|body| body["type"].as_str().map(str::to_owned));
        if response.status != status || kind.as_deref() != Some(&format!("/problems/{problem}")) {
            return Err(format!(
                "a webhook not refused with {status} {problem}: {response:?}"
            ));
        }
    }
    for secret in secrets {
        if contains(&response.raw, secret.as_bytes()) {
            return Err(format!("the answer contains an API key: {response:?}"));
        }
    }
    let is_head = request.is_head();
    if response.status >= 400 && !is_head {
        if response.body.is_empty() {
            if !TRANSPORT_STATUSES.contains(&response.status) {
                return Err(format!(
                    "an empty {} that hyper does not send",
                    response.status
                ));
            }
        } else {
            if response.header("content-type") != Some("application/problem+json") {
                return Err(format!(
                    "an error that is no problem document ({:?}): {response:?}",
                    response.header("content-type")
                ));
            }
            let problem: Value = serde_json::from_slice(&response.body)
                .map_err(|error| format!("a problem document that is no JSON: {error}"))?;
            if problem["status"] != response.status
                || !problem["type"]
                    .as_str()
                    .is_some_and(|kind| kind.starts_with("/problems/"))
            {
                return Err(format!("a malformed problem document: {problem}"));
            }
        }
    }
    if (200..300).contains(&response.status)
        && request.target.starts_with("/v1/")
        && !is_head
        && response.header("content-type") != Some("application/json")
    {
        return Err(format!(
            "a success that is not JSON ({:?})",
            response.header("content-type")
        ));
    }
    contract(request, response)
}

/// Checks an answer the server produced (it has a content type) against the API description.
fn contract(request: &Hostile, response: &RawResponse) -> Result<(), String> {
    // Methods are case-sensitive; the description's lookup is not.
    if request.raw.is_some()
        || request.method == "HEAD"
        || !request.method.bytes().all(|b| b.is_ascii_uppercase())
        || !request.target.starts_with('/')
        || response.header("content-type").is_none()
    {
        return Ok(());
    }
    let Ok(method) = reqwest::Method::from_bytes(request.method.as_bytes()) else {
        return Ok(());
    };
    let path = request.target.split(['?', '#']).next().unwrap_or_default();
    let mut headers = HeaderMap::new();
    for (name, value) in &response.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    let checked = TestResponse {
        status: response.status,
        headers,
        body: response.body.clone(),
    };
    let check =
        std::panic::AssertUnwindSafe(|| crate::support::contract::check(&method, path, &checked));
    std::panic::catch_unwind(check).map_err(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        format!("against the API description: {message}")
    })
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Counts per status, per kind of request, and of requests left unanswered.
#[derive(Default)]
pub struct Summary {
    pub statuses: BTreeMap<u16, usize>,
    pub kinds: BTreeMap<&'static str, BTreeMap<String, usize>>,
    /// The longest wait for an answer, per kind of request.
    pub slowest: BTreeMap<&'static str, Duration>,
    pub unanswered: usize,
    pub dropped: usize,
    pub total: usize,
}

impl Summary {
    pub fn count(&mut self, request: &Hostile, outcome: &Outcome, elapsed: Duration) {
        self.total += 1;
        if matches!(outcome, Outcome::Answered(_)) {
            let slowest = self.slowest.entry(request.kind).or_default();
            *slowest = elapsed.max(*slowest);
        }
        let label = match outcome {
            Outcome::Answered(response) => {
                *self.statuses.entry(response.status).or_default() += 1;
                response.status.to_string()
            }
            Outcome::NoAnswer => {
                self.unanswered += 1;
                "no answer".to_owned()
            }
            Outcome::Dropped(_) => {
                self.dropped += 1;
                "dropped".to_owned()
            }
            Outcome::Garbled(_) => "garbled".to_owned(),
        };
        *self
            .kinds
            .entry(request.kind)
            .or_default()
            .entry(label)
            .or_default() += 1;
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(status, count)| format!("{status}×{count}"))
            .collect();
        writeln!(
            f,
            "hostile: {} requests; statuses {}; {} unanswered (a body that never came), {} dropped",
            self.total,
            statuses.join(" "),
            self.unanswered,
            self.dropped,
        )?;
        for (kind, outcomes) in &self.kinds {
            let outcomes: Vec<String> = outcomes
                .iter()
                .map(|(outcome, count)| format!("{outcome}×{count}"))
                .collect();
            let slowest = self.slowest.get(kind).copied().unwrap_or_default();
            writeln!(
                f,
                "  {kind:<20} {} (slowest answer {} ms)",
                outcomes.join(" "),
                slowest.as_millis()
            )?;
        }
        Ok(())
    }
}
