//! On Citus (`make test-citus`), what a rebalance means for keys in flight: an account's shards move
//! to another worker while its payments stream in. Every statement waits for the move or meets the
//! account where it now is; each key still ends with one payment, and its stored answer moved with
//! it. Ignored on a single server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idempay_test_macros::api_test;

use crate::support::helpers::{TestApp, payment, retry_while_in_flight, wait_until};
use crate::support::instance::Instance;
use crate::support::invariants::assert_exactly_once;
use crate::support::stream::PaymentStream;

/// Clients sending new payments side by side, each at most one request per `PACE`.
const CLIENTS: usize = 4;
const PACE: Duration = Duration::from_millis(20);
/// Payments answered before the move starts, and again after it ended, before the stream stops.
const AROUND_THE_MOVE: usize = 12;

#[api_test(citus_only)]
async fn on_citus_payments_made_while_their_shards_move_to_another_worker_are_each_made_once() {
    let app = TestApp::spawn().await;
    let instance = Arc::new(Instance::start(&app.database_url(), &[]).await);
    let (shard, from) = placement_of(&app, &app.account_id).await;
    let to = other_worker(&app, &from).await;

    let stream = PaymentStream::start(&instance, &app.api_key, CLIENTS, PACE);
    wait_until("payments before the move", || async {
        stream.answered().await >= AROUND_THE_MOVE
    })
    .await;
    // `block_writes`: the shards stay readable while they are copied, and writes to them wait
    // until the move is over. (The default mode would copy by logical replication, which these
    // nodes do not run: `wal_level` is `replica`.)
    let began = Instant::now();
    let mover = {
        let db = app.db.clone();
        let (from, to) = (from.clone(), to.clone());
        tokio::spawn(async move {
            sqlx::query(
                "SELECT citus_move_shard_placement($1, $2, $3, $4, $5, \
                 shard_transfer_mode => 'block_writes')",
            )
            .bind(shard)
            .bind(&from.0)
            .bind(from.1)
            .bind(&to.0)
            .bind(to.1)
            .execute(&db)
            .await
        })
    };
    // The window this test aims at: a payment's statement held by the move, on the coordinator.
    let mut held = None;
    while !mover.is_finished() {
        if held.is_none() {
            held = waiting_for_the_move(&app).await;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    mover.await.unwrap().expect("the account's shards move");
    let ended = Instant::now();
    let after_the_move = stream.answered().await + AROUND_THE_MOVE;
    wait_until("payments after the move", || async {
        stream.answered().await >= after_the_move
    })
    .await;
    let sent = stream.stop().await;

    assert_eq!(
        nodes_of(&app, &app.account_id).await,
        std::slice::from_ref(&to),
        "every shard of the account's rows is on the other worker"
    );
    let during: Vec<_> = sent.iter().filter(|s| s.overlaps(began, ended)).collect();
    let slowest = during.iter().map(|s| s.elapsed()).max().unwrap_or_default();
    let created = sent.iter().filter(|s| s.answer.status == 201).count();
    eprintln!(
        "shard {shard} moved from {}:{} to {}:{} in {:.2?}: {} payments sent by {CLIENTS} clients, \
         {} of them in flight during the move (the slowest answered in {slowest:.2?}), {created} \
         answered 201",
        from.0,
        from.1,
        to.0,
        to.1,
        ended - began,
        sent.len(),
        during.len(),
    );
    let held = held.expect("no statement of a payment waited for the move");
    eprintln!(
        "held by the move: {}",
        held.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    assert!(
        !during.is_empty(),
        "no payment was in flight while the shards moved"
    );
    assert!(
        sent.iter()
            .any(|s| s.sent_at > ended && s.answer.status == 201),
        "payments went on after the move"
    );
    // A statement that waited past its lock timeout for the switch is answered 503, to be retried
    // with the same key; nothing else.
    for refused in sent.iter().filter(|s| s.answer.status != 201) {
        assert_eq!(
            refused.answer.status,
            503,
            "{}: {}",
            refused.key,
            String::from_utf8_lossy(&refused.answer.body)
        );
        assert!(refused.answer.header("retry-after").is_some());
    }

    // An instance started now has no answer in memory: every replay is read where the key now is.
    let fresh = Instance::start(&app.database_url(), &[]).await;
    for s in &sent {
        let body = payment(s.amount);
        let retry = retry_while_in_flight(|| fresh.post_payment(&app.api_key, &s.key, &body)).await;
        assert_eq!(retry.status, 201, "{}", s.key);
        if s.answer.status == 201 {
            assert!(retry.replayed(), "{}", s.key);
            assert_eq!(retry.body, s.answer.body, "{}", s.key);
        }
    }
    assert_eq!(
        app.payment_count().await,
        sent.len() as i64,
        "one payment per key"
    );
    assert_exactly_once(&app.db).await;
}

/// A worker: its name and port, as the cluster's metadata names it.
type Node = (String, i32);

/// The shard of `idempotency_keys` that holds `account`'s keys, and the worker it is on. Its
/// account's payments, refunds and events are in the shards co-located with it, which move with
/// it.
async fn placement_of(app: &TestApp, account: &str) -> (i64, Node) {
    let (shard, name, port) = sqlx::query_as(
        "SELECT shardid, nodename, nodeport FROM citus_shards
         WHERE table_name = 'idempotency_keys'::regclass
           AND shardid = get_shard_id_for_distribution_column('idempotency_keys', $1)",
    )
    .bind(account)
    .fetch_one(&app.db)
    .await
    .unwrap();
    (shard, (name, port))
}

/// The nodes that hold a shard of `account`'s rows, of any distributed table.
async fn nodes_of(app: &TestApp, account: &str) -> Vec<Node> {
    let (tables, nodes): (i64, Vec<Node>) = (
        sqlx::query_scalar("SELECT count(*) FROM pg_dist_partition WHERE partmethod = 'h'")
            .fetch_one(&app.db)
            .await
            .unwrap(),
        sqlx::query_as(
            "SELECT DISTINCT shard.nodename, shard.nodeport
             FROM pg_dist_partition AS tab
             JOIN citus_shards AS shard ON shard.table_name = tab.logicalrelid
               AND shard.shardid = get_shard_id_for_distribution_column(tab.logicalrelid, $1)
             WHERE tab.partmethod = 'h'",
        )
        .bind(account)
        .fetch_all(&app.db)
        .await
        .unwrap(),
    );
    assert!(tables >= 8, "only {tables} distributed tables");
    nodes
}

/// The text of a statement of idempay's that waits for a lock the move holds, if one does now:
/// Citus blocks writes to the shards it moves with an advisory lock on the coordinator.
async fn waiting_for_the_move(app: &TestApp) -> Option<String> {
    sqlx::query_scalar(
        "SELECT query FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'active'
           AND wait_event_type = 'Lock' AND wait_event = 'advisory'
           AND application_name NOT LIKE 'citus_internal%'
           AND query NOT LIKE '%citus_move_shard_placement%'
         LIMIT 1",
    )
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

/// The worker that is not `node`.
async fn other_worker(app: &TestApp, node: &Node) -> Node {
    sqlx::query_as(
        "SELECT nodename, nodeport FROM pg_dist_node
         WHERE groupid <> 0 AND noderole = 'primary' AND isactive
           AND (nodename, nodeport) <> ($1, $2)
         ORDER BY nodeport LIMIT 1",
    )
    .bind(&node.0)
    .bind(node.1)
    .fetch_one(&app.db)
    .await
    .unwrap()
}
