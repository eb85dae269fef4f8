//! The OpenAPI description of the API, generated from the handlers' annotations and doc comments.
//! Routes are registered through `utoipa-axum`, so a route cannot exist without its operation.
//! Here the root document and the finish every description gets; the application merges the
//! routes into it (`app::spec`). Served at `/openapi.json`, browsable at `/docs`, printed by
//! `idempay openapi`.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

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
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    servers((url = "/", description = "This service")),
    tags(
        (name = "payments", description = "Charges, at most once per idempotency key."),
        (name = "refunds", description = "Money given back, at most once per key and never more than was paid."),
        (name = "disputes", description = "What cardholders' banks claimed back, as the processor reported it."),
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

/// The description as served and committed, from what the routes' annotations generate: the
/// shapes code generators need (below). The figures its texts name are filled in by
/// [`with_figures`].
pub fn finish(description: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let mut description = optional_bodies_as_named_schemas(description);
    if let Some(components) = description.components.as_mut() {
        components.schemas.values_mut().for_each(name_enum_values);
    }
    list_items_by_reference(description)
}

/// Gives a string enum whose values are not identifiers (`payment.succeeded`, `*`) the names a
/// code generator gives its members, `x-enum-varnames` (`PAYMENT_SUCCEEDED`, `ALL`); without them
/// a generator numbers the members (`VALUE_7`) and a program cannot say which it means.
fn name_enum_values(schema: &mut utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>) {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::extensions::Extensions;
    use utoipa::openapi::schema::{ArrayItems, Schema};
    let RefOr::T(schema) = schema else { return };
    match schema {
        Schema::Object(object) => {
            object.properties.values_mut().for_each(name_enum_values);
            let Some(values) = &object.enum_values else {
                return;
            };
            let values: Vec<&str> = values
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect();
            let identifier = |value: &&str| {
                value.starts_with(|c: char| c.is_ascii_alphabetic())
                    && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            if values.iter().all(identifier) {
                return;
            }
            let names: Vec<String> = values
                .iter()
                .map(|value| match *value {
                    "*" => "ALL".to_owned(),
                    value => value
                        .chars()
                        .map(|c| {
                            if c.is_ascii_alphanumeric() {
                                c.to_ascii_uppercase()
                            } else {
                                '_'
                            }
                        })
                        .collect(),
                })
                .collect();
            object
                .extensions
                .get_or_insert_with(Extensions::default)
                .insert("x-enum-varnames".to_owned(), serde_json::json!(names));
        }
        Schema::Array(array) => {
            if let ArrayItems::RefOrSchema(items) = &mut array.items {
                name_enum_values(items);
            }
        }
        Schema::OneOf(one_of) => one_of.items.iter_mut().for_each(name_enum_values),
        Schema::AllOf(all_of) => all_of.items.iter_mut().for_each(name_enum_values),
        Schema::AnyOf(any_of) => any_of.items.iter_mut().for_each(name_enum_values),
        _ => {}
    }
}

/// A list's `data` refers to its items' named schema (`Payment`), where utoipa copies the schema
/// into every list: a code generator otherwise makes a second model per list
/// (`ListPaymentDataItem`) that code written for `Payment` cannot take.
fn list_items_by_reference(mut description: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ArrayItems, Ref, Schema};
    let Some(components) = description.components.as_mut() else {
        return description;
    };
    let named: Vec<String> = components.schemas.keys().cloned().collect();
    for (name, schema) in &mut components.schemas {
        let Some(item) = name.strip_prefix("List_") else {
            continue;
        };
        if !named.iter().any(|named| named == item) {
            continue;
        }
        let RefOr::T(Schema::Object(list)) = schema else {
            continue;
        };
        if let Some(RefOr::T(Schema::Array(data))) = list.properties.get_mut("data") {
            data.items = ArrayItems::RefOrSchema(Box::new(RefOr::Ref(Ref::from_schema_name(item))));
        }
    }
    description
}

/// A body that may be left out (a full refund's) is `required: false` with its named schema,
/// not utoipa's `oneOf: [schema, null]`: a body of `null` is no request anyone means, and code
/// generators turn that `oneOf` into a parameter that cannot be left out.
fn optional_bodies_as_named_schemas(
    mut description: utoipa::openapi::OpenApi,
) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::schema::{Schema, SchemaType, Type};
    use utoipa::openapi::{RefOr, Required};
    let is_null = |schema: &RefOr<Schema>| {
        matches!(schema, RefOr::T(Schema::Object(object))
            if object.schema_type == SchemaType::Type(Type::Null))
    };
    for item in description.paths.paths.values_mut() {
        let operations = [
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            let Some(RefOr::T(body)) = operation.request_body.as_mut() else {
                continue;
            };
            for content in body.content.values_mut() {
                let RefOr::T(content) = content else { continue };
                let Some(RefOr::T(Schema::OneOf(one_of))) = &content.schema else {
                    continue;
                };
                if let [schema, null] = one_of.items.as_slice()
                    && is_null(null)
                {
                    content.schema = Some(schema.clone());
                    body.required = Some(Required::False);
                }
            }
        }
    }
    description
}

/// Every keyed `POST` takes its body as JSON or as a form (`application/x-www-form-urlencoded`,
/// the mechanism's `form.rs`): the form is listed beside the JSON with the same schema, its object
/// and list members encoded `deepObject`, which is Stripe's bracket notation
/// (`metadata[order_id]=6735`). The processor's events come signed as JSON only.
///
/// Added last, after [`with_figures`]: utoipa reads back no `encoding` it wrote (its `headers`
/// member is required when read and left out when written empty).
pub fn with_form_bodies(mut description: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::encoding::EncodingBuilder;
    use utoipa::openapi::path::ParameterStyle;
    use utoipa::openapi::schema::{Schema, SchemaType, Type};
    const FORM: &str = "application/x-www-form-urlencoded";
    let schemas = description
        .components
        .as_ref()
        .map(|components| components.schemas.clone())
        .unwrap_or_default();
    // A schema, through its reference if it is one.
    let resolve = |schema: &RefOr<Schema>| -> Option<RefOr<Schema>> {
        match schema {
            RefOr::Ref(reference) => reference
                .ref_location
                .rsplit('/')
                .next()
                .and_then(|name| schemas.get(name))
                .cloned(),
            inline @ RefOr::T(_) => Some(inline.clone()),
        }
    };
    // The members of a body's schema that are objects or lists: those a form spells with brackets.
    let nested = |body: &RefOr<Schema>| -> Vec<String> {
        let Some(RefOr::T(Schema::Object(object))) = resolve(body) else {
            return Vec::new();
        };
        let scalar = |schema: &Schema| match schema {
            Schema::Object(object) => match &object.schema_type {
                SchemaType::Type(kind) => !matches!(kind, Type::Object | Type::Array),
                SchemaType::Array(kinds) => !kinds
                    .iter()
                    .any(|kind| matches!(kind, Type::Object | Type::Array)),
                SchemaType::AnyValue => false,
            },
            _ => false,
        };
        // A documented enum comes as `allOf` its values and a description: scalar if one part is.
        let is_scalar = |member: &RefOr<Schema>| match resolve(member) {
            Some(RefOr::T(Schema::AllOf(all))) => all
                .items
                .iter()
                .any(|part| matches!(resolve(part), Some(RefOr::T(part)) if scalar(&part))),
            Some(RefOr::T(schema)) => scalar(&schema),
            _ => false,
        };
        object
            .properties
            .iter()
            .filter(|(_, member)| !is_scalar(member))
            .map(|(name, _)| name.clone())
            .collect()
    };
    for item in description.paths.paths.values_mut() {
        let Some(operation) = item.post.as_mut() else {
            continue;
        };
        if operation.operation_id.as_deref() == Some("receiveProcessorEvent") {
            continue;
        }
        let Some(RefOr::T(body)) = operation.request_body.as_mut() else {
            continue;
        };
        let Some(RefOr::T(mut form)) = body.content.get("application/json").cloned() else {
            continue;
        };
        form.example = None;
        form.examples.clear();
        if let Some(schema) = &form.schema {
            for member in nested(schema) {
                let encoding = EncodingBuilder::new()
                    .style(Some(ParameterStyle::DeepObject))
                    .explode(Some(true))
                    .build();
                form.encoding.insert(member, encoding);
            }
        }
        body.content.insert(FORM.to_owned(), RefOr::T(form));
    }
    description
}

/// The description with the figures its texts name (`{key_ttl}`, …) filled in by `fill`, so no
/// text retypes a figure that the code could change. The placeholders are filled in the serialized
/// text: a figure is plain words, valid inside any JSON string, and parsing the text back keeps
/// the order of every member.
pub fn with_figures(
    description: utoipa::openapi::OpenApi,
    fill: impl FnOnce(&str) -> String,
) -> utoipa::openapi::OpenApi {
    let text = serde_json::to_string(&description).expect("the API description serializes");
    serde_json::from_str(&fill(&text)).expect("filling in figures keeps the description valid")
}
