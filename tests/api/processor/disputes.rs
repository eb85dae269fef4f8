//! The processor's disputes through their lifecycle, test helpers standing in for the
//! cardholder's bank: evidence (`under_review`), then the decision (`won` gives the amount back to
//! the charge, `lost` keeps it with the cardholder), once; `GET /v1/disputes` shows where each
//! stands. (The events these changes send are checked at idempay's intake, `two_hops_dispute.rs`.)

use idempay_test_macros::api_test;
use serde_json::json;

use super::{TestProcessor, charge};
use crate::support::helpers::new_key;

/// A captured charge of `amount` with a dispute of all of it: the charge's id and the dispute's.
async fn disputed(processor: &TestProcessor, amount: i64) -> (String, String) {
    let charged = processor
        .charge(&new_key(), &charge(amount, "pm_card_visa"))
        .await
        .json();
    let id = charged["id"].as_str().unwrap().to_owned();
    let opened = processor
        .post(
            &format!("/v1/charges/{id}/disputes"),
            None,
            &json!({ "amount": amount }),
        )
        .await;
    assert_eq!(opened.status, 201);
    let dispute = opened.json();
    assert_eq!(dispute["status"], "needs_response");
    (id, dispute["id"].as_str().unwrap().to_owned())
}

/// The charge's disputed amount, as the processor's ledger holds it.
async fn amount_disputed(processor: &TestProcessor, charge: &str) -> i64 {
    sqlx::query_scalar("SELECT amount_disputed FROM processor_charges WHERE id = $1")
        .bind(charge)
        .fetch_one(&processor.db)
        .await
        .unwrap()
}

/// The status `GET /v1/disputes` lists for `dispute`.
async fn listed_status(processor: &TestProcessor, dispute: &str) -> String {
    let page = processor.get("/v1/disputes").await.json();
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|listed| listed["id"] == dispute)
        .map(|listed| listed["status"].as_str().unwrap().to_owned())
        .unwrap()
}

#[api_test]
async fn a_won_dispute_gives_its_amount_back_to_the_charge_which_can_then_be_refunded() {
    let processor = TestProcessor::spawn().await;
    let (charge, dispute) = disputed(&processor, 3000).await;
    let refund_path = format!("/v1/charges/{charge}/refunds");
    processor
        .post(&refund_path, Some(&new_key()), &json!({ "amount": 1 }))
        .await
        .assert_problem(400, "refund-exceeds-payment");

    let reviewed = processor
        .post(
            &format!("/v1/disputes/{dispute}/evidence"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(reviewed.status, 200);
    assert_eq!(reviewed.json()["status"], "under_review");
    assert_eq!(listed_status(&processor, &dispute).await, "under_review");
    let won = processor
        .post(
            &format!("/v1/disputes/{dispute}/close"),
            None,
            &json!({ "outcome": "won" }),
        )
        .await;

    assert_eq!(won.status, 200);
    assert_eq!(won.json()["status"], "won");
    assert_eq!(listed_status(&processor, &dispute).await, "won");
    assert_eq!(amount_disputed(&processor, &charge).await, 0);
    let refund = processor
        .post(&refund_path, Some(&new_key()), &json!({ "amount": 3000 }))
        .await;
    refund.assert_status(201);
}

#[api_test]
async fn a_lost_dispute_keeps_its_amount_and_a_dispute_closes_once() {
    let processor = TestProcessor::spawn().await;
    let (charge, dispute) = disputed(&processor, 2000).await;
    let close = format!("/v1/disputes/{dispute}/close");

    let lost = processor
        .post(&close, None, &json!({ "outcome": "lost" }))
        .await;
    let again = processor
        .post(&close, None, &json!({ "outcome": "won" }))
        .await;
    let evidence = processor
        .post(
            &format!("/v1/disputes/{dispute}/evidence"),
            None,
            &json!({}),
        )
        .await;

    assert_eq!(lost.status, 200);
    assert_eq!(lost.json()["status"], "lost");
    let problem = again.assert_problem(400, "invalid-request");
    assert!(
        problem["detail"].as_str().unwrap().contains("is lost"),
        "{problem}"
    );
    evidence.assert_problem(400, "invalid-request");
    assert_eq!(listed_status(&processor, &dispute).await, "lost");
    assert_eq!(amount_disputed(&processor, &charge).await, 2000);
}

#[api_test]
async fn closing_an_unknown_dispute_or_with_no_outcome_is_refused() {
    let processor = TestProcessor::spawn().await;
    let (_, dispute) = disputed(&processor, 1000).await;
    let close = format!("/v1/disputes/{dispute}/close");

    for unknown in ["dp_000000000000000000000000", "ch_123", "nothing"] {
        processor
            .post(
                &format!("/v1/disputes/{unknown}/close"),
                None,
                &json!({ "outcome": "won" }),
            )
            .await
            .assert_problem(404, "not-found");
    }
    for body in [
        json!({}),
        json!({ "outcome": "maybe" }),
        json!({ "outcome": "won", "why": 1 }),
    ] {
        let refused = processor.post(&close, None, &body).await;
        assert_eq!(refused.status, 400, "{body}");
        assert_eq!(
            refused.header("content-type"),
            Some("application/problem+json")
        );
    }
    let unauthorized = processor
        .send(
            processor
                .http()
                .post(format!("{}{close}", processor.address))
                .json(&json!({ "outcome": "won" })),
        )
        .await;
    assert_eq!(unauthorized.status, 401);
    assert_eq!(listed_status(&processor, &dispute).await, "needs_response");
}
