//! A completed key decided by an instance that never saw it: what the key's row in the database
//! proves, not what one instance's memory of its replays remembers. Each instance caches the
//! replays it answered or stored (`CachedReplay` in src/idempotency/mod.rs), so a test on one
//! instance answers a completed key from that cache and never reaches the comparison in
//! `decide_existing`; these run real `idempay serve` processes side by side on one database.

use idempay_test_macros::api_test;
use serde_json::json;

use crate::support::helpers::{TestApp, new_key, payment};
use crate::support::instance::Instance;
use crate::support::invariants::assert_exactly_once;

/// Issue 29, defect 7: mutating the database-side comparison of a completed key (another body
/// replays the stored payment) passed every test, because each test asked the instance that had
/// cached the key. Here the other body goes to an instance whose cache is empty.
#[api_test]
async fn another_body_on_another_instance_is_refused_from_the_key_s_row() {
    let app = TestApp::spawn().await;
    let url = app.database_url();
    let (paying, deciding) = futures::join!(Instance::start(&url, &[]), Instance::start(&url, &[]));
    let key = new_key();
    let paid = paying
        .post_payment(&app.api_key, &key, &payment(4200))
        .await;
    paid.assert_status(201);

    // `deciding` never answered this key, so nothing in its memory can: only the row can.
    let other = deciding
        .post_payment(
            &app.api_key,
            &key,
            &json!({ "amount": 9900, "currency": "usd", "order": "cmd_9182" }),
        )
        .await;

    let problem = other.assert_problem(422, "idempotency-key-mismatch");
    assert!(!other.replayed());
    assert_eq!(
        problem["mismatched_fields"],
        json!(["/amount", "/currency"])
    );
    // The row still answers its own body, on either instance: a replay of the one payment.
    for instance in [&deciding, &paying] {
        let replay = instance
            .post_payment(&app.api_key, &key, &payment(4200))
            .await;
        assert_eq!(replay.status, 201);
        assert!(replay.replayed());
        assert_eq!(replay.body, paid.body);
    }
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}
