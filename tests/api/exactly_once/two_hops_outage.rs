//! Exactly once across two hops, outages: a processor refusing connections or answering 503, and
//! its webhooks delivered while idempay is down. The setup is `two_hops.rs`'s.

use idempay::config::Settings;
use idempay_test_macros::api_test;

use super::early_events::dispute_at_the_processor;
use super::two_hops::{
    assert_ledgers_agree, delivering_to, failing, idempay_and_processor, key_row, linked_to,
    rebind, replace_processor,
};
use crate::processor::{self, TestProcessor};
use crate::support::checks::count;
use crate::support::helpers::{TestApp, new_key, payment, wait_until};
use crate::support::instance::free_port;

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
        paid.assert_status(201);
        assert!(
            !paid.replayed(),
            "nothing had been done: the retry executes"
        );
    }
    assert_ledgers_agree(&app, &processor, INTENTS).await;
}

#[api_test]
async fn a_processor_answering_503_leaves_the_outcome_unknown_and_the_retry_charges_once() {
    let (app, failing) = idempay_and_processor(Settings::default(), failing()).await;
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
    let processor = replace_processor(&app, failing, processor::settings()).await;
    let paid = app.post_payment(&key, &payment(4200)).await;

    paid.assert_status(201);
    assert_ledgers_agree(&app, &processor, 1).await;
}

// ---------------------------------------------------------------------------------------------
// Webhooks while idempay is down
// ---------------------------------------------------------------------------------------------

#[api_test]
async fn events_delivered_while_idempay_is_down_are_redelivered_and_applied_once() {
    // The port idempay's intake will listen on; nothing listens there yet.
    let intake = free_port();
    let (settings, with_secret) = delivering_to(intake);
    let (app, processor) = idempay_and_processor(with_secret.clone(), settings).await;
    let paid = app.post_payment(&new_key(), &payment(5000)).await;
    assert_eq!(paid.status, 201);
    let (payment_id, charge) = (paid.json()["id"].clone(), paid.json()["charge"].clone());
    dispute_at_the_processor(&processor, charge.as_str().unwrap(), 1500).await;
    let attempted = || async {
        count(
            &app.db,
            "SELECT count(*) FROM webhook_deliveries WHERE attempts >= 2 AND delivered_at IS NULL",
        )
        .await
    };
    wait_until("both events fail to be delivered, twice", || async {
        attempted().await == 2
    })
    .await;

    let receiving = app
        .another_instance_on(rebind(intake).await, with_secret)
        .await;
    let delivered = || async {
        count(
            &app.db,
            "SELECT count(*) FROM webhook_deliveries WHERE delivered_at IS NOT NULL",
        )
        .await
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
    let disputes = count(&app.db, "SELECT count(*) FROM processor_disputes").await;
    assert_eq!(disputes, 1);
    assert_ledgers_agree(&app, &processor, 1).await;
}
