//! Exactly once across two hops, captures: a capture is one more call to the processor with a
//! downstream key of its own, so it gets what a charge and a refund get. A capture whose answer
//! was lost, followed by a refused connection, keeps its key and captures once; an instance killed
//! while the processor captures is recovered by another's recovery job; an authorization nobody
//! captures expires at the processor, and its event cancels the payment. The setup is
//! `two_hops.rs`'s.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::json;
use service::outbox::RetrySchedule;

use super::early_events::{NOT_WITHIN_THE_TEST, delivering_events};
use super::forever::until_known;
use super::two_hops::{
    assert_reconcile_says, assert_reconcile_succeeds, doomed_and_survivor, faulty,
    idempay_and_processor, key_row, kill_in_the_window, port_of, rebind, replace_processor,
    sent_into_the_window, under_way, waiting_at_most,
};
use crate::processor::{self, TestProcessor};
use crate::support::checks::{count, keyed_post, manual};
use crate::support::helpers::{new_key, send, wait_until};
use crate::support::instance::Instance;

/// What the processor holds of its one authorized charge: its capture state, what it took, and
/// the key its capture was made under.
async fn the_authorization(db: &sqlx::PgPool) -> (String, Option<i64>, Option<String>) {
    sqlx::query_as("SELECT capture_state, amount_captured, capture_key FROM processor_charges")
        .fetch_one(db)
        .await
        .unwrap()
}

/// A capture of 3000 of a 5000 authorization, made by the processor after idempay stopped
/// waiting (its answer lost); the retry meets a refused connection and keeps the key, since that
/// says nothing of the attempt before; after the outage, the retry records the one capture.
#[api_test]
async fn a_refused_connection_after_a_capture_whose_answer_was_lost_keeps_the_key_and_captures_once()
 {
    let impatient = waiting_at_most(Duration::from_secs(1));
    let (app, healthy) = idempay_and_processor(impatient, processor::settings()).await;
    let authorized = app.authorized(5000).await;
    let port = port_of(&healthy);
    // Each call takes 3 s there, beyond idempay's 1 s and its three attempts: the answer is lost,
    // the processor captures anyway.
    let slow = replace_processor(
        &app,
        healthy,
        faulty(|s| s.faults.latency = Duration::from_secs(3)),
    )
    .await;
    let key = new_key();
    let body = json!({ "amount_to_capture": 3000 });

    let unknown = app.post_capture(&authorized, &key, &body).await;
    unknown.assert_problem(503, "processor-outcome-unknown");
    wait_until("the processor commits the capture", || async {
        the_authorization(&app.db).await.0 == "captured"
    })
    .await;
    slow.stop();
    let refused = app.post_capture(&authorized, &key, &body).await;

    refused.assert_problem(503, "processor-outcome-unknown");
    let (_, point, downstream) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(point.as_deref(), Some("payment.capture_requested"));
    assert_eq!(
        app.get_payment(&authorized).await.json()["status"],
        "requires_capture",
        "nothing recorded yet"
    );

    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    let captured = until_known(|| app.post_capture(&authorized, &key, &body)).await;

    captured.assert_status(200);
    assert_eq!(captured.json()["amount_captured"], 3000);
    assert_eq!(
        the_authorization(&app.db).await,
        ("captured".to_owned(), Some(3000), downstream),
        "one capture at the processor, under the key's downstream key"
    );
    assert_reconcile_succeeds(&app, &processor).await;
}

/// An instance killed while the processor captures (the capture's recovery point committed, the
/// processor's own key for it in progress, nothing recorded), and no client retry: the recovery job
/// of another instance records the capture, and the client's later retry is its replay.
#[api_test(citus)]
async fn an_instance_killed_during_a_capture_is_recovered_by_another_instance_without_a_retry() {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        // Every call takes this long at the processor: long enough to see the capture under way
        // and kill the instance before it is answered; below idempay's 10 s timeout.
        faulty(|s| s.faults.latency = Duration::from_secs(6)),
    )
    .await;
    let (mut doomed, survivor) = doomed_and_survivor(&app, &processor).await;
    let authorized = survivor
        .post_payment(&app.api_key, &new_key(), &manual(5000))
        .await;
    assert_eq!(authorized.status, 201);
    let path = format!("/v1/payments/{}/capture", authorized.id());
    let key = new_key();
    let capture = |instance: &Instance| {
        keyed_post(
            &format!("{}{path}", instance.address),
            &app.api_key,
            &key,
            &json!({ "amount_to_capture": 4000 }),
        )
    };
    // The crash must hit the window: the capture under way at the processor, not yet recorded.
    let in_flight = sent_into_the_window(
        &app,
        "the capture under way at the processor",
        || capture(&doomed),
        || {
            under_way(
                &app,
                "processor:POST /v1/charges/%/capture",
                "payment.capture_requested",
                &key,
            )
        },
    )
    .await;
    let status = || async {
        sqlx::query_scalar::<_, String>("SELECT status FROM payments")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    assert_eq!(
        status().await,
        "requires_capture",
        "killed before the capture was recorded"
    );
    kill_in_the_window(&mut doomed, in_flight).await;

    wait_until("the recovery job records the capture", || async {
        status().await == "succeeded"
    })
    .await;
    let retry = send(capture(&survivor)).await;

    retry.assert_status(200);
    assert!(retry.replayed(), "answered from the recovered key");
    assert_eq!(retry.json()["amount_captured"], 4000);
    let (state, captured, _) = the_authorization(&app.db).await;
    assert_eq!(
        (state.as_str(), captured),
        ("captured", Some(4000)),
        "one capture at the processor, the one recorded"
    );
    assert_reconcile_says(
        &app,
        &processor,
        "reconciled 1 charges, 1 payments, 0 refunds and 0 disputes: 0 difference(s)\n",
    )
    .await;
}

/// An authorization nobody captures is released by the processor's expiry job once its time is
/// up: its `charge.expired` reaches idempay, whose payment becomes `canceled` (`expired`) with its
/// `payment.canceled`; a capture afterwards is refused, and the ledgers agree.
#[api_test]
async fn an_authorization_nobody_captures_expires_at_the_processor_and_the_payment_is_canceled() {
    let mut settings = processor::settings();
    settings.shared.expiry_interval = Duration::from_millis(300);
    settings.authorization_ttl = Duration::from_secs(2);
    let every_200ms = RetrySchedule::new(vec![Duration::from_millis(200); 100]).unwrap();
    let (app, processor, _) = delivering_events(
        Settings::default(),
        settings,
        every_200ms,
        NOT_WITHIN_THE_TEST,
    )
    .await;
    let held = app.authorized(5000).await;
    let captured = app.authorized(3000).await;
    let taken = app.post_capture(&captured, &new_key(), &json!({})).await;
    assert_eq!(taken.status, 200);

    wait_until(
        "the authorization expires and idempay hears of it",
        || async { app.get_payment(&held).await.json()["status"] == "canceled" },
    )
    .await;

    let payment = app.get_payment(&held).await.json();
    assert_eq!(payment["cancellation_reason"], "expired");
    assert_eq!(payment["amount_capturable"], 0);
    let states: Vec<String> =
        sqlx::query_scalar("SELECT capture_state FROM processor_charges ORDER BY amount")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        states,
        ["captured", "expired"],
        "the captured one is kept, the held one released"
    );
    let late = app.post_capture(&held, &new_key(), &json!({})).await;
    let refused = late.assert_problem(409, "payment-unexpected-state");
    assert!(refused["detail"].as_str().unwrap().contains("`canceled`"));
    let canceled = count(
        &app.db,
        "SELECT count(*) FROM events WHERE type = 'payment.canceled'",
    )
    .await;
    assert_eq!(canceled, 1, "one payment.canceled");
    assert_eq!(
        app.get_payment(&captured).await.json()["status"],
        "succeeded"
    );
    assert_reconcile_succeeds(&app, &processor).await;
}

/// A capture and a cancel of one authorization, both past idempay's check (each reads the payment
/// `requires_capture`: the processor's latency keeps both calls in flight together), meet at the
/// processor, whose charge row lock puts one first. The other is refused there, and that refusal
/// is its key's result at both hops: idempay stores the 409, naming the processor's refusal, and
/// replays it; the payment records only the winner, and the ledgers agree.
#[api_test]
async fn a_capture_and_a_cancel_that_both_pass_idempays_check_meet_at_the_processor() {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        faulty(|s| s.faults.latency = Duration::from_millis(1500)),
    )
    .await;
    let authorized = app.authorized(5000).await;
    let (capturing, canceling) = (new_key(), new_key());
    let capture_body = json!({ "amount_to_capture": 5000 });
    let cancel_body = json!({ "cancellation_reason": "abandoned" });

    let (captured, canceled) = tokio::join!(
        app.post_capture(&authorized, &capturing, &capture_body),
        app.post_cancel(&authorized, &canceling, &cancel_body),
    );

    let (won, lost, lost_retry) = match (captured.status, canceled.status) {
        (200, 409) => (
            "succeeded",
            canceled,
            app.post_cancel(&authorized, &canceling, &cancel_body).await,
        ),
        (409, 200) => (
            "canceled",
            captured,
            app.post_capture(&authorized, &capturing, &capture_body)
                .await,
        ),
        other => panic!("one wins, one is refused: {other:?}"),
    };
    let refused = lost.assert_problem(409, "payment-unexpected-state");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .starts_with("The processor refused"),
        "refused at the processor, under its lock, not by idempay's check: {refused}"
    );
    assert!(lost_retry.replayed(), "the refusal is the key's result");
    assert_eq!(lost_retry.body, lost.body);
    let payment = app.get_payment(&authorized).await.json();
    assert_eq!(payment["status"], won);
    let (state, _, _) = the_authorization(&app.db).await;
    assert_eq!(
        state,
        if won == "succeeded" {
            "captured"
        } else {
            "voided"
        },
        "the processor made the winner only"
    );
    assert_eq!(
        payment["canceled_at"].is_null(),
        won == "succeeded",
        "a captured payment has no cancellation"
    );
    assert_reconcile_succeeds(&app, &processor).await;
}
