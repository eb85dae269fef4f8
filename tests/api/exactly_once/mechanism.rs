//! The idempotency mechanism on its own, with units of work that HTTP cannot provoke: one that
//! panics, one that fails, and one that succeeds afterwards with the same key.

use std::time::Duration;

use axum::http::StatusCode;
use idempay::accounts::Account;
use idempay::http::error::{ApiError, ProblemKind};
use idempay::idempotency::{
    Fingerprint, Idempotency, IdempotencyKey, KeyedRequest, Policy, Scope, Service, StoredResponse,
};
use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::TestApp;

const POLICY: Policy = Policy {
    key_ttl: Duration::from_secs(60),
    lease: Duration::from_secs(30),
};

#[api_test]
async fn a_panicking_unit_of_work_releases_the_key_for_a_retry() {
    let (app, idempotency, account) = mechanism_on_a_fresh_database().await;
    let request = keyed(&account, "/v1/things");

    let panicked = idempotency
        .run(request.clone(), |_lease| async {
            panic!("a deliberate panic inside the unit of work")
        })
        .await;

    let Err(error) = panicked else {
        panic!("a panic is not a success")
    };
    assert_eq!(error.into_problem().kind(), ProblemKind::Internal);
    assert_eq!(app.key_count().await, 0, "the key was released");

    let retried = idempotency.run(request, complete_with_201).await.unwrap();
    assert_eq!(retried.status(), StatusCode::CREATED);
    assert_eq!(app.key_count().await, 1);
}

#[api_test]
async fn a_failing_unit_of_work_stores_nothing_and_passes_its_error_on() {
    let (app, idempotency, account) = mechanism_on_a_fresh_database().await;
    let request = keyed(&account, "/v1/things");

    let failed = idempotency
        .run(request, |_lease| async {
            Err(ApiError::Internal(anyhow::anyhow!(
                "the processor timed out"
            )))
        })
        .await;

    assert!(matches!(failed, Err(ApiError::Internal(_))));
    assert_eq!(app.key_count().await, 0);
}

#[api_test]
async fn the_same_key_on_another_route_is_a_separate_key() {
    let (app, idempotency, account) = mechanism_on_a_fresh_database().await;

    for route in ["/v1/things", "/v1/other-things"] {
        let response = idempotency
            .run(keyed(&account, route), complete_with_201)
            .await
            .unwrap();
        assert!(
            response.headers().get("idempotent-replayed").is_none(),
            "{route}"
        );
    }
    assert_eq!(app.key_count().await, 2);
}

/// The mechanism on its own, on a fresh database with one account.
async fn mechanism_on_a_fresh_database() -> (TestApp, Idempotency, Account) {
    let app = TestApp::spawn().await;
    let idempotency = Idempotency::new(Service::Api, app.db.clone(), POLICY);
    let (account, _) = idempay::accounts::create(&app.db, "mechanism")
        .await
        .unwrap();
    (app, idempotency, account)
}

/// The same key and payload for `route`, in `account`.
fn keyed(account: &Account, route: &str) -> KeyedRequest {
    KeyedRequest::new(
        Scope::new(account.id(), &axum::http::Method::POST, route),
        IdempotencyKey::parse(b"the-key").unwrap(),
        Fingerprint::of_request(route, &json!({ "thing": 1 })),
    )
}

async fn complete_with_201(
    lease: idempay::idempotency::Lease,
) -> Result<idempay::idempotency::Completion, ApiError> {
    let tx = lease.begin().await?;
    let response = StoredResponse::json(StatusCode::CREATED, &json!({ "ok": true }))
        .map_err(anyhow::Error::from)?;
    Ok(lease.complete(tx, response).await?)
}
