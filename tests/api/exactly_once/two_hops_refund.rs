//! Exactly once across two hops, refunds: a refund the processor fails later, and one recorded
//! after a dispute took its room. The setup is `two_hops.rs`'s.

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::json;
use service::outbox::WebhookSecrets;

use super::two_hops::{
    assert_reconcile_succeeds, delivering_to, faulty, idempay_and_processor, key_row, rebind,
    taking_events_signed_with,
};
use crate::support::helpers::{new_key, wait_until};
use crate::support::instance::free_port;
use crate::support::invariants::assert_exactly_once;

// ---------------------------------------------------------------------------------------------
// Refunds take the second hop too
// ---------------------------------------------------------------------------------------------

/// A refund is made at the processor with its own downstream key, recorded with the processor's
/// refund id, and replayed; when the card network gives it back later, the processor's
/// `charge.refund.failed` reaches idempay, whose refund fails and whose amount is refundable again.
/// The ledgers agree at each step.
#[api_test]
async fn a_refund_the_processor_fails_later_is_refundable_again_and_the_ledgers_agree() {
    let intake = free_port();
    let (settings, with_secret) = delivering_to(intake);
    let (app, processor) = idempay_and_processor(with_secret.clone(), settings).await;
    let app = app
        .another_instance_on(rebind(intake).await, with_secret)
        .await;
    let paid = app.paid(5000).await;
    let key = new_key();

    let refund = app
        .post_refund(&paid, &key, &json!({ "amount": 2000 }))
        .await;
    let again = app
        .post_refund(&paid, &key, &json!({ "amount": 2000 }))
        .await;

    refund.assert_status(201);
    assert!(again.replayed());
    assert_eq!(again.body, refund.body);
    let processor_refund = refund.json()["processor_refund"]
        .as_str()
        .expect("the processor's refund id")
        .to_owned();
    let refunds: Vec<(String, i64)> = sqlx::query_as("SELECT id, amount FROM processor_refunds")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(
        refunds,
        [(processor_refund.clone(), 2000)],
        "one refund at the processor"
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_refunded"], 2000);
    assert_reconcile_succeeds(&app, &processor).await;

    let failed = processor
        .post(
            &format!("/v1/refunds/{processor_refund}/failure"),
            None,
            &json!({}),
        )
        .await;
    failed.assert_status(200);
    wait_until("idempay applies charge.refund.failed", || async {
        app.get_payment(&paid).await.json()["amount_refunded"] == 0
    })
    .await;
    let ours = app
        .get(&format!(
            "/v1/refunds/{}",
            refund.json()["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(ours.json()["status"], "failed");
    assert_reconcile_succeeds(&app, &processor).await;
    let whole = app.post_refund(&paid, &new_key(), &json!({})).await;
    assert_eq!(whole.status, 201, "the amount is refundable again, at both");
    assert_eq!(whole.json()["amount"], 5000);
    assert_exactly_once(&app.db).await;
}

/// A dispute that arrives while a refund is at the processor takes what the payment has left;
/// the refund, made by then, is still recorded in full, and the disputed amount gives way to it:
/// refunded and disputed together never exceed the amount, and the dispute is flagged for review
/// (the money may leave twice).
#[api_test]
async fn a_refund_recorded_after_a_dispute_took_its_room_flags_the_dispute_for_review() {
    let secret = WebhookSecrets::generate();
    let (app, _processor) = idempay_and_processor(
        taking_events_signed_with(secret.clone()),
        // Every charge and refund takes this long at the processor.
        faulty(|s| s.faults.latency = Duration::from_secs(2)),
    )
    .await;
    let paid = app.paid(5000).await;
    let key = new_key();
    let body = json!({ "amount": 2000 });

    let (refund, answer) = tokio::join!(app.post_refund(&paid, &key, &body), async {
        wait_until("the refund is under way at the processor", || async {
            key_row(&app, &key)
                .await
                .is_some_and(|(_, point, _)| point.is_some())
        })
        .await;
        let data = json!({ "payment": paid, "dispute": "dp_meanwhile", "amount": 5000 });
        let url = app.url("/v1/webhooks/processor");
        idempay::webhooks::send(&url, &secret, "evt_meanwhile", "dispute.created", data)
            .await
            .unwrap()
    });

    assert_eq!(answer.0, 200);
    assert!(
        answer.1.contains("applied"),
        "it fitted when it came: {}",
        answer.1
    );
    assert_eq!(refund.status, 201, "{refund:?}");
    let payment = app.get_payment(&paid).await.json();
    assert_eq!(payment["amount_refunded"], 2000);
    assert_eq!(
        payment["amount_disputed"], 3000,
        "what fits beside the refund"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM disputes")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "needs_review");
}
