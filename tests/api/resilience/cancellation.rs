//! Requests dropped at the worst moment: while PostgreSQL's answer to their `BEGIN` is on its way.
//! A proxy between the service and the database holds that answer back ([`PgProxy`]); the client
//! hangs up (or the service's request timeout answers for it) while it is held; then the answer
//! goes through. Whatever the route, no backend of the service is left idle inside a transaction,
//! a write acknowledged afterwards is seen by another session at once, and nothing answers 500.
//!
//! The pool has one connection, so the connection the dropped request held is the one every later
//! statement runs on: a connection left inside a transaction could not hide among others. The
//! background jobs run hourly, so the `BEGIN` held is the request's. Each test proves the drop hit
//! its window: the client gave up while the answer was held, and what the request would have
//! written is not there once the answer went through.

use std::time::Duration;

use ::service::shared_settings::SharedArgs;
use futures::StreamExt;
use idempay::config::Settings;
use idempay::db::PoolLimits;
use idempay_test_macros::api_test;
use processor::ProcessorSettings;
use serde_json::json;
use service::outbox::WebhookSecrets;
use sqlx::PgPool;

use crate::processor::{API_KEY, TestProcessor, charge};
use crate::support::helpers::{
    TestApp, new_key, one_storm_at_a_time, payment, retry_while_in_flight,
};
use crate::support::pg_proxy::{PgProxy, Said};

/// How long a client waits before it hangs up: well inside the held answer.
const HANG_UP_AFTER: Duration = Duration::from_millis(300);

/// One connection, and a short wait for it: a request that finds the only connection lost to a
/// stranger's transaction fails within the test instead of hanging.
fn one_connection() -> PoolLimits {
    PoolLimits {
        max_connections: 1,
        acquire_timeout: Duration::from_secs(3),
    }
}

/// Jobs that run hourly: nothing but the test's requests sends a `BEGIN` meanwhile.
fn quiet_shared(secret: Option<WebhookSecrets>) -> SharedArgs {
    SharedArgs {
        expiry_interval: Duration::from_secs(3600),
        webhook_secrets: secret,
        ..SharedArgs::default()
    }
}

fn quiet_settings(secret: Option<WebhookSecrets>) -> Settings {
    Settings {
        shared: quiet_shared(secret),
        recovery_interval: Duration::from_secs(3600),
        webhook_poll_interval: Duration::from_secs(3600),
        ..Settings::default()
    }
}

/// Lets the jobs' first runs at start and the deliveries of the set-up's events finish: after it,
/// nothing but the test's request sends a `BEGIN`.
async fn quiet_down() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Asserts that the held `BEGIN` was the dropped request's: once its answer came, nobody awaited
/// the transaction any more and it was rolled back, before any other statement on its connection.
fn its_owner_was_gone(proxy: &PgProxy) {
    let sent = proxy.sent_after_held();
    assert_eq!(
        sent.first().map(String::as_str),
        Some("ROLLBACK"),
        "after the held BEGIN its connection sent {sent:?}"
    );
}

/// Backends of the database `db` is on, other than `db`'s own, idle inside a transaction.
async fn idle_in_transaction(db: &PgPool) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT application_name, state FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state LIKE 'idle in transaction%'",
    )
    .fetch_all(db)
    .await
    .unwrap()
}

/// Lets the held answer through, then asserts that within 2 s no backend is idle in a
/// transaction (the service had to notice the stray transaction and end it or close its
/// connection; left alone, the session's own timeout would take 30 s).
async fn release_and_check(proxy: &PgProxy, db: &PgPool) {
    proxy.release();
    let mut left = Vec::new();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = idle_in_transaction(db).await;
        if left.is_empty() {
            return;
        }
    }
    panic!(
        "backends idle in a transaction 2 s after the dropped request's BEGIN was answered: \
         {left:?}; the held connection then sent {:?}",
        proxy.sent_after_held()
    );
}

/// Sends `request` from a client that gives up after [`HANG_UP_AFTER`], asserts that it hung up
/// while the proxy held the answer to `held` (the window the test aims at), gives the server a
/// moment to notice the closed connection and drop the request, then lets the answer through and
/// checks that nothing was left inside a transaction ([`release_and_check`]).
async fn hang_up_while_held(
    proxy: &PgProxy,
    db: &PgPool,
    request: reqwest::RequestBuilder,
    held: &str,
) {
    let gave_up = request.timeout(HANG_UP_AFTER).send().await;
    assert!(
        gave_up.is_err_and(|error| error.is_timeout()),
        "the client hung up"
    );
    assert!(proxy.is_holding(), "while the answer to {held} was held");
    tokio::time::sleep(Duration::from_millis(200)).await;
    release_and_check(proxy, db).await;
}

/// A webhook event signed with `secret`, posted with a client that gives up after `patience`.
fn webhook(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    payment: &str,
    patience: Duration,
) -> reqwest::RequestBuilder {
    let data = json!({ "payment": payment, "dispute": format!("dp_{id}"), "amount": 100 });
    signed(app, secret, id, "dispute.created", &data, patience)
}

/// Event `id` of `kind` about `data`, signed with `secret`, posted with a client that gives up
/// after `patience`.
fn signed(
    app: &TestApp,
    secret: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: &serde_json::Value,
    patience: Duration,
) -> reqwest::RequestBuilder {
    let body = serde_json::to_vec(&json!({
        "type": kind,
        "timestamp": chrono::Utc::now(),
        "data": data,
    }))
    .unwrap();
    let now = chrono::Utc::now().timestamp();
    app.client()
        .post(app.url("/v1/webhooks/processor"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", now)
        .header("webhook-signature", secret.sign(id, now, &body).unwrap())
        .timeout(patience)
        .body(body)
}

async fn recorded_events(app: &TestApp, id: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM processed_events WHERE id = $1")
        .bind(id)
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// A webhook app whose pool goes through a proxy, with a payment to dispute.
async fn webhook_app(
    settings: impl FnOnce(WebhookSecrets) -> Settings,
) -> (TestApp, PgProxy, WebhookSecrets, String) {
    let secret = WebhookSecrets::generate();
    let proxy = PgProxy::to(&crate::support::harness::database_url("postgres")).await;
    let app = TestApp::spawn_reaching(settings(secret.clone()), one_connection(), |url| {
        proxy.url(url)
    })
    .await;
    let paid = app.paid(5000).await;
    quiet_down().await;
    (app, proxy, secret, paid)
}

/// After the dropped event, another one is acknowledged and at once seen from another session.
/// Delivered as the processor does: again while it is answered 503 (an app whose request timeout
/// is short answers so on a loaded machine), never given up on.
async fn a_later_event_is_applied_and_seen(app: &TestApp, secret: &WebhookSecrets, paid: &str) {
    let mut later = None;
    for _ in 0..20 {
        let answer = webhook(app, secret, "evt_after", paid, Duration::from_secs(10))
            .send()
            .await
            .unwrap();
        if answer.status() != 503 {
            later = Some(answer);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let later = later.expect("the event is answered other than 503 within 20 deliveries");
    assert_eq!(later.status(), 200, "{}", later.text().await.unwrap());
    assert_eq!(
        recorded_events(app, "evt_after").await,
        1,
        "an acknowledged event is seen by another session"
    );
    assert!(idle_in_transaction(&app.db).await.is_empty());
}

#[api_test]
async fn webhook_intake_dropped_by_a_client_hanging_up_mid_begin_leaves_no_transaction_open() {
    let (app, proxy, secret, paid) = webhook_app(|secret| quiet_settings(Some(secret))).await;
    proxy.hold_answer_to_begin();

    hang_up_while_held(
        &proxy,
        &app.db,
        webhook(&app, &secret, "evt_dropped", &paid, HANG_UP_AFTER),
        "the intake's BEGIN",
    )
    .await;
    its_owner_was_gone(&proxy);
    assert_eq!(
        recorded_events(&app, "evt_dropped").await,
        0,
        "the request was dropped before its transaction wrote anything"
    );
    a_later_event_is_applied_and_seen(&app, &secret, &paid).await;
}

/// The intake's look for parked events, after its commit, is no longer the sender's to cancel. A
/// dispute's change waits parked (delivered before the dispute); then the dispute's creation, whose
/// sender hangs up after the intake committed it, while PostgreSQL's answer to the intake's look
/// for the events waiting on the dispute is held. Once the answer goes through, the waiting
/// change is applied, by nobody's request: no event waits an hour for the sweep, and
/// `idempay reconcile` names none meanwhile.
#[api_test]
async fn a_sender_that_hangs_up_after_the_intake_committed_leaves_no_event_parked() {
    let (app, proxy, secret, paid) = webhook_app(|secret| quiet_settings(Some(secret))).await;
    let dispute = |extra: serde_json::Value| {
        let mut data = json!({ "payment": paid, "dispute": "dp_later", "amount": 100 });
        data.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        data
    };
    let reviewed = dispute(json!({ "status": "under_review" }));
    let early = signed(
        &app,
        &secret,
        "evt_reviewed",
        "charge.dispute.updated",
        &reviewed,
        Duration::from_secs(10),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(early.status(), 200);
    let early: serde_json::Value = early.json().await.unwrap();
    assert_eq!(early["outcome"], "parked");

    proxy.hold_answer_to(|sql: &str| sql.contains("FROM parked_events WHERE object"));
    let created = signed(
        &app,
        &secret,
        "evt_opened",
        "dispute.created",
        &dispute(json!({})),
        HANG_UP_AFTER,
    )
    .send()
    .await;
    let created = match created {
        Err(error) => error,
        Ok(answer) => panic!(
            "answered {}: {}",
            answer.status(),
            answer.text().await.unwrap()
        ),
    };
    assert!(created.is_timeout(), "the sender hung up: {created}");
    assert!(
        proxy.is_holding(),
        "while the answer to the intake's look was held"
    );
    assert_eq!(
        recorded_events(&app, "evt_opened").await,
        1,
        "the intake had committed the dispute's creation: the window is after the commit"
    );
    assert_eq!(parked_events(&app.db).await, ["evt_reviewed"]);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.release();

    let mut waiting = parked_events(&app.db).await;
    for _ in 0..50 {
        if waiting.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        waiting = parked_events(&app.db).await;
    }
    assert!(
        waiting.is_empty(),
        "the change waiting for the dispute is applied once the look's answer came, though its \
         request was gone: still parked {waiting:?}"
    );
    let applied = app.get("/v1/disputes/dp_later").await.json();
    assert_eq!(applied["status"], "under_review", "{applied}");
    assert!(idle_in_transaction(&app.db).await.is_empty());
}

async fn parked_events(db: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT id FROM parked_events ORDER BY id")
        .fetch_all(db)
        .await
        .unwrap()
}

#[api_test]
async fn webhook_intake_cut_short_by_the_request_timeout_mid_begin_leaves_no_transaction_open() {
    let (app, proxy, secret, paid) = webhook_app(|secret| Settings {
        request_timeout: HANG_UP_AFTER,
        ..quiet_settings(Some(secret))
    })
    .await;
    proxy.hold_answer_to_begin();

    let timed_out = webhook(
        &app,
        &secret,
        "evt_timed_out",
        &paid,
        Duration::from_secs(10),
    )
    .send()
    .await
    .unwrap();

    assert_eq!(
        timed_out.status(),
        503,
        "the service's request timeout answered"
    );
    assert!(
        proxy.is_holding(),
        "while the answer to the intake's BEGIN was held"
    );
    release_and_check(&proxy, &app.db).await;
    its_owner_was_gone(&proxy);
    assert_eq!(recorded_events(&app, "evt_timed_out").await, 0);
    a_later_event_is_applied_and_seen(&app, &secret, &paid).await;
}

#[api_test]
async fn a_processor_route_dropped_mid_begin_leaves_no_transaction_open() {
    let proxy = PgProxy::to(&crate::support::harness::database_url("postgres")).await;
    let processor = TestProcessor::spawn_reaching(
        ProcessorSettings {
            shared: quiet_shared(None),
            ..crate::processor::settings()
        },
        one_connection(),
        |url| proxy.url(url),
    )
    .await;
    let charged = processor
        .charge(&new_key(), &charge(5000, "pm_card_visa"))
        .await;
    assert_eq!(charged.status, 201);
    let charge_id = charged.json()["id"].as_str().unwrap().to_owned();
    let disputes = format!("{}/v1/charges/{charge_id}/disputes", processor.address);
    let client = reqwest::Client::new();
    quiet_down().await;
    proxy.hold_answer_to_begin();

    hang_up_while_held(
        &proxy,
        &processor.db,
        client
            .post(&disputes)
            .bearer_auth(API_KEY)
            .json(&json!({ "amount": 100 })),
        "the dispute's BEGIN",
    )
    .await;
    its_owner_was_gone(&proxy);
    assert_eq!(
        processor.count("processor_disputes").await,
        0,
        "the dropped dispute wrote nothing"
    );
    let opened = client
        .post(&disputes)
        .bearer_auth(API_KEY)
        .json(&json!({ "amount": 200 }))
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), 201, "{}", opened.text().await.unwrap());
    assert_eq!(
        processor.count("processor_disputes").await,
        1,
        "seen by another session"
    );
    assert!(idle_in_transaction(&processor.db).await.is_empty());
}

#[api_test]
async fn a_keyed_refund_whose_client_hangs_up_mid_begin_completes_and_replays() {
    let proxy = PgProxy::to(&crate::support::harness::database_url("postgres")).await;
    let app =
        TestApp::spawn_reaching(quiet_settings(None), one_connection(), |url| proxy.url(url)).await;
    let paid = app.paid(5000).await;
    let (key, body) = (new_key(), json!({ "amount": 1200 }));
    let refunds = format!("/v1/payments/{paid}/refunds");
    quiet_down().await;
    proxy.hold_answer_to_begin();

    hang_up_while_held(
        &proxy,
        &app.db,
        app.keyed_post_as(&app.api_key, &refunds, &key, &body),
        "a BEGIN of the refund's",
    )
    .await;
    // The keyed work runs to completion in a task of its own, so the held BEGIN's owner went on
    // (the processor's refund under its key, or idempay's record of it)...
    let sent = proxy.sent_after_held();
    assert!(
        sent.first()
            .is_some_and(|next| next.contains("refund") || next.contains("processor_charges")),
        "after the held BEGIN its connection sent {sent:?}"
    );
    // ...and the retry with the same key is the refund's replay.
    let retried =
        retry_while_in_flight(|| app.send(app.keyed_post_as(&app.api_key, &refunds, &key, &body)))
            .await;
    retried.assert_status(201);
    assert!(retried.replayed());
    let refunds_made: i64 = sqlx::query_scalar("SELECT count(*) FROM refunds")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(refunds_made, 1);
    assert!(idle_in_transaction(&app.db).await.is_empty());
}

#[api_test]
async fn a_list_whose_client_hangs_up_mid_query_leaves_the_connection_clean() {
    let proxy = PgProxy::to(&crate::support::harness::database_url("postgres")).await;
    let app =
        TestApp::spawn_reaching(quiet_settings(None), one_connection(), |url| proxy.url(url)).await;
    let paid = app.paid(1200).await;
    quiet_down().await;
    // The list's page query (its position query runs only with a cursor).
    proxy.hold_answer_to(|sql: &str| sql.contains("FROM payments") && sql.contains("ORDER BY"));

    hang_up_while_held(
        &proxy,
        &app.db,
        app.client()
            .get(app.url("/v1/payments"))
            .bearer_auth(&app.api_key),
        "the list's query",
    )
    .await;
    let listed = app
        .send(
            app.client()
                .get(app.url("/v1/payments"))
                .bearer_auth(&app.api_key),
        )
        .await;
    listed.assert_status(200);
    assert_eq!(listed.json()["data"][0]["id"], paid.as_str());
    let another = app.paid(1300).await;
    assert_eq!(
        app.payment_count().await,
        2,
        "{another} is seen by another session"
    );
    assert!(idle_in_transaction(&app.db).await.is_empty());
}

/// Backends of the database `db` is on, other than `db`'s own, idle in a transaction opened more
/// than `open_for` ago.
async fn idle_in_a_transaction_open_for(db: &PgPool, open_for: Duration) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT application_name, left(query, 200) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND state LIKE 'idle in transaction%'
           AND xact_start < now() - make_interval(secs => $1)",
    )
    .bind(open_for.as_secs_f64())
    .fetch_all(db)
    .await
    .unwrap()
}

/// What a request of the storm was, and what it was answered.
enum Answered {
    Payment(String),
    Event(String),
    HungUp,
}

/// With every answer of the database 40 ms late, 1,500 requests (new payments and webhook events, 16 at a time)
/// from clients that hang up at moments spread over each request's life (10 ms to 2 s in): none is answered 500, no
/// backend is idle in a transaction opened over 2 s before, PostgreSQL never says "there is
/// already a transaction in progress" nor refuses a statement of a failed one (25P02), and every
/// payment and event answered 2xx is still there 33 s later, past the sessions'
/// `idle_in_transaction_session_timeout` (30 s), which would have rolled back a write acknowledged
/// inside a stray transaction.
#[api_test]
async fn a_storm_of_hang_ups_over_a_slow_database_link_leaves_nothing_inside_a_transaction() {
    const REQUESTS: usize = 1_500;
    let _alone = one_storm_at_a_time().await;
    let secret = WebhookSecrets::generate();
    let proxy = PgProxy::to(&crate::support::harness::database_url("postgres")).await;
    let app = TestApp::spawn_reaching(
        Settings {
            shared: SharedArgs {
                webhook_secrets: Some(secret.clone()),
                ..SharedArgs::default()
            },
            ..Settings::default()
        },
        PoolLimits::default(),
        |url| proxy.url(url),
    )
    .await;
    let paid = app.paid(5_000).await;
    proxy.delay_answers(Duration::from_millis(40));

    let answers: Vec<Answered> = futures::stream::iter(0..REQUESTS)
        .map(|i| {
            let (app, secret, paid) = (&app, &secret, &paid);
            async move {
                // From 10 ms (before the first statement's answer) to 2 s (after most answers, on a
                // machine busy with the rest of the suite too).
                let patience = Duration::from_millis(10 + (i as u64 * 7_919) % 1_990);
                let request = if i % 2 == 0 {
                    app.keyed_post_as(
                        &app.api_key,
                        "/v1/payments",
                        &new_key(),
                        &payment(100 + i as i64),
                    )
                    .timeout(patience)
                } else {
                    webhook(app, secret, &format!("evt_storm_{i}"), paid, patience)
                };
                let Ok(response) = request.send().await else {
                    return Answered::HungUp;
                };
                let status = response.status().as_u16();
                let body: serde_json::Value = response.json().await.unwrap_or_default();
                assert!(status < 500 || status == 503, "answered {status}: {body}");
                match (status, i % 2) {
                    (201, 0) => Answered::Payment(body["id"].as_str().unwrap().to_owned()),
                    (200, 1) => Answered::Event(format!("evt_storm_{i}")),
                    _ => Answered::HungUp,
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    proxy.delay_answers(Duration::ZERO);

    let (mut payments, mut events) = (Vec::new(), Vec::new());
    for answer in answers {
        match answer {
            Answered::Payment(id) => payments.push(id),
            Answered::Event(id) => events.push(id),
            Answered::HungUp => {}
        }
    }
    let hung_up = REQUESTS - payments.len() - events.len();
    eprintln!(
        "storm: {} payments answered 201, {} events answered 200, {hung_up} hung up or refused",
        payments.len(),
        events.len()
    );
    assert!(
        hung_up >= REQUESTS / 10,
        "only {hung_up} of {REQUESTS} clients hung up"
    );
    assert!(
        !payments.is_empty() && !events.is_empty(),
        "some were answered"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stray = idle_in_a_transaction_open_for(&app.db, Duration::from_secs(2)).await;
    assert!(
        stray.is_empty(),
        "backends idle in a transaction: {stray:?}"
    );
    assert_eq!(proxy.said(), Said::default(), "what PostgreSQL said");

    tokio::time::sleep(Duration::from_secs(33)).await;
    let kept_payments: i64 = sqlx::query_scalar("SELECT count(*) FROM payments WHERE id = ANY($1)")
        .bind(&payments)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let kept_events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM processed_events WHERE id = ANY($1)")
            .bind(&events)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(
        kept_payments as usize,
        payments.len(),
        "payments answered 201 are kept"
    );
    assert_eq!(
        kept_events as usize,
        events.len(),
        "events answered 200 are kept"
    );
    assert_eq!(proxy.said(), Said::default());
}

/// The pool's release check, alone: a connection handed back inside a transaction (here a raw
/// `BEGIN`, as a dropped future once left it) is closed, not lent again; one inside a failed
/// transaction too. The next borrower gets another backend, outside any transaction.
#[api_test]
async fn the_pool_closes_a_connection_handed_back_inside_a_transaction() {
    let app = TestApp::spawn().await;
    let pool = idempay::db::pool_with(&app.database_url(), one_connection()).expect("pool");
    for poison in ["BEGIN", "BEGIN; SELECT 1/0"] {
        let mut connection = pool.acquire().await.unwrap();
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        sqlx::raw_sql(poison).execute(&mut *connection).await.ok();
        drop(connection);
        let mut next = pool.acquire().await.unwrap();
        let other: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *next)
            .await
            .unwrap();
        assert_ne!(
            other, pid,
            "{poison}: the connection was closed, not lent again"
        );
        drop(next);
        assert!(
            idle_in_transaction(&app.db).await.is_empty(),
            "{poison}: no backend is left idle in a transaction"
        );
    }
}
