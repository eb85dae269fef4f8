//! The lists' filters, as an operator uses them: the account's refunds (`GET /v1/refunds`), the
//! `created` bounds every list takes, `status` on payments and refunds, each combined with the
//! others and with the pages, and a malformed filter refused naming its parameter.

use idempay_test_macros::api_test;
use serde_json::{Value, json};

use super::webhooks::deliver;
use crate::support::helpers::{TestApp, new_key};

/// The ids of a page, in its order.
fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect()
}

/// A second, as unix timestamps count them, long before any test ran.
const T: i64 = 1_700_000_000;

/// Moves the payment or refund `id` to `seconds` after the epoch, so that a test places objects
/// in time without waiting for the clock.
async fn created_at(app: &TestApp, id: &str, seconds: f64) {
    let statement = if id.starts_with("re_") {
        "UPDATE refunds SET created_at = to_timestamp($2) WHERE id = $1"
    } else {
        "UPDATE payments SET created_at = to_timestamp($2) WHERE id = $1"
    };
    let moved = sqlx::query(statement)
        .bind(id)
        .bind(seconds)
        .execute(&app.db)
        .await
        .unwrap();
    assert_eq!(moved.rows_affected(), 1, "{id}");
}

#[api_test(citus)]
async fn the_accounts_refunds_are_listed_newest_first_a_page_at_a_time_and_only_to_it() {
    let app = TestApp::spawn().await;
    let first = app.paid(1000).await;
    let second = app.paid(1000).await;
    let mut refunds = Vec::new();
    for (payment, amount) in [(&first, 100), (&second, 200), (&first, 300)] {
        let made = app
            .post_refund(payment, &new_key(), &json!({ "amount": amount }))
            .await;
        assert_eq!(made.status, 201, "{}", made.json());
        refunds.push(made.id());
    }
    refunds.reverse();

    let everything = app.get("/v1/refunds").await.json();
    let newest = app.get("/v1/refunds?limit=2").await.json();
    let older = app
        .get(&format!(
            "/v1/refunds?limit=2&starting_after={}",
            refunds[1]
        ))
        .await
        .json();
    let newer = app
        .get(&format!("/v1/refunds?limit=1&ending_before={}", refunds[2]))
        .await
        .json();
    let of_first = app
        .get(&format!("/v1/refunds?payment={first}"))
        .await
        .json();

    assert_eq!(everything["object"], "list");
    assert_eq!(ids(&everything), refunds);
    assert_eq!(
        (ids(&newest), &newest["has_more"]),
        (refunds[0..2].to_vec(), &json!(true))
    );
    assert_eq!(
        (ids(&older), &older["has_more"]),
        (refunds[2..].to_vec(), &json!(false))
    );
    assert_eq!(
        (ids(&newer), &newer["has_more"]),
        (refunds[1..2].to_vec(), &json!(true))
    );
    assert_eq!(ids(&of_first), [refunds[0].clone(), refunds[2].clone()]);
    // The representation of the refund, and of the payment's own list.
    let one = app.get(&format!("/v1/refunds/{}", refunds[0])).await.json();
    let payments_own = app
        .get(&format!("/v1/payments/{first}/refunds"))
        .await
        .json();
    assert_eq!(everything["data"][0], one);
    assert_eq!(payments_own["data"], of_first["data"]);

    // Another account sees none of them, even naming the payment; its cursor is no place to page
    // from.
    let (_, other) = app.create_account("someone else").await;
    let as_other = |path: String| app.send(app.client().get(app.url(&path)).bearer_auth(&other));
    let theirs = as_other("/v1/refunds".to_owned()).await.json();
    let named = as_other(format!("/v1/refunds?payment={first}")).await;
    assert_eq!(theirs["data"], json!([]));
    assert_eq!((named.status, &named.json()["data"]), (200, &json!([])));
    as_other(format!("/v1/refunds?starting_after={}", refunds[0]))
        .await
        .assert_problem(404, "not-found");
    // Nor does a cursor outside the payment's refunds page it.
    app.get(&format!(
        "/v1/refunds?payment={second}&starting_after={}",
        refunds[0]
    ))
    .await
    .assert_problem(404, "not-found");
}

#[api_test(citus)]
async fn payments_are_filtered_by_status_and_created_seconds_combined_with_the_pages() {
    let app = TestApp::spawn().await;
    let oldest = app.paid(100).await;
    let declined = app
        .post_payment(
            &new_key(),
            &json!({ "amount": 200, "currency": "eur", "payment_method": "pm_card_chargeDeclined" }),
        )
        .await
        .assert_problem(402, "card-declined")["payment"]
        .as_str()
        .unwrap()
        .to_owned();
    let early = app.paid(300).await;
    let late = app.paid(400).await;
    let newest = app.paid(500).await;
    // T, then three in the second T + 1 (the declined one in it), then T + 3.
    for (id, at) in [
        (&oldest, 0.0),
        (&declined, 1.1),
        (&early, 1.2),
        (&late, 1.7),
        (&newest, 3.0),
    ] {
        created_at(&app, id, T as f64 + at).await;
    }
    let app = &app;
    let listed = |query: String| async move {
        let page = app.get(&format!("/v1/payments?{query}")).await;
        assert_eq!(page.status, 200, "{query}: {}", page.json());
        ids(&page.json())
    };
    let second_one = vec![late.clone(), early.clone(), declined.clone()];

    assert_eq!(listed(format!("created={}", T + 1)).await, second_one);
    assert_eq!(
        listed(format!("created[gte]={}&created[lte]={}", T + 1, T + 1)).await,
        second_one
    );
    assert_eq!(
        listed(format!("created[gt]={T}&created[lt]={}", T + 3)).await,
        second_one
    );
    assert_eq!(
        listed(format!("created[lt]={}", T + 1)).await,
        [oldest.as_str()]
    );
    assert_eq!(
        listed(format!("created[gt]={}", T + 1)).await,
        [newest.as_str()]
    );
    assert_eq!(
        listed(format!("created[gte]={T}&status=declined")).await,
        [declined.as_str()]
    );
    assert_eq!(
        listed(format!("created={}&status=succeeded", T + 1)).await,
        [late.clone(), early.clone()]
    );
    assert_eq!(
        listed(format!("created={}", T + 2)).await,
        Vec::<String>::new()
    );
    // Pages within the filtered list, either way.
    assert_eq!(
        listed(format!("created={}&limit=1&starting_after={late}", T + 1)).await,
        [early.as_str()]
    );
    assert_eq!(
        listed(format!(
            "created[lte]={}&status=succeeded&limit=1&ending_before={oldest}",
            T + 1
        ))
        .await,
        [early.as_str()]
    );
}

#[api_test]
async fn refunds_are_filtered_by_status_and_created_on_both_lists() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(1000).await;
    let kept = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 100 }))
        .await
        .id();
    let failed = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 200 }))
        .await
        .id();
    let answer = deliver(
        &app,
        &secret,
        "evt_rf",
        "refund.failed",
        &json!({ "refund": failed }),
    )
    .await;
    assert_eq!(answer.json()["outcome"], "applied");
    created_at(&app, &kept, T as f64).await;
    created_at(&app, &failed, T as f64 + 10.0).await;

    let app = &app;
    for list in [
        "/v1/refunds?".to_owned(),
        format!("/v1/refunds?payment={paid}&"),
        format!("/v1/payments/{paid}/refunds?"),
    ] {
        let listed = |query: &str| {
            let path = format!("{list}{query}");
            async move {
                let page = app.get(&path).await;
                assert_eq!(page.status, 200, "{path}: {}", page.json());
                ids(&page.json())
            }
        };
        assert_eq!(listed("status=failed").await, [failed.as_str()], "{list}");
        assert_eq!(listed("status=succeeded").await, [kept.as_str()], "{list}");
        assert_eq!(
            listed(&format!("created[lt]={}", T + 10)).await,
            [kept.as_str()],
            "{list}"
        );
        assert_eq!(
            listed(&format!("created[gte]={}&status=failed", T + 10)).await,
            [failed.as_str()],
            "{list}"
        );
        assert_eq!(
            listed(&format!("created[gte]={}&status=succeeded", T + 10)).await,
            Vec::<String>::new(),
            "{list}"
        );
    }
}

#[api_test]
async fn a_malformed_filter_is_refused_naming_its_parameter() {
    let app = TestApp::spawn().await;
    let paid = app.paid(100).await;
    for (path, parameter, allowed) in [
        ("/v1/payments?status=paid", "status", "succeeded"),
        ("/v1/refunds?status=done", "status", "failed"),
        (
            &format!("/v1/payments/{paid}/refunds?status=done") as &str,
            "status",
            "succeeded",
        ),
        ("/v1/disputes?status=open", "status", "needs_response"),
        ("/v1/events?type=payment.made", "type", "refund.created"),
        ("/v1/refunds?payment=ch_1", "payment", "pay_"),
        ("/v1/disputes?payment=pay_1", "payment", "pay_"),
        (
            "/v1/payments?created[gte]=yesterday",
            "created[gte]",
            "unix timestamp",
        ),
        (
            "/v1/refunds?created[lt]=-5",
            "created[lt]",
            "unix timestamp",
        ),
        ("/v1/disputes?created=1.5", "created", "unix timestamp"),
        (
            "/v1/events?created[lte]=99999999999999",
            "created[lte]",
            "unix timestamp",
        ),
        (
            "/v1/payments?created[after]=1",
            "created[after]",
            "created[gte]",
        ),
        ("/v1/refunds?colour=red", "colour", "created"),
        (
            "/v1/payments?status=failed&status=succeeded",
            "status",
            "more than once",
        ),
    ] {
        let problem = app.get(path).await.assert_problem(400, "invalid-request");
        // Lowercased: a detail is a sentence, whose first letter is a capital.
        let detail = problem["detail"].as_str().unwrap().to_lowercase();
        assert!(
            detail.contains(parameter) && detail.contains(allowed),
            "{path}: {detail}"
        );
    }
    // A bound's name as it was sent, in backticks, never capitalized into `Created[gte]`.
    let problem = app
        .get("/v1/payments?created[gte]=yesterday")
        .await
        .assert_problem(400, "invalid-request");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.starts_with("`created[gte]` must be"), "{detail}");
    // A well-formed payment of no one's matches nothing, as one of another account does.
    let page = app
        .get("/v1/refunds?payment=pay_000000000000000000000000")
        .await;
    assert_eq!((page.status, page.json()["data"].clone()), (200, json!([])));
    assert_eq!(
        app.get("/v1/payments?status=succeeded&created[gte]=0")
            .await
            .status,
        200
    );
}
