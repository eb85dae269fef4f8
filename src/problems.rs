//! The pages behind the problem `type` URIs: `/problems/{name}` explains each kind of problem, so
//! a developer who meets one in a response can look it up.

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::error::{Problem, ProblemKind};
use crate::extract::Path;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(problem_page))
}

/// Explain a problem type
///
/// The page a problem document's `type` resolves to: what the problem means and what to do.
/// The kinds are `invalid-request`, `invalid-idempotency-key`, `unauthorized`, `card-declined`,
/// `not-found`, `method-not-allowed`, `request-timeout`, `idempotency-key-in-use`,
/// `payload-too-large`, `unsupported-media-type`, `idempotency-key-mismatch`,
/// `payment-not-refundable`, `refund-exceeds-payment`, `webhook-signature-invalid`,
/// `webhook-timestamp-out-of-range`, `internal` and `service-unavailable`.
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
async fn problem_page(Path(name): Path<String>) -> Response {
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
        explanation = to_html(kind.explanation()),
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

    #[test]
    fn code_spans_become_code_and_markup_is_escaped() {
        assert_eq!(
            to_html("send `Retry-After` <now> & later"),
            "send <code>Retry-After</code> &lt;now&gt; &amp; later"
        );
    }
}
