//! Real concurrency: many identical requests at once, on one instance and across two, and the
//! database counts the payments.

use std::collections::HashSet;

use futures::future::join_all;
use idempay::config::Settings;
use idempay_test_macros::api_test;

use crate::support::helpers::{TestApp, TestResponse, new_key, payment};

const STORM: usize = 50;

#[api_test]
async fn fifty_simultaneous_identical_requests_make_exactly_one_payment() {
    let app = TestApp::spawn().await;
    let (key, body) = (new_key(), payment(4200));

    let responses = join_all((0..STORM).map(|_| app.post_payment(&key, &body))).await;

    assert_one_payment_and_consistent_answers(&app, &responses).await;
}

#[api_test]
async fn fifty_simultaneous_identical_requests_across_two_instances_make_exactly_one_payment() {
    let first = TestApp::spawn().await;
    let second = first.another_instance(Settings::default()).await;
    let (key, body) = (new_key(), payment(4200));

    let responses = join_all((0..STORM).map(|i| {
        let instance = if i % 2 == 0 { &first } else { &second };
        instance.post_payment(&key, &body)
    }))
    .await;

    assert_one_payment_and_consistent_answers(&first, &responses).await;
}

#[api_test]
async fn simultaneous_requests_with_different_keys_each_make_their_own_payment() {
    let app = TestApp::spawn().await;
    let keys: Vec<String> = (0..STORM).map(|_| new_key()).collect();
    let body = payment(4200);

    let responses = join_all(keys.iter().map(|key| app.post_payment(key, &body))).await;

    assert!(responses.iter().all(|response| response.status == 201));
    let ids: HashSet<_> = responses.iter().map(|r| r.json()["id"].clone()).collect();
    assert_eq!(ids.len(), STORM);
    assert_eq!(app.payment_count().await, STORM as i64);
}

/// Exactly one payment row; every 201 carries the same bytes; the others are 409; no 5xx.
async fn assert_one_payment_and_consistent_answers(app: &TestApp, responses: &[TestResponse]) {
    assert_eq!(app.payment_count().await, 1);
    crate::support::invariants::assert_exactly_once(&app.db).await;
    let created: Vec<_> = responses.iter().filter(|r| r.status == 201).collect();
    assert!(!created.is_empty());
    assert!(
        created.iter().all(|r| r.body == created[0].body),
        "every 201 body is identical"
    );
    assert_eq!(
        created.iter().filter(|r| !r.replayed()).count(),
        1,
        "one request executed, the other 201s are replays"
    );
    for response in responses.iter().filter(|r| r.status != 201) {
        response.assert_problem(409, "idempotency-key-in-use");
        assert!(response.header("retry-after").is_some());
    }
}
