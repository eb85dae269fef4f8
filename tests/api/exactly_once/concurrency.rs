//! Real concurrency: many identical requests at once, on one instance and across two, and the
//! database counts the payments.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use idempay_test_macros::api_test;

use crate::support::helpers::{
    TestApp, TestResponse, new_key, payment, slow_payment, with_slow_charge,
};

const STORM: usize = 50;

/// The slow card's charge: the first request holds the key this long, so that the others, sent at
/// the same moment, arrive while it does, even on a loaded machine.
const SLOW_CHARGE: Duration = Duration::from_secs(1);

#[api_test(citus)]
async fn fifty_simultaneous_identical_requests_make_exactly_one_payment() {
    let app = TestApp::spawn_with(with_slow_charge(SLOW_CHARGE)).await;
    let (key, body) = (new_key(), slow_payment(4200));

    let responses = join_all((0..STORM).map(|_| app.post_payment(&key, &body))).await;

    assert_one_payment_and_consistent_answers(&app, &responses).await;
    let conflicts = responses.iter().filter(|r| r.status == 409).count();
    assert!(
        conflicts > 0,
        "the requests overlapped: some arrived while the first was charging"
    );
}

#[api_test(citus)]
async fn fifty_simultaneous_identical_requests_across_two_instances_make_exactly_one_payment() {
    let first = TestApp::spawn_with(with_slow_charge(SLOW_CHARGE)).await;
    let second = first.another_instance(with_slow_charge(SLOW_CHARGE)).await;
    let (key, body) = (new_key(), slow_payment(4200));

    let instance = |i: usize| i % 2;
    let responses = join_all((0..STORM).map(|i| {
        let app = if instance(i) == 0 { &first } else { &second };
        app.post_payment(&key, &body)
    }))
    .await;

    assert_one_payment_and_consistent_answers(&first, &responses).await;
    let executor = responses
        .iter()
        .position(|r| r.status == 201 && !r.replayed())
        .map(instance);
    let conflicts_on_the_other = responses
        .iter()
        .enumerate()
        .filter(|(i, r)| r.status == 409 && Some(instance(*i)) != executor)
        .count();
    assert!(
        conflicts_on_the_other > 0,
        "the requests overlapped across the instances: the one that did not execute answered 409 \
         while the other was charging"
    );
}

#[api_test(citus)]
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
