//! Events: each change writes its event in its own transaction, with the object as it was right
//! after it; a change that does not happen writes none; the feed lists them in commit order, so a
//! consumer polling forward never skips or repeats one.

use std::collections::HashSet;
use std::time::Duration;

use futures::future::join_all;
use idempay_test_macros::api_test;
use serde_json::{Value, json};

use super::webhooks::{deliver, deliver_at};
use crate::support::helpers::{TestApp, holds_within, new_key, payment};

#[api_test(citus)]
async fn a_payment_writes_its_event_with_the_payment_as_it_was_created() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let succeeded = app.post_payment(&key, &payment(4200)).await;
    let declined = app
        .post_payment(
            &new_key(),
            &json!({ "amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined" }),
        )
        .await;
    let declined_id = declined.assert_problem(402, "card-declined")["payment"]
        .as_str()
        .unwrap()
        .to_owned();

    let events = feed(&app, 2).await;

    assert_eq!(types(&events), ["payment.declined", "payment.succeeded"]);
    assert_eq!(events[1]["data"]["object"], succeeded.json());
    assert_eq!(
        events[0]["data"]["object"],
        app.get_payment(&declined_id).await.json()
    );
    assert_eq!(events[1]["object"], "event");
    // The payment's clock reading is the event's: both are the change's time.
    assert_eq!(events[1]["created_at"], succeeded.json()["created_at"]);
    // The feed serves the bytes written with the event, and so does the event's own route.
    let id = events[1]["id"].as_str().unwrap();
    let one = app.get(&format!("/v1/events/{id}")).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json(), events[1]);
    let stored: Vec<u8> = sqlx::query_scalar("SELECT body FROM events WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(one.body, stored);

    let replay = app.post_payment(&key, &payment(4200)).await;
    assert!(replay.replayed());
    assert_eq!(event_count(&app).await, 2, "a replay writes no event");
}

#[api_test]
async fn a_partial_and_a_full_refund_write_refund_created_then_the_payment_after_it() {
    let app = TestApp::spawn().await;
    let paid = app.paid(5000).await;
    let partial = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 2000 }))
        .await;
    let rest = app.post_refund(&paid, &new_key(), &json!({})).await;
    assert_eq!((partial.status, rest.status), (201, 201));

    let events = feed(&app, 5).await;

    assert_eq!(
        types(&events),
        [
            "payment.refunded",
            "refund.created",
            "payment.refunded",
            "refund.created",
            "payment.succeeded",
        ]
    );
    assert_eq!(events[3]["data"]["object"], partial.json());
    assert_eq!(events[1]["data"]["object"], rest.json());
    let after_partial = &events[2]["data"]["object"];
    assert_eq!(after_partial["id"], paid);
    assert_eq!(after_partial["amount_refunded"], 2000);
    assert_eq!(after_partial["status"], "succeeded");
    assert_eq!(
        events[0]["data"]["object"],
        app.get_payment(&paid).await.json()
    );
    assert_eq!(events[0]["data"]["object"]["status"], "refunded");
    assert_eq!(events[0]["data"]["object"]["amount_refunded"], 5000);
}

#[api_test]
async fn a_refused_refund_and_a_replayed_one_write_no_event() {
    let app = TestApp::spawn().await;
    let paid = app.paid(1000).await;
    let key = new_key();
    let refund = json!({ "amount": 600 });
    assert_eq!(app.post_refund(&paid, &key, &refund).await.status, 201);
    feed(&app, 3).await;

    let replay = app.post_refund(&paid, &key, &refund).await;
    let refused = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 401 }))
        .await;

    assert!(replay.replayed());
    refused.assert_problem(400, "refund-exceeds-payment");
    assert_eq!(event_count(&app).await, 3);
}

#[api_test]
async fn intake_events_write_payment_failed_payment_disputed_and_refund_failed() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let failing = app.paid(3000).await;
    let disputed = app.paid(4000).await;
    let refunded = app.paid(5000).await;
    let refund = app
        .post_refund(&refunded, &new_key(), &json!({ "amount": 1000 }))
        .await
        .json();
    let before = event_count(&app).await;

    let failed = deliver(
        &app,
        &secret,
        "evt_f",
        "payment.failed",
        &json!({ "payment": failing }),
    )
    .await;
    let dispute = json!({ "payment": disputed, "dispute": "dp_1", "amount": 1500 });
    let opened = deliver(&app, &secret, "evt_d", "dispute.created", &dispute).await;
    let gave_back = json!({ "refund": refund["id"] });
    let refund_failed = deliver(&app, &secret, "evt_r", "refund.failed", &gave_back).await;

    for answer in [&failed, &opened, &refund_failed] {
        assert_eq!(answer.json()["outcome"], "applied");
    }
    let events = feed(&app, before + 3).await;
    assert_eq!(
        types(&events[..3]),
        ["refund.failed", "payment.disputed", "payment.failed"]
    );
    let refund_now = app
        .get(&format!("/v1/refunds/{}", refund["id"].as_str().unwrap()))
        .await
        .json();
    assert_eq!(refund_now["status"], "failed");
    assert_eq!(events[0]["data"]["object"], refund_now);
    assert_eq!(
        events[1]["data"]["object"],
        app.get_payment(&disputed).await.json()
    );
    assert_eq!(events[1]["data"]["object"]["amount_disputed"], 1500);
    assert_eq!(
        events[2]["data"]["object"],
        app.get_payment(&failing).await.json()
    );
    assert_eq!(events[2]["data"]["object"]["status"], "failed");
}

#[api_test]
async fn an_intake_event_that_changes_nothing_writes_no_event() {
    let (app, secret) = TestApp::spawn_with_webhooks().await;
    let paid = app.paid(3000).await;
    let declined = app
        .post_payment(
            &new_key(),
            &json!({ "amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined" }),
        )
        .await;
    let declined = declined.json()["payment"].as_str().unwrap().to_owned();
    let failure = json!({ "payment": paid });
    let now = chrono::Utc::now();
    deliver_at(&app, &secret, "evt_f", "payment.failed", &failure, now).await;
    let dispute = json!({ "payment": paid, "dispute": "dp_1", "amount": 100 });
    deliver(&app, &secret, "evt_d", "dispute.created", &dispute).await;
    let before = event_count(&app).await;
    assert_eq!(before, 4);

    let outcomes = [
        // The same event again.
        deliver_at(&app, &secret, "evt_f", "payment.failed", &failure, now).await,
        // The same dispute under another event id.
        deliver(&app, &secret, "evt_d2", "dispute.created", &dispute).await,
        // Older than the failure applied.
        deliver_at(
            &app,
            &secret,
            "evt_old",
            "payment.succeeded",
            &failure,
            now - chrono::Duration::minutes(5),
        )
        .await,
        // A declined payment never moves.
        deliver(
            &app,
            &secret,
            "evt_s",
            "payment.succeeded",
            &json!({ "payment": declined }),
        )
        .await,
        // A newer failure of a failed payment: applied, but the payment was failed already.
        deliver(&app, &secret, "evt_f2", "payment.failed", &failure).await,
    ]
    .map(|answer| answer.json()["outcome"].as_str().unwrap().to_owned());

    assert_eq!(
        outcomes,
        ["duplicate", "duplicate", "stale", "ignored", "applied"]
    );
    assert_eq!(event_count(&app).await, before);
}

#[api_test]
async fn the_feed_is_the_accounts_own_filtered_by_type_and_refuses_bad_parameters() {
    let app = TestApp::spawn().await;
    let paid = app.paid(2000).await;
    app.post_refund(&paid, &new_key(), &json!({})).await;
    let events = feed(&app, 3).await;
    let (_, other) = app.create_account("someone else").await;
    let as_other = |path: &str| app.send(app.client().get(app.url(path)).bearer_auth(&other));

    let theirs = as_other("/v1/events").await;
    let one = as_other(&format!("/v1/events/{}", events[0]["id"].as_str().unwrap())).await;
    let refunds = app.get("/v1/events?type=refund.created").await.json();

    assert_eq!(theirs.json()["data"], json!([]));
    one.assert_problem(404, "not-found");
    assert_eq!(
        types(refunds["data"].as_array().unwrap()),
        ["refund.created"]
    );
    for bad in [
        "/v1/events?type=payment.created",
        "/v1/events?limit=0",
        "/v1/events?limit=many",
        "/v1/events?colour=blue",
        "/v1/events?starting_after=evt_1&ending_before=evt_2",
    ] {
        app.get(bad).await.assert_problem(400, "invalid-request");
    }
    let cursor = events[0]["id"].as_str().unwrap();
    as_other(&format!("/v1/events?starting_after={cursor}"))
        .await
        .assert_problem(404, "not-found");
    app.get("/v1/events/evt_nothing")
        .await
        .assert_problem(404, "not-found");
}

#[api_test]
async fn the_feed_is_filtered_by_created_seconds_with_the_type_and_the_pages() {
    let app = TestApp::spawn().await;
    let paid = app.paid(2000).await;
    app.post_refund(&paid, &new_key(), &json!({})).await;
    let events = feed(&app, 3).await;
    assert_eq!(
        types(&events),
        ["payment.refunded", "refund.created", "payment.succeeded"]
    );
    let ids: Vec<&str> = events
        .iter()
        .map(|event| event["id"].as_str().unwrap())
        .collect();
    // The refund's two in the second 1 700 000 000, the payment's ten seconds before.
    for (id, at) in [(ids[0], 0.7), (ids[1], 0.2), (ids[2], -10.0)] {
        sqlx::query("UPDATE events SET created_at = to_timestamp($2) WHERE id = $1")
            .bind(id)
            .bind(1_700_000_000.0 + at)
            .execute(&app.db)
            .await
            .unwrap();
    }
    let app = &app;
    let listed = |query: String| async move {
        let page = app.get(&format!("/v1/events?{query}")).await;
        assert_eq!(page.status, 200, "{query}: {}", page.json());
        page.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|event| event["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };

    assert_eq!(listed("created=1700000000".into()).await, ids[0..2]);
    assert_eq!(listed("created[lt]=1700000000".into()).await, ids[2..]);
    assert_eq!(
        listed("created[gte]=1700000000&type=refund.created".into()).await,
        ids[1..2]
    );
    assert_eq!(
        listed(format!(
            "created[gte]=1700000000&limit=1&starting_after={}",
            ids[0]
        ))
        .await,
        ids[1..2]
    );
    assert_eq!(
        listed("created[gte]=1700000000&type=payment.succeeded".into()).await,
        Vec::<String>::new()
    );
}

#[api_test]
async fn events_written_are_counted_by_type() {
    let app = TestApp::spawn().await;
    let counted = || async {
        let metrics = String::from_utf8(app.get("/metrics").await.body).unwrap();
        metrics
            .lines()
            .find(|line| line.starts_with("idempay_events_written_total{type=\"refund.created\"}"))
            .and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = counted().await;

    let paid = app.paid(100).await;
    app.post_refund(&paid, &new_key(), &json!({})).await;

    // Other tests in this process count theirs too: at least this one's.
    assert!(counted().await > before);
}

/// Writers whose transactions take their ids in one order and commit in another (a test-side
/// transaction holds its event uncommitted while payments commit after it), and a consumer that
/// polls forward with `ending_before` all along: it reads every event once, in the feed's order.
#[api_test]
async fn a_consumer_polling_forward_never_skips_nor_repeats_an_event_committed_out_of_order() {
    const HELD: usize = 4;
    const WRITERS: usize = 3;
    const PAYMENTS_PER_ROUND: usize = 8;
    let app = TestApp::spawn().await;
    let template = app.get_payment(&app.paid(1).await).await.json();
    let mut consumer = Consumer::default();
    consumer.catch_up(&app).await;

    // Open HELD transactions, each with its event written and uncommitted, payments committing
    // between them; then commit them newest first, payments committing between those too.
    let mut held = Vec::new();
    for _ in 0..HELD {
        held.push(hold_an_event(&app, &template).await);
        write_while_polling(&app, &mut consumer, WRITERS, PAYMENTS_PER_ROUND).await;
    }
    while let Some((tx, _)) = held.pop() {
        tx.commit().await.unwrap();
        write_while_polling(&app, &mut consumer, WRITERS, PAYMENTS_PER_ROUND).await;
    }
    let total = 1 + HELD + 2 * HELD * WRITERS * PAYMENTS_PER_ROUND;
    assert_eq!(event_count(&app).await, i64::try_from(total).unwrap());
    // Every transaction has ended; the feed lists the last events once every transaction of the
    // server older than theirs has too (other tests run beside this one): 10 s at most.
    for _ in 0..1000 {
        if consumer.catch_up(&app).await.seen.len() >= total {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    let unique: HashSet<&String> = consumer.seen.iter().collect();
    assert_eq!(unique.len(), consumer.seen.len(), "an event was repeated");
    let in_commit_order: Vec<String> =
        sqlx::query_scalar("SELECT id FROM events WHERE account_id = $1 ORDER BY txid, seq")
            .bind(&app.account_id)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(consumer.seen, in_commit_order, "an event was skipped");
}

/// An event the feed does not list yet (an older transaction is still running) can be read by its
/// id, but is no cursor: an event of that older transaction may still commit behind it.
#[api_test]
async fn an_event_the_feed_does_not_list_yet_is_readable_but_no_cursor() {
    let app = TestApp::spawn().await;
    let template = app.get_payment(&app.paid(1).await).await.json();
    feed(&app, 1).await;
    let (held, _) = hold_an_event(&app, &template).await;
    app.paid(2).await;
    let newest: String = sqlx::query_scalar("SELECT id FROM events ORDER BY seq DESC LIMIT 1")
        .fetch_one(&app.db)
        .await
        .unwrap();

    let read = app.get(&format!("/v1/events/{newest}")).await;
    let paged = app.get(&format!("/v1/events?ending_before={newest}")).await;

    assert_eq!(read.status, 200);
    paged.assert_problem(404, "not-found");
    held.commit().await.unwrap();
    feed(&app, 3).await;
    let paged = app.get(&format!("/v1/events?ending_before={newest}")).await;
    assert_eq!(paged.status, 200);
}

/// A consumer of the feed: the ids it read, oldest first, and the newest as its cursor.
#[derive(Clone, Default)]
struct Consumer {
    seen: Vec<String>,
}

impl Consumer {
    /// Polls forward until no newer event is listed, a few events a page.
    async fn catch_up(&mut self, app: &TestApp) -> &Self {
        loop {
            let path = match self.seen.last() {
                Some(newest) => format!("/v1/events?limit=7&ending_before={newest}"),
                None => "/v1/events?limit=7".to_owned(),
            };
            let page = app.get(&path).await;
            page.assert_status(200);
            let page = page.json();
            let data = page["data"].as_array().unwrap();
            let ids = data
                .iter()
                .rev()
                .map(|event| event["id"].as_str().unwrap().to_owned());
            let first_page = self.seen.is_empty();
            self.seen.extend(ids);
            // Without a cursor the page is the newest events: the consumer starts from the
            // oldest, so it reads back to the beginning first.
            if first_page && page["has_more"] == true {
                self.seen.clear();
                self.read_from_the_beginning(app).await;
                continue;
            }
            if page["has_more"] != true {
                return self;
            }
        }
    }

    /// Pages back from the newest event to the oldest, then keeps them oldest first.
    async fn read_from_the_beginning(&mut self, app: &TestApp) {
        let mut path = "/v1/events?limit=7".to_owned();
        let mut newest_first = Vec::new();
        loop {
            let page = app.get(&path).await.json();
            let data = page["data"].as_array().unwrap();
            newest_first.extend(
                data.iter()
                    .map(|event| event["id"].as_str().unwrap().to_owned()),
            );
            if page["has_more"] != true {
                break;
            }
            path = format!(
                "/v1/events?limit=7&starting_after={}",
                newest_first.last().unwrap()
            );
        }
        newest_first.reverse();
        self.seen = newest_first;
    }
}

/// Begins a transaction on the test's database that takes its id and writes an event (a copy of
/// `payment`'s), and leaves it open.
async fn hold_an_event(
    app: &TestApp,
    payment: &Value,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, String) {
    let mut tx = idempotency::connections::begin(&app.db).await.unwrap();
    let id = format!("evt_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
    let body = json!({
        "id": id,
        "object": "event",
        "type": "payment.succeeded",
        "created_at": payment["created_at"],
        "data": { "object": payment },
    });
    sqlx::query(
        "INSERT INTO events (id, account_id, type, body) VALUES ($1, $2, 'payment.succeeded', $3)",
    )
    .bind(&id)
    .bind(&app.account_id)
    .bind(serde_json::to_vec(&body).unwrap())
    .execute(&mut *tx)
    .await
    .unwrap();
    (tx, id)
}

/// `writers` clients each make `payments` payments one after another, while the consumer polls.
async fn write_while_polling(
    app: &TestApp,
    consumer: &mut Consumer,
    writers: usize,
    payments: usize,
) {
    let writing = join_all((0..writers).map(|_| async {
        for _ in 0..payments {
            let answer = app.post_payment(&new_key(), &payment(100)).await;
            assert_eq!(answer.status, 201);
        }
    }));
    let (_, _) = tokio::join!(writing, consumer.catch_up(app));
    consumer.catch_up(app).await;
}

/// The account's events the feed lists, newest first, once it lists `count` of them: the feed
/// lists an event once every transaction older than its own has ended, anywhere on the database
/// server, so it may lag the change a moment. Here that server is the whole suite's, where other
/// tests hold transactions open on purpose (a lock for a request to wait on), for seconds on a
/// loaded run: the wait allows 30 s, the longest a service session may sit idle in a transaction,
/// and a feed still short by then names the oldest transactions that held it back.
async fn feed(app: &TestApp, count: i64) -> Vec<Value> {
    let wanted = usize::try_from(count).unwrap();
    let listed = holds_within(Duration::from_secs(30), || async {
        let page = app.get("/v1/events?limit=100").await.json();
        page["data"].as_array().unwrap().len() >= wanted
    })
    .await;
    if !listed {
        let oldest: Vec<(Option<String>, Option<String>, f64, String)> = sqlx::query_as(
            "SELECT datname::text, application_name,
                    extract(epoch FROM now() - xact_start)::float8, left(query, 100)
             FROM pg_stat_activity WHERE backend_xid IS NOT NULL
             ORDER BY xact_start LIMIT 3",
        )
        .fetch_all(&app.db)
        .await
        .unwrap();
        panic!("the feed does not list {count} events within 30 s; oldest writers: {oldest:?}");
    }
    let page = app.get("/v1/events?limit=100").await.json();
    assert_eq!(page["has_more"], false);
    page["data"].as_array().unwrap().clone()
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().unwrap())
        .collect()
}

async fn event_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(&app.db)
        .await
        .unwrap()
}
