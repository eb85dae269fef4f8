//! The cluster suite's own ground (`IDEMPAY_TEST_CITUS=1`): a test's database is a working
//! Citus database on every node. Ignored on a single server, where there is no cluster to check.

use idempay_test_macros::api_test;
use sqlx::{Connection, PgConnection};

use crate::support::citus::Cluster;
use crate::support::harness::node_database_urls;
use crate::support::helpers::TestApp;

#[api_test(citus_only)]
async fn a_test_database_is_on_every_node_and_distributes_its_rows_across_both_workers() {
    let app = TestApp::spawn().await;

    // The coordinator's copy of the template knows both workers.
    let workers: Vec<i32> =
        sqlx::query_scalar("SELECT node_port::int FROM citus_get_active_worker_nodes() ORDER BY 1")
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(
        workers.len(),
        2,
        "active workers in the test's database: {workers:?}"
    );

    // Every node has the test's database, with the extension.
    let urls = node_database_urls(app.database_name());
    assert_eq!(urls.len(), 3, "a coordinator and two workers: {urls:?}");
    for url in &urls {
        let mut node = PgConnection::connect(url).await.unwrap();
        let citus: Option<String> =
            sqlx::query_scalar("SELECT extversion FROM pg_extension WHERE extname = 'citus'")
                .fetch_optional(&mut node)
                .await
                .unwrap();
        assert!(citus.is_some(), "no citus extension in {url}");
    }

    // The tables the template distributed came with the copy: their shards are placed on both
    // workers, and each is there, in that node's copy of the test's database.
    let placements: Vec<(String, i32)> =
        sqlx::query_as("SELECT shard_name::text, nodeport FROM citus_shards ORDER BY 1, 2")
            .fetch_all(&app.db)
            .await
            .unwrap();
    for worker in &workers {
        assert!(
            placements.iter().any(|(_, port)| port == worker),
            "no shard of the template on the worker on port {worker}: {placements:?}"
        );
    }
    // One connection a node: a connection to a Citus database is slow to start, and one per
    // placement (hundreds) made this test outlast its time on a loaded machine. (The reference
    // table `accounts` is placed on the coordinator too.)
    let mut copies = std::collections::BTreeMap::new();
    for (_, port) in &placements {
        if !copies.contains_key(port) {
            copies.insert(*port, node(*port, app.database_name()).await);
        }
    }
    for (shard, port) in &placements {
        let copy = copies.get_mut(port).expect("connected above");
        let present: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(shard)
            .fetch_one(&mut *copy)
            .await
            .unwrap();
        assert!(
            present,
            "shard {shard} missing from the copy on port {port}"
        );
    }

    // A table distributed in the test's own database takes rows through the coordinator into
    // shards on both workers' copies, and nowhere else.
    sqlx::raw_sql(
        "CREATE TABLE spread (account_id text, n int);
         SELECT create_distributed_table('spread', 'account_id');
         INSERT INTO spread SELECT 'acct_' || i, i FROM generate_series(1, 100) i;",
    )
    .execute(&app.db)
    .await
    .unwrap();
    let shards: Vec<(String, i32)> = sqlx::query_as(
        "SELECT shard_name::text, nodeport FROM citus_shards
         WHERE table_name = 'spread'::regclass",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    let mut rows_per_worker = std::collections::BTreeMap::<i32, i64>::new();
    for (shard, port) in &shards {
        if !copies.contains_key(port) {
            copies.insert(*port, node(*port, app.database_name()).await);
        }
        let worker = copies.get_mut(port).expect("connected above");
        let rows: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {shard}")))
                .fetch_one(&mut *worker)
                .await
                .unwrap();
        *rows_per_worker.entry(*port).or_default() += rows;
    }
    assert_eq!(
        rows_per_worker.keys().copied().collect::<Vec<_>>(),
        workers,
        "rows on both workers"
    );
    assert!(
        rows_per_worker.values().all(|&rows| rows > 0),
        "{rows_per_worker:?}"
    );
    assert_eq!(
        rows_per_worker.values().sum::<i64>(),
        100,
        "{rows_per_worker:?}"
    );
}

/// A connection to the node on `port`, in its copy of `database`.
async fn node(port: i32, database: &str) -> PgConnection {
    let port = u16::try_from(port).unwrap();
    PgConnection::connect(&format!("{}/{database}", Cluster::url_base(port)))
        .await
        .unwrap()
}
