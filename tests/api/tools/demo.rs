//! The client half: intents through a lossy network end in exactly one payment each, and every
//! intent's final answer is the response the server stored for its key.

use client::{Client, ClientError, NewPayment, NewRefund};
use idempay::dev::demo::{self, Faults, Options};
use idempay_test_macros::api_test;

use idempay::config::Settings;
use idempay::downstream::ProcessorClient;

use crate::processor::{API_KEY, TestProcessor};
use crate::support::helpers::TestApp;

/// idempay charging at a processor of its own (its own database), both reachable by the demo.
async fn with_processor(new_key_per_call: bool) -> (TestApp, TestProcessor, ProcessorClient) {
    let processor = TestProcessor::spawn().await;
    let mut settings = Settings::default();
    settings.processor.url = Some(processor.address.clone());
    settings.processor.api_key = Some(API_KEY.to_owned());
    settings.processor.new_key_per_call = new_key_per_call;
    let app = TestApp::spawn_with(settings).await;
    let client = processor.client(std::time::Duration::from_secs(10));
    (app, processor, client)
}

/// The demo's tally of a run through a lossy network to the API and a processor that loses 30 %
/// of its answers.
async fn lossy_run(app: &TestApp, processor: ProcessorClient, intents: usize) -> demo::Tally {
    let options = Options {
        processor: Some((processor, 0.3)),
        ..losing_30_percent(intents, 0.0, false)
    };
    run(app, &options).await
}

/// `intents`, 8 at a time, through a network that loses 30 % of the answers and resets `resets`
/// of the connections; `naive`, a new key per attempt, as a client without the mechanism does.
fn losing_30_percent(intents: usize, resets: f64, naive: bool) -> Options {
    Options {
        intents,
        faults: Faults {
            lost_responses: 0.3,
            resets,
        },
        naive,
        concurrency: 8,
        processor: None,
    }
}

/// Runs the demo against `app`; its tally, printed for the run's log.
async fn run(app: &TestApp, options: &Options) -> demo::Tally {
    let tally = demo::run(&app.address, &app.api_key, options, |_| {})
        .await
        .unwrap();
    println!("{tally}");
    tally
}

#[api_test]
async fn with_the_downstream_key_a_processor_losing_answers_charges_each_intent_once() {
    let (app, processor, client) = with_processor(false).await;

    let tally = lossy_run(&app, client, 60).await;

    assert_eq!(tally.unanswered, 0, "{tally}");
    assert_eq!(tally.payments_in_ledger, 60, "{tally}");
    assert_eq!(tally.charges_at_processor, Some(60), "{tally}");
    assert!(
        processor.count("processor_charges").await == 60,
        "the processor's own ledger agrees"
    );
}

#[api_test]
async fn a_new_key_per_processor_call_charges_lost_answers_twice() {
    let (app, _processor, client) = with_processor(true).await;

    let tally = lossy_run(&app, client, 40).await;

    assert_eq!(tally.payments_in_ledger, 40, "{tally}");
    let charges = tally.charges_at_processor.expect("counted");
    assert!(
        charges > 40,
        "lost answers were charged again under new keys: {tally}"
    );
}

#[api_test]
async fn two_hundred_intents_through_30_percent_lost_answers_make_exactly_two_hundred_payments() {
    let app = TestApp::spawn().await;

    let tally = run(&app, &losing_30_percent(200, 0.05, false)).await;

    assert!(
        tally.lost_responses > 20,
        "the network did lose answers: {tally}"
    );
    assert_eq!(tally.unanswered, 0);
    assert_eq!(tally.payments_in_ledger, 200);
    assert_eq!(tally.duplicates, 0);
    assert_eq!(app.payment_count().await, 200);
    assert!(tally.replays > 0, "lost answers were recovered by replays");
    crate::support::invariants::assert_exactly_once(&app.db).await;
    for outcome in &tally.outcomes {
        let key = outcome
            .idempotency_key
            .as_deref()
            .expect("a key per intent");
        let (code, body): (i16, Vec<u8>) = sqlx::query_as(
            "SELECT response_code, response_body FROM idempotency_keys WHERE idem_key = $1",
        )
        .bind(key)
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(
            outcome.status,
            Some(code.unsigned_abs()),
            "{}",
            outcome.order
        );
        assert_eq!(
            outcome.raw.as_deref(),
            Some(body.as_slice()),
            "{}",
            outcome.order
        );
    }
}

#[api_test]
async fn a_new_key_per_attempt_charges_twice() {
    let app = TestApp::spawn().await;

    let tally = run(&app, &losing_30_percent(50, 0.0, true)).await;

    assert!(tally.duplicates > 0, "{tally}");
    assert_eq!(tally.payments_in_ledger, 50 + tally.duplicates);
    assert_eq!(app.payment_count().await as usize, tally.payments_in_ledger);
}

#[api_test]
async fn the_client_reads_refunds_lists_and_types_refusals() {
    let app = TestApp::spawn().await;
    let client = Client::new(&app.address, &app.api_key);
    let order = NewPayment {
        amount: 5000,
        currency: "eur".to_owned(),
        ..NewPayment::default()
    };

    let paid = client.create_payment(&order, None).await.unwrap();
    let read = client.get_payment(&paid.value.id).await.unwrap();
    let refund = NewRefund {
        metadata: Default::default(),
        amount: Some(1200),
        reason: None,
    };
    let refunded = client
        .refund_payment(&paid.value.id, &refund, Some("refund-1".to_owned()))
        .await
        .unwrap();
    let again = client
        .refund_payment(&paid.value.id, &refund, Some("refund-1".to_owned()))
        .await
        .unwrap();
    let page = client.list_payments(10, None).await.unwrap();
    let declined = client
        .create_payment(
            &NewPayment {
                payment_method: Some("pm_card_chargeDeclined".to_owned()),
                ..order.clone()
            },
            None,
        )
        .await;

    assert_eq!((paid.status, paid.attempts, paid.replayed), (201, 1, false));
    assert_eq!(read.value, paid.value);
    assert_eq!(refunded.value.amount, 1200);
    assert!(
        again.replayed && again.value == refunded.value,
        "the same refund, replayed"
    );
    assert_eq!(page.value.data.len(), 1);
    match declined {
        Err(ClientError::Api {
            problem, attempts, ..
        }) => {
            assert_eq!(problem.type_uri, "/problems/card-declined");
            assert!(problem.extensions["payment"].is_string());
            assert_eq!(attempts, 1, "a 402 is final, never retried");
        }
        other => panic!("a declined card is a typed refusal: {other:?}"),
    }
    assert_eq!(app.payment_count().await, 2);
}

#[api_test]
async fn the_client_waits_out_a_409_and_receives_the_first_requests_result() {
    let app = TestApp::spawn_with(crate::support::helpers::with_slow_charge(
        std::time::Duration::from_millis(800),
    ))
    .await;
    let client = Client::new(&app.address, &app.api_key);
    let slow = NewPayment {
        amount: 100,
        currency: "eur".to_owned(),
        payment_method: Some("pm_card_slow".to_owned()),
        ..NewPayment::default()
    };
    let key = Some("one-intent".to_owned());

    let (first, second) = tokio::join!(
        client.create_payment(&slow, key.clone()),
        client.create_payment(&slow, key.clone()),
    );

    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first.value, second.value, "both learn of the one payment");
    let waited = if first.replayed { &first } else { &second };
    assert!(waited.replayed && waited.attempts >= 2, "{waited:?}");
    assert_eq!(app.payment_count().await, 1);
}
