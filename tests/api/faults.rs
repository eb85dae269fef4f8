//! Real server processes under faults: one killed with SIGKILL in the middle of a charge, and
//! three serving a storm of retries on one database. The invariants are checked after each.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use libtest_mimic::Trial;
use serde_json::json;

use crate::helpers::{TestApp, TestResponse, new_key, payment, retry_while_in_flight};
use crate::instance::Instance;
use crate::invariants::assert_exactly_once;
use crate::trials;

pub fn trials() -> Vec<Trial> {
    let processes = trials![faults;
        a_killed_instance_leaves_its_key_to_a_retry_that_takes_over_once,
        three_instances_under_a_retry_storm_make_one_payment_per_key,
    ];
    processes.into_iter().chain(crash_trials()).collect()
}

/// A crash at each step of the lifecycle, where the binary has its crash points.
#[cfg(feature = "failpoints")]
fn crash_trials() -> Vec<Trial> {
    trials![faults;
        a_crash_right_after_the_reservation_is_taken_over_and_charged_once,
        a_crash_between_the_charge_and_its_commit_leaves_nothing_and_is_charged_once,
        a_crash_after_the_commit_is_answered_by_a_replay,
    ]
}

#[cfg(not(feature = "failpoints"))]
fn crash_trials() -> Vec<Trial> {
    Vec::new()
}

/// Kills an instance at `failpoint` during a payment, then retries on a healthy one until the key
/// is free; returns the retry's answer, with the invariants checked.
#[cfg(feature = "failpoints")]
async fn crash_at(failpoint: &str) -> (TestApp, TestResponse) {
    let app = TestApp::spawn().await;
    let mut crashing = Instance::start(
        &app.database_url(),
        &[("IDEMPAY_FAILPOINT", failpoint), ("IDEMPAY_LEASE", "1s")],
    )
    .await;
    let key = new_key();
    let body = payment(4200);
    let request = reqwest::Client::new()
        .post(format!("{}/v1/payments", crashing.address))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", &key)
        .json(&body)
        .send()
        .await;
    assert!(request.is_err(), "the process died before it answered");
    let exit = crashing.child.wait().await.unwrap();
    assert!(!exit.success(), "{failpoint}: aborted");

    let retry = retry_while_in_flight(|| app.post_payment(&key, &body)).await;
    assert_eq!(retry.status, 201, "{failpoint}");
    assert_eq!(app.payment_count().await, 1, "{failpoint}");
    assert_exactly_once(&app.db).await;
    (app, retry)
}

#[cfg(feature = "failpoints")]
async fn a_crash_right_after_the_reservation_is_taken_over_and_charged_once() {
    let (_, retry) = crash_at("after-reserve").await;
    assert!(
        !retry.replayed(),
        "nothing had been charged: the retry executes"
    );
}

#[cfg(feature = "failpoints")]
async fn a_crash_between_the_charge_and_its_commit_leaves_nothing_and_is_charged_once() {
    let (_, retry) = crash_at("before-commit").await;
    assert!(
        !retry.replayed(),
        "the uncommitted charge was rolled back: the retry executes"
    );
}

#[cfg(feature = "failpoints")]
async fn a_crash_after_the_commit_is_answered_by_a_replay() {
    let (_, retry) = crash_at("after-commit").await;
    assert!(
        retry.replayed(),
        "the charge committed: the retry gets its stored response"
    );
}

async fn a_killed_instance_leaves_its_key_to_a_retry_that_takes_over_once() {
    let app = TestApp::spawn().await;
    let mut doomed = Instance::start(
        &app.database_url(),
        // The lease outlasts the early retry below even on a loaded machine.
        &[("IDEMPAY_LEASE", "5s"), ("IDEMPAY_SLOW_CHARGE", "30s")],
    )
    .await;
    let key = new_key();
    let slow = json!({ "amount": 100, "currency": "eur", "payment_method": "pm_card_slow" });
    let request = reqwest::Client::new()
        .post(format!("{}/v1/payments", doomed.address))
        .bearer_auth(&app.api_key)
        .header("idempotency-key", &key)
        .json(&slow)
        .send();
    let in_flight = tokio::spawn(request);
    while app.key_count().await == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    doomed.child.kill().await.expect("SIGKILL");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance never answered"
    );

    // The lease is still running: the retry is told to wait.
    let early = app.post_payment(&key, &slow).await;
    early.assert_problem(409, "idempotency-key-in-use");
    assert_eq!(app.payment_count().await, 0);

    // Once the lease has run out, a retry takes the key over and charges exactly once.
    let survivor = Instance::start(&app.database_url(), &[("IDEMPAY_SLOW_CHARGE", "100ms")]).await;
    let taken_over =
        retry_while_in_flight(|| survivor.post_payment(&app.api_key, &key, &slow)).await;
    assert_eq!(taken_over.status, 201);
    assert!(!taken_over.replayed(), "the takeover executed the charge");
    let replay = survivor.post_payment(&app.api_key, &key, &slow).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken_over.body);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

async fn three_instances_under_a_retry_storm_make_one_payment_per_key() {
    const KEYS: usize = 200;
    const COPIES: usize = 5;
    let app = TestApp::spawn().await;
    let env = [("IDEMPAY_EXPIRY_INTERVAL", "100ms")];
    let instances = [
        Instance::start(&app.database_url(), &env).await,
        Instance::start(&app.database_url(), &env).await,
        Instance::start(&app.database_url(), &env).await,
    ];
    let keys: Vec<String> = (0..KEYS).map(|_| new_key()).collect();
    let body = payment(4200);

    // Every key sent COPIES times, the copies spread over the three instances, 50 at a time.
    let sends: Vec<(usize, &String)> = (0..COPIES)
        .flat_map(|copy| {
            keys.iter()
                .enumerate()
                .map(move |(i, key)| ((i + copy) % 3, key))
        })
        .collect();
    let mut answers: HashMap<&String, Vec<TestResponse>> = HashMap::new();
    for batch in sends.chunks(50) {
        let responses =
            join_all(batch.iter().map(|(instance, key)| {
                instances[*instance].post_payment(&app.api_key, key, &body)
            }))
            .await;
        for ((_, key), response) in batch.iter().zip(responses) {
            answers.entry(key).or_default().push(response);
        }
    }

    assert_eq!(app.payment_count().await, KEYS as i64);
    for (key, responses) in &answers {
        // 503: an instance was too loaded to answer in time and asked for a retry. Never more.
        assert!(
            responses
                .iter()
                .all(|r| matches!(r.status, 201 | 409 | 503)),
            "{key}"
        );
        let created: Vec<_> = responses.iter().filter(|r| r.status == 201).collect();
        assert!(
            created.iter().all(|r| r.body == created[0].body),
            "{key}: one answer"
        );
        assert_eq!(
            created.iter().filter(|r| !r.replayed()).count(),
            1,
            "{key}: executed once"
        );
    }
    assert_exactly_once(&app.db).await;
}
