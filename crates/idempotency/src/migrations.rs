//! The crate's own migrations (`migrations/`): the keys' table and `idempotency_complete`, in a
//! database of a service adopting the crate, recorded apart from the service's own.

use sqlx::PgPool;
use sqlx::migrate::Migrate;

use crate::connections;

/// Where [`migrate`] records the crate's migrations it applied.
pub const MIGRATIONS_TABLE: &str = "_idempotency_migrations";

/// Creates the keys' table and `idempotency_complete` (the crate's `migrations/`) where they are
/// missing: what a service adopting the crate runs at start, before or after its own migrations.
///
/// What it applied is recorded in a table of its own, [`MIGRATIONS_TABLE`], not in sqlx's
/// `_sqlx_migrations`: sqlx refuses to run a migrator over a table that records versions it does
/// not know, so a shared record made each side ignore the other's (`set_ignore_missing`), which
/// would also let either miss a migration of its own that was removed by mistake. Apart, each
/// migrator checks everything it finds. Both take the same advisory lock, so instances starting
/// at once migrate one after the other.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    let mut migrator = sqlx::migrate!("./migrations");
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    move_shared_record(pool, &migrator).await?;
    migrator.run(pool).await
}

/// A database migrated before the crate had [`MIGRATIONS_TABLE`] recorded its migrations in
/// `_sqlx_migrations`, beside the service's: without their record, this migrator would create
/// the keys' table again and fail. The rows move, in one transaction, and only those whose
/// version and checksum are one of the crate's migrations, so no row of the service's is touched.
async fn move_shared_record(
    pool: &PgPool,
    migrator: &sqlx::migrate::Migrator,
) -> Result<(), sqlx::migrate::MigrateError> {
    let mut tx = connections::begin(pool).await?;
    // Instances starting at once move the rows one after the other.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(MIGRATIONS_TABLE)
        .execute(&mut *tx)
        .await?;
    let shared: Option<String> = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
        .fetch_one(&mut *tx)
        .await?;
    if shared.is_none() {
        return Ok(());
    }
    // The table as sqlx's migrator creates it, by sqlx's own statement.
    tx.ensure_migrations_table(MIGRATIONS_TABLE).await?;
    for migration in migrator.iter() {
        sqlx::query(
            "WITH moved AS (
                 DELETE FROM _sqlx_migrations WHERE version = $1 AND checksum = $2
                 RETURNING version, description, installed_on, success, checksum, execution_time
             )
             INSERT INTO _idempotency_migrations
                 (version, description, installed_on, success, checksum, execution_time)
             SELECT * FROM moved
             ON CONFLICT (version) DO NOTHING",
        )
        .bind(migration.version)
        .bind(migration.checksum.as_ref())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
