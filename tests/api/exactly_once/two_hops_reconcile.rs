//! Exactly once across two hops, checked: `idempay reconcile` names every difference of a ledger
//! broken on purpose, and none of a ledger that is only busy (payments made while it reads, keys
//! in flight). The setup is `two_hops.rs`'s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::State;
use idempay::config::Settings;
use idempay_test_macros::api_test;
use tokio::net::TcpListener;
use tokio::sync::Notify;

use super::two_hops::{
    assert_reconcile_reports, assert_reconciled, charge_of, idempay_and_processor, reconcile_said,
    waiting_at_most,
};
use crate::processor::{self, API_KEY};
use crate::support::checks::execute;
use crate::support::helpers::{new_key, payment, wait_until};
use crate::support::instance::idempay;

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
    assert_reconcile_reports(
        &app,
        &processor,
        1,
        vec![
            format!("charge {lost} (2000) has no payment"),
            "charge ch_stray (777) has no payment".to_owned(),
        ],
        "reconciled 3 charges, 1 payments, 0 refunds and 0 disputes: 2 difference(s)",
    )
    .await;
}

/// Reconcile compares currencies: a payment in another currency than its charge is a line. And a
/// refund is compared with the charge it names (a refund carries no currency of its own, on either
/// side: it is in its charge's): one whose processor refund is of another charge than its
/// payment's is a line. Before, neither was compared.
#[api_test]
async fn reconcile_names_a_currency_or_a_refund_s_charge_that_differs() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    let paid = [app.paid(4000).await, app.paid(5000).await];
    let charges = [
        charge_of(&app, &paid[0]).await,
        charge_of(&app, &paid[1]).await,
    ];
    let refund = app
        .post_refund(&paid[0], &new_key(), &serde_json::json!({ "amount": 1000 }))
        .await;
    assert_eq!(refund.status, 201);
    let refund = refund.id();
    assert_reconciled(&app, &processor, 2).await;

    execute(
        &app.db,
        "UPDATE payments SET currency = 'usd' WHERE id = $1",
        &paid[1],
    )
    .await;
    // The processor's refund moved to the other charge (whose refunded total stays as it was).
    execute(
        &app.db,
        "UPDATE processor_refunds SET charge_id = $1",
        &charges[1],
    )
    .await;
    assert_reconcile_reports(
        &app,
        &processor,
        1,
        vec![
            format!(
                "payment {} / charge {}: currency is usd here, eur at the processor",
                paid[1], charges[1]
            ),
            format!(
                "refund {refund}: is of charge {} here (its payment's), {} at the processor",
                charges[0], charges[1]
            ),
        ],
        "reconciled 2 charges, 2 payments, 1 refunds and 0 disputes: 2 difference(s)",
    )
    .await;
}

/// Makes every call at the running `processor` take `ms` milliseconds (its test fault route).
async fn taking(processor: &crate::processor::TestProcessor, ms: u64) {
    let set = processor
        .send(
            processor
                .http()
                .put(format!("{}/v1/test/faults", processor.address))
                .bearer_auth(API_KEY)
                .json(&serde_json::json!({ "lose_answers": 0.0, "fail": 0.0, "latency_ms": ms })),
        )
        .await;
    assert_eq!(set.status, 200);
}

/// A charge and a refund the processor made while the keys that asked for them are in progress
/// (their answers came later than idempay waits, so the keys are suspended within the recovery
/// window, to be resumed) are in flight: said, not differences, and the refunded amount they make
/// is not counted against the payment yet. Before, each was a difference (a charge without
/// payment, a refund without record, a refunded amount that differs), and reconcile exited 1.
/// Once no key accounts for the charge (its key deleted here), it is a difference again.
#[api_test]
async fn reconcile_says_a_charge_or_refund_whose_key_is_in_progress_is_in_flight() {
    // A second per attempt: the first payment, at a processor without latency, is made within it
    // on a loaded machine too (at 200 ms, a loaded CI run timed it out), and the later ones, at a
    // processor three times slower, never are.
    let settings = waiting_at_most(Duration::from_secs(1));
    let (app, processor) = idempay_and_processor(settings, processor::settings()).await;
    let paid = app.paid(4000).await;
    // Slower than idempay waits: every attempt times out, and the processor acts later.
    taking(&processor, 3000).await;
    let (charging, refunding) = (new_key(), new_key());
    app.post_payment(&charging, &payment(4200))
        .await
        .assert_problem(503, "processor-outcome-unknown");
    app.post_refund(&paid, &refunding, &serde_json::json!({ "amount": 1000 }))
        .await
        .assert_problem(503, "processor-outcome-unknown");
    wait_until("the processor made the charge and the refund", || async {
        processor.count("processor_charges").await == 2
            && processor.count("processor_refunds").await == 1
    })
    .await;
    let (charge, refund): (String, String) = sqlx::query_as(
        "SELECT (SELECT id FROM processor_charges WHERE amount = 4200),
                (SELECT id FROM processor_refunds)",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    let scope = |route: &str| format!("{}:{route}", app.account_id);

    assert_reconcile_reports(
        &app,
        &processor,
        0,
        vec![
            format!(
                "charge {charge} (4200) in flight: key {charging:?} ({}), which asked for it, is in \
                 progress; its payment is not recorded yet",
                scope("POST /v1/payments")
            ),
            format!(
                "processor refund {refund} (1000) in flight: key {refunding:?} ({}), which asked for \
                 it, is in progress; its refund is not recorded yet",
                scope("POST /v1/payments/{id}/refunds")
            ),
        ],
        "reconciled 2 charges, 1 payments, 0 refunds and 0 disputes: 0 difference(s), 2 in flight",
    )
    .await;

    // A real difference is never hidden: with the charge's key gone, nothing accounts for it.
    execute(
        &app.db,
        "DELETE FROM idempotency_keys WHERE idem_key = $1 AND scope NOT LIKE 'processor:%'",
        &charging,
    )
    .await;
    let stdout = reconcile_said(&app, &processor, 1).await;
    assert!(
        stdout
            .lines()
            .any(|line| line == format!("charge {charge} (4200) has no payment")),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(": 1 difference(s), 1 in flight\n"),
        "{stdout}"
    );
}

/// Payments made while reconcile runs are not differences, whenever they land between its
/// reads: one recorded after the processor's ledger was read (before, it was read first, and such
/// a payment was reported as naming a charge the processor does not have), and one recorded after
/// idempay's ledger was read and before the processor's (its charge is then found recorded by
/// idempay's second read). A gate between reconcile and the processor holds its first read of the
/// charges, after or before it reaches the processor, while the test pays.
#[api_test]
async fn a_payment_made_while_reconcile_reads_the_ledgers_is_no_difference() {
    let (app, processor) = idempay_and_processor(Settings::default(), processor::settings()).await;
    app.paid(4000).await;

    for (hold, paid) in [(Hold::Answer, 2), (Hold::Request, 3)] {
        let gate = Gate::open(&processor.address, hold).await;
        let running = tokio::spawn({
            let env = [
                ("DATABASE_URL".to_owned(), app.database_url()),
                ("IDEMPAY_PROCESSOR_URL".to_owned(), gate.address.clone()),
                ("IDEMPAY_PROCESSOR_API_KEY".to_owned(), API_KEY.to_owned()),
            ];
            async move {
                let env: Vec<(&str, &str)> =
                    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                idempay(&["reconcile"], &env).await
            }
        });
        gate.reached().await;
        app.paid(4000 + paid).await;
        gate.release();
        let output = running.await.unwrap();

        let stdout = String::from_utf8(output.stdout).unwrap();
        assert_eq!(output.status.code(), Some(0), "{hold:?}: {stdout}");
        let (charges, payments) = match hold {
            // The processor's charges read before the payment, idempay's ledger before too.
            Hold::Answer => (paid - 1, paid - 1),
            // idempay's ledger read before the payment, the processor's after.
            Hold::Request => (paid, paid - 1),
        };
        assert_eq!(
            stdout,
            format!(
                "reconciled {charges} charges, {payments} payments, 0 refunds and 0 disputes: \
                 0 difference(s)\n"
            ),
            "{hold:?}"
        );
    }
    assert_reconciled(&app, &processor, 3).await;
}

/// Where the gate holds reconcile's first read of the processor's charges.
#[derive(Clone, Copy, Debug)]
enum Hold {
    /// After the processor answered it: the test's payment comes after the read.
    Answer,
    /// Before it reaches the processor: the test's payment comes before the read.
    Request,
}

/// A proxy in front of the processor that holds the first `GET /v1/charges` (at `Hold`) until the
/// test releases it, and passes everything else through.
struct Gate {
    address: String,
    reached: Arc<Notify>,
    release: Arc<Notify>,
}

impl Gate {
    async fn open(processor: &str, hold: Hold) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let reached = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let state = GateState {
            processor: processor.to_owned(),
            hold,
            held: Arc::new(AtomicBool::new(false)),
            reached: reached.clone(),
            release: release.clone(),
            client: reqwest::Client::new(),
        };
        let app = axum::Router::new().fallback(pass).with_state(state);
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            address,
            reached,
            release,
        }
    }

    /// Waits until reconcile's first read of the charges is held.
    async fn reached(&self) {
        tokio::time::timeout(Duration::from_secs(60), self.reached.notified())
            .await
            .expect("reconcile reads the processor's charges");
    }

    fn release(&self) {
        self.release.notify_one();
    }
}

#[derive(Clone)]
struct GateState {
    processor: String,
    hold: Hold,
    held: Arc<AtomicBool>,
    reached: Arc<Notify>,
    release: Arc<Notify>,
    client: reqwest::Client,
}

async fn pass(
    State(gate): State<GateState>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let holds = request.uri().path() == "/v1/charges" && !gate.held.swap(true, Ordering::SeqCst);
    let hold = || async {
        gate.reached.notify_one();
        gate.release.notified().await;
    };
    if holds && matches!(gate.hold, Hold::Request) {
        hold().await;
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    let mut forwarded = gate.client.request(
        request.method().clone(),
        format!("{}{path}", gate.processor),
    );
    if let Some(authorization) = request.headers().get("authorization") {
        forwarded = forwarded.header("authorization", authorization);
    }
    let answer = forwarded.send().await.expect("the processor answers");
    let status = answer.status().as_u16();
    let body = answer.bytes().await.expect("its body");
    if holds && matches!(gate.hold, Hold::Answer) {
        hold().await;
    }
    axum::response::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap()
}

/// A capture the processor made while idempay's key for it is still in progress (its answer
/// lost, the key suspended at its recovery point) is in flight: said, and the payment's capture
/// figures are not compared until it is recorded. Before, it was four differences (the capture,
/// `amount_captured`...) and reconcile exited 1. Once the capture is recorded, the ledgers agree;
/// a cancellation's reason that tells a void from an expiry is compared too (a voided
/// authorization recorded as expired is a line).
#[api_test]
async fn reconcile_says_a_capture_whose_key_is_in_progress_is_in_flight_and_compares_cancellations()
{
    let settings = waiting_at_most(Duration::from_secs(1));
    let (app, processor) = idempay_and_processor(settings, processor::settings()).await;
    let authorized = app.authorized(5000).await;
    let voided = app.authorized(2000).await;
    app.post_cancel(&voided, &new_key(), &serde_json::json!({}))
        .await
        .assert_status(200);
    taking(&processor, 3000).await;
    let capturing = new_key();
    let body = serde_json::json!({ "amount_to_capture": 3000 });
    app.post_capture(&authorized, &capturing, &body)
        .await
        .assert_problem(503, "processor-outcome-unknown");
    let charge = charge_of(&app, &authorized).await;
    wait_until("the processor made the capture", || async {
        sqlx::query_scalar::<_, String>("SELECT capture_state FROM processor_charges WHERE id = $1")
            .bind(&charge)
            .fetch_one(&app.db)
            .await
            .unwrap()
            == "captured"
    })
    .await;

    assert_reconcile_reports(
        &app,
        &processor,
        0,
        vec![format!(
            "charge {charge} captured in flight: key {capturing:?} ({}:POST \
             /v1/payments/{{id}}/capture), which asked for it, is in progress; its payment still \
             requires capture here",
            app.account_id
        )],
        "reconciled 2 charges, 2 payments, 0 refunds and 0 disputes: 0 difference(s), 1 in flight",
    )
    .await;

    taking(&processor, 0).await;
    let recorded = app.post_capture(&authorized, &capturing, &body).await;
    recorded.assert_status(200);
    assert_eq!(recorded.json()["amount_captured"], 3000);
    assert_reconciled(&app, &processor, 2).await;
    execute(
        &app.db,
        "UPDATE payments SET cancellation_reason = 'expired' WHERE id = $1",
        &voided,
    )
    .await;
    let voided_charge = charge_of(&app, &voided).await;
    assert_reconcile_reports(
        &app,
        &processor,
        1,
        vec![format!(
            "payment {voided} / charge {voided_charge}: cancellation_reason is expired here, void \
             at the processor"
        )],
        "reconciled 2 charges, 2 payments, 0 refunds and 0 disputes: 1 difference(s)",
    )
    .await;
}
