//! idempay on Citus, the PostgreSQL extension that distributes tables across nodes: the step
//! that distributes the migrated schema by account (`idempay migrate --citus`), and how the
//! service tells which kind of database it runs on.
//!
//! The migrations are the same for one server and for a cluster: every table a request writes has
//! `account_id` in its primary key and its unique constraints, so each can be split by it. This
//! step then makes `accounts` a reference table (a copy on every node: small, read by every
//! request, written rarely) and the tables of an account's requests distributed tables, all
//! co-located on `account_id`: the shards that hold one account's key, payment, refunds, events
//! and deliveries are on the same node, so each request's statements run on that one node and its
//! transaction commits there, without a two-phase commit. The processor's tables and the record of
//! processed (and parked) webhooks stay on the coordinator: they are not per account (the processor stands for
//! another company's system, best given a database of its own).
//!
//! The calls are Citus functions, which a plain PostgreSQL does not have: they are built at run
//! time, not checked at compile time like the rest of the SQL.

use sqlx::{AssertSqlSafe, Connection, PgPool};

/// The reference table: a copy on every node, so that the foreign keys of distributed tables can
/// name it and every node reads it locally.
pub const REFERENCE: &[&str] = &["accounts"];

/// The distributed tables, in an order in which each table's foreign keys name tables already
/// distributed, all co-located with the first.
pub const DISTRIBUTED: &[&str] = &[
    "idempotency_keys",
    "payments",
    "refunds",
    "disputes",
    "events",
    "webhook_endpoints",
    "webhook_deliveries",
    "webhook_attempts",
];

/// What [`distribute`] did.
#[derive(Debug, Default)]
pub struct Distribution {
    /// Tables it distributed or replicated now; those that already were are left as they are.
    pub tables: Vec<&'static str>,
}

/// Distributes the migrated schema on the Citus cluster `pool` reaches (its coordinator). Run it
/// after the migrations; it is idempotent: a table already distributed is skipped, so it can run
/// on every `idempay migrate --citus`.
///
/// Fails with the database's error if the extension is not installed or no worker is registered.
pub async fn distribute(pool: &PgPool) -> Result<Distribution, sqlx::Error> {
    // A connection of its own, taken out of the pool: the settings below must not go back to it.
    let mut connection = pool.acquire().await?.detach();
    // Distributed (hash) and reference tables; not the "Citus local" tables the extension adds
    // to its metadata on its own, which still have to be distributed.
    let done: Vec<String> = sqlx::query_scalar(
        "SELECT logicalrelid::regclass::text FROM pg_catalog.pg_dist_partition
         WHERE partmethod = 'h' OR (partmethod = 'n' AND repmodel = 't')",
    )
    .fetch_all(&mut connection)
    .await?;
    // Triggers on distributed tables run on each copy or shard, where they may touch only their
    // own rows: idempay's one, on `accounts`, only notifies (and only on the coordinator).
    sqlx::query("SET citus.enable_unsafe_triggers = on")
        .execute(&mut connection)
        .await?;
    // Citus distributes a table only if no local table refers to it, and a table that refers to
    // another only once that one is distributed: the foreign keys between the tables to
    // distribute are dropped first and added back, as they were, once all of them are.
    let pending: Vec<&str> = REFERENCE
        .iter()
        .chain(DISTRIBUTED)
        .copied()
        .filter(|table| !done.iter().any(|name| name == table))
        .collect();
    let foreign_keys: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, quote_ident(conname), pg_get_constraintdef(oid)
         FROM pg_catalog.pg_constraint
         WHERE contype = 'f' AND conrelid::regclass::text = ANY($1)
           AND confrelid::regclass::text = ANY($1)",
    )
    .bind(&pending)
    .fetch_all(&mut connection)
    .await?;
    // Every name is the catalog's own, quoted by it (`regclass`'s text, `quote_ident`), and the
    // definition is `pg_get_constraintdef`'s: nothing of a request reaches these statements.
    for (table, name, _) in &foreign_keys {
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE {table} DROP CONSTRAINT {name}"
        )))
        .execute(&mut connection)
        .await?;
    }
    let mut distribution = Distribution::default();
    for &table in REFERENCE {
        if !done.iter().any(|name| name == table) {
            sqlx::query("SELECT create_reference_table($1)")
                .bind(table)
                .execute(&mut connection)
                .await?;
            distribution.tables.push(table);
        }
    }
    for &table in DISTRIBUTED {
        if !done.iter().any(|name| name == table) {
            sqlx::query("SELECT create_distributed_table($1, 'account_id', colocate_with => $2)")
                .bind(table)
                .bind(if table == DISTRIBUTED[0] {
                    "default"
                } else {
                    DISTRIBUTED[0]
                })
                .execute(&mut connection)
                .await?;
            distribution.tables.push(table);
        }
    }
    for (table, name, definition) in &foreign_keys {
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE {table} ADD CONSTRAINT {name} {definition}"
        )))
        .execute(&mut connection)
        .await?;
    }
    connection.close().await?;
    Ok(distribution)
}
