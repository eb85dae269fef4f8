//! The fair claim of due deliveries: each endpoint's oldest due ones in turn, so that one endpoint's
//! backlog, or one that never answers, cannot hold back another's. A deliverer keeps at most
//! [`PER_ENDPOINT`] sends in flight to one endpoint, and a claim takes nothing of an endpoint at that
//! bound: a receiver that holds every request until the timeout holds that many sends, never the
//! whole loop. Svix and Stripe keep one queue per endpoint for the same reason.
//!
//! An endpoint is the account's endpoint id, or the URL for a sender whose deliveries have none
//! (the processor's). The claim walks the endpoints with pending deliveries and reads each one's
//! oldest due rows through the index `webhook_deliveries_due_by_endpoint`, a few rows each: a claim
//! reads about as many rows as it takes, however long one endpoint's backlog.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// How many sends one deliverer keeps in flight to one endpoint at most.
pub const PER_ENDPOINT: i64 = 5;

/// One claimed attempt.
pub(super) struct Due {
    pub(super) account_id: String,
    pub(super) id: i64,
    pub(super) event_id: String,
    pub(super) url: String,
    pub(super) body: Vec<u8>,
    pub(super) attempts: i32,
    /// Of `attempts`, those the receiver asked for sooner than the schedule (`Retry-After`).
    pub(super) early_attempts: i32,
    /// Set while the attempt claimed is such an early one: when the schedule's own is due.
    pub(super) step_due_at: Option<DateTime<Utc>>,
    pub(super) endpoint_id: Option<String>,
    /// The endpoint's `whsec_…`; `None` for the processor's rows.
    pub(super) secret: Option<String>,
    /// The secret a roll replaced, while it still signs beside `secret` (until the endpoint's
    /// `previous_secret_expires_at`, on the database's clock).
    pub(super) previous_secret: Option<String>,
    pub(super) created_at: DateTime<Utc>,
}

/// Where a delivery goes, as the bound on sends in flight counts: its account and endpoint id, or
/// its URL when it has no endpoint id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Endpoint {
    pub(super) account: String,
    pub(super) endpoint: String,
}

impl Due {
    pub(super) fn endpoint(&self) -> Endpoint {
        Endpoint {
            account: self.account_id.clone(),
            endpoint: self.endpoint_id.clone().unwrap_or_else(|| self.url.clone()),
        }
    }
}

/// The sends a deliverer has in flight, by endpoint.
#[derive(Debug, Default)]
pub(super) struct InFlight(HashMap<Endpoint, i64>);

impl InFlight {
    pub(super) fn start(&mut self, endpoint: Endpoint) {
        *self.0.entry(endpoint).or_insert(0) += 1;
    }

    pub(super) fn end(&mut self, endpoint: &Endpoint) {
        if let Some(count) = self.0.get_mut(endpoint) {
            *count -= 1;
            if *count <= 0 {
                self.0.remove(endpoint);
            }
        }
    }

    fn of(&self, endpoint: &Endpoint) -> i64 {
        self.0.get(endpoint).copied().unwrap_or(0)
    }

    /// The claim's parameters: accounts, endpoints and their counts, side by side.
    fn columns(&self) -> (Vec<String>, Vec<String>, Vec<i64>) {
        let mut accounts = Vec::with_capacity(self.0.len());
        let mut endpoints = Vec::with_capacity(self.0.len());
        let mut counts = Vec::with_capacity(self.0.len());
        for (endpoint, count) in &self.0 {
            accounts.push(endpoint.account.clone());
            endpoints.push(endpoint.endpoint.clone());
            counts.push(*count);
        }
        (accounts, endpoints, counts)
    }
}

/// Takes up to `room` due rows of the sender (`of_endpoints`: the merchant endpoints' rows, or the
/// processor's), at most [`PER_ENDPOINT`] less those `in_flight` of each endpoint, the endpoints'
/// first rows before any endpoint's second, and makes them due again only after `in_flight_ms`.
///
/// One statement, one short lock. The endpoints with pending rows are found by a walk of the index
/// (a recursive query that jumps from one endpoint to the next: PostgreSQL has no skip scan), and
/// each one's oldest due rows are locked in its own `LATERAL` read, `FOR UPDATE SKIP LOCKED` as
/// another loop may be claiming them. The batch is locked once, in `ARRAY(…)` (see
/// `Idempotency::expire_batch`).
pub(super) async fn claim(
    pool: &PgPool,
    of_endpoints: bool,
    room: i64,
    in_flight: &InFlight,
    in_flight_ms: i64,
) -> Result<Vec<Due>, sqlx::Error> {
    let (accounts, endpoints, counts) = in_flight.columns();
    sqlx::query_as!(
        Due,
        r#"
        WITH RECURSIVE endpoints AS (
            (SELECT account_id, COALESCE(endpoint_id, url) AS endpoint,
                    endpoint_id IS NOT NULL AS of_endpoints
             FROM webhook_deliveries
             WHERE delivered_at IS NULL AND failed_at IS NULL
             ORDER BY account_id, COALESCE(endpoint_id, url)
             LIMIT 1)
            UNION ALL
            SELECT next.account_id, next.endpoint, next.of_endpoints
            FROM endpoints
            CROSS JOIN LATERAL (
                SELECT account_id, COALESCE(endpoint_id, url) AS endpoint,
                       endpoint_id IS NOT NULL AS of_endpoints
                FROM webhook_deliveries
                WHERE delivered_at IS NULL AND failed_at IS NULL
                  AND (account_id, COALESCE(endpoint_id, url))
                      > (endpoints.account_id, endpoints.endpoint)
                ORDER BY account_id, COALESCE(endpoint_id, url)
                LIMIT 1
            ) AS next
        ),
        fair AS (
            SELECT picked.ctid, picked.next_attempt_at, picked.turn
            FROM endpoints
            LEFT JOIN unnest($4::text[], $5::text[], $6::bigint[])
                AS busy(account_id, endpoint, sending)
                ON busy.account_id = endpoints.account_id AND busy.endpoint = endpoints.endpoint
            CROSS JOIN LATERAL (
                SELECT locked.ctid, locked.next_attempt_at,
                       row_number() OVER (ORDER BY locked.next_attempt_at) AS turn
                FROM (
                    SELECT delivery.ctid, delivery.next_attempt_at
                    FROM webhook_deliveries AS delivery
                    WHERE delivery.account_id = endpoints.account_id
                      AND COALESCE(delivery.endpoint_id, delivery.url) = endpoints.endpoint
                      AND delivery.delivered_at IS NULL AND delivery.failed_at IS NULL
                      AND delivery.next_attempt_at <= now()
                    ORDER BY delivery.next_attempt_at
                    LIMIT GREATEST($3::bigint - COALESCE(busy.sending, 0), 0)
                    FOR UPDATE SKIP LOCKED
                ) AS locked
            ) AS picked
            WHERE endpoints.of_endpoints = $7
            ORDER BY picked.turn, picked.next_attempt_at
            LIMIT $2
        ),
        claimed AS (
            UPDATE webhook_deliveries
            SET attempts = attempts + 1,
                next_attempt_at = now() + $1::bigint * interval '1 millisecond'
            WHERE ctid = ANY(ARRAY(SELECT ctid FROM fair))
            RETURNING account_id, id, event_id, url, body, attempts, early_attempts,
                      step_due_at, endpoint_id, created_at
        )
        SELECT claimed.account_id AS "account_id!", claimed.id AS "id!", claimed.event_id AS "event_id!", claimed.url AS "url!",
               claimed.body AS "body!", claimed.attempts AS "attempts!",
               claimed.early_attempts AS "early_attempts!", claimed.step_due_at,
               claimed.endpoint_id, endpoint.secret AS "secret?",
               CASE WHEN endpoint.previous_secret_expires_at > now()
                    THEN endpoint.previous_secret END AS "previous_secret?",
               claimed.created_at AS "created_at!"
        FROM claimed
        LEFT JOIN webhook_endpoints endpoint
            ON endpoint.account_id = claimed.account_id AND endpoint.id = claimed.endpoint_id
        "#,
        in_flight_ms,
        room,
        PER_ENDPOINT,
        &accounts,
        &endpoints,
        &counts,
        of_endpoints,
    )
    .fetch_all(pool)
    .await
}

/// [`claim`] on Citus, which locks rows only in a statement on one shard: the due rows are read
/// without locks, ranked in each endpoint (each account's on its own node), and the update claims
/// those still due when it reaches them (see `Deliverer::claim`). The rows of endpoints at their
/// bound are left here rather than in the read, which would join the in-flight counts on every node.
pub(super) async fn claim_unlocked(
    pool: &PgPool,
    of_endpoints: bool,
    room: i64,
    in_flight: &InFlight,
    in_flight_ms: i64,
) -> Result<Vec<Due>, sqlx::Error> {
    let ranked = sqlx::query!(
        r#"
        SELECT account_id AS "account_id!", id AS "id!", endpoint AS "endpoint!", turn AS "turn!"
        FROM (
            SELECT account_id, id, next_attempt_at, COALESCE(endpoint_id, url) AS endpoint,
                   row_number() OVER (PARTITION BY account_id, COALESCE(endpoint_id, url)
                                      ORDER BY next_attempt_at) AS turn
            FROM webhook_deliveries
            WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
              AND (endpoint_id IS NOT NULL) = $2
        ) AS due
        WHERE turn <= $3
        ORDER BY turn, next_attempt_at
        LIMIT $1
        "#,
        room.saturating_mul(PER_ENDPOINT),
        of_endpoints,
        PER_ENDPOINT,
    )
    .fetch_all(pool)
    .await?;
    let room = usize::try_from(room).unwrap_or(0);
    let (owners, ids): (Vec<String>, Vec<i64>) = ranked
        .into_iter()
        .filter(|row| {
            let endpoint = Endpoint {
                account: row.account_id.clone(),
                endpoint: row.endpoint.clone(),
            };
            row.turn + in_flight.of(&endpoint) <= PER_ENDPOINT
        })
        .take(room)
        .map(|row| (row.account_id, row.id))
        .unzip();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let claimed = sqlx::query!(
        r#"
        UPDATE webhook_deliveries
        SET attempts = attempts + 1,
            next_attempt_at = now() + $3::bigint * interval '1 millisecond'
        WHERE (account_id, id) IN (SELECT * FROM unnest($1::text[], $2::bigint[]))
          AND delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= now()
        RETURNING account_id, id, event_id, url, body, attempts, early_attempts, step_due_at,
                  endpoint_id, created_at
        "#,
        &owners,
        &ids,
        in_flight_ms,
    )
    .fetch_all(pool)
    .await?;
    // The endpoints' secrets, read by account: a join in the update would not be routed.
    let mut due = Vec::with_capacity(claimed.len());
    for row in claimed {
        let (secret, previous_secret) = match &row.endpoint_id {
            Some(endpoint) => sqlx::query!(
                r#"
                SELECT secret,
                       CASE WHEN previous_secret_expires_at > now()
                            THEN previous_secret END AS "previous_secret?"
                FROM webhook_endpoints WHERE account_id = $1 AND id = $2
                "#,
                row.account_id,
                endpoint,
            )
            .fetch_optional(pool)
            .await?
            .map_or((None, None), |keys| {
                (Some(keys.secret), keys.previous_secret)
            }),
            None => (None, None),
        };
        due.push(Due {
            account_id: row.account_id,
            id: row.id,
            event_id: row.event_id,
            url: row.url,
            body: row.body,
            attempts: row.attempts,
            early_attempts: row.early_attempts,
            step_due_at: row.step_due_at,
            endpoint_id: row.endpoint_id,
            secret,
            previous_secret,
            created_at: row.created_at,
        });
    }
    Ok(due)
}
