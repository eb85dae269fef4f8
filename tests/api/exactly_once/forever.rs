//! The downstream key is forever: once a call with it may have reached the processor, idempay never
//! forgets it and never calls with another. A "nothing happened" answer (a refused connection, a
//! 4xx) after such a call speaks of that attempt only, so it leaves the outcome unknown and the key
//! suspended, whoever meets it: the client's retry, or the recovery job. Each scenario makes the
//! processor commit a charge (or a refund) whose answer idempay never saw, then refuses connections,
//! then comes back: one charge, recorded once.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::json;

use super::two_hops::{
    assert_ledgers_agree, assert_reconcile_succeeds, faulty, idempay_and_processor, key_row,
    linked_to, port_of, rebind, replace_processor, the_charge, waiting_at_most,
};
use crate::processor::{self, TestProcessor};
use crate::support::helpers::{TestApp, TestResponse, new_key, payment, wait_until};

/// How long the processor takes over each call in these scenarios, beyond idempay's timeout
/// ([`TIMEOUT`]) and its three attempts (the second and third find the call in flight there): the
/// first answer is lost, the processor commits anyway.
const LATENCY: Duration = Duration::from_secs(3);
const TIMEOUT: Duration = Duration::from_secs(1);

fn impatient() -> Settings {
    waiting_at_most(TIMEOUT)
}

/// Sends the request until it is answered otherwise than 503 `processor-outcome-unknown`, as the
/// retrying client does: on a loaded machine a processor just started may still answer a first
/// attempt after idempay's timeout, which is one more unknown outcome, not a different one.
pub(crate) async fn until_known<F, Fut>(send: F) -> TestResponse
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = TestResponse>,
{
    for _ in 0..5 {
        let answer = send().await;
        if answer.status != 503 {
            return answer;
        }
        answer.assert_problem(503, "processor-outcome-unknown");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    send().await
}

/// How many times the key was taken over (by a retry or the recovery job).
async fn takeovers(app: &TestApp, key: &str) -> i32 {
    sqlx::query_scalar(
        "SELECT takeovers FROM idempotency_keys WHERE idem_key = $1 AND scope NOT LIKE 'processor:%'",
    )
    .bind(key)
    .fetch_optional(&app.db)
    .await
    .unwrap()
    .expect("the key is kept: a refused connection says nothing of the call before")
}

/// A payment whose charge the processor committed after idempay stopped waiting: answered 503
/// `processor-outcome-unknown`, the key at its recovery point, the processor's one charge made
/// with its downstream key. Returns the charge's id and that key.
async fn a_charge_idempay_never_heard_of(app: &TestApp, key: &str) -> (String, String) {
    let unknown = app.post_payment(key, &payment(4200)).await;
    unknown.assert_problem(503, "processor-outcome-unknown");
    wait_until("the processor commits the charge", || async {
        app.charge_count().await == 1
    })
    .await;
    let (charge, charged_with) = the_charge(app).await;
    let (_, point, downstream) = key_row(app, key).await.expect("the key is kept");
    assert_eq!(point.as_deref(), Some("payment.charge_requested"));
    assert_eq!(downstream.as_deref(), Some(charged_with.as_str()));
    (charge, charged_with)
}

#[api_test]
async fn a_refused_connection_after_a_charge_whose_answer_was_lost_keeps_the_key_and_charges_once()
{
    let (app, slow) =
        idempay_and_processor(impatient(), faulty(|s| s.faults.latency = LATENCY)).await;
    let key = new_key();
    let (charge, charged_with) = a_charge_idempay_never_heard_of(&app, &key).await;
    let port = port_of(&slow);
    slow.stop();

    // The retry meets a processor that refuses connections: that says nothing of the first call.
    let retry = app.post_payment(&key, &payment(4200)).await;

    retry.assert_problem(503, "processor-outcome-unknown");
    let (status, point, downstream) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(
        (status.as_str(), point.as_deref(), downstream.as_deref()),
        (
            "in_progress",
            Some("payment.charge_requested"),
            Some(charged_with.as_str())
        ),
        "suspended with the downstream key the charge was made with"
    );

    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    let body = payment(4200);
    let paid = until_known(|| app.post_payment(&key, &body)).await;

    paid.assert_status(201);
    assert_eq!(
        paid.json()["charge"],
        charge.as_str(),
        "the one charge, recorded"
    );
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// The same with no client retry: the recovery job meets the refused connection, again and again,
/// and keeps the key; once the processor is back it records the one charge, which the client's
/// retry after the outage replays. On a Citus cluster too, where the recovery job claims the key
/// with statements of their own (`store::recovery`): one that forgot its holder may have called
/// would let the refusal clear the key, and the next call charge again under a new key.
#[api_test(citus)]
async fn the_recovery_job_meeting_a_refused_connection_keeps_the_key_and_records_the_one_charge() {
    let (app, slow) =
        idempay_and_processor(impatient(), faulty(|s| s.faults.latency = LATENCY)).await;
    let key = new_key();
    let (charge, _) = a_charge_idempay_never_heard_of(&app, &key).await;
    let port = port_of(&slow);
    slow.stop();
    let before = takeovers(&app, &key).await;

    // An instance whose recovery job runs often, while nothing listens on the processor's port.
    let recovering = app
        .another_instance(Settings {
            recovery_interval: Duration::from_millis(200),
            ..linked_to(&slow.address, impatient())
        })
        .await;
    wait_until("the recovery job tried the key twice", || async {
        takeovers(&app, &key).await >= before + 2
    })
    .await;

    let (status, point, _) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(
        (status.as_str(), point.as_deref()),
        ("in_progress", Some("payment.charge_requested"))
    );
    assert_eq!(app.payment_count().await, 0);

    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    wait_until("the recovery job records the charge", || async {
        app.payment_count().await == 1
    })
    .await;
    let body = payment(4200);
    let retry = until_known(|| recovering.post_payment(&key, &body)).await;

    retry.assert_status(201);
    assert!(retry.replayed(), "the recovery job's result");
    assert_eq!(retry.json()["charge"], charge.as_str());
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// A refund too: 1000 of a 4200 payment, made by the processor after idempay stopped waiting;
/// the retry meets a refused connection and keeps the key; after the outage, one refund of 1000 at
/// both.
#[api_test]
async fn a_refused_connection_after_a_refund_whose_answer_was_lost_keeps_the_key_and_refunds_once()
{
    let (app, healthy) = idempay_and_processor(impatient(), processor::settings()).await;
    let paid = app.paid(4200).await;
    let port = port_of(&healthy);
    let slow = replace_processor(&app, healthy, faulty(|s| s.faults.latency = LATENCY)).await;
    let key = new_key();
    let refund = json!({ "amount": 1000 });

    let unknown = app.post_refund(&paid, &key, &refund).await;
    unknown.assert_problem(503, "processor-outcome-unknown");
    wait_until("the processor commits the refund", || async {
        slow.count("processor_refunds").await == 1
    })
    .await;
    slow.stop();
    let retry = app.post_refund(&paid, &key, &refund).await;

    retry.assert_problem(503, "processor-outcome-unknown");
    let (_, point, _) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(point.as_deref(), Some("refund.refund_requested"));

    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    let refunded = until_known(|| app.post_refund(&paid, &key, &refund)).await;

    refunded.assert_status(201);
    let at_the_processor: Vec<i64> = sqlx::query_scalar("SELECT amount FROM processor_refunds")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(at_the_processor, [1000], "one refund at the processor");
    assert_eq!(app.get_payment(&paid).await.json()["amount_refunded"], 1000);
    assert_reconcile_succeeds(&app, &processor).await;
}
