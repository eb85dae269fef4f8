//! The lifecycle of a key, row by row: replay, mismatch, in flight, take over, scope, release.

use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::checks::{key_status, refuses_connections};
use crate::support::helpers::{
    TestApp, new_key, payment, reserve_as_a_dead_process, retry_while_in_flight, slow_payment,
    wait_until, with_slow_charge,
};
use crate::support::invariants::{assert_every_charge_recorded_once, assert_exactly_once};
use crate::support::raw_http::socket_address;

#[api_test(citus)]
async fn replay_returns_the_original_status_and_body_byte_for_byte() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment(4200)).await;

    let replay = app.post_payment(&key, &payment(4200)).await;

    assert_eq!(first.status, 201);
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("location"), first.header("location"));
    assert_eq!(replay.header("content-type"), first.header("content-type"));
    assert!(replay.replayed());
    assert!(!first.replayed());
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_retry_that_serialises_the_same_body_differently_is_a_replay() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app
        .raw_post()
        .header("idempotency-key", &key)
        .header("content-type", "application/json")
        .body(r#"{"amount":4200,"currency":"eur","order":"cmd_9182"}"#);
    let first = app.send(first).await;

    let retry = app
        .raw_post()
        .header("idempotency-key", &key)
        .header("content-type", "application/json; charset=utf-8")
        .body("{\n  \"order\": \"cmd_9182\",\n  \"currency\": \"eur\",\n  \"amount\": 4200\n}");
    let retry = app.send(retry).await;

    assert_eq!(first.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test]
async fn a_retry_that_writes_the_amount_in_another_notation_is_a_replay() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let send = |amount: &str| {
        app.raw_post()
            .header("idempotency-key", &key)
            .header("content-type", "application/json")
            .body(format!(r#"{{"amount":{amount},"currency":"eur"}}"#))
    };
    let first = app.send(send("4200")).await;
    assert_eq!(first.status, 201);
    // Another JSON library may write the same number as a float or with an exponent.
    for amount in ["42e2", "4200.0", "4.2E3"] {
        let retry = app.send(send(amount)).await;
        assert_eq!(retry.status, 201, "{amount}: {}", retry.json());
        assert!(retry.replayed(), "{amount}");
        assert_eq!(retry.body, first.body);
    }
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_declined_charge_is_replayed_byte_for_byte() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let body =
        json!({ "amount": 500, "currency": "eur", "payment_method": "pm_card_chargeDeclined" });
    let first = app.post_payment(&key, &body).await;

    let replay = app.post_payment(&key, &body).await;

    first.assert_problem(402, "card-declined");
    assert_eq!(replay.status, 402);
    assert_eq!(replay.body, first.body);
    assert_eq!(
        replay.header("content-type"),
        Some("application/problem+json")
    );
    assert!(replay.replayed());
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn the_same_key_with_another_payload_is_refused_and_nothing_executes() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment(4200)).await;

    let other = app.post_payment(&key, &payment(9900)).await;

    assert_eq!(first.status, 201);
    other.assert_problem(422, "idempotency-key-mismatch");
    assert!(!other.replayed());
    assert_eq!(app.payment_count().await, 1);
    // The key still answers its own payload.
    assert!(app.post_payment(&key, &payment(4200)).await.replayed());
    assert_exactly_once(&app.db).await;
}

#[api_test]
async fn a_mismatch_names_the_changed_field_and_never_its_values() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.post_payment(&key, &payment(4217)).await;

    let other = app.post_payment(&key, &payment(9931)).await;

    let problem = other.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(problem["mismatched_fields"], json!(["/amount"]));
    let text = String::from_utf8_lossy(&other.body);
    assert!(!text.contains("4217") && !text.contains("9931"), "{text}");
}

#[api_test]
async fn a_mismatch_lists_every_changed_field_sorted_and_an_added_one() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.post_payment(&key, &payment(4200)).await;

    let two = app
        .post_payment(
            &key,
            &json!({ "amount": 4300, "currency": "usd", "order": "cmd_9182" }),
        )
        .await;
    let added = app
        .post_payment(
            &key,
            &json!({ "amount": 4200, "currency": "eur", "order": "cmd_9182",
                                     "description": "more" }),
        )
        .await;
    // Another notation of the same amount is the same field: only the real change is named.
    let renoted = app
        .post_payment(
            &key,
            &json!({ "amount": 4.2e3, "currency": "eur", "order": "cmd_1" }),
        )
        .await;

    let two = two.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(two["mismatched_fields"], json!(["/amount", "/currency"]));
    let added = added.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(added["mismatched_fields"], json!(["/description"]));
    let renoted = renoted.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(renoted["mismatched_fields"], json!(["/order"]));
}

#[api_test]
async fn a_mismatch_on_a_key_reserved_without_field_digests_omits_the_list() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // Such a row is what a key reserved before the digests were recorded looks like.
    reserve_as_a_dead_process(&app, &key, &payment(4200), "now() + interval '1 minute'").await;

    let other = app.post_payment(&key, &payment(9900)).await;

    let problem = other.assert_problem(422, "idempotency-key-mismatch");
    assert!(problem.get("mismatched_fields").is_none(), "{problem}");
}

#[api_test(citus)]
async fn a_mismatch_is_refused_even_while_the_first_request_runs() {
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_millis(1500))).await;
    let key = new_key();
    let slow = slow_payment(100);
    let first = app.start_payment(&key, &slow).await;

    let other = app.post_payment(&key, &payment(100)).await;

    let problem = other.assert_problem(422, "idempotency-key-mismatch");
    // Read from the key's row (the first request has not completed, so nothing is cached).
    assert_eq!(
        problem["mismatched_fields"],
        json!(["/order", "/payment_method"])
    );
    assert_eq!(first.await.unwrap().status, 201);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test]
async fn bare_and_quoted_keys_are_the_same_key() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment(4200)).await;

    let quoted = app
        .post_payment(&format!("\"{key}\""), &payment(4200))
        .await;

    assert_eq!(first.status, 201);
    assert!(quoted.replayed());
    assert_eq!(quoted.body, first.body);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_retry_while_the_first_request_runs_gets_409_with_retry_after() {
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_millis(1500))).await;
    let key = new_key();
    let slow = slow_payment(100);
    let first = app.start_payment(&key, &slow).await;

    let retry = app.post_payment(&key, &slow).await;

    retry.assert_problem(409, "idempotency-key-in-use");
    assert_eq!(retry.header("retry-after"), Some("1"));
    assert_eq!(first.await.unwrap().status, 201);
    // Once the first request is done, the retry gets its result.
    let later = app.post_payment(&key, &slow).await;
    assert_eq!(later.status, 201);
    assert!(later.replayed());
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_slow_request_renews_its_lease_and_is_never_taken_over() {
    // The charge outlasts the lease twice over; only the heartbeat keeps the key held.
    let settings = Settings {
        shared: SharedArgs {
            lease: Duration::from_millis(1000),
            slow_charge: Duration::from_millis(2400),
            ..SharedArgs::default()
        },
        ..Settings::default()
    };
    let app = TestApp::spawn_with(settings).await;
    let key = new_key();
    let slow = slow_payment(100);
    let started = tokio::time::Instant::now();
    let first = app.start_payment(&key, &slow).await;

    // Retries after the lease's first length: each is refused while the charge runs (or, on a
    // slow machine, replays its result once done), and none executes.
    for at in [1200, 1600, 2000] {
        tokio::time::sleep_until(started + Duration::from_millis(at)).await;
        let retry = app.post_payment(&key, &slow).await;
        if retry.status == 201 {
            assert!(retry.replayed(), "a retry took the live request's key over");
        } else {
            retry.assert_problem(409, "idempotency-key-in-use");
        }
    }

    assert_eq!(
        first.await.unwrap().status,
        201,
        "the slow request kept its lease"
    );
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_key_whose_process_died_is_taken_over_after_its_lease() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // What a crashed instance leaves behind: a reservation whose lease ran out, no payment.
    reserve_as_a_dead_process(&app, &key, &payment(4200), "now() - interval '1 second'").await;

    let retry = app.post_payment(&key, &payment(4200)).await;

    retry.assert_status(201);
    assert!(!retry.replayed());
    assert_eq!(app.payment_count().await, 1);
    let replay = app.post_payment(&key, &payment(4200)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, retry.body);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_key_with_a_live_lease_is_not_taken_over() {
    let app = TestApp::spawn().await;
    let key = new_key();
    reserve_as_a_dead_process(&app, &key, &payment(4200), "now() + interval '20 seconds'").await;

    let retry = app.post_payment(&key, &payment(4200)).await;

    retry.assert_problem(409, "idempotency-key-in-use");
    assert_eq!(
        retry.header("retry-after"),
        Some("1"),
        "a short hint, not the whole lease"
    );
    assert_eq!(app.payment_count().await, 0);
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn a_request_that_lost_its_lease_rolls_back_its_charge() {
    // Long enough for the takeover below to land while the charge runs, even on a loaded machine.
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_secs(3))).await;
    let key = new_key();
    let slow = slow_payment(100);
    let first = app.start_payment(&key, &slow).await;
    // Another request takes the key over while the first is charging.
    app.take_over_the_key_in_progress().await;

    let status = first.await.unwrap().status;

    assert_eq!(
        status, 409,
        "the loser answers with the key's current state"
    );
    assert_eq!(
        app.payment_count().await,
        0,
        "the loser's charge was rolled back"
    );
    assert_eq!(
        key_status(&app).await,
        "in_progress",
        "the winner's reservation is untouched"
    );
    assert_exactly_once(&app.db).await;
}

#[api_test(citus)]
async fn the_same_key_from_another_account_is_a_separate_key() {
    let app = TestApp::spawn().await;
    let (_, other_api_key) = app.create_account("another merchant").await;
    let key = new_key();
    let mine = app.post_payment(&key, &payment(4200)).await;

    let theirs = app
        .post_payment_as(&other_api_key, &key, &payment(4200))
        .await;

    assert_eq!(mine.status, 201);
    assert_eq!(theirs.status, 201);
    assert!(
        !theirs.replayed(),
        "another account never sees this account's response"
    );
    assert_ne!(theirs.json()["id"], mine.json()["id"]);
    assert_eq!(app.payment_count().await, 2);
    // And a different payload under the same key is no mismatch across accounts.
    let other_payload = app
        .post_payment_as(&other_api_key, &new_key(), &payment(1))
        .await;
    assert_eq!(other_payload.status, 201);
    assert_exactly_once(&app.db).await;
}

/// A failure after the charge (here the database refuses the payment's insert) does not release
/// the key: the charge may have happened (here it did), so the key is kept at its recovery point
/// and the retry records the same charge instead of making a second one.
#[api_test(citus)]
async fn a_failure_after_the_charge_keeps_the_key_and_the_retry_records_the_same_charge() {
    let app = TestApp::spawn().await;
    app.refuse_payments().await;
    let key = new_key();

    let failed = app.post_payment(&key, &payment(4200)).await;

    let problem = failed.assert_problem(500, "internal");
    assert!(
        !problem["detail"].as_str().unwrap().contains("ledger"),
        "causes are not echoed"
    );
    let kept: (String, Option<String>) =
        sqlx::query_as("SELECT status, recovery_point FROM idempotency_keys WHERE idem_key = $1")
            .bind(&key)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        kept,
        (
            "in_progress".to_owned(),
            Some("payment.charge_requested".to_owned())
        ),
        "the key is kept at its recovery point"
    );
    assert_eq!(app.payment_count().await, 0);
    assert_eq!(app.charge_count().await, 1, "the processor charged once");

    sqlx::raw_sql("DROP TRIGGER refuse_payment ON payments")
        .execute(&app.db)
        .await
        .unwrap();
    let retry = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(retry.status, 201);
    assert!(!retry.replayed());
    assert_eq!(app.payment_count().await, 1);
    assert_eq!(app.charge_count().await, 1, "no second charge on retry");
    assert_exactly_once(&app.db).await;
    assert_every_charge_recorded_once(&app.db).await;
}

#[api_test(citus)]
async fn a_request_whose_client_hangs_up_still_completes() {
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_millis(800))).await;
    let key = new_key();
    let slow = slow_payment(100);
    let first = app.start_payment(&key, &slow).await;
    // Dropping the request closes its connection while the charge is running.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());

    // The charge finishes on the server; a client retrying as told gets its stored result.
    let retry = retry_while_in_flight(|| app.post_payment(&key, &slow)).await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

#[api_test]
async fn a_server_that_shuts_down_finishes_its_in_flight_requests() {
    // The charge lasts long enough for the checks made while it runs, even on a loaded machine.
    let (app, mut server) = TestApp::spawn_watched(with_slow_charge(Duration::from_secs(3))).await;
    let key = new_key();
    let slow = slow_payment(100);
    let first = app.start_payment(&key, &slow).await;

    app.stop();

    // The listener closes at once: new connections are refused while the request runs...
    let address = socket_address(&app);
    wait_until("the stopping server refuses new connections", || {
        refuses_connections(address)
    })
    .await;
    // ...and the server has not ended: it waits for its request in flight.
    let ended_early = server.is_finished();
    assert_eq!(
        key_status(&app).await,
        "in_progress",
        "the charge is still running (else the checks came too late to mean anything)"
    );
    assert!(
        !ended_early,
        "the server ended while its request was in flight"
    );

    let answer = first.await.unwrap();
    assert_eq!(answer.status, 201, "the request in flight was finished");
    let ended = tokio::time::timeout(SERVER_ENDS_WITHIN, &mut server)
        .await
        .expect("the server ends once its request in flight is answered");
    ended
        .expect("the server's task did not panic")
        .expect("the server stopped without an error");
    assert!(
        refuses_connections(address).await,
        "a stopped server accepts no connection"
    );
    assert_eq!(app.payment_count().await, 1);
    assert_eq!(key_status(&app).await, "completed");
    assert_exactly_once(&app.db).await;
}

/// How long a server may take to end once its last request is answered: closing its connections
/// and stopping its expiry job take milliseconds; the rest is for a loaded machine.
const SERVER_ENDS_WITHIN: Duration = Duration::from_secs(10);

/// The request timeout answers 503 while the charge runs; the charge goes on in a task of its own
/// and commits, and the client's retry with the same key receives that result as a replay: one
/// payment, not a second charge.
#[api_test]
async fn the_work_of_a_request_answered_503_at_its_timeout_goes_on_and_its_retry_receives_it() {
    let settings = Settings {
        // Room for the request to reach its charge (the key reserved) before the timeout, even on
        // a loaded machine: a request cut off before that started nothing, and proves nothing.
        request_timeout: Duration::from_secs(2),
        shared: SharedArgs {
            // Far beyond the request timeout, so that the 503 is read while the charge still
            // runs.
            slow_charge: Duration::from_secs(5),
            ..SharedArgs::default()
        },
        ..Settings::default()
    };
    let app = TestApp::spawn_with(settings).await;
    let key = new_key();
    let slow = slow_payment(100);
    // The account is looked up once and kept: the payment below goes straight to its key.
    assert_eq!(app.get("/v1/payments").await.status, 200);

    let first = app.post_payment(&key, &slow).await;

    first.assert_problem(503, "service-unavailable");
    assert!(first.header("retry-after").is_some());
    let key_reserved: Option<String> = sqlx::query_scalar(
        "SELECT status FROM idempotency_keys WHERE scope NOT LIKE 'processor:%'",
    )
    .fetch_optional(&app.db)
    .await
    .unwrap();
    assert_eq!(
        (key_reserved.as_deref(), app.payment_count().await),
        (Some("in_progress"), 0),
        "answered 503 while the charge was running"
    );
    // The client retries as told; the work it started goes on meanwhile, and completes.
    let retry = retry_while_in_flight(|| app.post_payment(&key, &slow)).await;
    retry.assert_status(201);
    assert!(
        retry.replayed(),
        "the retry receives the result of the work that went on, not a second execution"
    );
    assert_eq!(app.payment_count().await, 1);
    let id: String = sqlx::query_scalar("SELECT id FROM payments")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(retry.json()["id"], id.as_str());
    assert_eq!(key_status(&app).await, "completed");
    assert_exactly_once(&app.db).await;
}
