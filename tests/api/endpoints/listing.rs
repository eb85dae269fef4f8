//! Listing payments: newest first, keyset pages in Stripe's shape, only the caller's.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use idempay_test_macros::api_test;
use serde_json::Value;
use tokio::sync::Notify;

use crate::support::helpers::{TestApp, new_key, payment, wait_until};

#[api_test(citus)]
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

#[api_test(citus)]
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

    // Each page is read once a few more payments were created after the one before it, so the
    // inserts land between the pages whatever the machine's speed. Offsets would skip or repeat.
    let first_page_read = Notify::new();
    let committed = AtomicUsize::new(0);
    let inserting = async {
        first_page_read.notified().await;
        let mut inserts = Vec::new();
        for _ in 0..20 {
            let sent = Instant::now();
            app.paid(200).await;
            inserts.push((sent, Instant::now()));
            committed.fetch_add(1, Ordering::SeqCst);
        }
        inserts
    };
    let paging = async {
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        let mut page_times = Vec::new();
        for page_number in 1.. {
            let query = cursor.map_or_else(
                || "limit=7".to_owned(),
                |c| format!("limit=7&starting_after={c}"),
            );
            let sent = Instant::now();
            let page = app.get(&format!("/v1/payments?{query}")).await.json();
            page_times.push((sent, Instant::now()));
            if page_number == 1 {
                first_page_read.notify_one();
            }
            let page_ids = ids(&page);
            seen.extend(page_ids.iter().cloned());
            if page["has_more"] == false {
                break;
            }
            cursor = page_ids.last().cloned();
            let inserted = (3 * page_number).min(20);
            wait_until("payments are created between the pages", || async {
                committed.load(Ordering::SeqCst) >= inserted
            })
            .await;
        }
        (seen, page_times)
    };
    let (inserts, (seen, page_times)) = tokio::join!(inserting, paging);

    let unique: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no payment appears twice");
    assert!(
        before.is_subset(&unique),
        "every payment that existed before is listed"
    );
    // The inserts really interleaved with the paging: some were sent after the first page was
    // read, and answered (so committed) before the last page was asked for.
    let first_page_read_at = page_times.first().unwrap().1;
    let last_page_asked_at = page_times.last().unwrap().0;
    let between = inserts
        .iter()
        .filter(|(sent, answered)| *sent > first_page_read_at && *answered < last_page_asked_at)
        .count();
    assert!(
        between > 0,
        "no payment was created between the first page and the last ({} pages, {} inserts)",
        page_times.len(),
        inserts.len()
    );
}

/// What a list promises, and where it stops. A payment sorts by its `created_at`, taken just
/// before its insert, not by its commit: one whose insert waits (here for a lock the test holds)
/// commits after a newer one but sorts behind it. Read again, the list shows it in its place, and
/// pages of a list that does not change neither skip nor repeat; but a client polling for new
/// payments with `ending_before` the newest it saw never sees it.
#[api_test]
async fn a_payment_committed_after_a_newer_one_sorts_behind_the_polling_cursor() {
    let app = TestApp::spawn().await;
    let older = app.paid(100).await;

    // The insert of the payment of 300 waits for a lock this test holds, so it commits only after
    // the test lets it: after a newer payment committed and a page was read.
    let mut gate = app.db.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(7301)")
        .execute(&mut *gate)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION hold_payment() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.amount = 300 THEN PERFORM pg_advisory_xact_lock(7301); END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER hold_payment BEFORE INSERT ON payments
         FOR EACH ROW EXECUTE FUNCTION hold_payment();",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let late = app.start_payment(&new_key(), &payment(300)).await;
    // Its `created_at` is taken once it reaches the insert, which then waits.
    app.until_a_statement_waits(
        "the payment of 300 waits to be inserted",
        "%INSERT INTO payments%",
    )
    .await;
    let newer = app.paid(200).await;
    let polled = app.get("/v1/payments").await.json();
    assert_eq!(ids(&polled), [newer.clone(), older.clone()]);

    sqlx::query("SELECT pg_advisory_unlock(7301)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let late = late.await.unwrap();
    assert_eq!(late.status, 201, "{}", late.json());
    let late = late.json()["id"].as_str().unwrap().to_owned();

    // The limit: polling forward from the newest payment seen finds nothing new.
    let since = app
        .get(&format!("/v1/payments?ending_before={newer}"))
        .await
        .json();
    assert_eq!(ids(&since), Vec::<String>::new());
    assert_eq!(since["has_more"], false);

    // The property: read again, the list holds it, behind the cursor; a walk one page at a time
    // over the list, which no longer changes, sees each payment once.
    let all = app.get("/v1/payments").await.json();
    assert_eq!(ids(&all), [newer.clone(), late.clone(), older.clone()]);
    let mut walked = Vec::new();
    let mut query = "limit=1".to_owned();
    loop {
        let page = app.get(&format!("/v1/payments?{query}")).await.json();
        walked.extend(ids(&page));
        if page["has_more"] == false {
            break;
        }
        query = format!("limit=1&starting_after={}", walked.last().unwrap());
    }
    assert_eq!(walked, [newer, late, older]);
}

fn ids(list: &Value) -> Vec<String> {
    list["data"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|item| item["id"].as_str().unwrap().to_owned())
        .collect()
}
