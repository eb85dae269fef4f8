//! Exactly once across two hops: idempay charges at a processor over HTTP, and the processor
//! misbehaves (it loses answers, refuses connections, fails, is slower than idempay waits, keeps
//! charging while idempay is killed or loses its lease, delivers its webhooks while idempay is
//! down). After each scenario the two ledgers agree: by the invariants as SQL, and by
//! `idempay reconcile` run as an operator runs it.
//!
//! The processor runs in the test process on the test's database, so that it outlives the idempay
//! instances killed here, can be restarted on the same port, and its ledger joins idempay's.

use std::time::Duration;

use client::{Client, NewPayment};
use futures::StreamExt;
use idempay::config::{ProcessorLink, Settings};
use idempay::processor::{Fraction, ProcessorSettings};
use idempay::webhooks::{RetrySchedule, WebhookSecrets};
use idempay_test_macros::api_test;
use serde_json::json;
use tokio::net::TcpListener;

use crate::processor::{self, API_KEY, TestProcessor};
use crate::support::helpers::{
    TestApp, holds_within, new_key, one_storm_at_a_time, payment, retry_while_in_flight, send,
    slow_payment, wait_until,
};
use crate::support::instance::{Instance, LogFile, free_port, idempay};
use crate::support::invariants::{assert_every_charge_recorded_once, assert_exactly_once};

/// The line idempay logs each time one request asks the processor again about a charge whose
/// answer did not arrive: the evidence that a processor "losing answers" lost some.
const ASKED_AGAIN: &str = "charge outcome unknown; asking again";

/// idempay's settings, calling the processor at `address`. Its recovery job is kept out of the
/// way: the scenarios that prove recovery run instances of their own.
pub(crate) fn linked_to(address: &str, settings: Settings) -> Settings {
    Settings {
        processor: ProcessorLink {
            url: Some(address.to_owned()),
            api_key: Some(API_KEY.to_owned()),
            ..settings.processor
        },
        recovery_interval: Duration::from_secs(60 * 60),
        ..settings
    }
}

/// idempay on a fresh database, and a processor with `processor` settings keeping its ledger in
/// that database; idempay calls it with `settings` (its link filled in).
pub(crate) async fn idempay_and_processor(
    settings: Settings,
    processor: ProcessorSettings,
) -> (TestApp, TestProcessor) {
    // The processor's port is bound first: idempay is built knowing its address, the processor
    // serving on the database idempay's test created.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", listener.local_addr().unwrap());
    let app = TestApp::spawn_with(linked_to(&address, settings)).await;
    let processor = TestProcessor::beside_on(&app, processor, listener).await;
    (app, processor)
}

/// Environment for an `idempay serve` process calling `processor`.
pub(crate) fn instance_env<'a>(
    processor: &'a TestProcessor,
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("IDEMPAY_PROCESSOR_URL", processor.address.as_str()),
        ("IDEMPAY_PROCESSOR_API_KEY", API_KEY),
    ];
    env.extend_from_slice(more);
    env
}

/// Runs `idempay reconcile` against `processor` over its list API and asserts it finds the two
/// ledgers equal: exit 0 and the one summary line, with `payments` charges and payments, and the
/// refunds and disputes idempay recorded.
pub(crate) async fn assert_reconciled(app: &TestApp, processor: &TestProcessor, payments: usize) {
    let (refunds, disputes): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM refunds), (SELECT count(*) FROM disputes)")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let output = reconcile(app, processor).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "reconcile found differences ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        format!(
            "reconciled {payments} charges, {payments} payments, {refunds} refunds and {disputes} disputes: 0 difference(s)\n"
        )
    );
}

pub(crate) async fn reconcile(app: &TestApp, processor: &TestProcessor) -> std::process::Output {
    idempay(
        &["reconcile"],
        &[
            ("DATABASE_URL", &app.database_url()),
            ("IDEMPAY_PROCESSOR_URL", &processor.address),
            ("IDEMPAY_PROCESSOR_API_KEY", API_KEY),
        ],
    )
    .await
}

/// The invariants as SQL, then reconcile: every scenario ends here.
pub(crate) async fn assert_ledgers_agree(app: &TestApp, processor: &TestProcessor, payments: i64) {
    assert_eq!(app.payment_count().await, payments, "payments");
    assert_eq!(app.charge_count().await, payments, "charges");
    assert_exactly_once(&app.db).await;
    assert_every_charge_recorded_once(&app.db).await;
    assert_reconciled(app, processor, payments as usize).await;
}

/// A processor's settings with these faults.
pub(crate) fn faulty(faults: impl FnOnce(&mut ProcessorSettings)) -> ProcessorSettings {
    let mut settings = processor::settings();
    faults(&mut settings);
    settings
}

/// The key row's state: its status, recovery point and downstream key.
pub(crate) async fn key_row(
    app: &TestApp,
    key: &str,
) -> Option<(String, Option<String>, Option<String>)> {
    sqlx::query_as(
        "SELECT status, recovery_point, downstream_key FROM idempotency_keys
         WHERE idem_key = $1 AND scope NOT LIKE 'processor:%'",
    )
    .bind(key)
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

/// Whether the payment under `key` is in the middle of its charge: its recovery point is committed
/// (the reservation records it) and the processor holds its own key for the charge's downstream
/// key, in progress: the call has reached the processor and is not answered yet.
pub(crate) async fn charge_under_way(app: &TestApp, key: &str) -> bool {
    sqlx::query_scalar(
        // The processor's key is looked up by the downstream key, not joined to idempay's: they
        // belong to other owners, so on Citus to other shards.
        "SELECT EXISTS (
             SELECT 1 FROM idempotency_keys p
             WHERE p.scope = 'processor:POST /v1/charges' AND p.status = 'in_progress'
               AND p.idem_key = (
                   SELECT k.downstream_key FROM idempotency_keys k
                   WHERE k.idem_key = $1 AND k.scope NOT LIKE 'processor:%'
                     AND k.recovery_point = 'payment.charge_requested'))",
    )
    .bind(key)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// The processor's only charge: its id and the idempotency key it was made with.
pub(crate) async fn the_charge(app: &TestApp) -> (String, String) {
    sqlx::query_as("SELECT id, idempotency_key FROM processor_charges")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// The port a processor serves on, to start another there once it stopped.
pub(crate) fn port_of(processor: &TestProcessor) -> u16 {
    processor
        .address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("the processor's port")
}

/// Binds `port` again once the processor that served there has let it go.
pub(crate) async fn rebind(port: u16) -> TcpListener {
    for _ in 0..200 {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            return listener;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("port {port} never came free");
}

/// A payment intent for the retrying client.
fn intent(amount: i64) -> NewPayment {
    NewPayment {
        amount,
        currency: "eur".to_owned(),
        ..NewPayment::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The processor loses answers
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn a_hundred_intents_through_a_processor_losing_30_percent_of_its_answers_charge_a_hundred_times()
 {
    const INTENTS: usize = 100;
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        faulty(|s| s.faults.lose_answers = Fraction::parse("0.3").unwrap()),
    )
    .await;
    // A process of its own, whose logs say each time an answer did not arrive.
    let (logs, log_file) = LogFile::create();
    let instance = Instance::start_logging_to(
        log_file,
        &app.database_url(),
        &instance_env(
            &processor,
            &[("RUST_LOG", "warn,idempay::processor::client=info")],
        ),
    )
    .await;
    let client = Client::new(&instance.address, &app.api_key);

    let answers: Vec<_> = futures::stream::iter(0..INTENTS)
        .map(|n| {
            let client = client.clone();
            async move { client.create_payment(&intent(100 + n as i64), None).await }
        })
        .buffer_unordered(8)
        .collect()
        .await;

    for answer in &answers {
        let answer = answer.as_ref().expect("every intent ends in a payment");
        assert_eq!(answer.status, 201);
    }
    let lost = logs.read().matches(ASKED_AGAIN).count();
    eprintln!("{lost} of {INTENTS} charges asked again after a lost answer");
    assert!(lost >= 10, "the processor did lose answers: {lost}");
    assert_ledgers_agree(&app, &processor, INTENTS as i64).await;
}

// ---------------------------------------------------------------------------------------------
// The processor is down, or failing
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn a_processor_refusing_connections_charges_nothing_and_releases_the_key_until_it_is_back() {
    const INTENTS: i64 = 5;
    // Nothing listens on the processor's port yet.
    let port = free_port();
    let address = format!("http://127.0.0.1:{port}");
    let app = TestApp::spawn_with(linked_to(&address, Settings::default())).await;
    let keys: Vec<String> = (0..INTENTS).map(|_| new_key()).collect();

    for (n, key) in keys.iter().enumerate() {
        let refused = app.post_payment(key, &payment(1000 + n as i64)).await;
        refused.assert_problem(503, "processor-unavailable");
        assert!(refused.header("retry-after").is_some());
        assert_eq!(key_row(&app, key).await, None, "the key is released");
    }
    assert_eq!(app.payment_count().await, 0);

    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    for (n, key) in keys.iter().enumerate() {
        let paid = app.post_payment(key, &payment(1000 + n as i64)).await;
        assert_eq!(paid.status, 201, "{}", String::from_utf8_lossy(&paid.body));
        assert!(
            !paid.replayed(),
            "nothing had been done: the retry executes"
        );
    }
    assert_ledgers_agree(&app, &processor, INTENTS).await;
}

#[api_test]
async fn a_processor_answering_503_leaves_the_outcome_unknown_and_the_retry_charges_once() {
    let (app, failing) = idempay_and_processor(
        Settings::default(),
        faulty(|s| s.faults.fail = Fraction::ALWAYS),
    )
    .await;
    let key = new_key();

    let unknown = app.post_payment(&key, &payment(4200)).await;

    unknown.assert_problem(503, "processor-outcome-unknown");
    assert!(unknown.header("retry-after").is_some());
    // A 5xx may hide a charge: the key is kept at its recovery point, not released.
    let (status, point, _) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(
        (status.as_str(), point.as_deref()),
        ("in_progress", Some("payment.charge_requested"))
    );
    assert_eq!(app.charge_count().await, 0);

    // The processor is replaced by a healthy one on the same port and database.
    let port = port_of(&failing);
    failing.stop();
    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    let paid = app.post_payment(&key, &payment(4200)).await;

    assert_eq!(paid.status, 201, "{}", String::from_utf8_lossy(&paid.body));
    assert_ledgers_agree(&app, &processor, 1).await;
}

// ---------------------------------------------------------------------------------------------
// idempay gives up before the processor does
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn a_charge_slower_than_the_processor_timeout_is_recorded_by_the_retry_once() {
    let (app, processor) = idempay_and_processor(
        Settings {
            processor: ProcessorLink {
                timeout: Duration::from_millis(300),
                ..ProcessorLink::default()
            },
            ..Settings::default()
        },
        // Far beyond idempay's three attempts (300 ms, then two that find the key in flight).
        faulty(|s| s.faults.latency = Duration::from_secs(2)),
    )
    .await;
    let key = new_key();

    let unknown = app.post_payment(&key, &payment(4200)).await;

    unknown.assert_problem(503, "processor-outcome-unknown");
    assert!(unknown.header("retry-after").is_some());
    // idempay gave up; the processor did not: the charge it was asked for happens anyway.
    wait_until("the processor charges after the latency", || async {
        app.charge_count().await == 1
    })
    .await;
    assert_eq!(app.payment_count().await, 0, "not recorded yet");
    let (charge, charged_with) = the_charge(&app).await;
    let (_, point, downstream) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(point.as_deref(), Some("payment.charge_requested"));
    assert_eq!(downstream.as_deref(), Some(charged_with.as_str()));

    let retry = app.post_payment(&key, &payment(4200)).await;

    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(
        retry.json()["charge"],
        charge.as_str(),
        "that charge, recorded"
    );
    assert_ledgers_agree(&app, &processor, 1).await;
}

// ---------------------------------------------------------------------------------------------
// idempay dies during the charge
// ---------------------------------------------------------------------------------------------

/// An instance killed with SIGKILL while the processor is charging, and no client retry: the
/// recovery job of `survivor` (already running beside it, or started after the kill) records the
/// charge; the client's later retry is answered by a replay of what it stored.
async fn killed_during_the_charge_is_recovered_without_a_retry(survivor_runs_beside: bool) {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        // Long enough to kill the instance while it runs, even on a loaded machine.
        faulty(|s| s.slow_charge = Duration::from_secs(3)),
    )
    .await;
    let recovering = instance_env(
        &processor,
        &[
            ("IDEMPAY_LEASE", "3s"),
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
            ("IDEMPAY_RECOVERY_INTERVAL", "500ms"),
        ],
    );
    let mut doomed = Instance::start(&app.database_url(), &recovering).await;
    let mut survivor = None;
    if survivor_runs_beside {
        survivor = Some(Instance::start(&app.database_url(), &recovering).await);
    }
    let key = new_key();
    let slow = slow_payment(100);
    let in_flight = tokio::spawn(doomed.payment_request(&app.api_key, &key, &slow).send());

    // The crash must hit the window: the charge under way at the processor (the recovery point
    // committed) and not yet recorded.
    // 20 s: a loaded cluster (three nodes on two cores) has taken more than 10 s to get there.
    if !holds_within(Duration::from_secs(20), || charge_under_way(&app, &key)).await {
        let keys: Vec<(String, String, Option<String>, Option<String>)> = sqlx::query_as(
            "SELECT scope, status, recovery_point, downstream_key FROM idempotency_keys",
        )
        .fetch_all(&app.db)
        .await
        .unwrap();
        panic!(
            "the charge is not under way at the processor within 20 s; keys: {keys:?}, \
             payments: {}",
            app.payment_count().await
        );
    }
    assert_eq!(app.payment_count().await, 0, "killed before the payment");
    doomed.child.kill().await.expect("SIGKILL");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance never answered"
    );

    let survivor = match survivor {
        Some(survivor) => survivor,
        None => Instance::start(&app.database_url(), &recovering).await,
    };
    // No request: the recovery job resumes the key once the dead instance's lease runs out.
    wait_until("the recovery job records the payment", || async {
        app.payment_count().await == 1
    })
    .await;
    let (status, _, downstream) = key_row(&app, &key).await.unwrap();
    assert_eq!(status, "completed");
    let (charge, charged_with) = the_charge(&app).await;
    assert_eq!(
        downstream,
        Some(charged_with),
        "the charge the dead instance asked for"
    );

    let retry = survivor.post_payment(&app.api_key, &key, &slow).await;

    assert_eq!(retry.status, 201);
    assert!(
        retry.replayed(),
        "the retry is answered from the recovered key"
    );
    let stored: Vec<u8> = sqlx::query_scalar(
        "SELECT response_body FROM idempotency_keys WHERE idem_key = $1 AND status = 'completed'",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(retry.body, stored, "the response the recovery stored");
    assert_eq!(retry.json()["charge"], charge.as_str());
    assert_ledgers_agree(&app, &processor, 1).await;
}

#[api_test(citus)]
async fn an_instance_killed_during_the_charge_is_recovered_by_another_instance_without_a_retry() {
    killed_during_the_charge_is_recovered_without_a_retry(true).await;
}

#[api_test]
async fn an_instance_killed_during_the_charge_is_recovered_by_its_restart_without_a_retry() {
    killed_during_the_charge_is_recovered_without_a_retry(false).await;
}

// ---------------------------------------------------------------------------------------------
// idempay loses its lease during the charge
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn a_request_that_loses_its_lease_during_the_charge_and_its_takeover_name_one_charge() {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        faulty(|s| s.slow_charge = Duration::from_secs(3)),
    )
    .await;
    let key = new_key();
    let slow = slow_payment(100);
    let original = app.start_payment(&key, &slow).await;
    wait_until(
        "the original's charge is under way at the processor",
        || charge_under_way(&app, &key),
    )
    .await;

    // The original loses its lease while the processor charges (a new token), and the key is free
    // at once: the client's retry takes it over for real and resumes the recovery point.
    let taken = sqlx::query(
        "UPDATE idempotency_keys SET lock_token = gen_random_uuid(), locked_until = now()
         WHERE idem_key = $1 AND status = 'in_progress'",
    )
    .bind(&key)
    .execute(&app.db)
    .await
    .unwrap();
    assert_eq!(taken.rows_affected(), 1, "taken over while the charge ran");
    let retry = retry_while_in_flight(|| app.post_payment(&key, &slow)).await;
    let original = original.await.unwrap();

    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(
        original.status == 409 || original.replayed(),
        "the original, without its lease, recorded nothing: {} {}",
        original.status,
        String::from_utf8_lossy(&original.body)
    );
    let (charge, charged_with) = the_charge(&app).await;
    let (_, _, downstream) = key_row(&app, &key).await.unwrap();
    assert_eq!(
        downstream,
        Some(charged_with),
        "both holders sent the key's one downstream key"
    );
    assert_eq!(retry.json()["charge"], charge.as_str());
    assert_ledgers_agree(&app, &processor, 1).await;
}

// ---------------------------------------------------------------------------------------------
// A failure after the charge: the pool exhausted
// ---------------------------------------------------------------------------------------------

/// The trigger that refuses the payment's insert is `lifecycle`'s; here the charge cannot be
/// recorded because the instance's only connection for it is taken: the completion runs on the
/// lot (`db::Lot`, as many connections as the pool: one here), and another request's reservation
/// holds it, waiting on a key the test keeps uncommitted. The key is kept, and the retry records
/// the same charge.
#[api_test]
async fn a_charge_made_while_the_pool_is_exhausted_is_recorded_by_the_retry_without_a_second_charge()
 {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        faulty(|s| s.slow_charge = Duration::from_secs(3)),
    )
    .await;
    let instance = Instance::start(
        &app.database_url(),
        &instance_env(
            &processor,
            &[
                ("IDEMPAY_DATABASE_MAX_CONNECTIONS", "1"),
                ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "300ms"),
                ("IDEMPAY_LEASE", "3s"),
                ("IDEMPAY_RECOVERY_INTERVAL", "1h"),
            ],
        ),
    )
    .await;
    let key = new_key();
    let slow = slow_payment(100);
    let charging = tokio::spawn(
        instance
            .payment_request(&app.api_key, &key, &slow)
            .timeout(crate::support::instance::ANSWER_WITHIN)
            .send(),
    );
    wait_until("the charge is under way at the processor", || {
        charge_under_way(&app, &key)
    })
    .await;

    // A refund's reservation takes the lot's only connection and waits there: the test's own
    // transaction inserted the same key under the same scope and keeps it uncommitted, so the
    // reservation's insert waits to learn whether that row will exist. The processor's statements
    // are not held up. The refund names no payment, so it makes nothing once it runs.
    let held = new_key();
    let mut lock = app.db.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys
             (account_id, scope, idem_key, request_hash, status, lock_token, locked_until,
              expires_at)
         VALUES (split_part($1, ':', 1), $1, $2, sha256('held'), 'in_progress',
                 gen_random_uuid(), now() + interval '1 minute', now() + interval '1 day')",
    )
    .bind(format!(
        "{}:POST /v1/payments/{{id}}/refunds",
        app.account_id
    ))
    .bind(&held)
    .execute(&mut *lock)
    .await
    .unwrap();
    let holding = tokio::spawn(
        reqwest::Client::new()
            .post(format!(
                "{}/v1/payments/pay_Jx8bq2LkR5Vn0Ww3Zt7YcA1d/refunds",
                instance.address
            ))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", held.as_str())
            .header("Content-Type", "application/json")
            .body("{}")
            .send(),
    );
    app.until_a_statement_waits(
        "the refund's reservation waits on the uncommitted key, holding the lot's connection",
        "%ON CONFLICT (account_id, scope, idem_key) DO NOTHING%",
    )
    .await;
    // The connection was taken before the charge could be recorded: the failure comes after it.
    assert_eq!(app.payment_count().await, 0, "the window was hit");

    let failed = charging.await.unwrap().expect("an answer");
    lock.rollback().await.unwrap();
    holding.await.unwrap().ok();

    // 503, as any wait for a connection past the acquire timeout; the key is kept.
    assert_eq!(failed.status(), 503, "the charge could not be recorded");
    assert_eq!(app.charge_count().await, 1, "the processor charged");
    assert_eq!(app.payment_count().await, 0);
    let (status, point, _) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(
        (status.as_str(), point.as_deref()),
        ("in_progress", Some("payment.charge_requested"))
    );
    let retry = retry_while_in_flight(|| instance.post_payment(&app.api_key, &key, &slow)).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.json()["charge"], the_charge(&app).await.0.as_str());
    assert_ledgers_agree(&app, &processor, 1).await;
}

// ---------------------------------------------------------------------------------------------
// A retry storm across three instances
// ---------------------------------------------------------------------------------------------

#[api_test(citus)]
async fn three_instances_under_a_retry_storm_through_a_lossy_processor_charge_once_per_intent() {
    let _alone = one_storm_at_a_time().await;
    const INTENTS: usize = 40;
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        faulty(|s| {
            s.faults.lose_answers = Fraction::parse("0.3").unwrap();
            // The copies of a key overlap: while one instance charges, the others find it held.
            s.faults.latency = Duration::from_millis(300);
        }),
    )
    .await;
    let env = instance_env(
        &processor,
        &[("RUST_LOG", "warn,idempay::processor::client=info")],
    );
    let mut logs = Vec::new();
    let mut clients = Vec::new();
    let mut instances = Vec::new();
    for _ in 0..3 {
        let (log, file) = LogFile::create();
        let instance = Instance::start_logging_to(file, &app.database_url(), &env).await;
        clients.push(Client::new(&instance.address, &app.api_key));
        instances.push(instance);
        logs.push(log);
    }

    // Every intent's key sent to the three instances at once, each copy retried by the client.
    let outcomes: Vec<_> = futures::stream::iter(0..INTENTS)
        .map(|n| {
            let clients = clients.clone();
            async move {
                let key = Some(new_key());
                let order = intent(100 + n as i64);
                let (a, b, c) = tokio::join!(
                    clients[0].create_payment(&order, key.clone()),
                    clients[1].create_payment(&order, key.clone()),
                    clients[2].create_payment(&order, key.clone()),
                );
                [a, b, c].map(|answer| answer.expect("every copy ends in the payment"))
            }
        })
        .buffer_unordered(10)
        .collect()
        .await;

    let mut waited = 0;
    for copies in &outcomes {
        assert!(
            copies
                .iter()
                .all(|copy| copy.status == 201 && copy.value == copies[0].value),
            "the three copies learn of one payment: {copies:?}"
        );
        // At most one copy executed, the others were replays. None did when the processor lost
        // the executing copy's answer and an instance's recovery job (every 10 s) recorded the
        // charge first: then every copy's retry is answered by the replay. The ledgers below
        // prove one charge per intent either way.
        assert!(
            copies.iter().filter(|copy| !copy.replayed).count() <= 1,
            "at most one copy executed, the others were replays: {copies:?}"
        );
        waited += copies.iter().filter(|copy| copy.attempts > 1).count();
    }
    let lost: usize = logs
        .iter()
        .map(|log| log.read().matches(ASKED_AGAIN).count())
        .sum();
    eprintln!("retry storm: {waited} copies retried after a 409; {lost} answers lost");
    assert!(waited >= INTENTS, "copies raced and waited: {waited}");
    assert!(lost > 0, "the processor lost answers");
    assert_ledgers_agree(&app, &processor, INTENTS as i64).await;
}

// ---------------------------------------------------------------------------------------------
// Webhooks while idempay is down
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn events_delivered_while_idempay_is_down_are_redelivered_and_applied_once() {
    let secret = WebhookSecrets::generate();
    // The port idempay's intake will listen on; nothing listens there yet.
    let intake = free_port();
    let mut settings = processor::settings();
    settings.webhook_url = Some(format!("http://127.0.0.1:{intake}/v1/webhooks/processor"));
    settings.webhook_secrets = Some(secret.clone());
    // Retried every 200 ms for 20 s: longer than idempay is down.
    settings.webhook_retry_schedule =
        RetrySchedule::new(vec![Duration::from_millis(200); 100]).unwrap();
    let with_secret = Settings {
        webhook_secrets: Some(secret),
        ..Settings::default()
    };
    let (app, processor) = idempay_and_processor(with_secret.clone(), settings).await;
    let paid = app.post_payment(&new_key(), &payment(5000)).await;
    assert_eq!(paid.status, 201);
    let (payment_id, charge) = (paid.json()["id"].clone(), paid.json()["charge"].clone());
    let dispute = processor
        .post(
            &format!("/v1/charges/{}/disputes", charge.as_str().unwrap()),
            None,
            &json!({ "amount": 1500 }),
        )
        .await;
    assert_eq!(
        dispute.status,
        201,
        "{}",
        String::from_utf8_lossy(&dispute.body)
    );
    let attempted = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM webhook_deliveries WHERE attempts >= 2 AND delivered_at IS NULL",
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    wait_until("both events fail to be delivered, twice", || async {
        attempted().await == 2
    })
    .await;

    let receiving = app
        .another_instance_on(rebind(intake).await, with_secret)
        .await;
    let delivered = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NOT NULL",
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    wait_until("both events are redelivered to idempay", || async {
        delivered().await == 2
    })
    .await;
    let disputed = || async {
        receiving
            .get_payment(payment_id.as_str().unwrap())
            .await
            .json()["amount_disputed"]
            .clone()
    };
    assert_eq!(disputed().await, 1500);

    // Every event delivered again, with its webhook id: duplicates, applied once.
    sqlx::query("UPDATE webhook_deliveries SET delivered_at = NULL, next_attempt_at = now()")
        .execute(&app.db)
        .await
        .unwrap();
    wait_until("both events are delivered again", || async {
        delivered().await == 2
    })
    .await;
    let outcomes: Vec<(String, String)> =
        sqlx::query_as("SELECT type, outcome FROM processed_events ORDER BY type")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(outcomes.len(), 2, "one record per event: {outcomes:?}");
    assert!(
        outcomes.contains(&("charge.dispute.created".to_owned(), "applied".to_owned())),
        "{outcomes:?}"
    );
    assert_eq!(disputed().await, 1500, "the dispute applied once");
    let disputes: i64 = sqlx::query_scalar("SELECT count(*) FROM processor_disputes")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(disputes, 1);
    assert_ledgers_agree(&app, &processor, 1).await;
}

// ---------------------------------------------------------------------------------------------
// Reconcile finds what the invariants forbid
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn reconcile_names_every_difference_of_a_broken_ledger_and_exits_1() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    for amount in [1000, 2000] {
        assert_eq!(
            app.post_payment(&new_key(), &payment(amount)).await.status,
            201
        );
    }
    assert_reconciled(&app, &processor, 2).await;

    // A payment lost, and a charge no payment ever asked for.
    let lost: String =
        sqlx::query_scalar("DELETE FROM payments WHERE amount = 2000 RETURNING charge")
            .fetch_one(&app.db)
            .await
            .unwrap();
    sqlx::query(
        "INSERT INTO processor_charges (id, amount, currency, status, payment_method, idempotency_key)
         VALUES ('ch_stray', 777, 'eur', 'succeeded', 'pm_card_visa', 'stray')",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let output = reconcile(&app, &processor).await;

    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let mut lines: Vec<&str> = stdout.lines().collect();
    let summary = lines.pop();
    lines.sort_unstable();
    let mut expected = vec![
        format!("charge {lost} (2000) has no payment"),
        "charge ch_stray (777) has no payment".to_owned(),
    ];
    expected.sort_unstable();
    assert_eq!(lines, expected);
    assert_eq!(
        summary,
        Some("reconciled 3 charges, 1 payments, 0 refunds and 0 disputes: 2 difference(s)")
    );
}

// ---------------------------------------------------------------------------------------------
// Refunds take the second hop too
// ---------------------------------------------------------------------------------------------

/// A refund is made at the processor with its own downstream key, recorded with the processor's
/// refund id, and replayed; when the card network gives it back later, the processor's
/// `charge.refund.failed` reaches idempay, whose refund fails and whose amount is refundable again.
/// The ledgers agree at each step.
#[api_test]
async fn a_refund_the_processor_fails_later_is_refundable_again_and_the_ledgers_agree() {
    let secret = WebhookSecrets::generate();
    let intake = free_port();
    let mut settings = processor::settings();
    settings.webhook_url = Some(format!("http://127.0.0.1:{intake}/v1/webhooks/processor"));
    settings.webhook_secrets = Some(secret.clone());
    settings.webhook_retry_schedule =
        RetrySchedule::new(vec![Duration::from_millis(200); 100]).unwrap();
    let with_secret = Settings {
        webhook_secrets: Some(secret),
        ..Settings::default()
    };
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

    assert_eq!(
        refund.status,
        201,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
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
    let output = reconcile(&app, &processor).await;
    assert!(output.status.success(), "{output:?}");

    let failed = processor
        .post(
            &format!("/v1/refunds/{processor_refund}/failure"),
            None,
            &json!({}),
        )
        .await;
    assert_eq!(
        failed.status,
        200,
        "{}",
        String::from_utf8_lossy(&failed.body)
    );
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
    let output = reconcile(&app, &processor).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let whole = app.post_refund(&paid, &new_key(), &json!({})).await;
    assert_eq!(whole.status, 201, "the amount is refundable again, at both");
    assert_eq!(whole.json()["amount"], 5000);
    assert_exactly_once(&app.db).await;
}

/// A refund too: an instance killed while the processor makes it (the refund's recovery point
/// committed, the processor's own key for it in progress, no refund recorded), and no client
/// retry: the recovery job of another instance records the processor's refund, and the client's
/// later retry is its replay.
#[api_test(citus)]
async fn an_instance_killed_during_a_refund_is_recovered_by_another_instance_without_a_retry() {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        // Every charge and refund takes this long at the processor: long enough for the test to
        // see the refund under way and kill the instance before it is answered, on a loaded
        // cluster too.
        faulty(|s| s.faults.latency = Duration::from_secs(6)),
    )
    .await;
    let recovering = instance_env(
        &processor,
        &[
            ("IDEMPAY_LEASE", "3s"),
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
            ("IDEMPAY_RECOVERY_INTERVAL", "500ms"),
        ],
    );
    let mut doomed = Instance::start(&app.database_url(), &recovering).await;
    let survivor = Instance::start(&app.database_url(), &recovering).await;
    let paid = survivor
        .post_payment(&app.api_key, &new_key(), &payment(5000))
        .await;
    assert_eq!(paid.status, 201);
    let refunds = format!(
        "{}/v1/payments/{}/refunds",
        doomed.address,
        paid.json()["id"].as_str().unwrap()
    );
    let key = new_key();
    let refund = |base: &str| {
        reqwest::Client::new()
            .post(refunds.replace(&doomed.address, base))
            .bearer_auth(&app.api_key)
            .header("idempotency-key", &key)
            .json(&json!({ "amount": 2000 }))
    };
    let in_flight = tokio::spawn(refund(&doomed.address).send());

    wait_until("the refund is under way at the processor", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (
                 SELECT 1 FROM idempotency_keys p
                 WHERE p.scope LIKE 'processor:POST /v1/charges/%/refunds'
                   AND p.status = 'in_progress'
                   AND p.idem_key = (
                       SELECT k.downstream_key FROM idempotency_keys k
                       WHERE k.idem_key = $1 AND k.recovery_point = 'refund.refund_requested'))",
        )
        .bind(&key)
        .fetch_one(&app.db)
        .await
        .unwrap()
    })
    .await;
    let recorded = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM refunds")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    assert_eq!(recorded().await, 0, "killed before the refund was recorded");
    doomed.child.kill().await.expect("SIGKILL");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance never answered"
    );

    wait_until("the recovery job records the refund", || async {
        recorded().await == 1
    })
    .await;
    let retry = send(refund(&survivor.address)).await;

    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert!(retry.replayed(), "answered from the recovered key");
    let processor_refunds: Vec<String> = sqlx::query_scalar("SELECT id FROM processor_refunds")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(
        processor_refunds,
        [retry.json()["processor_refund"]
            .as_str()
            .unwrap()
            .to_owned()],
        "one refund at the processor, the one recorded"
    );
    let output = reconcile(&app, &processor).await;
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "reconciled 1 charges, 1 payments, 1 refunds and 0 disputes: 0 difference(s)\n"
    );
    assert!(output.status.success());
}

/// The recovery jobs of three instances meet one backlog of suspended keys: every charge the
/// processor made is recorded once, whichever job claims its key (`SKIP LOCKED`, the conditional
/// takeover), and every key is completed.
#[api_test]
async fn the_recovery_jobs_of_three_instances_record_a_backlog_of_suspended_keys_once() {
    let _alone = one_storm_at_a_time().await;
    const KEYS: usize = 10;
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        // Slower than idempay waits: every outcome is unknown when its request gives up.
        faulty(|s| s.faults.latency = Duration::from_millis(1500)),
    )
    .await;
    let impatient = Instance::start(
        &app.database_url(),
        &instance_env(
            &processor,
            &[
                ("IDEMPAY_PROCESSOR_TIMEOUT", "200ms"),
                ("IDEMPAY_RECOVERY_INTERVAL", "1h"),
            ],
        ),
    )
    .await;
    let keys: Vec<String> = (0..KEYS).map(|_| new_key()).collect();
    let body = payment(1000);
    let answers = futures::future::join_all(
        keys.iter()
            .map(|key| impatient.post_payment(&app.api_key, key, &body)),
    )
    .await;
    for answer in &answers {
        answer.assert_problem(503, "processor-outcome-unknown");
    }
    drop(impatient);
    wait_until("the processor has made every charge", || async {
        app.charge_count().await == KEYS as i64
    })
    .await;
    assert_eq!(app.payment_count().await, 0, "nothing recorded yet");

    let recovering = instance_env(
        &processor,
        &[
            ("IDEMPAY_LEASE", "3s"),
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
            ("IDEMPAY_RECOVERY_INTERVAL", "300ms"),
        ],
    );
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Instance::start(&app.database_url(), &recovering).await);
    }
    wait_until("the recovery jobs record every payment", || async {
        app.payment_count().await == KEYS as i64
    })
    .await;

    let mut recovered = 0.0;
    for instance in &instances {
        recovered += instance
            .metrics()
            .await
            .value(r#"idempay_idempotency_outcomes_total{outcome="recovered"}"#)
            .unwrap_or_default();
    }
    assert!(
        recovered >= KEYS as f64,
        "each key was resumed by a recovery job: {recovered}"
    );
    for key in &keys {
        let (status, _, _) = key_row(&app, key).await.unwrap();
        assert_eq!(status, "completed", "{key}");
    }
    assert_ledgers_agree(&app, &processor, KEYS as i64).await;
}

/// A dispute that arrives while a refund is at the processor takes what the payment has left;
/// the refund, made by then, is still recorded in full, and the disputed amount gives way to it:
/// refunded and disputed together never exceed the amount, and the dispute is flagged for review
/// (the money may leave twice).
#[api_test]
async fn a_refund_recorded_after_a_dispute_took_its_room_flags_the_dispute_for_review() {
    let secret = WebhookSecrets::generate();
    let (app, _processor) = idempay_and_processor(
        Settings {
            webhook_secrets: Some(secret.clone()),
            ..Settings::default()
        },
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
