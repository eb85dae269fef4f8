//! Exactly once across two hops, checked: `idempay reconcile` names every difference of a ledger
//! broken on purpose. The setup is `two_hops.rs`'s.

use idempay::config::Settings;
use idempay_test_macros::api_test;

use super::two_hops::{assert_reconciled, idempay_and_processor, reconcile};
use crate::processor;
use crate::support::helpers::{new_key, payment};

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
