//! How far behind each endpoint's deliveries are, read at each scrape: the age of the oldest due
//! delivery (pending, its next attempt due) of each endpoint, for the [`ENDPOINTS`] endpoints
//! furthest behind. An endpoint that never answers, or a loop that is stuck, shows as a rising age
//! on its own line, where the oldest pending delivery over all of them cannot say whose it is.

use std::collections::HashSet;
use std::sync::Mutex;

use sqlx::PgPool;

use crate::name::ServiceName;

/// How many endpoints the gauge follows at most, the furthest behind first: the series stay few
/// whatever the number of endpoints.
pub const ENDPOINTS: i64 = 50;

/// A line of the gauge: the service whose series it is, the sender and the endpoint.
type Line = (&'static str, String, String);

/// The lines given an age at an earlier scrape: one caught up since is written 0, so that it falls
/// rather than stays at its last age.
static SEEN: Mutex<Option<HashSet<Line>>> = Mutex::new(None);

/// Reads the age of each endpoint's oldest due delivery into `service`'s gauge; its scrape calls
/// it. A scrape while the database is down still answers, with the last ages it read.
pub fn read_oldest_due(
    service: ServiceName,
    pool: &PgPool,
) -> futures_util::future::BoxFuture<'_, ()> {
    Box::pin(async move {
        match oldest_due(pool).await {
            Ok(ages) => {
                let now: HashSet<Line> = ages
                    .iter()
                    .map(|(sender, endpoint, _)| {
                        (service.as_str(), sender.clone(), endpoint.clone())
                    })
                    .collect();
                let mut seen = SEEN
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                for seen in seen.get_or_insert_with(HashSet::new).iter() {
                    let (name, sender, endpoint) = seen;
                    if *name == service.as_str() && !now.contains(seen) {
                        super::metrics::oldest_due(service, sender, endpoint, 0.0);
                    }
                }
                for (sender, endpoint, seconds) in ages {
                    super::metrics::oldest_due(service, &sender, &endpoint, seconds);
                }
                seen.get_or_insert_with(HashSet::new).extend(now);
            }
            Err(error) => tracing::warn!(%error, "cannot read the oldest due webhook deliveries"),
        }
    })
}

/// Each endpoint's sender (`endpoints`, `processor`), endpoint (its id; `idempay` for the
/// processor's deliveries, which go to idempay) and how long its oldest due delivery has been
/// due, in seconds: for a first attempt, its age.
pub async fn oldest_due(pool: &PgPool) -> Result<Vec<(String, String, f64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"
        SELECT CASE WHEN endpoint_id IS NULL THEN 'processor' ELSE 'endpoints' END AS "sender!",
               COALESCE(endpoint_id, 'idempay') AS "endpoint!",
               GREATEST(EXTRACT(EPOCH FROM now() - min(next_attempt_at))::float8, 0) AS "seconds!"
        FROM webhook_deliveries
        WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
        GROUP BY 1, 2
        ORDER BY 3 DESC
        LIMIT $1
        "#,
        ENDPOINTS,
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.sender, row.endpoint, row.seconds))
        .collect())
}
