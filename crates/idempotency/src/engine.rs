//! Which kind of database the keys live in: one PostgreSQL server, or a Citus cluster whose
//! `idempotency_keys` table is distributed by owner. The lifecycle's statements differ on Citus
//! (see [`Lease::engine`](crate::Lease::engine)).

use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::OnceCell;

/// How a database runs the keys' table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// One PostgreSQL server (or the coordinator of a Citus cluster before distribution).
    Postgres,
    /// A Citus cluster with the keys' table distributed by owner.
    Citus,
}

/// Tells which engine `pool` reaches: Citus once `idempotency_keys` is a distributed table.
pub async fn engine(pool: &PgPool) -> Result<Engine, sqlx::Error> {
    // `pg_dist_partition` exists only where the extension is installed; `to_regclass` says
    // whether it does without failing where it does not.
    let citus: bool = sqlx::query_scalar(
        "SELECT to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL
            AND EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition
                        WHERE logicalrelid = 'idempotency_keys'::regclass)",
    )
    .fetch_one(pool)
    .await
    .or_else(|error| match &error {
        // The extension is absent: the subquery's table does not exist.
        sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => Ok(false),
        _ => Err(error),
    })?;
    Ok(if citus {
        Engine::Citus
    } else {
        Engine::Postgres
    })
}

/// The engine of a database, asked at the first use and remembered: a service's clones share it.
#[derive(Clone, Debug, Default)]
pub struct KnownEngine(Arc<OnceCell<Engine>>);

impl KnownEngine {
    pub async fn get(&self, pool: &PgPool) -> Result<Engine, sqlx::Error> {
        self.0.get_or_try_init(|| engine(pool)).await.copied()
    }
}
