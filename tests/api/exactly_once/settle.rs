//! The way out of a held key: `idempay keys settle` reads the processor's ledger under the key's
//! downstream key and completes the key with the answer its first request would have had, or, when
//! the processor made nothing, with a final `processor-made-nothing`; the client's retry then gets
//! it, replayed. Before it, a held key answered 409 forever: the customer charged, no payment, the
//! key never expiring.
//!
//! Each scenario leaves a key held as an operator finds it: the processor made the charge (or
//! refund) and its answer was lost, or it failed before making anything; the recovery window
//! passed; the processor is healthy again.

use std::time::Duration;

use ::processor::ProcessorSettings;
use idempay::config::Settings;
use idempay::db::PoolLimits;
use idempay_test_macros::api_test;

use super::early_events::{
    NOT_WITHIN_THE_TEST, delivering_events, dispute_at_the_processor, patiently,
};
use super::two_hops::{
    assert_ledgers_agree, failing, faulty, idempay_and_processor, key_column, key_row, linked_to,
    port_of, rebind, replace_processor, the_charge,
};
use crate::processor::{self, API_KEY, TestProcessor};
use crate::support::checks::count;
use crate::support::helpers::{TestApp, new_key, payment, wait_until};
use crate::support::instance::idempay;
use crate::support::pg_proxy::PgProxy;

/// The recovery window of these scenarios: long enough for the first request's attempts (the
/// processor's timeout is short) and for the processor's 1 s of latency before its calls'
/// deadline, a second before the window ends (`idempotency::CLOCK_MARGIN`); short enough to wait
/// out.
const WINDOW: Duration = Duration::from_secs(3);

fn settings() -> Settings {
    let mut settings = Settings {
        recovery_window: WINDOW,
        ..Settings::default()
    };
    settings.processor.timeout = Duration::from_millis(300);
    settings
}

/// A processor slower than idempay waits: the charge or refund is made after idempay gave up on
/// every attempt, so its outcome is unknown to idempay.
fn losing_answers() -> ProcessorSettings {
    faulty(|s| s.faults.latency = Duration::from_secs(1))
}

/// Waits out the recovery window, after which the key's retry finds it held.
async fn past_the_window() {
    tokio::time::sleep(WINDOW + Duration::from_millis(300)).await;
}

/// The payment under `key` is answered 503 `processor-outcome-unknown`, then, past the window,
/// held for an operator.
async fn hold_payment(app: &TestApp, key: &str) {
    app.post_payment(key, &payment(4200))
        .await
        .assert_problem(503, "processor-outcome-unknown");
    past_the_window().await;
    assert_held(app, key, app.post_payment(key, &payment(4200)).await).await;
}

/// The same for a refund of `payment_id`.
async fn hold_refund(app: &TestApp, payment_id: &str, key: &str, refund: &serde_json::Value) {
    app.post_refund(payment_id, key, refund)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    past_the_window().await;
    assert_held(app, key, app.post_refund(payment_id, key, refund).await).await;
}

/// The retry's answer: held for an operator, and the key row says so.
async fn assert_held(app: &TestApp, key: &str, retry: crate::support::helpers::TestResponse) {
    retry.assert_problem(409, "idempotency-key-held");
    let (status, _, _) = key_row(app, key).await.expect("kept");
    assert_eq!(status, "held");
}

/// `idempay keys settle KEY --account …` run as an operator runs it, against `processor`.
async fn settle(app: &TestApp, processor: &TestProcessor, key: &str) -> std::process::Output {
    idempay(
        &["keys", "settle", key, "--account", &app.account_id],
        &[
            ("DATABASE_URL", &app.database_url()),
            ("IDEMPAY_PROCESSOR_URL", &processor.address),
            ("IDEMPAY_PROCESSOR_API_KEY", API_KEY),
        ],
    )
    .await
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The recovery state's payment or refund id: what the key chose before the call.
async fn chosen(app: &TestApp, key: &str, member: &str) -> String {
    key_column(app, key, &format!("recovery_state ->> '{member}'")).await
}

/// The processor charged and its answer was lost; the key was held. The settle records the
/// payment under the id the key chose, from the processor's charge under its downstream key, and
/// the client's retry gets the 201 the first request would have had, replayed. A second settle
/// changes nothing; a recovery job running beside it never touches the key.
#[api_test]
async fn a_held_charge_is_settled_from_the_processors_ledger_and_its_retry_gets_the_payment() {
    let (app, losing) = idempay_and_processor(settings(), losing_answers()).await;
    let key = new_key();
    hold_payment(&app, &key).await;
    assert_eq!(losing.count("processor_charges").await, 1, "charged");
    let processor = replace_processor(&app, losing, processor::settings()).await;
    let payment_id = chosen(&app, &key, "payment").await;
    // The recovery job of another instance runs beside the settle, every 100 ms.
    let _recovering = app
        .another_instance(Settings {
            recovery_interval: Duration::from_millis(100),
            ..linked_to(&processor.address, settings())
        })
        .await;
    // Inspection shows the operator what is at stake: the state names the chosen payment.
    let inspected = app.get(&format!("/v1/idempotency_keys/{key}")).await.json();
    assert_eq!(
        inspected["uses"][0]["recovery_state"]["payment"], payment_id,
        "{inspected}"
    );

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    assert_eq!(
        stdout(&settled),
        format!(
            "POST /v1/payments: settled: the key now answers 201 (/v1/payments/{payment_id})\n"
        )
    );
    let retry = app.post_payment(&key, &payment(4200)).await;
    retry.assert_status(201);
    assert!(retry.replayed(), "the first request's answer, replayed");
    let body = retry.json();
    assert_eq!(body["id"], payment_id);
    let (charge,): (String,) = sqlx::query_as("SELECT id FROM processor_charges")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(body["charge"], charge);
    assert_eq!(
        retry.header("location"),
        Some(format!("/v1/payments/{payment_id}").as_str())
    );
    // Its event, as any payment's.
    let events: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM events
         WHERE type = 'payment.succeeded'
           AND convert_from(body, 'UTF8')::jsonb -> 'data' -> 'object' ->> 'id' = $1",
    )
    .bind(&payment_id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(events, 1);
    assert_ledgers_agree(&app, &processor, 1).await;

    let again = settle(&app, &processor, &key).await;
    assert!(again.status.success(), "{again:?}");
    assert_eq!(
        stdout(&again),
        "POST /v1/payments: already completed: nothing to settle\n"
    );
    assert_eq!(processor.count("processor_charges").await, 1);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// The processor failed before charging, every time; the key was held. The settle finds nothing
/// under its downstream key and completes it with `processor-made-nothing`, final and replayed:
/// the client learns that nothing was charged and that only a new key tries again.
#[api_test]
async fn a_held_charge_the_processor_never_made_completes_with_a_final_nothing_made() {
    let (app, failing) = idempay_and_processor(settings(), failing()).await;
    let key = new_key();
    hold_payment(&app, &key).await;
    let processor = replace_processor(&app, failing, processor::settings()).await;

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    assert_eq!(
        stdout(&settled),
        "POST /v1/payments: settled: the key now answers 409\n"
    );
    let retry = app.post_payment(&key, &payment(4200)).await;
    retry.assert_problem(409, "processor-made-nothing");
    assert!(retry.replayed());
    assert_eq!(retry.header("retry-after"), None, "final");
    assert_eq!(processor.count("processor_charges").await, 0);
    assert_ledgers_agree(&app, &processor, 0).await;
    // A new key tries the intent again, and pays.
    let paid = app.post_payment(&new_key(), &payment(4200)).await;
    assert_eq!(paid.status, 201);
}

/// A settle that cannot reach the processor changes nothing: the key is handed back, held, and
/// the command fails; once the processor answers, the same command settles it.
#[api_test]
async fn a_settle_that_cannot_ask_the_processor_leaves_the_key_held() {
    let (app, losing) = idempay_and_processor(settings(), losing_answers()).await;
    let key = new_key();
    hold_payment(&app, &key).await;
    let port = port_of(&losing);
    losing.stop();

    let unreachable = settle(&app, &losing, &key).await;

    assert_eq!(unreachable.status.code(), Some(1), "{unreachable:?}");
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        stderr.contains("asking the processor for the charge under idk_"),
        "{stderr}"
    );
    let (status, _, _) = key_row(&app, &key).await.expect("kept");
    assert_eq!(status, "held", "handed back");
    app.post_payment(&key, &payment(4200))
        .await
        .assert_problem(409, "idempotency-key-held");

    let processor = TestProcessor::beside_on(&app, processor::settings(), rebind(port).await).await;
    let settled = settle(&app, &processor, &key).await;
    assert!(settled.status.success(), "{settled:?}");
    assert_eq!(app.post_payment(&key, &payment(4200)).await.status, 201);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// Refunds alike: the processor refunded and the answer was lost; the key was held; the settle
/// records the refund under the id the key chose, and the retry gets the 201.
#[api_test]
async fn a_held_refund_is_settled_from_the_processors_ledger() {
    let (app, healthy) = idempay_and_processor(settings(), processor::settings()).await;
    let paid = app.post_payment(&new_key(), &payment(4200)).await;
    assert_eq!(paid.status, 201);
    let payment_id = paid.id();
    let losing = replace_processor(&app, healthy, losing_answers()).await;
    let key = new_key();
    let refund = serde_json::json!({ "amount": 1500 });
    hold_refund(&app, &payment_id, &key, &refund).await;
    assert_eq!(losing.count("processor_refunds").await, 1, "refunded");
    let processor = replace_processor(&app, losing, processor::settings()).await;
    let refund_id = chosen(&app, &key, "refund").await;

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    assert_eq!(
        stdout(&settled),
        format!(
            "POST /v1/payments/{{id}}/refunds: settled: the key now answers 201 (/v1/refunds/{refund_id})\n"
        )
    );
    let retry = app.post_refund(&payment_id, &key, &refund).await;
    retry.assert_status(201);
    assert!(retry.replayed());
    assert_eq!(retry.json()["id"], refund_id);
    let payment = app.get(&format!("/v1/payments/{payment_id}")).await.json();
    assert_eq!(payment["amount_refunded"], 1500);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// A refund the processor failed before making: settled as nothing refunded, and the payment is
/// whole.
#[api_test]
async fn a_held_refund_the_processor_never_made_completes_with_a_final_nothing_made() {
    let (app, healthy) = idempay_and_processor(settings(), processor::settings()).await;
    let paid = app.post_payment(&new_key(), &payment(4200)).await;
    let payment_id = paid.id();
    let failing = replace_processor(&app, healthy, failing()).await;
    let key = new_key();
    let refund = serde_json::json!({ "amount": 1500 });
    hold_refund(&app, &payment_id, &key, &refund).await;
    let processor = replace_processor(&app, failing, processor::settings()).await;

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    let retry = app.post_refund(&payment_id, &key, &refund).await;
    retry.assert_problem(409, "processor-made-nothing");
    assert!(retry.replayed());
    let payment = app.get(&format!("/v1/payments/{payment_id}")).await.json();
    assert_eq!(payment["amount_refunded"], 0);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// A capture too: captured at the processor after idempay stopped waiting, its key held; the settle
/// reads the charge, which names the key its capture was made under, and records the capture; the
/// retry gets the 200 the first request would have had. A capture the processor never made settles
/// as nothing made, and the authorization is still there to capture under a new key.
#[api_test]
async fn a_held_capture_is_settled_from_the_processors_charge() {
    let (app, healthy) = idempay_and_processor(settings(), processor::settings()).await;
    let authorized = app.authorized(5000).await;
    let never = app.authorized(3000).await;
    let losing = replace_processor(&app, healthy, losing_answers()).await;
    let (key, body) = (new_key(), serde_json::json!({ "amount_to_capture": 4000 }));
    app.post_capture(&authorized, &key, &body)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    let failing = replace_processor(&app, losing, failing()).await;
    let (unmade, all) = (new_key(), serde_json::json!({}));
    app.post_capture(&never, &unmade, &all)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    past_the_window().await;
    assert_held(&app, &key, app.post_capture(&authorized, &key, &body).await).await;
    assert_held(&app, &unmade, app.post_capture(&never, &unmade, &all).await).await;
    let processor = replace_processor(&app, failing, processor::settings()).await;

    let settled = settle(&app, &processor, &key).await;
    let nothing = settle(&app, &processor, &unmade).await;

    assert!(settled.status.success(), "{settled:?}");
    assert!(
        stdout(&settled)
            .starts_with("POST /v1/payments/{id}/capture: settled: the key now answers 200"),
        "{}",
        stdout(&settled)
    );
    let retry = app.post_capture(&authorized, &key, &body).await;
    retry.assert_status(200);
    assert!(retry.replayed());
    assert_eq!(retry.json()["amount_captured"], 4000);
    assert!(nothing.status.success(), "{nothing:?}");
    let retry = app.post_capture(&never, &unmade, &all).await;
    retry.assert_problem(409, "processor-made-nothing");
    let captured = app.post_capture(&never, &new_key(), &all).await;
    assert_eq!(
        captured.json()["amount_captured"],
        3000,
        "still authorized, captured now"
    );
    assert_ledgers_agree(&app, &processor, 2).await;
}

/// A held capture whose authorization something else released meanwhile (here a void under
/// another key, straight at the processor; an expiry does the same): nothing was made under the
/// capture's key, and nothing can be (the processor refuses every release now), so the settle
/// completes it as nothing made and the retry gets that, final. Before, the settle exited 1
/// ("settle it by hand") and the key stayed held for ever.
#[api_test]
async fn a_held_capture_whose_authorization_was_released_otherwise_settles_as_nothing_made() {
    let (app, healthy) = idempay_and_processor(settings(), processor::settings()).await;
    let authorized = app.authorized(5000).await;
    let failing = replace_processor(&app, healthy, failing()).await;
    let (key, body) = (new_key(), serde_json::json!({ "amount_to_capture": 4000 }));
    app.post_capture(&authorized, &key, &body)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    past_the_window().await;
    assert_held(&app, &key, app.post_capture(&authorized, &key, &body).await).await;
    let processor = replace_processor(&app, failing, processor::settings()).await;
    let charge = super::two_hops::charge_of(&app, &authorized).await;
    let voided = processor
        .post(
            &format!("/v1/charges/{charge}/void"),
            Some("another-key"),
            &serde_json::json!({}),
        )
        .await;
    assert_eq!(voided.status, 200, "{:?}", voided.json());

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    app.post_capture(&authorized, &key, &body)
        .await
        .assert_problem(409, "processor-made-nothing");
    let captures: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM processor_charges WHERE id = $1 AND capture_state = 'captured'",
    )
    .bind(&charge)
    .fetch_one(&processor.db)
    .await
    .unwrap();
    assert_eq!(captures, 0, "nothing captured under any key");
}

/// A cancel alike: voided at the processor after idempay stopped waiting, its key held; the settle
/// reads the charge, which names the key its void was made under, and records the cancel with
/// the reason the key asked for; the retry gets the 200 the first request would have had.
#[api_test]
async fn a_held_cancel_is_settled_from_the_processors_charge() {
    let (app, healthy) = idempay_and_processor(settings(), processor::settings()).await;
    let authorized = app.authorized(5000).await;
    let losing = replace_processor(&app, healthy, losing_answers()).await;
    let (key, body) = (
        new_key(),
        serde_json::json!({ "cancellation_reason": "fraudulent" }),
    );
    app.post_cancel(&authorized, &key, &body)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    past_the_window().await;
    assert_held(&app, &key, app.post_cancel(&authorized, &key, &body).await).await;
    let processor = replace_processor(&app, losing, processor::settings()).await;

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    assert!(
        stdout(&settled)
            .starts_with("POST /v1/payments/{id}/cancel: settled: the key now answers 200"),
        "{}",
        stdout(&settled)
    );
    let retry = app.post_cancel(&authorized, &key, &body).await;
    retry.assert_status(200);
    assert!(retry.replayed());
    let payment = retry.json();
    assert_eq!(payment["status"], "canceled");
    assert_eq!(payment["cancellation_reason"], "fraudulent");
    assert!(payment["canceled_at"].is_string());
    let (state,): (String,) = sqlx::query_as("SELECT capture_state FROM processor_charges")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(state, "voided");
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// A settle while the capture is still in flight at the processor (in its latency, its key there
/// in progress): the charge, read under the capture's downstream key, is answered 409, so the
/// settle fails and hands the key back, held, rather than read an authorization still held and
/// record "nothing made" beside a capture that might still commit. (Read without the key, the
/// charge said `requires_capture`: the key was completed as nothing made, the money taken
/// regardless.) The capture's latency outlasts its deadline, the window's end less the clock
/// margin: the processor refuses it once the latency is over, storing nothing, and the same settle
/// then records that nothing was made. The payment is still authorized, and a capture under a new
/// key takes it, once.
#[api_test]
async fn a_settle_during_a_capture_still_in_flight_leaves_the_key_held_until_the_processor_decides()
{
    let (app, healthy) = idempay_and_processor(settings(), processor::settings()).await;
    let authorized = app.authorized(5000).await;
    // Each capture takes 8 s there: past idempay's three attempts and its recovery window, so the
    // key is held while the processor is still in the first attempt's latency.
    let slow = replace_processor(
        &app,
        healthy,
        faulty(|s| s.faults.latency = Duration::from_secs(8)),
    )
    .await;
    let (key, body) = (new_key(), serde_json::json!({ "amount_to_capture": 4000 }));
    app.post_capture(&authorized, &key, &body)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    past_the_window().await;
    assert_held(&app, &key, app.post_capture(&authorized, &key, &body).await).await;
    let capture_state = || async {
        sqlx::query_scalar::<_, String>("SELECT capture_state FROM processor_charges")
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    let captures_in_flight = || async {
        count(
            &app.db,
            "SELECT count(*) FROM idempotency_keys \
             WHERE scope = 'processor:POST /v1/charges/{id}/capture' AND status = 'in_progress'",
        )
        .await
    };
    assert_eq!(
        captures_in_flight().await,
        1,
        "the settle meets it in flight"
    );

    let early = settle(&app, &slow, &key).await;

    assert!(!early.status.success(), "{}", stdout(&early));
    let (status, _, _) = key_row(&app, &key).await.expect("kept");
    assert_eq!(status, "held", "handed back, held");
    wait_until("the processor decides on the capture", || async {
        captures_in_flight().await == 0
    })
    .await;
    assert_eq!(
        capture_state().await,
        "requires_capture",
        "refused for its deadline: nothing captured"
    );
    let settled = settle(&app, &slow, &key).await;
    assert!(settled.status.success(), "{settled:?}");
    let retry = app.post_capture(&authorized, &key, &body).await;
    retry.assert_problem(409, "processor-made-nothing");
    assert!(retry.replayed());
    let healthy = replace_processor(&app, slow, processor::settings()).await;
    let captured = app.post_capture(&authorized, &new_key(), &body).await;
    captured.assert_status(200);
    assert_eq!(captured.json()["amount_captured"], 4000);
    assert_eq!(capture_state().await, "captured");
    let captures = count(
        &app.db,
        "SELECT count(*) FROM events WHERE type = 'payment.captured'",
    )
    .await;
    assert_eq!(captures, 1, "captured once");
    assert_ledgers_agree(&app, &healthy, 1).await;
}

/// The processor's side: a charge read under a key is answered 409 while a capture or a void
/// under that key is in progress there, and read as usual otherwise.
#[api_test]
async fn the_processor_answers_a_charge_read_under_a_capture_key_in_progress_409() {
    let processor = TestProcessor::spawn().await;
    let made = processor
        .charge("settle-key-a", &processor::charge(700, "pm_card_visa"))
        .await;
    let charge = made.json()["id"].as_str().unwrap().to_owned();
    for (route, key) in [("capture", "capturing-key"), ("void", "voiding-key")] {
        sqlx::query(
            "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status,
                                           lock_token, locked_until, expires_at)
             VALUES ('processor', $1, $2, sha256('x'), 'in_progress', gen_random_uuid(),
                     now() + interval '1 minute', now() + interval '1 day')",
        )
        .bind(format!("processor:POST /v1/charges/{{id}}/{route}"))
        .bind(key)
        .execute(&processor.db)
        .await
        .unwrap();
        let busy = processor
            .get(&format!("/v1/charges/{charge}?idempotency_key={key}"))
            .await;
        assert_eq!(busy.status, 409, "{route}");
    }
    let read = processor
        .get(&format!("/v1/charges/{charge}?idempotency_key=another-key"))
        .await;
    assert_eq!(read.status, 200);
    assert_eq!(read.json()["id"], charge.as_str());
    assert_eq!(
        processor.get(&format!("/v1/charges/{charge}")).await.status,
        200
    );
    let invalid = processor
        .get(&format!("/v1/charges/{charge}?idempotency_key="))
        .await;
    assert_eq!(invalid.status, 400);
}

/// The processor's side, when the request holding a key died (or stalls) and its lease ran out:
/// nobody is making anything under the key, so a read under it is answered (nothing made)
/// instead of 409 for ever, which would keep a held key from ever being settled. The read fences
/// the key first (its token replaced, as a takeover's), so the old holder, should it wake, cannot
/// complete it (its completion, and the charge with it, rolls back: see
/// `a_request_that_lost_its_lease_rolls_back_its_charge`). Found by the explorer: seed 2011, a
/// processor killed mid-charge, its key's settle answered 409 at every try.
#[api_test]
async fn a_read_under_a_key_whose_lease_ran_out_fences_it_and_answers() {
    let processor = TestProcessor::spawn().await;
    let lapsed_token: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status,
                                       lock_token, locked_until, expires_at)
         VALUES ('processor', 'processor:POST /v1/charges', 'dead-holder', sha256('x'),
                 'in_progress', gen_random_uuid(), now() - interval '1 second',
                 now() + interval '1 day')
         RETURNING lock_token",
    )
    .fetch_one(&processor.db)
    .await
    .unwrap();

    let read = processor
        .get("/v1/charges?idempotency_key=dead-holder")
        .await;
    assert_eq!(read.status, 200, "{:?}", read.json());
    assert_eq!(read.json()["data"].as_array().unwrap().len(), 0);
    let token = dead_holders_token(&processor).await;
    assert_ne!(
        token, lapsed_token,
        "the read fenced the key off its old holder"
    );

    // A live lease is still someone making it: 409, and the key left as it is.
    sqlx::query(
        "UPDATE idempotency_keys SET locked_until = now() + interval '1 minute'
         WHERE idem_key = 'dead-holder'",
    )
    .execute(&processor.db)
    .await
    .unwrap();
    let busy = processor
        .get("/v1/charges?idempotency_key=dead-holder")
        .await;
    assert_eq!(busy.status, 409);
    let unchanged = dead_holders_token(&processor).await;
    assert_eq!(unchanged, token);
}

/// The token of the processor's key `dead-holder`: who may complete it.
async fn dead_holders_token(processor: &TestProcessor) -> uuid::Uuid {
    sqlx::query_scalar("SELECT lock_token FROM idempotency_keys WHERE idem_key = 'dead-holder'")
        .fetch_one(&processor.db)
        .await
        .unwrap()
}

/// The processor's side of a settle: its charges are found by the key they were made under, and
/// a key it is still charging under is answered 409, not "nothing".
#[api_test]
async fn the_processor_lists_the_charges_made_under_an_idempotency_key() {
    let processor = TestProcessor::spawn().await;
    let made = processor
        .charge("settle-key-1", &processor::charge(700, "pm_card_visa"))
        .await;
    assert_eq!(made.status, 201);
    processor
        .charge("settle-key-2", &processor::charge(800, "pm_card_visa"))
        .await;

    let found = processor
        .get("/v1/charges?idempotency_key=settle-key-1")
        .await;
    assert_eq!(found.status, 200);
    let found = found.json();
    assert_eq!(found["data"].as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found["data"][0]["id"], made.json()["id"]);
    assert_eq!(found["data"][0]["idempotency_key"], "settle-key-1");
    let none = processor
        .get("/v1/charges?idempotency_key=never-used")
        .await
        .json();
    assert_eq!(none["data"].as_array().unwrap().len(), 0);
    let refunds = processor
        .get("/v1/refunds?idempotency_key=settle-key-1")
        .await
        .json();
    assert_eq!(refunds["data"].as_array().unwrap().len(), 0);

    let invalid = processor.get("/v1/charges?idempotency_key=").await;
    assert_eq!(invalid.status, 400);
    let unknown = processor.get("/v1/charges?key=settle-key-1").await;
    assert_eq!(unknown.status, 400);

    sqlx::query(
        "INSERT INTO idempotency_keys (account_id, scope, idem_key, request_hash, status,
                                       lock_token, locked_until, expires_at)
         VALUES ('processor', 'processor:POST /v1/charges', 'settle-key-3', sha256('x'),
                 'in_progress', gen_random_uuid(), now() + interval '1 minute',
                 now() + interval '1 day')",
    )
    .execute(&processor.db)
    .await
    .unwrap();
    let busy = processor
        .get("/v1/charges?idempotency_key=settle-key-3")
        .await;
    assert_eq!(busy.status, 409);
}

/// The scenario an operator meets: the customer was charged, the key held, and the cardholder's
/// bank disputed the charge meanwhile. The processor's dispute event names a charge no payment
/// records: it is kept, and the settle that records the payment applies it, once (on the code
/// before, it was refused until the sender gave up, then lost).
#[api_test]
async fn a_dispute_opened_while_the_key_was_held_is_applied_once_by_the_settle() {
    let mut slow = losing_answers();
    slow.shared.webhook_retry_schedule = patiently();
    let (app, slow, secret) =
        delivering_events(settings(), slow, patiently(), NOT_WITHIN_THE_TEST).await;
    let key = new_key();
    hold_payment(&app, &key).await;
    let mut healthy = processor::settings();
    healthy.webhook_url = Some(app.url("/v1/webhooks/processor"));
    healthy.shared.webhook_secrets = Some(secret);
    healthy.shared.webhook_retry_schedule = patiently();
    let processor = replace_processor(&app, slow, healthy).await;
    let (charge, _) = the_charge(&app).await;
    dispute_at_the_processor(&processor, &charge, 1000).await;
    // Its own event, not any: the charge's `charge.succeeded` is parked too, and may be first.
    wait_until("the dispute event is parked", || async {
        count(
            &app.db,
            "SELECT count(*) FROM parked_events WHERE type = 'charge.dispute.created'",
        )
        .await
            == 1
    })
    .await;

    let settled = settle(&app, &processor, &key).await;

    assert!(settled.status.success(), "{settled:?}");
    let payment_id = chosen(&app, &key, "payment").await;
    let payment = app.get(&format!("/v1/payments/{payment_id}")).await.json();
    assert_eq!(payment["amount_disputed"], 1000, "{payment}");
    let disputes = count(&app.db, "SELECT count(*) FROM disputes").await;
    assert_eq!(disputes, 1);
    let parked = count(&app.db, "SELECT count(*) FROM parked_events").await;
    assert_eq!(parked, 0);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// A holder stalled between taking its key and sending its call, past the window, the hold and an
/// operator's settle: when it wakes, its call reaches the processor, and is refused there for its
/// deadline (the key's window's end, less the clock margin), so nothing contradicts the settle's
/// "nothing made". Without the deadline, the call charged: a charge no payment records, under a key
/// that answers that nothing happened.
///
/// The stall is PostgreSQL's answer to the reservation, held by a proxy: the key is committed
/// (in progress, at its recovery point), and its holder waits, as a paused process would.
#[api_test]
async fn a_holder_that_wakes_after_its_key_was_settled_is_refused_by_its_call_s_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let mut stalling = Settings {
        // No recovery job: it would resume the key within the window, and charge.
        recovery_interval: Duration::from_secs(3600),
        ..linked_to(&address, settings())
    };
    stalling.shared.lease = Duration::from_secs(1);
    stalling.processor.timeout = Duration::from_secs(3);
    let limits = PoolLimits {
        acquire_timeout: Duration::from_millis(300),
        ..PoolLimits::default()
    };
    let proxy = PgProxy::to(&crate::support::harness::database_url("postgres")).await;
    let app = TestApp::spawn_reaching(stalling, limits, |url| proxy.url(url)).await;
    // The processor's latency lets the test see the late call arrive (its key in progress there).
    let processor = TestProcessor::beside_on(
        &app,
        faulty(|s| s.faults.latency = Duration::from_secs(1)),
        listener,
    )
    .await;
    // A first payment prepares the reservation on the connection the next one reuses: the proxy
    // then holds the answer to its execution (a statement's first preparation is answered
    // before it runs).
    app.post_payment(&new_key(), &payment(1000))
        .await
        .assert_status(201);
    let key = new_key();

    proxy.hold_answer_to(|sql: &str| sql.contains("INSERT INTO idempotency_keys"));
    let request = app.keyed_post_as(&app.api_key, "/v1/payments", &key, &payment(4200));
    let stalled = tokio::spawn(request.send());
    wait_until("the reservation's answer is held", || async {
        proxy.is_holding()
    })
    .await;
    let (status, point, _) = key_row(&app, &key).await.expect("the key is committed");
    assert_eq!(
        (status.as_str(), point.as_deref()),
        ("in_progress", Some("payment.charge_requested"))
    );
    past_the_window().await;
    assert_held(&app, &key, app.post_payment(&key, &payment(4200)).await).await;
    let settled = settle(&app, &processor, &key).await;
    assert!(settled.status.success(), "{settled:?}");
    assert_eq!(
        stdout(&settled),
        "POST /v1/payments: settled: the key now answers 409\n"
    );

    proxy.release();
    let processor_keys_in_progress = || async {
        count(
            &app.db,
            "SELECT count(*) FROM idempotency_keys \
             WHERE scope = 'processor:POST /v1/charges' AND status = 'in_progress'",
        )
        .await
    };
    wait_until("the woken holder's call reaches the processor", || async {
        processor_keys_in_progress().await == 1
    })
    .await;
    wait_until("the processor refused it and released its key", || async {
        processor_keys_in_progress().await == 0
    })
    .await;
    stalled.abort();

    assert_eq!(
        processor.count("processor_charges").await,
        1,
        "nothing charged but the first payment"
    );
    let retry = app.post_payment(&key, &payment(4200)).await;
    retry.assert_problem(409, "processor-made-nothing");
    assert!(retry.replayed());
    assert_ledgers_agree(&app, &processor, 1).await;
}
