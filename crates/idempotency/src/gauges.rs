//! What the keys' table holds now, for gauges read at a scrape: how many keys wait at each route
//! and recovery point, and how old the oldest suspended one is. Counters lose what they counted at
//! a restart; these are read from the table, so they say what is true now on every instance.

use sqlx::PgPool;

/// Keys in one state at one route and recovery point.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyCount {
    /// `in_progress` (a request is at its call downstream now), `suspended` (its call's outcome
    /// is unknown and its request gone: a retry or the recovery job resumes it) or `held` (past
    /// the recovery window: an operator settles it).
    pub state: String,
    /// The route template the key was used on (`/v1/payments`).
    pub route: String,
    /// The recovery point its work recorded.
    pub recovery_point: String,
    pub keys: i64,
    /// For suspended keys, the age of the oldest (since its creation: the recovery window counts
    /// from there), in seconds; 0 otherwise.
    pub oldest_seconds: f64,
}

/// The keys past their recovery point, by state, route and point: only those, so that the read
/// uses the partial indexes of suspended and held keys and never scans the completed ones (a key
/// in progress before any recovery point lives for the instant of its request).
pub async fn key_counts(pool: &PgPool) -> Result<Vec<KeyCount>, sqlx::Error> {
    sqlx::query_as!(
        KeyCount,
        r#"
        SELECT CASE WHEN status = 'held' THEN 'held'
                    WHEN locked_until <= now() THEN 'suspended'
                    ELSE 'in_progress' END AS "state!",
               substring(scope FROM position(' ' IN scope) + 1) AS "route!",
               recovery_point AS "recovery_point!",
               count(*) AS "keys!",
               COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)
                            FILTER (WHERE status = 'in_progress' AND locked_until <= now())),
                        0)::float8 AS "oldest_seconds!"
        FROM idempotency_keys
        WHERE (status = 'in_progress' AND recovery_point IS NOT NULL) OR status = 'held'
        GROUP BY 1, 2, 3
        "#
    )
    .fetch_all(pool)
    .await
}
