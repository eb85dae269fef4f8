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
    let found = columns_holding(&app.db, &key).await;
    assert!(found.is_empty(), "the secret itself is stored in {found:?}");
    // Nor its random part without the `sk_` prefix.
    let secret = key.strip_prefix("sk_").unwrap();
    let found = columns_holding(&app.db, secret).await;
    assert!(found.is_empty(), "the secret itself is stored in {found:?}");
}

#[api_test]
async fn key_commands_refuse_malformed_and_unknown_keys_with_a_clear_message() {
    let app = TestApp::spawn().await;
    let database_url = app.database_url();
    let env = [("DATABASE_URL", database_url.as_str())];
    let unknown = format!("sk_{}", "a".repeat(40));
    let cases = [
        (
            vec!["rotate-key", "--api-key", "sk_short"],
            "not an API key",
        ),
        (vec!["revoke-key", "--api-key", "pk_test"], "not an API key"),
        (
            vec!["rotate-key", "--api-key", unknown.as_str()],
            "no account has this API key",
        ),
        (
            vec!["revoke-key", "--api-key", unknown.as_str()],
            "no account has this API key",
        ),
        (
            vec!["rotate-key", "--account", "acct_nobody"],
            "no account has the id",
        ),
        (vec!["rotate-key"], "--api-key"),
    ];

    for (args, message) in cases {
        let output = idempay(&[&["account"], args.as_slice()].concat(), &env).await;

        assert!(!output.status.success(), "{args:?}: {output:?}");
        assert!(
            output.stdout.is_empty(),
            "{args:?} printed a key: {output:?}"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    // Nothing changed: the account's key still works.
    let listed = app
        .send(
            app.client()
                .get(app.url("/v1/payments"))
                .bearer_auth(&app.api_key),
        )
        .await;
    assert_eq!(listed.status, 200);
}

/// The columns of the database's tables (`table.column`) that hold `needle` in some row: every
/// column of a character or JSON type, searched as text, and every `bytea` column, searched for the
/// needle's UTF-8 bytes.
async fn columns_holding(db: &sqlx::PgPool, needle: &str) -> Vec<String> {
    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text
         FROM information_schema.columns
         WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
           AND data_type IN ('text', 'character varying', 'character', 'json', 'jsonb', 'bytea')
         ORDER BY table_name, column_name",
    )
    .fetch_all(db)
    .await
    .unwrap();
    // The search cannot be vacuous: it covers the column that stores the key's hash.
    assert!(
        columns
            .iter()
            .any(|(table, column, _)| table == "accounts" && column == "api_key_hash"),
        "{columns:?}"
    );
    let mut found = Vec::new();
    for (table, column, data_type) in columns {
        let condition = if data_type == "bytea" {
            format!(r#"position(convert_to($1, 'UTF8') in "{column}") > 0"#)
        } else {
            format!(r#"position($1 in "{column}"::text) > 0"#)
        };
        let holding: i64 = sqlx::query_scalar(&format!(
            r#"SELECT count(*) FROM "{table}" WHERE {condition}"#
        ))
        .bind(needle)
        .fetch_one(db)
        .await
        .unwrap();
        if holding > 0 {
            found.push(format!("{table}.{column}"));
        }
    }
    found
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
