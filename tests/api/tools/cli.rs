//! The command line, run as a user would: the real binary against the test database.

use idempay_test_macros::api_test;
use sha2::{Digest, Sha256};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use crate::support::harness::database_url;
use crate::support::helpers::{TestApp, new_key, payment, reserve_as_a_dead_process};
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
        let holding: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            r#"SELECT count(*) FROM "{table}" WHERE {condition}"#
        )))
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
    let env = env(&app);

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
    // Usually its first attempt; on a loaded machine the first may time out, and the client's
    // retry with the same key is then answered 201 by a replay, which is the point.
    assert!(stderr.contains(": HTTP 201"), "{stderr}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("replayed"));
    assert_eq!(app.payment_count().await, 1);
}

#[api_test]
async fn pay_exits_non_zero_with_the_problem_when_the_card_is_declined() {
    let app = TestApp::spawn().await;
    let env = env(&app);

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
    // A decline is final: the 402 ends the attempts. (On a loaded machine a first attempt may
    // time out before its answer; the retry with the same key is answered the same 402.)
    let stderr = String::from_utf8_lossy(&output.stderr);
    let attempts: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("attempt "))
        .collect();
    assert!(
        attempts
            .last()
            .is_some_and(|last| last.ends_with(": HTTP 402"))
            && attempts
                .iter()
                .filter(|line| line.contains("HTTP 402"))
                .count()
                == 1,
        "{stderr}"
    );
}

/// A key held by an instance that died answers 409 until its lease ends. The lease here ends
/// only once `pay` has been answered 409 nine times, more than a client that counted eight retries
/// would take before giving up. `pay` keeps retrying with the same key until its
/// deadline, takes the key over once the lease has ended, and pays once.
#[api_test]
async fn pay_retries_a_dead_instance_s_key_with_the_same_key_until_its_lease_ends_and_pays_once() {
    let (app, key) = a_dead_process_s_key("now() + interval '1 hour'").await;
    let mut pay = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempay"))
        .args(pay_args(&key, "60s"))
        .envs(env(&app))
        .env("RUST_LOG", "off")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = pay.stdout.take().unwrap();
    let mut lines = BufReader::new(pay.stderr.take().unwrap()).lines();

    let mut stderr = String::new();
    while let Some(line) = lines.next_line().await.unwrap() {
        stderr.push_str(&line);
        stderr.push('\n');
        if line.starts_with("attempt 9: HTTP 409") {
            // The dead instance's lease runs out now.
            sqlx::query("UPDATE idempotency_keys SET locked_until = now() WHERE idem_key = $1")
                .bind(&key)
                .execute(&app.db)
                .await
                .unwrap();
        }
    }
    let status = pay.wait().await.unwrap();

    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("attempt 9: HTTP 409"), "{stderr}");
    let mut paid = Vec::new();
    BufReader::new(stdout).read_to_end(&mut paid).await.unwrap();
    let paid: serde_json::Value = serde_json::from_slice(&paid).unwrap();
    assert_eq!(paid["amount"], 4200);
    assert_eq!(app.payment_count().await, 1);
    let replay = app.post_payment(&key, &payment(4200)).await;
    assert!(
        replay.replayed(),
        "the key it paid with is the one it was given"
    );
}

/// When the deadline runs out before the key's holder is known to be done, the outcome is
/// unknown: `pay` says so with an exit code of its own and prints the key to retry with.
#[api_test]
async fn pay_whose_deadline_runs_out_exits_with_outcome_unknown_and_prints_the_key() {
    let (app, key) = a_dead_process_s_key("now() + interval '1 minute'").await;

    let output = idempay(&pay_args(&key, "3s"), &env(&app)).await;

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(i32::from(idempay::dev::cli::EXIT_OUTCOME_UNKNOWN)),
        "{stderr}"
    );
    let last_line = stderr.lines().last().unwrap_or_default();
    assert!(
        last_line.contains("outcome unknown") && last_line.contains(&key),
        "{stderr}"
    );
    assert_eq!(app.payment_count().await, 0);
}

/// A payment that could never be sent (nothing listens) is told apart from an unknown outcome.
#[api_test]
async fn pay_that_cannot_connect_exits_with_not_sent() {
    // A port bound and never listened on refuses every connection, and no other test's server can
    // take it meanwhile, as it could a port merely found free.
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = format!("http://{}", closed.local_addr().unwrap());
    let key = new_key();
    let env = [
        ("IDEMPAY_URL", address.as_str()),
        ("IDEMPAY_API_KEY", "sk_test"),
    ];

    let output = idempay(&pay_args(&key, "1s"), &env).await;

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(i32::from(idempay::dev::cli::EXIT_NOT_SENT)),
        "{stderr}"
    );
    assert!(stderr.contains("not sent"), "{stderr}");
}

/// A read loses nothing by not being retried: `keys show` against a port that refuses connections
/// ends at once (not after retrying for the 90 s deadline, "no connection in 43 attempts"), naming
/// the URL it tried and how to name another; `--help` says where the URL comes from.
#[api_test]
async fn keys_show_fails_at_once_on_a_refused_connection_naming_the_url() {
    let closed = tokio::net::TcpSocket::new_v4().unwrap();
    closed.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = format!("http://{}", closed.local_addr().unwrap());
    let env = [
        ("IDEMPAY_URL", address.as_str()),
        ("IDEMPAY_API_KEY", "sk_test"),
    ];

    let started = std::time::Instant::now();
    let output = idempay(&["keys", "show", "k1"], &env).await;
    let took = started.elapsed();
    let help = idempay(&["keys", "show", "--help"], &[]).await;

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(i32::from(idempay::dev::cli::EXIT_NOT_SENT)),
        "{stderr}"
    );
    // One attempt, not a retry loop: told by what it says, not by how fast a loaded machine ran
    // it. The bound is the retry loop's 90 s deadline, which a retrying read would use up.
    assert!(
        stderr.contains("no connection in 1 attempts") && took < std::time::Duration::from_secs(90),
        "{took:?}: {stderr}"
    );
    assert!(
        stderr.contains(&format!("cannot reach the API at {address}"))
            && stderr.contains("IDEMPAY_URL"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("[env: IDEMPAY_URL="),
        "{help:?}"
    );
}

/// `idempay pay` of the test payment (`payment(4200)`) with `key`, within `deadline`.
fn pay_args<'a>(key: &'a str, deadline: &'a str) -> Vec<&'a str> {
    vec![
        "pay",
        "--amount",
        "4200",
        "--currency",
        "eur",
        "--order",
        "cmd_9182",
        "--idempotency-key",
        key,
        "--deadline",
        deadline,
    ]
}

/// A server, and a key of its account reserved for a payment of 4200 (as `pay_args` sends) by a
/// process that died, its lease ending `locked_until`.
async fn a_dead_process_s_key(locked_until: &str) -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let key = new_key();
    reserve_as_a_dead_process(&app, &key, &payment(4200), locked_until).await;
    (app, key)
}

/// Where `idempay pay` finds the app, and who it pays as.
fn env(app: &TestApp) -> [(&str, &str); 2] {
    [
        ("IDEMPAY_URL", app.address.as_str()),
        ("IDEMPAY_API_KEY", app.api_key.as_str()),
    ]
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

#[api_test]
async fn keys_show_prints_each_route_s_block_and_refuses_an_unknown_key() {
    let app = TestApp::spawn().await;
    let key = format!("order/{}", new_key());
    let paid = app.post_payment(&key, &payment(4200)).await;
    let env = env(&app);

    let shown = idempay(&["keys", "show", &key], &env).await;
    let unknown = idempay(&["keys", "show", &new_key()], &env).await;

    assert!(shown.status.success(), "{shown:?}");
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.starts_with(&format!("POST /v1/payments {key}\n")),
        "{text}"
    );
    assert!(text.contains("  state           completed\n"), "{text}");
    assert!(text.contains("  response        201\n"), "{text}");
    let location = paid.header("location").unwrap();
    assert!(
        text.contains(&format!("  location        {location}\n")),
        "{text}"
    );
    assert!(
        !text.contains("locked until"),
        "absent fields are left out: {text}"
    );
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("404"),
        "{unknown:?}"
    );
}

/// A rollback, or an instance of the previous release restarted during a deploy, meets a schema
/// the next release migrated: `migrate` (and `serve`, which migrates first) starts beside the
/// migration it does not have, and leaves its record alone.
#[api_test]
async fn migrate_starts_on_a_database_a_later_release_migrated_further() {
    let app = TestApp::spawn().await;
    let database_url = app.database_url();
    let later: i64 = 99_991_231_000_001;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'a later release', true, '\\x00', 1)",
    )
    .bind(later)
    .execute(&app.db)
    .await
    .unwrap();

    let output = idempay(&["migrate"], &[("DATABASE_URL", database_url.as_str())]).await;

    assert!(output.status.success(), "{output:?}");
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(newest, later, "the later release's record is kept");
}

/// Two instances of a release start together (a rolling deploy of more than one) on a database
/// whose next migration builds an index `CONCURRENTLY`: one migrates while the other waits for
/// the migrations' lock. A wait inside a statement (`pg_advisory_lock`, as sqlx waits) keeps a
/// snapshot the index's build waits for, and PostgreSQL cancels one of the two as a deadlock: a
/// failed start, or an index left invalid. Both start, and every index is valid.
#[api_test]
async fn two_instances_migrating_at_once_through_a_concurrent_index_build_both_start() {
    let name = format!("migrate_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&database_url("postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = database_url(&name);
    let db = PgPool::connect(&url).await.unwrap();
    // The schema as it was before the last migrations, the first of which builds an index
    // concurrently.
    let migrator = sqlx::migrate!("./migrations");
    let concurrent = migrator
        .iter()
        .filter(|migration| migration.no_tx)
        .map(|migration| migration.version)
        .max()
        .unwrap();
    migrator.run_to(concurrent - 1, &db).await.unwrap();
    // Holding the lock, so that both find it taken and wait for it; let go once they do.
    let mut holder = db.acquire().await.unwrap();
    let lock = idempay::db::migrations_lock_id(&name);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(lock)
        .execute(&mut *holder)
        .await
        .unwrap();
    let both = tokio::spawn({
        let url = url.clone();
        async move {
            let env = [("DATABASE_URL", url.as_str())];
            tokio::join!(idempay(&["migrate"], &env), idempay(&["migrate"], &env))
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(lock)
        .execute(&mut *holder)
        .await
        .unwrap();

    let (first, second) = both.await.unwrap();
    for output in [&first, &second] {
        assert!(output.status.success(), "{output:?}");
    }
    let invalid: Vec<String> = sqlx::query_scalar(
        "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid OR NOT indisready",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert!(invalid.is_empty(), "{invalid:?}");
    let newest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(newest, migrator.iter().map(|m| m.version).max().unwrap());
}
