//! The OpenAPI description of the API, generated from the handlers' annotations and doc comments.
//! Routes are registered through `utoipa-axum`, so a route cannot exist without its operation.
//! Served at `/openapi.json`, browsable at `/docs`, printed by `idempay openapi`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::Figures;
use crate::config::Settings;

/// The parts of the description that belong to no single route.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "idempay",
        description = "A payment API in which idempotency keys turn at-least-once delivery into \
exactly-once effects.

Every mutating request carries an `Idempotency-Key` header: one key per business intent, reused \
on every retry. The first request with a key executes; every repeat with the same key and body \
receives the first response unchanged, status code included, with `Idempotent-Replayed: true`. \
The same key with a different body is refused (422); a key whose first request is still running \
answers 409 with `Retry-After`.

**Expiry policy**: a key and its stored response are kept for {key_ttl} by default \
(`IDEMPAY_KEY_TTL`) after the request completed, then deleted; after that the key is new again. Keys are scoped to \
the account and the endpoint.

Errors are RFC 9457 problem documents (`application/problem+json`). Each `type` is a URI \
reference, `/problems/{name}`, that resolves to a page explaining it.

Test payment methods decide the outcome as Stripe's test cards do: `pm_card_visa` succeeds, \
`pm_card_chargeDeclined` is declined (402), `pm_card_slow` succeeds after a delay.",
        license(name = "MIT OR Apache-2.0"),
    ),
    servers((url = "/", description = "This service")),
    tags(
        (name = "payments", description = "Charges, at most once per idempotency key."),
        (name = "refunds", description = "Money given back, at most once per key and never more than was paid."),
        (name = "events", description = "What happened to payments and refunds, in commit order."),
        (name = "idempotency", description = "The keys themselves: what became of each."),
        (name = "webhooks", description = "The processor's events, applied exactly once."),
        (name = "webhook endpoints", description = "Where a merchant's events are delivered, signed, at least once."),
        (name = "problems", description = "The kinds of problem the API answers with."),
        (name = "operations", description = "Liveness and readiness probes."),
    ),
    modifiers(&BearerApiKey),
)]
pub struct ApiDoc;

/// The secret API key, sent as a bearer token.
struct BearerApiKey;

impl Modify for BearerApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("sk_…")
                    .description(Some(
                        "The account's secret API key: `Authorization: Bearer sk_…`.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The complete description: this document with every route's operation.
pub fn spec() -> utoipa::openapi::OpenApi {
    with_default_figures(super::routes().into_openapi())
}

/// The description with the figures its texts name (`{key_ttl}`, …) filled in from the default
/// settings and the constants, so no text retypes a figure that the code could change. The
/// placeholders are filled in the serialized text: a figure is plain words, valid inside any JSON
/// string, and parsing the text back keeps the order of every member.
pub fn with_default_figures(description: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let text = serde_json::to_string(&description).expect("the API description serializes");
    let settings = Settings::default();
    // The retry schedule is not `Copy`, as `Figures` is: filled in here, from the same settings.
    let filled = Figures::of(&settings)
        .fill(&text)
        .replace(
            "{webhook_retry_schedule}",
            &settings.webhook_retry_schedule.to_string(),
        )
        .replace(
            "{webhook_jitter}",
            &format!("±{}%", crate::webhooks::JITTER * 100.0),
        );
    serde_json::from_str(&filled).expect("filling in figures keeps the description valid")
}

/// The description as committed under `openapi/openapi.json`.
pub fn spec_json() -> String {
    let mut json = spec()
        .to_pretty_json()
        .expect("the API description always serializes");
    json.push('\n');
    json
}
