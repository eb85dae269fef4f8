//! The disputes the processor's events recorded, as a merchant reads them: `GET /v1/disputes`
//! (newest first, a page at a time, filtered by payment) and `GET /v1/disputes/{id}`.

use idempay_test_macros::api_test;
use serde_json::{Value, json};

use super::webhooks::deliver;
use crate::support::helpers::{TestApp, new_key, payment};

/// The ids of a page's disputes, in its order.
fn ids(page: &Value) -> Vec<&str> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dispute| dispute["id"].as_str().unwrap())
        .collect()
}

/// Three disputes over two payments, recorded one after another by the processor's events: the
/// first two payments' ids, and the disputes `dp_a` (500 of the first), `dp_b` (700 of the
/// second, more than it has left: flagged) and `dp_c` (300 of the first).
async fn three_disputes(app: &TestApp, secret: &service::outbox::WebhookSecrets) -> [String; 2] {
    let first = app.paid(5000).await;
    let second = app.paid(600).await;
    for (event, payment, dispute, amount) in [
        ("evt_d1", &first, "dp_a", 500),
        ("evt_d2", &second, "dp_b", 700),
        ("evt_d3", &first, "dp_c", 300),
    ] {
        let data = json!({ "payment": payment, "dispute": dispute, "amount": amount });
        let applied = deliver(app, secret, event, "dispute.created", &data).await;
        assert_eq!(applied.status, 200, "{:?}", applied.json());
    }
    [first, second]
}

#[api_test(citus)]
async fn disputes_are_listed_newest_first_in_their_payment_s_currency_and_read_by_id() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let [first, second] = three_disputes(&app, &secret).await;

    let page = app.get("/v1/disputes").await;
    assert_eq!(page.status, 200);
    let page = page.json();
    assert_eq!(page["object"], "list");
    assert_eq!(page["has_more"], false);
    assert_eq!(ids(&page), ["dp_c", "dp_b", "dp_a"]);
    let flagged = &page["data"][1];
    assert_eq!(
        flagged,
        &json!({
            "id": "dp_b",
            "object": "dispute",
            "payment": second,
            "amount": 700,
            "currency": "eur",
            "status": "needs_review",
            "created_at": flagged["created_at"],
        })
    );
    assert_eq!(page["data"][0]["payment"], first.as_str());
    assert_eq!(page["data"][0]["status"], "open");
    assert!(flagged["created_at"].is_string());

    let one = app.get("/v1/disputes/dp_b").await;
    assert_eq!(one.status, 200);
    assert_eq!(
        &one.json(),
        flagged,
        "the same representation as in the list"
    );

    // Pages: the keyset of the other lists, either way from a cursor.
    let newest = app.get("/v1/disputes?limit=2").await.json();
    assert_eq!(
        (ids(&newest), &newest["has_more"]),
        (vec!["dp_c", "dp_b"], &json!(true))
    );
    let older = app
        .get("/v1/disputes?limit=2&starting_after=dp_b")
        .await
        .json();
    assert_eq!(
        (ids(&older), &older["has_more"]),
        (vec!["dp_a"], &json!(false))
    );
    let newer = app
        .get("/v1/disputes?limit=1&ending_before=dp_a")
        .await
        .json();
    assert_eq!(
        (ids(&newer), &newer["has_more"]),
        (vec!["dp_b"], &json!(true))
    );
    app.get("/v1/disputes?starting_after=dp_nothing")
        .await
        .assert_problem(404, "not-found");
}

#[api_test(citus)]
async fn the_payment_filter_lists_one_payment_s_disputes() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let [first, second] = three_disputes(&app, &secret).await;

    let of_first = app.get(&format!("/v1/disputes?payment={first}")).await;
    assert_eq!(of_first.status, 200);
    assert_eq!(ids(&of_first.json()), ["dp_c", "dp_a"]);
    let of_second = app
        .get(&format!("/v1/disputes?payment={second}"))
        .await
        .json();
    assert_eq!(ids(&of_second), ["dp_b"]);
    let paged = app
        .get(&format!(
            "/v1/disputes?payment={first}&limit=1&starting_after=dp_c"
        ))
        .await
        .json();
    assert_eq!(ids(&paged), ["dp_a"]);
    // A cursor outside the filtered list is no place to page from.
    app.get(&format!("/v1/disputes?payment={first}&starting_after=dp_b"))
        .await
        .assert_problem(404, "not-found");
    // A payment without disputes, or none of the account's, has none to list.
    let undisputed = app.paid(100).await;
    for payment in [undisputed.as_str(), "pay_000000000000000000000000"] {
        let page = app.get(&format!("/v1/disputes?payment={payment}")).await;
        assert_eq!(page.status, 200);
        assert_eq!(page.json()["data"], json!([]), "{payment}");
    }
    let problem = app
        .get("/v1/disputes?payment=ch_123")
        .await
        .assert_problem(400, "invalid-request");
    assert!(
        problem["detail"].as_str().unwrap().contains("pay_"),
        "{problem}"
    );
    app.get("/v1/disputes?charge=ch_123")
        .await
        .assert_problem(400, "invalid-request");
}

#[api_test(citus)]
async fn another_account_s_dispute_is_not_found_like_an_unknown_one() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let (_, other_key) = app.create_account("other merchant").await;
    let theirs = app
        .post_payment_as(&other_key, &new_key(), &payment(900))
        .await;
    assert_eq!(theirs.status, 201);
    let data = json!({ "payment": theirs.json()["id"], "dispute": "dp_theirs", "amount": 100 });
    assert_eq!(
        deliver(&app, &secret, "evt_theirs", "dispute.created", &data)
            .await
            .status,
        200
    );

    let mine = app.get("/v1/disputes/dp_theirs").await;
    let problem = mine.assert_problem(404, "not-found");
    let unknown = app
        .get("/v1/disputes/dp_unknown")
        .await
        .assert_problem(404, "not-found");
    assert_eq!(problem["title"], unknown["title"]);
    assert_eq!(app.get("/v1/disputes").await.json()["data"], json!([]));
    app.get(&format!("/v1/disputes/{}", "d".repeat(101)))
        .await
        .assert_problem(404, "not-found");
    // The owner reads it.
    let owned = app
        .send(
            app.client()
                .get(app.url("/v1/disputes/dp_theirs"))
                .bearer_auth(&other_key),
        )
        .await;
    assert_eq!(owned.status, 200);
    assert_eq!(owned.json()["amount"], 100);
}
