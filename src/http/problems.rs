//! The pages behind the problem `type` URIs: `/problems/{name}` explains each kind of problem, so
//! a developer who meets one in a response can look it up.

use std::time::Duration;

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{Problem, ProblemKind};
use super::extract::Path;

/// The figures the texts speak of (the problem pages, the API description), taken from the
/// settings and constants they describe: a text never states a limit the service does not apply.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub key_ttl: Duration,
    pub event_ttl: Duration,
    pub lease: Duration,
    pub body_limit_bytes: usize,
    pub body_read_timeout: Duration,
    pub webhook_tolerance: Duration,
    /// How long a merchant endpoint has to answer a delivery.
    pub webhook_delivery_timeout: Duration,
    pub max_signatures: usize,
    pub max_key_len: usize,
    /// Webhook endpoints per account.
    pub max_webhook_endpoints: i64,
    /// The processor's events kept per account until the objects they name are recorded.
    pub max_parked: i64,
    /// Requests per second per account; 0 for no limit.
    pub rate_limit: u32,
}

impl Figures {
    /// The kind's explanation with its placeholders filled in.
    pub fn explain(&self, kind: ProblemKind) -> String {
        self.fill(kind.explanation())
    }

    /// `text` with each placeholder (`{key_ttl}`, `{event_ttl}`, `{lease}`, `{body_limit}`,
    /// `{body_read_timeout}`, `{webhook_tolerance}`, `{webhook_delivery_timeout}`,
    /// `{max_signatures}`, `{max_key_len}`, `{max_webhook_endpoints}`, `{max_parked}`,
    /// `{rate_limit}`, `{problem_kinds}`) replaced by its figure.
    pub fn fill(&self, text: &str) -> String {
        text.replace("{key_ttl}", &in_words(self.key_ttl))
            .replace("{event_ttl}", &in_words(self.event_ttl))
            .replace("{lease}", &in_words(self.lease))
            .replace(
                "{body_limit}",
                &format!("{} KiB", self.body_limit_bytes / 1024),
            )
            .replace("{body_read_timeout}", &in_words(self.body_read_timeout))
            .replace("{webhook_tolerance}", &in_words(self.webhook_tolerance))
            .replace(
                "{webhook_delivery_timeout}",
                &in_words(self.webhook_delivery_timeout),
            )
            .replace("{max_signatures}", &self.max_signatures.to_string())
            .replace("{max_key_len}", &self.max_key_len.to_string())
            .replace(
                "{max_webhook_endpoints}",
                &self.max_webhook_endpoints.to_string(),
            )
            .replace("{max_parked}", &self.max_parked.to_string())
            .replace("{rate_limit}", &rate_in_words(self.rate_limit))
            .replace("{problem_kinds}", &problem_kinds())
    }
}

/// Every problem kind's slug, as a sentence lists them.
fn problem_kinds() -> String {
    let slugs: Vec<String> = ProblemKind::ALL
        .iter()
        .map(|kind| format!("`{}`", kind.slug()))
        .collect();
    match slugs.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The rate limit as a person says it.
fn rate_in_words(per_second: u32) -> String {
    match per_second {
        0 => "no limit is set".to_owned(),
        1 => "1 request a second, with a burst of 1".to_owned(),
        n => format!("{n} requests a second, with a burst of {n}"),
    }
}

/// A duration as a person says it: `24 hours`, `5 minutes`, `1 second`, `250 milliseconds`.
fn in_words(duration: Duration) -> String {
    let millis = duration.as_millis();
    let (count, unit) = [(3_600_000, "hour"), (60_000, "minute"), (1_000, "second")]
        .into_iter()
        .find(|(unit, _)| millis >= *unit && millis % unit == 0)
        .map_or((millis, "millisecond"), |(unit, name)| {
            (millis / unit, name)
        });
    format!("{count} {unit}{}", if count == 1 { "" } else { "s" })
}

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    Figures: FromRef<S>,
{
    OpenApiRouter::new().routes(routes!(problem_page))
}

/// Explain a problem type
///
/// The page a problem document's `type` resolves to: what the problem means and what to do.
/// The kinds are {problem_kinds}.
#[utoipa::path(
    get,
    path = "/problems/{name}",
    operation_id = "explainProblem",
    tag = "problems",
    params(("name" = String, Path, description = "The last segment of a problem `type`.", example = "idempotency-key-mismatch")),
    responses(
        (status = 200, description = "A short page explaining the problem.", body = String, content_type = "text/html"),
        (status = 404, description = "No such kind of problem (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
    )
)]
async fn problem_page(State(figures): State<Figures>, Path(name): Path<String>) -> Response {
    let Some(kind) = ProblemKind::from_slug(&name) else {
        return Problem::new(ProblemKind::NotFound, format!("No problem type `{name}`."))
            .into_response();
    };
    let page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{title}</title></head>\n<body><h1>{title}</h1>\n\
         <p>HTTP status {status}. Type <code>{uri}</code>.</p>\n<p>{explanation}</p>\n\
         <p><a href=\"/docs/\">API documentation</a></p></body></html>\n",
        title = kind.title(),
        status = kind.status().as_u16(),
        uri = kind.type_uri(),
        explanation = to_html(&figures.explain(kind)),
    );
    (
        [(header::CACHE_CONTROL, "public, max-age=86400")],
        Html(page),
    )
        .into_response()
}

/// The explanations are plain text with `code` spans in backticks.
fn to_html(text: &str) -> String {
    let escaped = text
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    escaped
        .split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 1 {
                format!("<code>{part}</code>")
            } else {
                part.to_owned()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Figures {
        Figures {
            key_ttl: Duration::from_secs(24 * 3600),
            event_ttl: Duration::from_secs(7 * 24 * 3600),
            lease: Duration::from_secs(30),
            body_limit_bytes: 64 * 1024,
            body_read_timeout: Duration::from_secs(5),
            webhook_tolerance: Duration::from_secs(300),
            webhook_delivery_timeout: Duration::from_secs(10),
            max_signatures: 8,
            max_key_len: 255,
            max_webhook_endpoints: 16,
            max_parked: 10_000,
            rate_limit: 1000,
        }
    }

    #[test]
    fn durations_are_told_in_their_largest_whole_unit() {
        assert_eq!(in_words(Duration::from_secs(24 * 3600)), "24 hours");
        assert_eq!(in_words(Duration::from_secs(300)), "5 minutes");
        assert_eq!(in_words(Duration::from_secs(1)), "1 second");
        assert_eq!(in_words(Duration::from_millis(1500)), "1500 milliseconds");
    }

    #[test]
    fn every_placeholder_is_filled_with_the_running_figures() {
        let figures = figures();
        for &kind in ProblemKind::ALL {
            let text = figures.explain(kind);
            // What stays in braces is literal: the parts of a signed webhook payload.
            let left = text
                .replace("{webhook-id}", "")
                .replace("{webhook-timestamp}", "")
                .replace("{body}", "");
            assert!(!left.contains('{'), "{kind:?}: {text}");
        }
        assert!(
            figures
                .explain(ProblemKind::PayloadTooLarge)
                .contains("64 KiB")
        );
        assert!(
            figures
                .explain(ProblemKind::IdempotencyKeyMismatch)
                .contains("24 hours")
        );
        let shorter = Figures {
            key_ttl: Duration::from_secs(90 * 60),
            ..figures
        };
        assert!(
            shorter
                .explain(ProblemKind::IdempotencyKeyMismatch)
                .contains("90 minutes")
        );
    }

    #[test]
    fn code_spans_become_code_and_markup_is_escaped() {
        assert_eq!(
            to_html("send `Retry-After` <now> & later"),
            "send <code>Retry-After</code> &lt;now&gt; &amp; later"
        );
    }
}
