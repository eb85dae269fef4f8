//! The processor's routes: each keyed request answered once and replayed, its ledger never beyond
//! what was charged.

use idempay_test_macros::api_test;
use serde_json::json;

use super::{TestProcessor, charge};
use crate::support::helpers::new_key;

#[api_test]
async fn a_charge_is_created_and_replayed_byte_for_byte_with_one_ledger_row() {
    let processor = TestProcessor::spawn().await;
    let key = new_key();

    let first = processor.charge(&key, &charge(4200, "pm_card_visa")).await;
    let again = processor.charge(&key, &charge(4200, "pm_card_visa")).await;

    first.assert_status(201);
    let created = first.json();
    assert!(created["id"].as_str().unwrap().starts_with("ch_"));
    assert_eq!(created["object"], "charge");
    assert_eq!(created["status"], "succeeded");
    assert_eq!(created["amount"], 4200);
    assert_eq!(created["amount_refunded"], 0);
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/charges/{}", created["id"].as_str().unwrap()).as_str())
    );
    assert!(!first.replayed());
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(processor.count("processor_charges").await, 1);
    let scope: String = sqlx::query_scalar("SELECT scope FROM idempotency_keys")
        .fetch_one(&processor.db)
        .await
        .unwrap();
    assert_eq!(scope, "processor:POST /v1/charges");
}

#[api_test]
async fn the_same_key_with_another_body_is_refused_with_422() {
    let processor = TestProcessor::spawn().await;
    let key = new_key();
    processor.charge(&key, &charge(4200, "pm_card_visa")).await;

    let other = processor.charge(&key, &charge(4300, "pm_card_visa")).await;

    other.assert_problem(422, "idempotency-key-mismatch");
    assert_eq!(processor.count("processor_charges").await, 1);
}

#[api_test]
async fn a_declined_charge_is_a_402_naming_it_recorded_and_replayed() {
    let processor = TestProcessor::spawn().await;
    let key = new_key();

    let first = processor
        .charge(&key, &charge(4200, "pm_card_chargeDeclined"))
        .await;
    let again = processor
        .charge(&key, &charge(4200, "pm_card_chargeDeclined"))
        .await;

    let problem = first.assert_problem(402, "card-declined");
    assert_eq!(problem["decline_code"], "generic_decline");
    let id = problem["charge"].as_str().expect("the charge is named");
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    let recorded = processor.get(&format!("/v1/charges/{id}")).await;
    assert_eq!(recorded.json()["status"], "declined");
    assert_eq!(recorded.json()["decline_code"], "generic_decline");
    assert_eq!(processor.count("processor_charges").await, 1);
}

#[api_test]
async fn a_request_without_the_api_key_is_refused_with_401() {
    let processor = TestProcessor::spawn().await;
    let url = format!("{}/v1/charges", processor.address);

    let none = processor
        .send(
            processor
                .http()
                .post(&url)
                .header("idempotency-key", new_key())
                .json(&charge(100, "pm_card_visa")),
        )
        .await;
    let wrong = processor
        .send(
            processor
                .http()
                .post(&url)
                .bearer_auth("pk_test_processoR")
                .header("idempotency-key", new_key())
                .json(&charge(100, "pm_card_visa")),
        )
        .await;
    let list = processor.send(processor.http().get(&url)).await;

    none.assert_problem(401, "unauthorized");
    wrong.assert_problem(401, "unauthorized");
    list.assert_problem(401, "unauthorized");
    assert_eq!(processor.count("processor_charges").await, 0);
    assert_eq!(processor.count("idempotency_keys").await, 0);
}

#[api_test]
async fn a_charge_without_a_key_or_with_a_bad_body_reserves_nothing() {
    let processor = TestProcessor::spawn().await;

    let keyless = processor
        .post("/v1/charges", None, &charge(100, "pm_card_visa"))
        .await;
    let unknown_method = processor
        .charge(&new_key(), &charge(100, "pm_card_unknown"))
        .await;
    let no_amount = processor
        .charge(&new_key(), &json!({ "currency": "eur" }))
        .await;

    keyless.assert_problem(400, "invalid-idempotency-key");
    unknown_method.assert_problem(400, "invalid-request");
    no_amount.assert_problem(400, "invalid-request");
    assert_eq!(processor.count("idempotency_keys").await, 0);
}

#[api_test]
async fn charges_are_listed_newest_first_in_keyset_pages() {
    let processor = TestProcessor::spawn().await;
    let mut ids = Vec::new();
    for amount in 1..=5 {
        let created = processor
            .charge(&new_key(), &charge(amount, "pm_card_visa"))
            .await;
        ids.push(created.json()["id"].as_str().unwrap().to_owned());
    }
    ids.reverse();

    let first = processor.get("/v1/charges?limit=2").await.json();
    let second = processor
        .get(&format!("/v1/charges?limit=2&starting_after={}", ids[1]))
        .await
        .json();
    let last = processor
        .get(&format!("/v1/charges?limit=2&starting_after={}", ids[3]))
        .await
        .json();
    let back = processor
        .get(&format!("/v1/charges?limit=2&ending_before={}", ids[2]))
        .await
        .json();

    let page_ids = |page: &serde_json::Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|charge| charge["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(first["object"], "list");
    assert_eq!(first["url"], "/v1/charges");
    assert_eq!(first["data"][0]["object"], "charge");
    assert_eq!(page_ids(&first), ids[0..2]);
    assert_eq!(first["has_more"], true);
    assert_eq!(page_ids(&second), ids[2..4]);
    assert_eq!(page_ids(&last), ids[4..5]);
    assert_eq!(last["has_more"], false);
    assert_eq!(page_ids(&back), ids[0..2]);
    processor
        .get("/v1/charges?starting_after=ch_nope")
        .await
        .assert_problem(404, "not-found");
}

#[api_test]
async fn a_charge_is_read_back_by_id_and_an_unknown_one_is_not_found() {
    let processor = TestProcessor::spawn().await;
    let created = processor
        .charge(&new_key(), &charge(4200, "pm_card_visa"))
        .await
        .json();

    let read = processor
        .get(&format!("/v1/charges/{}", created["id"].as_str().unwrap()))
        .await;

    assert_eq!(read.status, 200);
    assert_eq!(read.json(), created);
    // An id of another shape reads as a missing one: the same 404, the same sentence.
    for id in ["ch_aaaaaaaaaaaaaaaaaaaaaaaa", "pay_1"] {
        let problem = processor
            .get(&format!("/v1/charges/{id}"))
            .await
            .assert_problem(404, "not-found");
        assert_eq!(problem["detail"], format!("No charge `{id}`."));
    }
}

#[api_test]
async fn a_refund_never_exceeds_the_charge_and_is_replayed_with_its_key() {
    let processor = TestProcessor::spawn().await;
    let created = processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await
        .json();
    let id = created["id"].as_str().unwrap();
    let path = format!("/v1/charges/{id}/refunds");
    let key = new_key();

    let partial = processor
        .post(&path, Some(&key), &json!({ "amount": 3000 }))
        .await;
    let replay = processor
        .post(&path, Some(&key), &json!({ "amount": 3000 }))
        .await;
    let too_much = processor
        .post(&path, Some(&new_key()), &json!({ "amount": 3000 }))
        .await;
    let rest = processor.post(&path, Some(&new_key()), &json!({})).await;
    let nothing_left = processor.post(&path, Some(&new_key()), &json!({})).await;

    assert_eq!(partial.status, 201);
    let refund = partial.json();
    assert!(refund["id"].as_str().unwrap().starts_with("pyr_"));
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["charge"], id);
    assert_eq!(refund["amount"], 3000);
    assert!(replay.replayed());
    assert_eq!(replay.body, partial.body);
    let refused = too_much.assert_problem(400, "refund-exceeds-payment");
    assert!(
        refused["detail"]
            .as_str()
            .unwrap()
            .contains("Nothing was refunded")
    );
    assert_eq!(rest.status, 201);
    assert_eq!(rest.json()["amount"], 2000);
    nothing_left.assert_problem(400, "refund-exceeds-payment");
    let charge = processor.get(&format!("/v1/charges/{id}")).await.json();
    assert_eq!(charge["amount_refunded"], 5000);
    let refunds = processor.get("/v1/refunds").await.json();
    assert_eq!(refunds["url"], "/v1/refunds");
    assert_eq!(refunds["data"].as_array().unwrap().len(), 2);
    assert!(
        refunds["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|refund| refund["charge"] == id)
    );
}

#[api_test]
async fn a_declined_or_unknown_charge_cannot_be_refunded() {
    let processor = TestProcessor::spawn().await;
    let declined = processor
        .charge(&new_key(), &charge(5000, "pm_card_chargeDeclined"))
        .await
        .json();
    let id = declined["charge"].as_str().unwrap();

    let refused = processor
        .post(
            &format!("/v1/charges/{id}/refunds"),
            Some(&new_key()),
            &json!({}),
        )
        .await;
    let unknown = processor
        .post(
            "/v1/charges/ch_aaaaaaaaaaaaaaaaaaaaaaaa/refunds",
            Some(&new_key()),
            &json!({}),
        )
        .await;

    refused.assert_problem(400, "payment-not-refundable");
    unknown.assert_problem(404, "not-found");
    assert_eq!(processor.count("processor_refunds").await, 0);
}

#[api_test]
async fn a_dispute_is_opened_up_to_the_charge_amount() {
    let processor = TestProcessor::spawn().await;
    let created = processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await
        .json();
    let path = format!("/v1/charges/{}/disputes", created["id"].as_str().unwrap());

    let opened = processor
        .post(&path, None, &json!({ "amount": 4000 }))
        .await;
    let beyond = processor
        .post(&path, None, &json!({ "amount": 1001 }))
        .await;
    let rest = processor
        .post(&path, None, &json!({ "amount": 1000 }))
        .await;

    assert_eq!(opened.status, 201);
    let dispute = opened.json();
    assert!(dispute["id"].as_str().unwrap().starts_with("dp_"));
    assert_eq!(dispute["object"], "dispute");
    assert_eq!(dispute["charge"], created["id"]);
    assert_eq!(dispute["amount"], 4000);
    beyond.assert_problem(400, "invalid-request");
    assert_eq!(rest.status, 201);
    assert_eq!(processor.count("processor_disputes").await, 2);
}

/// The processor takes its keyed requests through the mechanism's `Idempotent`, as idempay does:
/// a body that does not say it is JSON is refused with 415 before anything is reserved, and the
/// same key then charges once the body is sent as JSON.
#[api_test]
async fn a_body_without_a_json_content_type_is_refused_with_415_and_reserves_nothing() {
    let processor = TestProcessor::spawn().await;
    let key = new_key();
    let untyped = reqwest::Client::new()
        .post(format!("{}/v1/charges", processor.address))
        .bearer_auth(super::API_KEY)
        .header("idempotency-key", &key)
        .body(charge(4200, "pm_card_visa").to_string());

    let refused = super::read(untyped).await;

    refused.assert_problem(415, "unsupported-media-type");
    assert_eq!(processor.count("idempotency_keys").await, 0);
    assert_eq!(processor.count("processor_charges").await, 0);
    let charged = processor.charge(&key, &charge(4200, "pm_card_visa")).await;
    assert_eq!(charged.status, 201);
    assert!(!charged.replayed());
}
