//! The connection pool and the schema migrations.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// Connections per instance. Slow work holds none, so a few serve many requests.
const MAX_CONNECTIONS: u32 = 16;
/// A request that waits longer than this for a connection fails fast with 503 instead of hanging.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects lazily: the service starts even while the database is still coming up, and
/// `/readyz` tells when it is reachable.
pub fn pool(database_url: &str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy(database_url)
}

/// Applies the migrations under `migrations/` that have not run yet.
pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    sqlx::migrate!("./migrations").run(pool).await
}
