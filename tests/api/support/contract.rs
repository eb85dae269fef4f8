//! The contract: every response the suite receives is checked against the committed OpenAPI
//! description (`openapi/openapi.json`). A status the operation does not document, a content type
//! it does not declare, a body that does not match its schema or a header that does not match its
//! declaration fails the test that received it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{LazyLock, Mutex};

use reqwest::Method;
use serde_json::Value;

use crate::support::helpers::TestResponse;

static SPEC: LazyLock<Value> = LazyLock::new(|| {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    let text = std::fs::read_to_string(path).expect("openapi/openapi.json is committed");
    serde_json::from_str(&text).expect("openapi/openapi.json is JSON")
});

/// How often each documented (operation, status) was received.
static SEEN: LazyLock<Mutex<BTreeMap<(String, String), usize>>> = LazyLock::new(Default::default);
/// Responses from routes outside the description (unknown routes, the docs themselves).
static OUTSIDE: Mutex<usize> = Mutex::new(0);

/// Routes that serve pages rather than the API: the description itself, the docs, and the
/// checkout page with its assets (`IDEMPAY_DEMO_UI`).
const DOCUMENTATION_ROUTES: [&str; 3] = ["/openapi.json", "/docs", "/demo/checkout"];

/// The checkout page's calls, each answered by the API route of the same name under `/v1`.
const DEMO_API: &str = "/demo/api/";

/// Checks one response to `method path` against the description; panics on a violation.
pub fn check(method: &Method, path: &str, response: &TestResponse) {
    if let Some(route) = path.strip_prefix(DEMO_API) {
        return check(method, &format!("/v1/{route}"), response);
    }
    let Some((template, operation)) = operation(method, path) else {
        check_outside(path, response);
        return;
    };
    let id = operation["operationId"]
        .as_str()
        .unwrap_or(template)
        .to_owned();
    let status = response.status.to_string();
    let documented = &operation["responses"][&status];
    assert!(
        documented.is_object(),
        "contract: {id} answered {status}, which its description does not list: {}",
        String::from_utf8_lossy(&response.body)
    );
    check_content(&id, &status, documented, response);
    check_headers(&id, &status, documented, response);
    *SEEN.lock().unwrap().entry((id, status)).or_default() += 1;
}

/// A request outside the described routes may only be answered with a problem document, unless
/// it asked for the description or the docs page.
fn check_outside(path: &str, response: &TestResponse) {
    *OUTSIDE.lock().unwrap() += 1;
    if DOCUMENTATION_ROUTES
        .iter()
        .any(|route| path.starts_with(route))
    {
        return;
    }
    assert!(
        response.status >= 400,
        "contract: {path} answered {} but is not in the description",
        response.status
    );
    assert_eq!(
        response.header("content-type"),
        Some("application/problem+json")
    );
    validate(&component("Problem"), &response.json(), path);
}

fn check_content(id: &str, status: &str, documented: &Value, response: &TestResponse) {
    let Some(content) = documented["content"].as_object() else {
        assert!(
            response.body.is_empty(),
            "contract: {id} {status} documents no body"
        );
        return;
    };
    let content_type = response
        .header("content-type")
        .and_then(|value| value.split(';').next())
        .unwrap_or_default()
        .trim();
    let Some(media) = content.get(content_type) else {
        panic!(
            "contract: {id} {status} answered {content_type:?}, but documents {:?}",
            content.keys().collect::<Vec<_>>()
        );
    };
    let body = if content_type.ends_with("json") {
        response.json()
    } else {
        Value::String(String::from_utf8_lossy(&response.body).into_owned())
    };
    validate(&media["schema"], &body, &format!("{id} {status}"));
}

fn check_headers(id: &str, status: &str, documented: &Value, response: &TestResponse) {
    let Some(headers) = documented["headers"].as_object() else {
        return;
    };
    for (name, declaration) in headers {
        let Some(value) = response.header(name) else {
            continue;
        };
        let value = match declaration["schema"]["type"].as_str() {
            Some("integer") => value
                .parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| panic!("contract: {id} {status}: {name} is not an integer")),
            _ => Value::String(value.to_owned()),
        };
        validate(
            &declaration["schema"],
            &value,
            &format!("{id} {status} {name}"),
        );
    }
}

/// Validates `instance` against `schema`, whose references point into the description.
fn validate(schema: &Value, instance: &Value, what: &str) {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.insert("components".to_owned(), SPEC["components"].clone());
    }
    let validator = jsonschema::draft202012::new(&schema)
        .unwrap_or_else(|error| panic!("contract: the schema of {what} is invalid: {error}"));
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|error| format!("{} at {}", error, error.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "contract: {what} does not match its schema: {errors:?}\nbody: {instance}"
    );
}

fn component(name: &str) -> Value {
    serde_json::json!({ "$ref": format!("#/components/schemas/{name}") })
}

/// The described operation for `method path`, matching `{parameter}` segments.
fn operation<'a>(method: &Method, path: &str) -> Option<(&'a str, &'a Value)> {
    let method = method.as_str().to_ascii_lowercase();
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    SPEC["paths"]
        .as_object()?
        .iter()
        .find_map(|(template, item)| {
            let pattern: Vec<&str> = template.split('/').collect();
            let matches = pattern.len() == segments.len()
                && pattern.iter().zip(&segments).all(|(expected, actual)| {
                    (expected.starts_with('{') && !actual.is_empty()) || expected == actual
                });
            let operation = item.get(&method)?;
            matches.then_some((template.as_str(), operation))
        })
}

/// What the run covered: printed when the suite ends.
pub fn report() -> String {
    let seen = SEEN.lock().unwrap();
    let responses: usize = seen.values().sum();
    let documented: BTreeSet<(String, String)> = SPEC["paths"]
        .as_object()
        .into_iter()
        .flat_map(|paths| paths.values())
        .flat_map(|item| item.as_object().into_iter().flat_map(|ops| ops.values()))
        .flat_map(|operation| {
            let id = operation["operationId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            operation["responses"]
                .as_object()
                .into_iter()
                .flat_map(|responses| responses.keys().cloned())
                .map(move |status| (id.clone(), status))
        })
        .collect();
    let covered: Vec<String> = seen
        .keys()
        .map(|(id, status)| format!("{id} {status}"))
        .collect();
    let missed: Vec<String> = documented
        .iter()
        .filter(|pair| !seen.contains_key(*pair))
        .map(|(id, status)| format!("{id} {status}"))
        .collect();
    let operations: BTreeSet<&String> = seen.keys().map(|(id, _)| id).collect();
    format!(
        "contract: {responses} responses validated against openapi/openapi.json ({} outside it); \
         {} operations and {} of {} documented responses exercised\n  covered: {}\n  not exercised: {}",
        OUTSIDE.lock().unwrap(),
        operations.len(),
        seen.len(),
        documented.len(),
        covered.join(", "),
        missed.join(", "),
    )
}
