//! Exactly once across two hops, dispute outcomes: the cardholder's bank opens a dispute at the
//! processor, the merchant's evidence puts it under review, the bank closes it won or lost; each
//! change reaches idempay as the processor's signed event, applied once. The ledgers agree at each
//! step. The setup is `two_hops.rs`'s.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::{Value, json};
use service::outbox::RetrySchedule;

use super::early_events::{NOT_WITHIN_THE_TEST, delivering_events, dispute_at_the_processor};
use super::two_hops::{assert_reconcile_succeeds, charge_of};
use crate::processor::TestProcessor;
use crate::support::checks::count;
use crate::support::helpers::{TestApp, new_key, wait_until};

/// idempay and a processor that delivers its events to it, every 200 ms until acknowledged.
async fn delivering() -> (TestApp, TestProcessor) {
    let every_200ms = RetrySchedule::new(vec![Duration::from_millis(200); 100]).unwrap();
    let (app, processor, _) = delivering_events(
        Settings::default(),
        crate::processor::settings(),
        every_200ms,
        NOT_WITHIN_THE_TEST,
    )
    .await;
    (app, processor)
}

/// Opens a dispute of `amount` on the payment's charge at the processor; its id, once idempay
/// recorded it.
async fn opened(app: &TestApp, processor: &TestProcessor, payment: &str, amount: i64) -> String {
    let charge = charge_of(app, payment).await;
    let id = dispute_at_the_processor(processor, &charge, amount).await;
    wait_until("idempay records the dispute", || async {
        app.get(&format!("/v1/disputes/{id}")).await.status == 200
    })
    .await;
    id
}

/// Waits until idempay's dispute is `status`.
async fn until_status(app: &TestApp, dispute: &str, status: &str) -> Value {
    wait_until(&format!("idempay's dispute becomes {status}"), || async {
        app.get(&format!("/v1/disputes/{dispute}")).await.json()["status"] == status
    })
    .await;
    app.get(&format!("/v1/disputes/{dispute}")).await.json()
}

#[api_test]
async fn a_dispute_won_at_the_processor_gives_the_amount_back_at_both_and_closes_once() {
    let (app, processor) = delivering().await;
    let paid = app.paid(5000).await;
    let dispute = opened(&app, &processor, &paid, 1500).await;
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1500);
    assert_reconcile_succeeds(&app, &processor).await;

    let evidence = processor
        .post(
            &format!("/v1/disputes/{dispute}/evidence"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(evidence.json()["status"], "under_review");
    until_status(&app, &dispute, "under_review").await;
    assert_reconcile_succeeds(&app, &processor).await;
    let won = processor
        .post(
            &format!("/v1/disputes/{dispute}/close"),
            None,
            &json!({ "outcome": "won" }),
        )
        .await;
    let twice = processor
        .post(
            &format!("/v1/disputes/{dispute}/close"),
            None,
            &json!({ "outcome": "lost" }),
        )
        .await;

    assert_eq!(won.json()["status"], "won");
    assert_eq!(
        twice.status,
        400,
        "a dispute closes once: {:?}",
        twice.json()
    );
    until_status(&app, &dispute, "won").await;
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 0);
    let charge: (i64,) = sqlx::query_as("SELECT amount_disputed FROM processor_charges")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(charge, (0,), "given back at the processor too");
    assert_reconcile_succeeds(&app, &processor).await;
    let all = app.post_refund(&paid, &new_key(), &json!({})).await;
    assert_eq!(all.status, 201, "{:?}", all.json());
    assert_eq!(all.json()["amount"], 5000);
}

#[api_test]
async fn a_dispute_lost_at_the_processor_keeps_the_amount_disputed_at_both() {
    let (app, processor) = delivering().await;
    let paid = app.paid(5000).await;
    let dispute = opened(&app, &processor, &paid, 2000).await;

    let lost = processor
        .post(
            &format!("/v1/disputes/{dispute}/close"),
            None,
            &json!({ "outcome": "lost" }),
        )
        .await;

    assert_eq!(lost.json()["status"], "lost");
    until_status(&app, &dispute, "lost").await;
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 2000);
    assert_reconcile_succeeds(&app, &processor).await;
    app.post_refund(&paid, &new_key(), &json!({ "amount": 3001 }))
        .await
        .assert_problem(400, "refund-exceeds-payment");
    let closed = count(
        &app.db,
        "SELECT count(*) FROM events WHERE type = 'dispute.closed'",
    )
    .await;
    assert_eq!(closed, 1, "one dispute.closed, whatever the redeliveries");
}

/// The scenario of a won dispute that gave back more than it took, end to end: pay 8,861, refund
/// 3,000, and the bank opens two disputes of 4,000 at the processor (the second claims more than
/// is left here: flagged, the payment holding 5,861). The second is won: the payment keeps the
/// first's 4,000 disputed, and reconcile finds both ledgers agreeing (before, the payment showed
/// 1,861 while the first dispute was still open, and reconcile named the difference).
#[api_test]
async fn a_won_dispute_squeezed_beside_a_refund_leaves_the_other_dispute_whole_at_both_ledgers() {
    let (app, processor) = delivering().await;
    let paid = app.paid(8861).await;
    let refunded = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 3000 }))
        .await;
    assert_eq!(refunded.status, 201, "{:?}", refunded.json());
    let first = opened(&app, &processor, &paid, 4000).await;
    let second = opened(&app, &processor, &paid, 4000).await;
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 5861);
    assert_eq!(
        app.get(&format!("/v1/disputes/{second}")).await.json()["needs_review"],
        true
    );
    assert_reconcile_succeeds(&app, &processor).await;

    let won = processor
        .post(
            &format!("/v1/disputes/{second}/close"),
            None,
            &json!({ "outcome": "won" }),
        )
        .await;

    assert_eq!(won.json()["status"], "won");
    until_status(&app, &second, "won").await;
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 4000);
    assert_eq!(
        app.get(&format!("/v1/disputes/{first}")).await.json()["status"],
        "needs_response",
        "the first is still open"
    );
    assert_reconcile_succeeds(&app, &processor).await;
}
