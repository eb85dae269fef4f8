//! The disputes the processor's events recorded, as a merchant reads them: `GET /v1/disputes`
//! (newest first, a page at a time, filtered by payment) and `GET /v1/disputes/{id}`.

use std::time::Duration;

use idempay_test_macros::api_test;
use serde_json::{Value, json};

use super::webhooks::{deliver, deliver_at};
use chrono::{DateTime, Utc};
use service::outbox::WebhookSecrets;

use crate::support::helpers::{TestApp, TestResponse, holds_within, new_key, payment};

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
async fn three_disputes(app: &TestApp, secret: &WebhookSecrets) -> [String; 2] {
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
            "status": "needs_response",
            "needs_review": true,
            "created_at": flagged["created_at"],
        })
    );
    assert_eq!(page["data"][0]["payment"], first.as_str());
    assert_eq!(page["data"][0]["status"], "needs_response");
    assert_eq!(page["data"][0]["needs_review"], false);
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

#[api_test]
async fn disputes_are_filtered_by_status_and_created_with_the_payment_filter() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let [first, _] = three_disputes(&app, &secret).await;
    let charge = charge_of(&app, &first).await;
    let reviewed =
        json!({ "charge": charge, "dispute": "dp_a", "amount": 500, "status": "under_review" });
    Processor(&app, &secret)
        .event(
            "evt_d4",
            "charge.dispute.updated",
            &reviewed,
            Utc::now() + chrono::Duration::seconds(1),
        )
        .await;
    // dp_a and dp_b in the second 1 700 000 000, dp_c ten seconds later.
    for (dispute, at) in [("dp_a", 0.2), ("dp_b", 0.7), ("dp_c", 10.0)] {
        sqlx::query("UPDATE disputes SET created_at = to_timestamp($2) WHERE id = $1")
            .bind(dispute)
            .bind(1_700_000_000.0 + at)
            .execute(&app.db)
            .await
            .unwrap();
    }
    let app = &app;
    let listed = |query: String| async move {
        let page = app.get(&format!("/v1/disputes?{query}")).await;
        assert_eq!(page.status, 200, "{query}: {}", page.json());
        ids(&page.json())
            .iter()
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
    };

    assert_eq!(listed("status=under_review".into()).await, ["dp_a"]);
    assert_eq!(
        listed("status=needs_response".into()).await,
        ["dp_c", "dp_b"]
    );
    assert_eq!(listed("created=1700000000".into()).await, ["dp_b", "dp_a"]);
    assert_eq!(listed("created[gt]=1700000000".into()).await, ["dp_c"]);
    assert_eq!(
        listed(format!("payment={first}&created[lte]=1700000000")).await,
        ["dp_a"]
    );
    assert_eq!(
        listed(format!("payment={first}&status=needs_response")).await,
        ["dp_c"]
    );
    assert_eq!(
        listed("status=needs_response&limit=1&starting_after=dp_c".into()).await,
        ["dp_b"]
    );
    assert_eq!(listed("status=won".into()).await, Vec::<String>::new());
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

/// The processor's charge behind `payment`: what its dispute events name.
async fn charge_of(app: &TestApp, payment: &str) -> String {
    app.get_payment(payment).await.json()["charge"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The processor, as its signed events about a charge's dispute reach `app`.
struct Processor<'a>(&'a TestApp, &'a WebhookSecrets);

impl Processor<'_> {
    /// Delivers event `id` of `kind` about a dispute, created `at`: a test orders them in time.
    async fn event(&self, id: &str, kind: &str, data: &Value, at: DateTime<Utc>) -> TestResponse {
        deliver_at(self.0, self.1, id, kind, data, at).await
    }
}

/// Where a dispute stands, and the payment's disputed amount.
async fn standing(app: &TestApp, dispute: &str, payment: &str) -> (Value, Value) {
    let dispute = app.get(&format!("/v1/disputes/{dispute}")).await.json();
    let payment = app.get_payment(payment).await.json();
    (
        dispute["status"].clone(),
        payment["amount_disputed"].clone(),
    )
}

/// A dispute's lifecycle from the processor's events: evidence puts it `under_review`, the bank's
/// decision closes it; a won one gives its amount back to the payment, whose refundable amount
/// grows by it. Each event applies once (its redelivery is a `duplicate`), in order (an older one
/// after a newer is `stale`), and a closed dispute changes no more. idempay writes
/// `dispute.updated` and `dispute.closed`.
#[api_test(citus)]
async fn a_won_dispute_gives_its_amount_back_once_and_in_order() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let charge = charge_of(&app, &paid).await;
    let processor = Processor(&app, &secret);
    let t0 = chrono::Utc::now();
    let at = |seconds: i64| t0 + chrono::Duration::seconds(seconds);
    let event = |status: &str| json!({ "charge": charge, "dispute": "dp_w", "amount": 1500, "status": status });
    let opened = json!({ "charge": charge, "dispute": "dp_w", "amount": 1500 });
    processor
        .event("evt_w1", "charge.dispute.created", &opened, at(0))
        .await;
    assert_eq!(
        standing(&app, "dp_w", &paid).await,
        (json!("needs_response"), json!(1500))
    );

    let reviewed = processor
        .event(
            "evt_w2",
            "charge.dispute.updated",
            &event("under_review"),
            at(1),
        )
        .await;
    let won = processor
        .event("evt_w3", "charge.dispute.closed", &event("won"), at(2))
        .await;
    let again = processor
        .event("evt_w3", "charge.dispute.closed", &event("won"), at(2))
        .await;
    let late = processor
        .event(
            "evt_w4",
            "charge.dispute.updated",
            &event("under_review"),
            at(1),
        )
        .await;
    let lost_after = processor
        .event("evt_w5", "charge.dispute.closed", &event("lost"), at(3))
        .await;

    assert_eq!(reviewed.json()["outcome"], "applied");
    assert_eq!(won.json()["outcome"], "applied");
    assert_eq!(again.json()["outcome"], "duplicate");
    assert_eq!(late.json()["outcome"], "stale");
    assert_eq!(
        lost_after.json()["outcome"],
        "ignored",
        "a closed dispute changes no more"
    );
    assert_eq!(
        standing(&app, "dp_w", &paid).await,
        (json!("won"), json!(0)),
        "the amount came back once"
    );
    let all = app.post_refund(&paid, &new_key(), &json!({})).await;
    assert_eq!(all.status, 201, "{:?}", all.json());
    assert_eq!(
        all.json()["amount"],
        5000,
        "the won amount is refundable again"
    );
    let written: Vec<String> = sqlx::query_scalar(
        "SELECT type FROM events WHERE type LIKE 'dispute.%' ORDER BY txid, seq",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(written, ["dispute.updated", "dispute.closed"]);
    // The feed serves them, each with the dispute as its object (the description says so: the
    // suite checks every answer against it). It lists an event once every older transaction on
    // the server has ended, and other tests of the suite hold some open for seconds: it may lag.
    let closed_in_feed = async || {
        let feed = app.get("/v1/events?limit=10").await;
        assert_eq!(feed.status, 200);
        feed.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|event| event["type"] == "dispute.closed")
            .cloned()
    };
    let listed = holds_within(Duration::from_secs(30), || async {
        closed_in_feed().await.is_some()
    })
    .await;
    assert!(listed, "dispute.closed in the feed within 30 s");
    let closed = closed_in_feed().await.unwrap();
    assert_eq!(closed["data"]["object"]["status"], "won");
}

/// A lost dispute keeps its amount with the cardholder: the payment's `amount_disputed` stays,
/// and only the rest is refundable. A change delivered before its dispute is known (redelivered
/// ahead of its `charge.dispute.created`) is parked, and applied once the dispute is recorded.
#[api_test(citus)]
async fn a_lost_dispute_keeps_its_amount_and_a_close_before_its_dispute_waits_for_it() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(5000).await;
    let charge = charge_of(&app, &paid).await;
    let processor = Processor(&app, &secret);
    let t0 = chrono::Utc::now();
    let closed = json!({ "charge": charge, "dispute": "dp_l", "amount": 2000, "status": "lost" });
    let opened = json!({ "charge": charge, "dispute": "dp_l", "amount": 2000 });

    let early = processor
        .event(
            "evt_l2",
            "charge.dispute.closed",
            &closed,
            t0 + chrono::Duration::seconds(1),
        )
        .await;
    let created = processor
        .event("evt_l1", "charge.dispute.created", &opened, t0)
        .await;

    assert_eq!(early.json()["outcome"], "parked");
    assert_eq!(created.json()["outcome"], "applied");
    assert_eq!(
        standing(&app, "dp_l", &paid).await,
        (json!("lost"), json!(2000)),
        "the parked close applied once its dispute was recorded"
    );
    let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM parked_events")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(parked, 0);
    app.post_refund(&paid, &new_key(), &json!({ "amount": 3001 }))
        .await
        .assert_problem(400, "refund-exceeds-payment");
    let unknown_status =
        json!({ "charge": charge, "dispute": "dp_l", "amount": 2000, "status": "open" });
    let refused = processor
        .event(
            "evt_l3",
            "charge.dispute.closed",
            &unknown_status,
            t0 + chrono::Duration::seconds(5),
        )
        .await;
    assert_eq!(refused.json()["outcome"], "ignored");
}

/// A payment's disputed amount is what its disputes hold, counted from them
/// (`payments::disputed`): pay 8,861, refund 3,000, and the bank opens two disputes of 4,000; the
/// second claims more than is left (5,861 is captured and not refunded), so it is flagged and the
/// payment holds 5,861.
/// Won, the second gives back only what it held: the first's 4,000 stays disputed, and only
/// 1,861 remains refundable. (An accumulated figure gave back all 4,000 and showed 1,861.)
#[api_test(citus)]
async fn a_won_dispute_squeezed_beside_a_refund_gives_back_only_what_it_held() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(8861).await;
    let refunded = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 3000 }))
        .await;
    assert_eq!(refunded.status, 201, "{:?}", refunded.json());
    let charge = charge_of(&app, &paid).await;
    let processor = Processor(&app, &secret);
    let t0 = chrono::Utc::now();
    let at = |seconds: i64| t0 + chrono::Duration::seconds(seconds);
    for (event, dispute) in [("evt_s1", "dp_first"), ("evt_s2", "dp_second")] {
        let opened = json!({ "charge": charge, "dispute": dispute, "amount": 4000 });
        processor
            .event(event, "charge.dispute.created", &opened, at(0))
            .await
            .assert_status(200);
    }
    assert_eq!(
        standing(&app, "dp_second", &paid).await,
        (json!("needs_response"), json!(5861)),
        "the disputes hold what is left, no more"
    );
    assert_eq!(
        app.get("/v1/disputes/dp_second").await.json()["needs_review"],
        true
    );

    let closed =
        json!({ "charge": charge, "dispute": "dp_second", "amount": 4000, "status": "won" });
    let won = processor
        .event("evt_s3", "charge.dispute.closed", &closed, at(1))
        .await;

    assert_eq!(won.json()["outcome"], "applied");
    assert_eq!(
        standing(&app, "dp_second", &paid).await,
        (json!("won"), json!(4000)),
        "the first dispute still holds its 4,000"
    );
    app.post_refund(&paid, &new_key(), &json!({ "amount": 1862 }))
        .await
        .assert_problem(400, "refund-exceeds-payment");
    let rest = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 1861 }))
        .await;
    assert_eq!(rest.status, 201, "{:?}", rest.json());
    assert_eq!(
        app.get_payment(&paid).await.json()["amount_disputed"],
        4000,
        "a refund of what is not disputed leaves the disputes whole"
    );
}

/// A dispute whose event arrives while idempay's payment still requires capture (the processor
/// captured; the capture's answer is still on its way here) holds nothing yet, since nothing is
/// captured here; it is not flagged, since the authorization covers it. Once the capture is
/// recorded, it holds what the capture took, and that much is no longer refundable.
#[api_test(citus)]
async fn a_dispute_before_the_capture_is_recorded_holds_what_the_capture_took() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let authorized = app.authorized(5000).await;
    let charge = charge_of(&app, &authorized).await;
    let opened = json!({ "charge": charge, "dispute": "dp_early", "amount": 2000 });
    Processor(&app, &secret)
        .event(
            "evt_e1",
            "charge.dispute.created",
            &opened,
            chrono::Utc::now(),
        )
        .await
        .assert_status(200);
    assert_eq!(
        standing(&app, "dp_early", &authorized).await,
        (json!("needs_response"), json!(0))
    );
    assert_eq!(
        app.get("/v1/disputes/dp_early").await.json()["needs_review"],
        false
    );

    let captured = app
        .post_capture(
            &authorized,
            &new_key(),
            &json!({ "amount_to_capture": 3000 }),
        )
        .await;

    captured.assert_status(200);
    assert_eq!(
        captured.json()["amount_disputed"],
        2000,
        "the capture's answer counts the dispute"
    );
    assert_eq!(
        standing(&app, "dp_early", &authorized).await,
        (json!("needs_response"), json!(2000))
    );
    app.post_refund(&authorized, &new_key(), &json!({ "amount": 1001 }))
        .await
        .assert_problem(400, "refund-exceeds-payment");
}

/// The ledgers' money rules are the database's (migrations/20261210000001_money_invariants.sql):
/// a statement that would break one is refused, naming the rule, whatever code wrote it.
#[api_test(citus)]
async fn the_schema_refuses_a_payment_that_breaks_a_money_rule() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000).await;
    let authorized = app.authorized(4000).await;
    let (paid_charge, authorized_charge) = (
        charge_of(&app, &paid).await,
        charge_of(&app, &authorized).await,
    );
    // Each statement breaks one rule alone.
    let breaks = [
        (
            "UPDATE payments SET amount_captured = 4000, amount_refunded = 3000,
                                 amount_disputed = 1001
             WHERE id = $1",
            &paid,
            "payments_money_held",
        ),
        (
            "UPDATE payments SET amount_capturable = 10 WHERE id = $1",
            &paid,
            "payments_capturable",
        ),
        (
            "UPDATE payments SET amount_captured = 100 WHERE id = $1",
            &authorized,
            "payments_capturable",
        ),
        (
            "UPDATE payments SET canceled_at = now() WHERE id = $1",
            &paid,
            "payments_canceled",
        ),
        (
            "UPDATE payments SET status = 'canceled', amount_capturable = 0 WHERE id = $1",
            &authorized,
            "payments_canceled",
        ),
        (
            "UPDATE processor_charges SET amount_refunded = amount, amount_captured = 10
             WHERE id = $1",
            &paid_charge,
            "processor_charges_money_held",
        ),
        (
            "UPDATE processor_charges SET amount_captured = 10 WHERE id = $1",
            &authorized_charge,
            "processor_charges_released",
        ),
    ];
    for (statement, row, rule) in breaks {
        let refused = sqlx::query(statement)
            .bind(row)
            .execute(&app.db)
            .await
            .expect_err(statement);
        let refused = refused
            .as_database_error()
            .expect("a refusal of the database's");
        assert_eq!(refused.code().as_deref(), Some("23514"), "{statement}");
        // By its message: on Citus the worker's error reaches the client without the
        // constraint's field, and names the shard's copy of it (`payments_money_held_102008`).
        assert!(refused.message().contains(rule), "{statement}: {refused}");
    }
}
