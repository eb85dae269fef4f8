//! Exactly once across two hops, recovery: idempay killed or losing its lease while the processor
//! charges or refunds, and the recovery jobs of several instances meeting one backlog. The setup
//! is `two_hops.rs`'s.

use std::time::Duration;

use idempay::config::Settings;
use idempay_test_macros::api_test;
use serde_json::json;

use super::two_hops::{
    assert_ledgers_agree, assert_reconcile_says, charge_under_way, doomed_and_survivor, faulty,
    idempay_and_processor, instance_env, key_row, kill_in_the_window, recovering_env,
    sent_into_the_window, the_charge, under_way,
};
use crate::support::checks::{count, keyed_post};
use crate::support::helpers::{
    new_key, one_storm_at_a_time, payment, retry_while_in_flight, send, slow_payment, wait_until,
};
use crate::support::instance::Instance;

// ---------------------------------------------------------------------------------------------
// idempay dies during the charge
// ---------------------------------------------------------------------------------------------

/// An instance killed with SIGKILL while the processor is charging, and no client retry: the
/// recovery job of `survivor` (already running beside it, or started after the kill) records the
/// charge; the client's later retry is answered by a replay of what it stored.
async fn killed_during_the_charge_is_recovered_without_a_retry(survivor_runs_beside: bool) {
    let (app, processor) = idempay_and_processor(
        Settings::default(),
        // Long enough to kill the instance while it runs, even on a loaded cluster: 3 s was not
        // (the instance answered before the kill). Below idempay's 10 s timeout.
        faulty(|s| s.shared.slow_charge = Duration::from_secs(6)),
    )
    .await;
    let recovering = recovering_env(&processor, "500ms");
    let mut doomed = Instance::start(&app.database_url(), &recovering).await;
    let mut survivor = None;
    if survivor_runs_beside {
        survivor = Some(Instance::start(&app.database_url(), &recovering).await);
    }
    let key = new_key();
    let slow = slow_payment(100);
    // The crash must hit the window: the charge under way at the processor (the recovery point
    // committed) and not yet recorded.
    let in_flight = sent_into_the_window(
        &app,
        "the charge under way at the processor",
        || doomed.payment_request(&app.api_key, &key, &slow),
        || charge_under_way(&app, &key),
    )
    .await;
    assert_eq!(app.payment_count().await, 0, "killed before the payment");
    kill_in_the_window(&mut doomed, in_flight).await;

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
        faulty(|s| s.shared.slow_charge = Duration::from_secs(3)),
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

    retry.assert_status(201);
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
// idempay dies during a refund
// ---------------------------------------------------------------------------------------------

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
    let (mut doomed, survivor) = doomed_and_survivor(&app, &processor).await;
    let paid = survivor
        .post_payment(&app.api_key, &new_key(), &payment(5000))
        .await;
    assert_eq!(paid.status, 201);
    let path = format!("/v1/payments/{}/refunds", paid.id());
    let key = new_key();
    let refund = |instance: &Instance| {
        keyed_post(
            &format!("{}{path}", instance.address),
            &app.api_key,
            &key,
            &json!({ "amount": 2000 }),
        )
    };
    // The crash must hit the window: the refund under way at the processor, not yet recorded.
    let in_flight = sent_into_the_window(
        &app,
        "the refund under way at the processor",
        || refund(&doomed),
        || {
            under_way(
                &app,
                "processor:POST /v1/charges/%/refunds",
                "refund.refund_requested",
                &key,
            )
        },
    )
    .await;
    let recorded = || async { count(&app.db, "SELECT count(*) FROM refunds").await };
    assert_eq!(recorded().await, 0, "killed before the refund was recorded");
    kill_in_the_window(&mut doomed, in_flight).await;

    wait_until("the recovery job records the refund", || async {
        recorded().await == 1
    })
    .await;
    let retry = send(refund(&survivor)).await;

    retry.assert_status(201);
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
    assert_reconcile_says(
        &app,
        &processor,
        "reconciled 1 charges, 1 payments, 1 refunds and 0 disputes: 0 difference(s)\n",
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// The recovery jobs of several instances share a backlog
// ---------------------------------------------------------------------------------------------

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

    let recovering = recovering_env(&processor, "300ms");
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(Instance::start(&app.database_url(), &recovering).await);
    }
    wait_until("the recovery jobs record every payment", || async {
        app.payment_count().await == KEYS as i64
    })
    .await;

    // Counted once each key's work completed, an instant after its payment commits.
    wait_until(
        "each key was resumed by a recovery job, and counted",
        || async {
            let mut recovered = 0.0;
            for instance in &instances {
                recovered += instance
                    .metrics()
                    .await
                    .value(r#"idempay_idempotency_outcomes_total{outcome="recovered"}"#)
                    .unwrap_or_default();
            }
            recovered >= KEYS as f64
        },
    )
    .await;
    for key in &keys {
        let (status, _, _) = key_row(&app, key).await.unwrap();
        assert_eq!(status, "completed", "{key}");
    }
    assert_ledgers_agree(&app, &processor, KEYS as i64).await;
}
