//! The processor's events about objects idempay has not recorded yet (issue 29, defect 2). The
//! processor answers idempay's call and delivers its events independently: while a payment's
//! outcome is unknown (503 `processor-outcome-unknown`, the key suspended), its charge exists at
//! the processor, a dispute can be opened on it, and its event can reach idempay before any payment
//! names the charge. Such an event is refused (409 `webhook-object-not-recorded`), recorded
//! nowhere, and applied once when its redelivery finds the payment; and `idempay reconcile`
//! compares disputed amounts and disputes, so an event that was lost anyway shows.
//!
//! The processor runs in the test process on the test's database, delivering its events to the
//! idempay under test, as in `two_hops.rs`, whose helpers these share.

use std::time::Duration;

use ::processor::ProcessorSettings;
use ::processor::SharedArgs;
use idempay::config::{ProcessorLink, Settings};
use idempay_test_macros::api_test;
use serde_json::json;
use service::outbox::{RetrySchedule, WebhookSecrets};
use tokio::net::TcpListener;

use super::two_hops::{assert_ledgers_agree, faulty, key_row, linked_to, reconcile, the_charge};
use crate::processor::{self, TestProcessor};
use crate::support::helpers::{TestApp, new_key, payment, send, wait_until};

/// Every 200 ms for 30 s: longer than any scenario here takes to record its payment.
fn patiently() -> RetrySchedule {
    RetrySchedule::new(vec![Duration::from_millis(200); 150]).unwrap()
}

/// idempay and a processor on the test's database, the processor delivering its events, signed,
/// to idempay's intake and retrying a refused one on `schedule`.
async fn delivering_events(
    settings: Settings,
    mut processor: ProcessorSettings,
    schedule: RetrySchedule,
) -> (TestApp, TestProcessor, WebhookSecrets) {
    let secret = WebhookSecrets::generate();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", listener.local_addr().unwrap());
    let app = TestApp::spawn_with(linked_to(
        &address,
        Settings {
            shared: SharedArgs {
                webhook_secrets: Some(secret.clone()),
                ..settings.shared
            },
            ..settings
        },
    ))
    .await;
    processor.webhook_url = Some(app.url("/v1/webhooks/processor"));
    processor.shared.webhook_secrets = Some(secret.clone());
    processor.shared.webhook_retry_schedule = schedule;
    let processor = TestProcessor::beside_on(&app, processor, listener).await;
    (app, processor, secret)
}

/// Opens a dispute of `amount` on `charge` at the processor, as the cardholder's bank does; its id.
async fn dispute_at_the_processor(processor: &TestProcessor, charge: &str, amount: i64) -> String {
    let opened = processor
        .post(
            &format!("/v1/charges/{charge}/disputes"),
            None,
            &json!({ "amount": amount }),
        )
        .await;
    assert_eq!(
        opened.status,
        201,
        "{}",
        String::from_utf8_lossy(&opened.body)
    );
    opened.json()["id"].as_str().unwrap().to_owned()
}

/// The processor's delivery of the event whose body names `object`: its event id, attempts so far,
/// the status its last attempt was answered, and whether it was acknowledged.
async fn delivery_naming(app: &TestApp, object: &str) -> Option<(String, i32, Option<i16>, bool)> {
    sqlx::query_as(
        "SELECT event_id, attempts, last_status, delivered_at IS NOT NULL FROM webhook_deliveries
         WHERE endpoint_id IS NULL AND position($1::bytea IN body) > 0",
    )
    .bind(format!("\"dispute\":\"{object}\"").into_bytes())
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

/// Whether idempay recorded the event `id` as processed.
async fn processed(app: &TestApp, id: &str) -> Option<String> {
    sqlx::query_scalar("SELECT outcome FROM processed_events WHERE id = $1")
        .bind(id)
        .fetch_optional(&app.db)
        .await
        .unwrap()
}

/// The reproduction: a payment answered 503 (the processor slower than idempay waits), a
/// dispute opened on its charge before the client retries. The dispute's event is refused, not
/// recorded as processed; the retry records the payment (201); the processor's outbox delivers the
/// event again and it applies, once: the payment shows the dispute, and the same signed event
/// delivered once more is a duplicate. On the code before the fix, the first delivery was
/// acknowledged `ignored` and the payment showed `amount_disputed: 0` for good.
#[api_test]
async fn a_dispute_event_that_arrives_before_its_payment_is_recorded_is_refused_then_applied_once()
{
    let (app, processor, secret) = delivering_events(
        Settings {
            processor: ProcessorLink {
                timeout: Duration::from_millis(300),
                ..ProcessorLink::default()
            },
            ..Settings::default()
        },
        // Far beyond idempay's attempts: the answer comes after idempay gave up.
        faulty(|s| s.faults.latency = Duration::from_secs(2)),
        patiently(),
    )
    .await;
    let key = new_key();
    app.post_payment(&key, &payment(4200))
        .await
        .assert_problem(503, "processor-outcome-unknown");
    wait_until("the processor charges after the latency", || async {
        app.charge_count().await == 1
    })
    .await;
    let (charge, _) = the_charge(&app).await;
    let dispute = dispute_at_the_processor(&processor, &charge, 1500).await;

    wait_until("the dispute's event is delivered once", || async {
        delivery_naming(&app, &dispute)
            .await
            .is_some_and(|(_, attempts, status, _)| attempts >= 1 && status.is_some())
    })
    .await;

    let (event, _, status, acknowledged) = delivery_naming(&app, &dispute).await.unwrap();
    assert_eq!(
        (status, acknowledged),
        (Some(409), false),
        "refused while no payment names the charge"
    );
    assert_eq!(
        processed(&app, &event).await,
        None,
        "not recorded as processed"
    );
    assert_eq!(
        app.payment_count().await,
        0,
        "the payment is not recorded yet"
    );
    let (_, point, _) = key_row(&app, &key).await.expect("the key is kept");
    assert_eq!(point.as_deref(), Some("payment.charge_requested"));

    let retry = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(
        retry.status,
        201,
        "{}",
        String::from_utf8_lossy(&retry.body)
    );
    assert_eq!(retry.json()["charge"], charge.as_str());
    let paid = retry.json()["id"].as_str().unwrap().to_owned();

    wait_until("the outbox delivers the dispute's event again", || async {
        delivery_naming(&app, &dispute)
            .await
            .is_some_and(|(_, _, _, acknowledged)| acknowledged)
    })
    .await;
    assert_eq!(processed(&app, &event).await.as_deref(), Some("applied"));
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1500);

    // The same event once more, signed as the processor signs it, with its webhook id: a
    // duplicate, applied nothing.
    let body: Vec<u8> =
        sqlx::query_scalar("SELECT body FROM webhook_deliveries WHERE event_id = $1")
            .bind(&event)
            .fetch_one(&app.db)
            .await
            .unwrap();
    let now = chrono::Utc::now().timestamp();
    let again = send(
        reqwest::Client::new()
            .post(app.url("/v1/webhooks/processor"))
            .header("content-type", "application/json")
            .header("webhook-id", &event)
            .header("webhook-timestamp", now)
            .header(
                "webhook-signature",
                secret.sign(&event, now, &body).unwrap(),
            )
            .body(body),
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["outcome"], "duplicate");
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1500);
    let disputes: i64 = sqlx::query_scalar("SELECT count(*) FROM disputes")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(disputes, 1);
    assert_ledgers_agree(&app, &processor, 1).await;
}

/// An event about a charge idempay will never record (made at the processor directly) wedges
/// nothing: it is refused at every attempt until the processor's outbox gives it up on its
/// schedule, recorded nowhere, while the events of a payment idempay records are applied beside
/// it; and `idempay reconcile` names the charge. On the code before the fix, its first delivery was
/// acknowledged `ignored` and nothing showed that an event had been dropped.
#[api_test]
async fn an_event_about_a_charge_never_recorded_is_refused_until_given_up_and_wedges_nothing() {
    let (app, processor, _) = delivering_events(
        Settings::default(),
        processor::settings(),
        RetrySchedule::parse("100ms,100ms,100ms,100ms").unwrap(),
    )
    .await;
    let direct = processor
        .charge(&new_key(), &processor::charge(777, "pm_card_visa"))
        .await;
    assert_eq!(direct.status, 201);
    let stranger = direct.json()["id"].as_str().unwrap().to_owned();
    let paid = app.paid(5000).await;
    let charge = app.get_payment(&paid).await.json()["charge"]
        .as_str()
        .unwrap()
        .to_owned();
    dispute_at_the_processor(&processor, &charge, 1500).await;

    // The stranger's delivery: its event id, attempts, last answer, acknowledged, given up.
    let delivery = || async {
        sqlx::query_as::<_, (String, i32, Option<i16>, bool, bool)>(
            "SELECT event_id, attempts, last_status, delivered_at IS NOT NULL,
                    failed_at IS NOT NULL
             FROM webhook_deliveries WHERE position($1::bytea IN body) > 0",
        )
        .bind(stranger.as_bytes())
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    wait_until("the stranger's event is answered", || async {
        delivery().await.2.is_some()
    })
    .await;
    assert_eq!(
        delivery().await.2,
        Some(409),
        "refused: no payment names it"
    );
    wait_until("the outbox gives the stranger's event up", || async {
        delivery().await.4
    })
    .await;

    let (event, attempts, status, acknowledged, _) = delivery().await;
    assert_eq!(
        (attempts, status, acknowledged),
        (5, Some(409), false),
        "refused at each of its five attempts, then given up"
    );
    assert_eq!(processed(&app, &event).await, None, "recorded nowhere");
    wait_until("the payment's dispute is applied beside it", || async {
        app.get_payment(&paid).await.json()["amount_disputed"] == 1500
    })
    .await;
    let output = reconcile(&app, &processor).await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!(
            "charge {stranger} (777) has no payment\n\
             reconciled 2 charges, 1 payments, 0 refunds and 1 disputes: 1 difference(s)\n"
        )
    );
}

/// `idempay reconcile` compares what was refunded and disputed on both ledgers: each figure broken
/// on idempay's side is a line naming the payment or dispute and both values, and the exit is 1.
/// Before, it compared no dispute, so a dispute lost on the way showed nowhere.
#[api_test]
async fn reconcile_names_a_refunded_or_disputed_amount_that_differs_between_the_ledgers() {
    let (app, processor, _) =
        delivering_events(Settings::default(), processor::settings(), patiently()).await;
    let mut paid = Vec::new();
    for amount in [4000, 5000, 6000] {
        let id = app.paid(amount).await;
        let charge = app.get_payment(&id).await.json()["charge"]
            .as_str()
            .unwrap()
            .to_owned();
        paid.push((id, charge));
    }
    let refunded = app
        .post_refund(&paid[0].0, &new_key(), &json!({ "amount": 1000 }))
        .await;
    assert_eq!(refunded.status, 201);
    let disputes = [
        dispute_at_the_processor(&processor, &paid[1].1, 1500).await,
        dispute_at_the_processor(&processor, &paid[2].1, 700).await,
    ];
    wait_until("idempay applies both disputes", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM disputes")
            .fetch_one(&app.db)
            .await
            .unwrap()
            == 2
    })
    .await;
    assert_ledgers_agree(&app, &processor, 3).await;

    // Broken by hand: a refund the payment no longer counts, a dispute the payment no longer
    // shows (the lost event), a dispute recorded for less than the bank took, and one of
    // the processor's disputes no dispute records.
    sqlx::query("UPDATE payments SET amount_refunded = 0 WHERE id = $1")
        .bind(&paid[0].0)
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("UPDATE payments SET amount_disputed = 0 WHERE id = $1")
        .bind(&paid[1].0)
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("UPDATE disputes SET amount = 500 WHERE id = $1")
        .bind(&disputes[1])
        .execute(&app.db)
        .await
        .unwrap();
    let stray = "dp_stray";
    sqlx::query("INSERT INTO processor_disputes (id, charge_id, amount) VALUES ($1, $2, 300)")
        .bind(stray)
        .bind(&paid[2].1)
        .execute(&app.db)
        .await
        .unwrap();
    let output = reconcile(&app, &processor).await;

    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let mut lines: Vec<&str> = stdout.lines().collect();
    let summary = lines.pop();
    lines.sort_unstable();
    let [
        (first, first_charge),
        (second, second_charge),
        (_, third_charge),
    ] = &paid[..]
    else {
        unreachable!()
    };
    let mut expected = vec![
        format!(
            "payment {first} / charge {first_charge}: amount_refunded is 0 here, 1000 at the processor"
        ),
        format!(
            "payment {second} / charge {second_charge}: amount_disputed is 0 here, 1500 at the processor"
        ),
        format!(
            "dispute {}: amount is 500 here, 700 at the processor",
            disputes[1]
        ),
        format!(
            "payment {} / charge {third_charge}: amount_disputed is 700 here, 1000 at the processor",
            paid[2].0
        ),
        format!("processor dispute {stray} (300) of charge {third_charge} has no dispute"),
    ];
    expected.sort_unstable();
    assert_eq!(lines, expected);
    assert_eq!(
        summary,
        Some("reconciled 3 charges, 3 payments, 1 refunds and 2 disputes: 5 difference(s)")
    );
}

/// A dispute "squeezed" by a refund: of a payment of 4000 refunded 3000, the bank disputes 2000.
/// The processor records the dispute in full (a bank takes what it claims); idempay records it in
/// full too, flagged `needs_review`, and its payment's `amount_disputed` takes the 1000 that
/// remained. That is what both ledgers legitimately hold: reconcile finds them equal. Before, it
/// compared the payment's 1000 with the processor's 2000 and reported a mismatch for ever. A
/// disputed amount other than the 1000 that fits is still a difference.
#[api_test]
async fn reconcile_finds_a_dispute_squeezed_by_a_refund_equal_on_both_ledgers() {
    let (app, processor, _) =
        delivering_events(Settings::default(), processor::settings(), patiently()).await;
    let paid = app.paid(4000).await;
    let charge = app.get_payment(&paid).await.json()["charge"]
        .as_str()
        .unwrap()
        .to_owned();
    let refunded = app
        .post_refund(&paid, &new_key(), &json!({ "amount": 3000 }))
        .await;
    assert_eq!(refunded.status, 201);
    let dispute = dispute_at_the_processor(&processor, &charge, 2000).await;
    wait_until("idempay records the dispute", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM disputes")
            .fetch_one(&app.db)
            .await
            .unwrap()
            == 1
    })
    .await;
    let recorded = app.get(&format!("/v1/disputes/{dispute}")).await.json();
    assert_eq!(
        (recorded["amount"].as_i64(), recorded["status"].as_str()),
        (Some(2000), Some("needs_review")),
        "{recorded}"
    );
    assert_eq!(app.get_payment(&paid).await.json()["amount_disputed"], 1000);

    assert_ledgers_agree(&app, &processor, 1).await;

    sqlx::query("UPDATE payments SET amount_disputed = 500 WHERE id = $1")
        .bind(&paid)
        .execute(&app.db)
        .await
        .unwrap();
    let output = reconcile(&app, &processor).await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert_eq!(
        stdout.lines().next(),
        Some(
            format!(
                "payment {paid} / charge {charge}: amount_disputed is 500 here, 2000 (a dispute \
                 needs review: at most the 1000 left after the refunds) at the processor"
            )
            .as_str()
        ),
        "{stdout}"
    );
}
