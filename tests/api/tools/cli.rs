//! The command line, run as a user would: the real binary against the test database.

use idempay_test_macros::api_test;
use sha2::{Digest, Sha256};

use crate::support::helpers::{TestApp, new_key};
use crate::support::instance::idempay;

#[api_test]
async fn account_create_prints_a_key_that_authenticates_and_stores_only_its_hash() {
    let app = TestApp::spawn().await;
    let database_url = app.database_url();

    let output = idempay(
        &["account", "create", "--name", "Acme"],
        &[("DATABASE_URL", database_url.as_str())],
    )
    .await;

    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let key = stdout.lines().last().unwrap().trim().to_owned();
    assert!(key.starts_with("sk_") && key.len() > 40, "{key}");
    let paid = app
        .post_payment_as(&key, &new_key(), &crate::support::helpers::payment(100))
        .await;
    assert_eq!(paid.status, 201);
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT api_key_hash FROM accounts")
        .fetch_all(&app.db)
        .await
        .unwrap();
    let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    assert!(stored.iter().any(|stored| stored == &hash));
    let plain: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM accounts WHERE position(convert_to($1, 'UTF8') in api_key_hash) > 0",
    )
    .bind(&key)
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(plain, 0, "the secret itself is not stored");
}

#[api_test]
async fn pay_charges_once_and_a_rerun_with_the_same_key_is_a_replay() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let args = [
        "pay",
        "--amount",
        "4200",
        "--currency",
        "eur",
        "--order",
        "cmd_1",
        "--idempotency-key",
        key.as_str(),
    ];
    let env = [
        ("IDEMPAY_BASE_URL", app.address.as_str()),
        ("IDEMPAY_API_KEY", app.api_key.as_str()),
    ];

    let first = idempay(&args, &env).await;
    let again = idempay(&args, &env).await;

    assert!(first.status.success(), "{first:?}");
    assert!(again.status.success(), "{again:?}");
    assert_eq!(
        first.stdout, again.stdout,
        "the same payment, byte for byte"
    );
    let payment: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(payment["amount"], 4200);
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(stderr.contains("attempt 1: HTTP 201"), "{stderr}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("replayed"));
    assert_eq!(app.payment_count().await, 1);
}

#[api_test]
async fn pay_exits_non_zero_with_the_problem_when_the_card_is_declined() {
    let app = TestApp::spawn().await;
    let env = [
        ("IDEMPAY_BASE_URL", app.address.as_str()),
        ("IDEMPAY_API_KEY", app.api_key.as_str()),
    ];

    let output = idempay(
        &[
            "pay",
            "--amount",
            "100",
            "--currency",
            "eur",
            "--payment-method",
            "pm_card_chargeDeclined",
        ],
        &env,
    )
    .await;

    assert!(!output.status.success());
    let problem: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(problem["type"], "/problems/card-declined");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("attempt 1: HTTP 402") && !stderr.contains("attempt 2"),
        "{stderr}"
    );
}

#[api_test]
async fn openapi_prints_the_committed_description() {
    let output = idempay(&["openapi"], &[]).await;
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
    );
}
