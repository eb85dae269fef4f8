//! The API's own description: committed, current, served, browsable, and its problem types
//! resolve to pages.

use idempay::http::error::ProblemKind;
use idempay_test_macros::api_test;
use serde_json::Value;

use crate::support::helpers::TestApp;

#[api_test]
async fn the_committed_description_is_what_the_code_generates() {
    let committed = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"));
    assert!(
        idempay::app::spec_json() == committed,
        "openapi/openapi.json is stale: run `make openapi` and commit it"
    );
}

#[api_test]
async fn the_description_is_served_at_openapi_json() {
    let app = TestApp::spawn().await;
    let response = app.send(app.client().get(app.url("/openapi.json"))).await;

    assert_eq!(response.status, 200);
    let served: Value = response.json();
    let committed: Value = serde_json::from_str(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/openapi.json"
    )))
    .unwrap();
    assert_eq!(served, committed);
}

#[api_test]
async fn swagger_ui_is_served_from_the_binary() {
    let app = TestApp::spawn().await;
    let page = app.send(app.client().get(app.url("/docs/"))).await;
    assert_eq!(page.status, 200);
    assert!(
        page.header("content-type")
            .unwrap()
            .starts_with("text/html")
    );
    let html = String::from_utf8_lossy(&page.body);
    assert!(html.contains("swagger-ui"), "{html}");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "no asset from elsewhere"
    );

    for asset in [
        "/docs/swagger-ui.css",
        "/docs/swagger-ui-bundle.js",
        "/docs/swagger-initializer.js",
    ] {
        let response = app.send(app.client().get(app.url(asset))).await;
        assert_eq!(response.status, 200, "{asset}");
    }
}

#[api_test]
async fn every_problem_type_resolves_to_a_page() {
    let app = TestApp::spawn().await;
    for kind in ProblemKind::ALL {
        let page = app.send(app.client().get(app.url(kind.type_uri()))).await;
        assert_eq!(page.status, 200, "{}", kind.type_uri());
        let html = String::from_utf8_lossy(&page.body);
        assert!(html.contains(kind.title()), "{html}");
    }
    let unknown = app
        .send(app.client().get(app.url("/problems/no-such-thing")))
        .await;
    unknown.assert_problem(404, "not-found");
}
