//! On Citus (`make test-citus`), what keeps the mechanism's guarantees at the cost of one node: every
//! statement a request runs names its account and runs on the one node that holds it, and a
//! request's transaction commits there, without a two-phase commit. Ignored on a single server.

use std::collections::BTreeSet;
use std::time::Duration;

use idempay::config::ProcessorLink;
use idempay::config::Settings;
use idempay::db::citus::DISTRIBUTED;
use idempay_test_macros::api_test;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::processor::{API_KEY, TestProcessor};
use crate::support::helpers::{TestApp, new_key};

/// The statements of idempay's own code that may reach more than one node, each found by text
/// that only it has, and why. Each must still exist: a stale entry fails the test.
const ACROSS_ACCOUNTS: [(&str, &str); 29] = [
    (
        "SELECT recovery_point AS \"point!\"",
        "the start-up check for suspended keys no unit of work resumes: once per start, across \
         every account",
    ),
    (
        "AND NOT (COALESCE(recovery_state -> 'version', '1')::text",
        "the recovery job's report of the keys it leaves alone for their state's version: read \
         only, across every account",
    ),
    (
        "FOR UPDATE SKIP LOCKED",
        "a background job's single-server form (expiry, recovery, delivery): on Citus its \
         `_unlocked` twin runs",
    ),
    (
        "WITH reserved AS (",
        "the reservation's single-server form, one statement; on Citus the two routed ones run",
    ),
    (
        "SELECT idempotency_complete($21",
        "the payment's single-server form, effect and completion in one statement",
    ),
    (
        "RETURNING id, type, body",
        "events and their deliveries in one statement, the single-server form",
    ),
    (
        "SELECT idempotency_complete($18",
        "the processor's charge in one statement (its ledger is a local table)",
    ),
    (
        "SELECT account_id, id FROM",
        "a background job on Citus: the batch it reads across every account",
    ),
    (
        "SELECT account_id, id, recoveries FROM",
        "the recovery job on Citus: the batch it reads across every account, with each key's \
         tries (its wait grows with them)",
    ),
    (
        "IN (SELECT * FROM unnest($1::text[], $2::bigint[]))",
        "a background job on Citus: the batch it writes, by primary key, on every node it spans",
    ),
    (
        "IN (SELECT * FROM unnest($1::text[], $2::text[]))",
        "the expiry job's retention of events on Citus: the batch it deletes, by primary key, on \
         every node it spans (a pending delivery of each looked for on the event's own node)",
    ),
    (
        "OR charge = $2 LIMIT 1",
        "webhook intake: the account of the payment the processor names",
    ),
    (
        "SELECT account_id FROM payments WHERE charge = $1 LIMIT 1",
        "webhook intake, parking an event: the account of the charge it names, if recorded (the \
         processor's event names no account), whose bound of parked events it counts against",
    ),
    (
        "SELECT account_id, payment_id FROM disputes WHERE id = $1 LIMIT 1",
        "webhook intake: the account and payment of the dispute a `charge.dispute.updated` or \
         `.closed` names (the processor's event names no account)",
    ),
    (
        "OR processor_refund = $1 LIMIT 1",
        "webhook intake: the account of the refund the processor names",
    ),
    (
        "substring(scope FROM position(' ' IN scope) + 1)",
        "the metrics' keys past their recovery point (by state, route and point) and the age of \
         the oldest suspended one, read at a scrape over every account",
    ),
    (
        "min(created_at)",
        "the metrics' age of the oldest pending delivery, over every account",
    ),
    (
        "recovery_point AS \"recovery_point!\", downstream_key",
        "`idempay reconcile`: every suspended key, over every account",
    ),
    (
        "min(next_attempt_at)",
        "the metrics' age of each endpoint's oldest due delivery, over every account",
    ),
    (
        r#"count(*) FILTER (WHERE status = $1) AS "enabled!""#,
        "the metrics' count of webhook endpoints by status, over every account",
    ),
    (
        "PARTITION BY account_id, COALESCE(endpoint_id, url)",
        "the delivery loop on Citus: the due rows it ranks in each endpoint, read across every \
         account (each account's ranked on its own node)",
    ),
    (
        "FROM payments WHERE charge IS NOT NULL",
        "`idempay reconcile`: every payment, against the processor's ledger",
    ),
    (
        "FROM idempotency_keys WHERE status = 'held'",
        "`idempay reconcile`: every key held for an operator, over every account",
    ),
    (
        "WHERE p.charge IS NOT NULL",
        "`idempay reconcile`: every dispute, against the processor's ledger",
    ),
    (
        "WHERE r.processor_refund IS NOT NULL",
        "`idempay reconcile`: every refund, against the processor's ledger",
    ),
    (
        "FROM payments WHERE charge = ANY($1)",
        "`idempay reconcile`: the processor's charges its first read did not find recorded, \
         looked for again over every account",
    ),
    (
        "WHERE processor_refund = ANY($1)",
        "`idempay reconcile`: the processor's refunds its first read did not find recorded, \
         looked for again over every account",
    ),
    (
        "FROM disputes WHERE id = ANY($1)",
        "`idempay reconcile`: the processor's disputes its first read did not find recorded, \
         looked for again over every account",
    ),
    (
        "AND downstream_key = ANY($1)",
        "`idempay reconcile`: the keys in progress that asked for what the processor made and \
         idempay has not recorded yet, over every account",
    ),
];

#[api_test(citus_only)]
async fn on_citus_every_statement_a_request_runs_is_planned_on_the_one_node_of_its_account() {
    let app = TestApp::spawn().await;
    let statements = own_statements();
    assert!(
        statements.len() > 40,
        "found {} statements",
        statements.len()
    );

    // One connection: a prepared statement lives in its session.
    let session = PgPoolOptions::new()
        .max_connections(1)
        .connect(&app.database_url())
        .await
        .unwrap();
    let mut exempted: BTreeSet<&'static str> = BTreeSet::new();
    let mut to_check = Vec::new();
    for statement in statements {
        if !DISTRIBUTED
            .iter()
            .any(|table| names_table(&statement.query, table))
        {
            continue;
        }
        match exemption(&statement.query) {
            Some(marker) => {
                exempted.insert(marker);
            }
            None => to_check.push(statement),
        }
    }
    let checked = to_check.len();
    let mut spread = Vec::new();
    for (n, statement) in to_check.into_iter().enumerate() {
        let Statement { query, parameters } = statement;
        let plan = explain(
            &session,
            n,
            query.clone(),
            parameters,
            app.account_id.clone(),
        )
        .await;
        if let Err(why) = single_node(&plan) {
            spread.push(format!("{why}:\n{}\n{}", query.trim(), plan.join("\n")));
        }
    }
    assert!(
        spread.is_empty(),
        "{} of {checked} statements reach more than one node:\n\n{}",
        spread.len(),
        spread.join("\n\n")
    );
    for (marker, why) in ACROSS_ACCOUNTS {
        assert!(
            exempted.contains(marker),
            "no statement has {marker:?} any more ({why}): the exemption is stale"
        );
    }
    println!(
        "cluster: {checked} statements planned on one node, {} kinds exempted",
        exempted.len()
    );
    assert!(checked > 30, "only {checked} statements were checked");
}

#[api_test(citus_only)]
async fn on_citus_payments_replays_refunds_and_lists_commit_without_a_two_phase_commit() {
    // The processor keeps its ledger in a database of its own, as another company's system does:
    // what is counted here is idempay's own transactions.
    let processor = TestProcessor::spawn().await;
    let mut settings = Settings::default();
    settings.processor = ProcessorLink {
        url: Some(processor.address.clone()),
        api_key: Some(API_KEY.to_owned()),
        ..settings.processor
    };
    let app = TestApp::spawn_with(settings).await;
    // An account whose shards are on the other worker, for the check at the end.
    let mine = node_of(&app, &app.account_id).await;
    let mut other_account = app.create_account("another merchant").await.0;
    while node_of(&app, &other_account).await == mine {
        other_account = app.create_account("another merchant").await.0;
    }

    // Commit records of transactions already done are cleared, so that what follows is counted
    // from zero; the maintenance daemon clears them too, at most once a minute.
    sqlx::query("SELECT recover_prepared_transactions()")
        .execute(&app.db)
        .await
        .unwrap();
    let before = two_phase_commits(&app).await;
    let mut payments = Vec::new();
    for amount in [1000, 2000, 3000] {
        let key = new_key();
        let body = json!({"amount": amount, "currency": "eur", "payment_method": "pm_card_visa"});
        let created = app.post_payment(&key, &body).await;
        created.assert_status(201);
        let replay = app.post_payment(&key, &body).await;
        assert_eq!(replay.body, created.body);
        payments.push(created.id());
    }
    let refund = app
        .post_refund(&payments[0], &new_key(), &json!({"amount": 500}))
        .await;
    refund.assert_status(201);
    for path in [
        "/v1/payments".to_owned(),
        format!("/v1/payments/{}", payments[1]),
        format!("/v1/payments/{}/refunds", payments[0]),
        "/v1/events".to_owned(),
    ] {
        assert_eq!(app.get(&path).await.status, 200, "{path}");
    }
    let after = two_phase_commits(&app).await;
    assert_eq!(
        after, before,
        "idempay's requests committed by two-phase commit"
    );

    // The count sees one when there is one: a transaction that writes two accounts on two
    // different nodes commits by two-phase commit.
    let mut tx = idempotency::connections::begin(&app.db).await.unwrap();
    for account in [&app.account_id, &other_account] {
        sqlx::query("UPDATE accounts SET name = name WHERE id = $1")
            .bind(account)
            .execute(&mut *tx)
            .await
            .unwrap();
        sqlx::query("UPDATE payments SET description = description WHERE account_id = $1")
            .bind(account)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    assert!(
        two_phase_commits(&app).await > after,
        "a transaction across two nodes left no commit record: the count sees nothing"
    );
}

/// The marker of the exemption `query` falls under, if any.
fn exemption(query: &str) -> Option<&'static str> {
    ACROSS_ACCOUNTS
        .iter()
        .map(|(marker, _)| *marker)
        .find(|marker| query.contains(marker))
}

/// A statement of idempay's source, as the compile-time query data (`.sqlx/`) holds it.
struct Statement {
    query: String,
    parameters: Vec<String>,
}

/// Every `query!` statement of `src/` and of the crates (the committed `.sqlx/` data also holds
/// the tests' own).
fn own_statements() -> Vec<Statement> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // The service's statements and the mechanism's, which is a crate of its own and keeps its
    // query data in its own folder, so that it builds where it is packaged alone.
    let sources = source_text(&root.join("src")) + &source_text(&root.join("crates"));
    let folders = [root.join(".sqlx"), root.join("crates/idempotency/.sqlx")];
    let files = folders
        .iter()
        .flat_map(|folder| std::fs::read_dir(folder).unwrap());
    let mut statements = Vec::new();
    for entry in files {
        let data: Value =
            serde_json::from_slice(&std::fs::read(entry.unwrap().path()).unwrap()).unwrap();
        let query = data["query"].as_str().unwrap().to_owned();
        if !sources.contains(&query) {
            continue;
        }
        let parameters = data["describe"]["parameters"]["Left"]
            .as_array()
            .map(|types| {
                types
                    .iter()
                    .map(|kind| kind.as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        statements.push(Statement { query, parameters });
    }
    statements.sort_by(|a, b| a.query.cmp(&b.query));
    statements
}

fn source_text(dir: &std::path::Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            text.push_str(&source_text(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            text.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    text
}

fn names_table(query: &str, table: &str) -> bool {
    query.match_indices(table).any(|(at, _)| {
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !word(query[..at].chars().next_back()) && !word(query[at + table.len()..].chars().next())
    })
}

/// The statement's distributed plan with every text parameter set to the account (the one the
/// statement routes by) and the others to a value of their type.
async fn explain(
    session: &PgPool,
    n: usize,
    query: String,
    parameters: Vec<String>,
    account: String,
) -> Vec<String> {
    let values: Vec<String> = parameters
        .iter()
        .map(|kind| {
            let literal = match kind.as_str() {
                "Text" => account.clone(),
                "TextArray" => format!("{{{account}}}"),
                "Int2" | "Int4" | "Int8" | "Float8" => "1".to_owned(),
                "Int8Array" => "{1}".to_owned(),
                "Bytea" => "\\x00".to_owned(),
                "ByteaArray" => "{\"\\\\x00\"}".to_owned(),
                "Uuid" => "00000000-0000-0000-0000-000000000000".to_owned(),
                "Jsonb" => "{}".to_owned(),
                "Bool" => "true".to_owned(),
                "Timestamptz" => "2026-12-01T00:00:00Z".to_owned(),
                "TimestamptzArray" => "{2026-12-01T00:00:00Z}".to_owned(),
                other => panic!("no sample value for a {other} parameter"),
            };
            format!("'{}'", literal.replace('\'', "''"))
        })
        .collect();
    let name = format!("statement_{n}");
    let prepare = format!("PREPARE {name} AS {query}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare.as_str()))
        .execute(session)
        .await
        .unwrap_or_else(|error| panic!("{error}: {query}"));
    let execute = if values.is_empty() {
        format!("EXPLAIN (COSTS OFF) EXECUTE {name}")
    } else {
        format!("EXPLAIN (COSTS OFF) EXECUTE {name}({})", values.join(", "))
    };
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(execute.as_str()))
        .fetch_all(session)
        .await
        .unwrap_or_else(|error| panic!("{error}: {query}"));
    let deallocate = format!("DEALLOCATE {name}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(deallocate.as_str()))
        .execute(session)
        .await
        .unwrap();
    plan
}

/// Whether a plan's every task runs on one and the same node.
fn single_node(plan: &[String]) -> Result<(), String> {
    if !plan.iter().any(|line| line.contains("Custom Scan (Citus")) {
        return Err("not a distributed plan".to_owned());
    }
    for line in plan {
        if let Some(count) = line.trim().strip_prefix("Task Count: ") {
            if count != "1" {
                return Err(format!("{count} tasks"));
            }
        }
    }
    let nodes: BTreeSet<&str> = plan
        .iter()
        .filter_map(|line| line.trim().strip_prefix("Node: "))
        .collect();
    if nodes.len() > 1 {
        return Err(format!("tasks on {} nodes", nodes.len()));
    }
    Ok(())
}

/// Transactions of this database committed by two-phase commit whose record is still kept.
async fn two_phase_commits(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_dist_transaction")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// The node that holds `account`'s shard of `payments`.
async fn node_of(app: &TestApp, account: &str) -> i32 {
    tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::query_scalar(
            "SELECT nodeport FROM citus_shards
             WHERE table_name = 'payments'::regclass
               AND shardid = get_shard_id_for_distribution_column('payments', $1)",
        )
        .bind(account)
        .fetch_one(&app.db),
    )
    .await
    .expect("in time")
    .unwrap()
}
