//! The feed: `GET /v1/events` lists an account's events in commit order, and
//! `GET /v1/events/{id}` reads one. Both serve the bytes written with the event.

use axum::extract::{FromRef, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::value::RawValue;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{Event, EventId, EventType};
use crate::accounts::{Account, AccountCache, RateLimit};
use crate::http::error::{ApiError, AuthenticatedProblems, Problem};
use crate::http::extract::{FilteredQuery, PathId};
use service::ids::PublicId;
use service::pagination::{CreatedParams, Cursor, List, ListParams, unknown_cursor};

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(list_events))
        .routes(routes!(get_event))
}

/// One row of the feed: the event's stored bytes.
struct FeedRow {
    body: Vec<u8>,
}

/// List events
///
/// The account's events, newest first, a page at a time, ordered by commit: an event is listed
/// once the transaction that wrote it is older than every transaction still running, and sorts
/// after every event listed before it. So a consumer that polls forward never misses one: ask
/// with `ending_before` set to the newest event seen (the first of the last page), take the page,
/// and ask again from its first event; `has_more` says whether newer events already wait. Without
/// a cursor the page holds the newest events; `starting_after` pages back to older ones.
///
/// The cursor must be an event the feed lists: one it does not list yet (read by its id, or
/// received by a webhook, before the feed caught up) is refused with 404, since an event of an
/// older transaction may still commit behind it.
///
/// The cost of that guarantee: an event appears only when every transaction that started before
/// its own has ended, anywhere on the database server, so one long transaction (a slow migration,
/// a session left idle in a transaction) holds the feed back until it ends. Read one event at
/// `GET /v1/events/{id}` as soon as it committed.
///
/// With `type`, only the events of that type; with the `created` bounds, only those written then
/// (an event's `created_at` is when its transaction wrote it, so in a page ordered by commit it may
/// be a little out of order); all combined.
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "listEvents",
    tag = "events",
    params(ListParams, CreatedParams, ("type" = Option<EventType>, Query, description = "Only events of this type.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of events.", body = List<Event>, content_type = "application/json"),
        (status = 400, description = "A bad `limit`, `created` bound or `type`, an unknown parameter, or both cursors at once (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The cursor names no event of this account that the feed lists yet (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_events(
    State(pool): State<PgPool>,
    account: Account,
    FilteredQuery(mut query): FilteredQuery,
) -> Result<Response, ApiError> {
    let kind = query.take("type", EventType::parse_listing_all)?;
    let (page, created) = query.finish()?;
    let account = account.id().as_str();
    let kind = kind.map(EventType::as_str);
    // The bound: every transaction older than it has ended. Read by a statement of its own, on
    // the server the service talks to: on Citus that is the coordinator, whose transaction ids
    // the events carry (Citus evaluates their column's default there), while a statement routed
    // to a worker would read the worker's snapshot, of other ids. Read before the rows, it is no
    // newer than their snapshot, so every event below it is committed and visible to them.
    let bound =
        sqlx::query_scalar!(r#"SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS "bound!""#)
            .fetch_one(&pool)
            .await?;
    let cursor = match &page.cursor {
        Cursor::First => None,
        Cursor::After(id) | Cursor::Before(id) => {
            // A cursor the feed does not list yet would let an event that commits later, with an
            // older transaction, slip behind the consumer: only a listed event is a place to
            // page from.
            let listed = EventId::fits(id)
                && sqlx::query_scalar!(
                    r#"
                    SELECT txid < $3::text::xid8 AS "listed!"
                    FROM events
                    WHERE id = $1 AND account_id = $2
                    "#,
                    id,
                    account,
                    bound,
                )
                .fetch_optional(&pool)
                .await?
                .unwrap_or(false);
            if !listed {
                return Err(unknown_cursor(id).into());
            }
            Some(id.as_str())
        }
    };
    // The events below the bound in the `created` range that also pass `narrow`, in `order`, with
    // `narrow`'s arguments from $6 on.
    macro_rules! feed {
        ($narrow:literal, $order:literal $(, $arg:expr)*) => {
            sqlx::query_as!(
                FeedRow,
                "SELECT body FROM events
                 WHERE account_id = $1
                   AND txid < $2::text::xid8
                   AND created_at >= COALESCE($3, '-infinity'::timestamptz)
                   AND created_at < COALESCE($4, 'infinity'::timestamptz)
                   AND " + $narrow + " ORDER BY " + $order + " LIMIT $5",
                account,
                bound,
                created.from,
                created.until,
                page.fetch()
                $(, $arg)*
            )
            .fetch_all(&pool)
            .await?
        };
    }
    // One statement per shape (a type or not, a cursor or not), each an index range scan: on
    // `events_type_feed` with a type, on `events_feed` without, from the cursor's place on. One
    // statement with `($n IS NULL OR …)` may be planned once for every shape after five runs (a
    // prepared statement's generic plan), which could use neither the type nor the cursor to
    // bound its scan.
    let rows = match (&page.cursor, cursor, kind) {
        (Cursor::Before(_), Some(cursor), None) => feed!(
            "(txid, seq) > (SELECT txid, seq FROM events WHERE account_id = $1 AND id = $6)",
            "txid, seq",
            cursor
        ),
        (Cursor::Before(_), Some(cursor), Some(kind)) => feed!(
            "type = $6 AND (txid, seq) > (SELECT txid, seq FROM events WHERE account_id = $1 AND id = $7)",
            "txid, seq",
            kind,
            cursor
        ),
        (_, Some(cursor), None) => feed!(
            "(txid, seq) < (SELECT txid, seq FROM events WHERE account_id = $1 AND id = $6)",
            "txid DESC, seq DESC",
            cursor
        ),
        (_, Some(cursor), Some(kind)) => feed!(
            "type = $6 AND (txid, seq) < (SELECT txid, seq FROM events WHERE account_id = $1 AND id = $7)",
            "txid DESC, seq DESC",
            kind,
            cursor
        ),
        (_, None, None) => feed!("TRUE", "txid DESC, seq DESC"),
        (_, None, Some(kind)) => feed!("type = $6", "txid DESC, seq DESC", kind),
    };
    Ok(axum::Json(List::parse_rows(rows, &page, |row| raw(row.body))?).into_response())
}

/// Retrieve an event
///
/// One of the account's events, as soon as its transaction committed (the feed may list it only
/// later, see `GET /v1/events`). Another account's event is not found.
#[utoipa::path(
    get,
    path = "/v1/events/{id}",
    operation_id = "getEvent",
    tag = "events",
    params(("id" = String, Path, description = "The event's id, `evt_…`.", example = "evt_Hq2Lm8Rt0VbX4nWc6Zp1KsYd")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The event.", body = Event, content_type = "application/json"),
        (status = 404, description = "No such event for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn get_event(
    State(pool): State<PgPool>,
    account: Account,
    PathId(id): PathId<EventId>,
) -> Result<Response, ApiError> {
    let body = sqlx::query_scalar!(
        "SELECT body FROM events WHERE id = $1 AND account_id = $2",
        id.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| EventId::no_such(id.as_str()))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

/// An event's stored bytes, to be embedded in a list as they are.
fn raw(body: Vec<u8>) -> Result<Box<RawValue>, ApiError> {
    let text = String::from_utf8(body).map_err(anyhow::Error::from)?;
    Ok(RawValue::from_string(text).map_err(anyhow::Error::from)?)
}
