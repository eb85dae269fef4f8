//! Listing payments: newest first, keyset pages in Stripe's shape, only the caller's.

use std::collections::HashSet;

use futures::future::join_all;
use idempay_test_macros::api_test;
use serde_json::Value;

use crate::support::helpers::{TestApp, new_key, payment};

#[api_test]
async fn payments_are_listed_newest_first_a_page_at_a_time() {
    let app = TestApp::spawn().await;
    let mut created = Vec::new();
    for amount in 1..=5 {
        created.push(app.paid(amount).await);
    }
    created.reverse();

    let first = app.get("/v1/payments?limit=2").await.json();
    let second = app
        .get(&format!(
            "/v1/payments?limit=2&starting_after={}",
            created[1]
        ))
        .await
        .json();
    let last = app
        .get(&format!(
            "/v1/payments?limit=2&starting_after={}",
            created[3]
        ))
        .await
        .json();
    let back = app
        .get(&format!(
            "/v1/payments?limit=2&ending_before={}",
            created[2]
        ))
        .await
        .json();

    assert_eq!(first["object"], "list");
    assert_eq!(
        (ids(&first), first["has_more"].clone()),
        (created[0..2].to_vec(), true.into())
    );
    assert_eq!(
        (ids(&second), second["has_more"].clone()),
        (created[2..4].to_vec(), true.into())
    );
    assert_eq!(
        (ids(&last), last["has_more"].clone()),
        (created[4..5].to_vec(), false.into())
    );
    assert_eq!(
        (ids(&back), back["has_more"].clone()),
        (created[0..2].to_vec(), false.into())
    );
    let everything = app.get("/v1/payments").await.json();
    assert_eq!(ids(&everything), created, "the default page holds 10");
    assert_eq!(
        everything["data"][0],
        app.get_payment(&created[0]).await.json()
    );
}

#[api_test]
async fn only_the_callers_payments_are_listed() {
    let app = TestApp::spawn().await;
    let mine = app.paid(100).await;
    let (_, other_key) = app.create_account("someone else").await;
    let theirs = app
        .post_payment_as(&other_key, &new_key(), &payment(200))
        .await
        .json();
    let theirs = theirs["id"].as_str().unwrap();

    let list = app.get("/v1/payments").await.json();

    assert_eq!(ids(&list), vec![mine]);
    let foreign_cursor = app
        .get(&format!("/v1/payments?starting_after={theirs}"))
        .await;
    foreign_cursor.assert_problem(404, "not-found");
}

#[api_test]
async fn bad_list_parameters_are_refused() {
    let app = TestApp::spawn().await;
    for query in [
        "limit=0",
        "limit=101",
        "limit=ten",
        "starting_after=pay_000000000000000000000000&ending_before=pay_000000000000000000000000",
        "page=2",
    ] {
        let response = app.get(&format!("/v1/payments?{query}")).await;
        response.assert_problem(400, "invalid-request");
    }
    for unknown in [
        "starting_after=nothing",
        "ending_before=pay_000000000000000000000000",
        "starting_after=%00",
    ] {
        let response = app.get(&format!("/v1/payments?{unknown}")).await;
        response.assert_problem(404, "not-found");
    }
    assert_eq!(app.get("/v1/payments?limit=100").await.status, 200);
}

#[api_test]
async fn pages_neither_skip_nor_repeat_while_payments_are_created() {
    let app = TestApp::spawn().await;
    let mut before = HashSet::new();
    for _ in 0..30 {
        before.insert(app.paid(100).await);
    }

    let inserting = async {
        join_all((0..20).map(|_| async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            app.paid(200).await
        }))
        .await
    };
    let paging = async {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let query = cursor.map_or_else(
                || "limit=7".to_owned(),
                |c| format!("limit=7&starting_after={c}"),
            );
            let page = app.get(&format!("/v1/payments?{query}")).await.json();
            let page_ids = ids(&page);
            seen.extend(page_ids.iter().cloned());
            if page["has_more"] == false {
                return seen;
            }
            cursor = page_ids.last().cloned();
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
    };
    let (_, seen) = tokio::join!(inserting, paging);

    let unique: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no payment appears twice");
    assert!(
        before.is_subset(&unique),
        "every payment that existed before is listed"
    );
}

fn ids(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect()
}
