//! Exactly once across two hops, the charge: a processor losing answers, idempay giving up before
//! the processor answers, a retry storm across three instances, and a charge made while idempay's
//! pool is exhausted. The setup is `two_hops.rs`'s.

use std::time::Duration;

use ::processor::Fraction;
use client::{Client, NewPayment};
use futures::StreamExt;
use idempay::config::Settings;
use idempay_test_macros::api_test;

use super::two_hops::{
    assert_ledgers_agree, charge_under_way, faulty, idempay_and_processor, instance_env, key_row,
    sent_into_the_window, the_charge, waiting_at_most,
};
use crate::processor;
use crate::support::helpers::{
    new_key, one_storm_at_a_time, payment, retry_while_in_flight, wait_until,
};
use crate::support::instance::{Instance, LogFile};

/// The line idempay logs each time one request asks the processor again about a charge whose
/// answer did not arrive: the evidence that a processor "losing answers" lost some.
const ASKED_AGAIN: &str = "charge outcome unknown; asking again";

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
            &[("RUST_LOG", "warn,idempay::downstream::client=info")],
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
// idempay gives up before the processor does
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn a_charge_slower_than_the_processor_timeout_is_recorded_by_the_retry_once() {
    let (app, processor) = idempay_and_processor(
        waiting_at_most(Duration::from_millis(300)),
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

    retry.assert_status(201);
    assert_eq!(
        retry.json()["charge"],
        charge.as_str(),
        "that charge, recorded"
    );
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
///
/// Each step waits for an event, not a duration: the processor's charge is held at its insert by
/// a lock the test takes on its ledger, and let go only once the lot's connection is taken (with a
/// slow card of 3 s instead, a loaded machine set up the lot after the charge was recorded).
#[api_test]
async fn a_charge_made_while_the_pool_is_exhausted_is_recorded_by_the_retry_without_a_second_charge()
 {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    // Reads of the ledger go on; the processor's insert of the charge waits for this transaction.
    let mut ledger = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("LOCK TABLE processor_charges IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *ledger)
        .await
        .unwrap();
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
    let body = payment(100);
    // The instance's one connection may be busy with its background work when the payment comes:
    // a 503 before the charge is resent, as a client would (`sent_into_the_window`).
    let charging = sent_into_the_window(
        &app,
        "the processor's charge waits at its insert for the ledger's lock",
        || {
            instance
                .payment_request(&app.api_key, &key, &body)
                .timeout(crate::support::instance::ANSWER_WITHIN)
        },
        || app.a_statement_waits("%INSERT INTO processor_charges%"),
    )
    .await;
    assert!(charge_under_way(&app, &key).await);

    // A refund's reservation takes the lot's only connection and waits there: the test's own
    // transaction inserted the same key under the same scope and keeps it uncommitted, so the
    // reservation's insert waits to learn whether that row will exist. The processor's statements
    // are not held up. The refund names no payment, so it makes nothing once it runs.
    let held = new_key();
    let mut lock = idempotency::connections::begin(&app.db).await.unwrap();
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
    ledger.commit().await.unwrap();

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
    let retry = retry_while_in_flight(|| instance.post_payment(&app.api_key, &key, &body)).await;
    retry.assert_status(201);
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
        &[("RUST_LOG", "warn,idempay::downstream::client=info")],
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
