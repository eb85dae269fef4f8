//! Cursor pagination in Stripe's shape: `?limit=&starting_after=&ending_before=` in, and
//! `{ "object": "list", "data": [...], "has_more": bool }` out, newest first.
//!
//! Cursors are object ids, and pages are cut by keyset (`(created_at, id)` before or after the
//! cursor's), never by OFFSET. What that promises, exactly:
//!
//! - a walk never repeats an object, and never skips one that was committed before the walk
//!   began: an object's place in the order never changes, and each page starts where the last
//!   ended;
//! - an object committed during the walk is listed if it sorts into the part not yet read, and
//!   not by this walk otherwise. `created_at` is taken just before the object's insert, not at
//!   its commit, and an insert may wait (for a lock, a connection, a slow disk) while a newer
//!   object commits: the older one then commits later but sorts behind it. A client that polls
//!   for new objects with `ending_before` the newest it saw never sees such an object.
//!
//! Following every change reliably needs idempay's feed of events, `GET /v1/events`
//! (`src/events/`), which pages by commit order instead: an event is listed only once every
//! transaction older than its own has ended, so polling it forward with `ending_before` never
//! misses one.
//!
//! A list filtered by more than its page reads its query with [`ListQuery`]: the page, the
//! `created` range every list takes ([`Created`]) and the list's own filters, by name.
//!
//! A refusal is a [`PageError`], which each service answers as a problem document of its own
//! catalogue (idempay: `PageQuery`, its extractor, and the `From` impls beside it in
//! `src/http/extract.rs`).

use axum::extract::Query;
use axum::http::Uri;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

mod query;
pub use query::{Created, CreatedParams, ListQuery};

const DEFAULT_LIMIT: i64 = 10;
const MAX_LIMIT: i64 = 100;

/// The query of a list request.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// How many objects to return, 1 to 100 (default 10).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
    /// An object id: return the objects listed after it (older ones). Not with `ending_before`.
    starting_after: Option<String>,
    /// An object id: return the objects listed before it (newer ones). Not with `starting_after`.
    ending_before: Option<String>,
}

impl ListParams {
    /// The parameters of a list whose query has more (a filter), parsed with them.
    pub fn new(
        limit: Option<i64>,
        starting_after: Option<String>,
        ending_before: Option<String>,
    ) -> Self {
        Self {
            limit,
            starting_after,
            ending_before,
        }
    }
}

/// Which slice of the list a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// The newest objects.
    First,
    /// The objects older than this id.
    After(String),
    /// The objects newer than this id.
    Before(String),
}

/// Why a list request cannot be answered. The crate knows no service's problem catalogue: each
/// service maps this to its own problem documents (idempay: 400 `invalid-request` with the detail,
/// 404 `not-found`), with [`PageError`]'s text as their detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    /// The query is malformed or out of bounds; the text says how.
    #[error("{0}")]
    Invalid(String),
    /// The cursor names no object of this list: like any id that names nothing, a 404.
    #[error("`{0}` is no object of this list to page from.")]
    UnknownCursor(String),
}

/// A validated list request.
#[derive(Debug, Clone)]
pub struct PageRequest {
    pub limit: i64,
    pub cursor: Cursor,
}

impl PageRequest {
    /// How many rows to fetch: one more than the page, to learn whether there are more.
    pub fn fetch(&self) -> i64 {
        self.limit + 1
    }

    /// The page the query of `uri` asks for (`?limit=&starting_after=&ending_before=` and nothing
    /// else): what a service's extractor reads, rejecting with its own problem document.
    pub fn from_uri(uri: &Uri) -> Result<Self, PageError> {
        let Query(params) = Query::<ListParams>::try_from_uri(uri)
            .map_err(|rejection| PageError::Invalid(rejection.body_text()))?;
        Self::try_from(params)
    }
}

impl TryFrom<ListParams> for PageRequest {
    type Error = PageError;

    fn try_from(params: ListParams) -> Result<Self, PageError> {
        let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(PageError::Invalid(format!(
                "`limit` must be from 1 to {MAX_LIMIT}, got {limit}."
            )));
        }
        // An empty cursor is no cursor, as a form that leaves the field blank sends it.
        let present = |cursor: Option<String>| cursor.filter(|id| !id.is_empty());
        let cursor = match (
            present(params.starting_after),
            present(params.ending_before),
        ) {
            (None, None) => Cursor::First,
            (Some(id), None) => Cursor::After(id),
            (None, Some(id)) => Cursor::Before(id),
            (Some(_), Some(_)) => {
                return Err(PageError::Invalid(
                    "Give starting_after or ending_before, not both.".to_owned(),
                ));
            }
        };
        Ok(Self { limit, cursor })
    }
}

/// A cursor's position in the order: newest first, ties broken by id.
#[derive(Debug, Clone)]
pub struct Position {
    pub created_at: DateTime<Utc>,
    pub id: String,
}

/// A page of a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct List<T> {
    /// Always `list`.
    #[schema(value_type = String, pattern = "^list$")]
    pub object: &'static str,
    /// The objects, newest first.
    pub data: Vec<T>,
    /// Whether more objects follow in the direction of this request.
    pub has_more: bool,
}

impl<T> List<T> {
    /// Cuts the fetched rows to the page. `rows` come in the order they were fetched: newest first
    /// for `First` and `After`, oldest first for `Before` (the keyset walks away from the cursor).
    pub fn from_rows(mut rows: Vec<T>, page: &PageRequest) -> Self {
        let limit = usize::try_from(page.limit).unwrap_or(usize::MAX);
        let has_more = rows.len() > limit;
        rows.truncate(limit);
        if matches!(page.cursor, Cursor::Before(_)) {
            rows.reverse();
        }
        Self {
            object: "list",
            data: rows,
            has_more,
        }
    }

    /// [`List::from_rows`] of the rows read, each parsed into what the API shows.
    pub fn parse_rows<R, E>(
        rows: Vec<R>,
        page: &PageRequest,
        parse: impl FnMut(R) -> Result<T, E>,
    ) -> Result<Self, E> {
        let rows = rows.into_iter().map(parse).collect::<Result<_, _>>()?;
        Ok(Self::from_rows(rows, page))
    }
}

/// The cursor names no object of this list: like any id that names nothing, 404.
pub fn unknown_cursor(id: &str) -> PageError {
    PageError::UnknownCursor(id.to_owned())
}

/// The rows of one page of a list cut by keyset ([`keyset`]), with the list's three statements
/// written once and each checked at compile time:
/// - `position(cursor) if fits => statement, args…;` finds where the cursor's id stands: the
///   statement selects `created_at, id` of the one object it names among the list's, and runs only
///   when `fits` (an id of another kind's shape names nothing, without a query);
/// - `select` is a statement up to its `WHERE` (`SELECT … FROM …`, joins included);
/// - `created_at` and `id` name the columns the list is ordered by (`d.created_at` through a join);
/// - `filter` is the list's own condition (`TRUE` for none), whose parameters are `$4` onward,
///   given after it: `$1` and `$2` are the cursor's position, `$3` the rows to fetch.
///
/// The rows are `row`, fetched on `executor`; a failure is a [`ListError`], which each service
/// answers as its own problem.
#[macro_export]
macro_rules! keyset_page {
    (
        $executor:expr, $page:expr, $row:path,
        position($cursor:ident) if $fits:expr => $position:literal $(, $position_arg:expr)*;
        select: $select:literal, created_at: $created_at:literal, id: $id:literal,
        filter: $filter:literal $(, $arg:expr)* $(,)?
    ) => {
        $crate::pagination::keyset::<_, $crate::pagination::ListError>(
            $page,
            async |$cursor: &str| {
                if !$fits {
                    return Ok(None);
                }
                Ok(::sqlx::query_as!(
                    $crate::pagination::Position,
                    $position
                    $(, $position_arg)*
                )
                .fetch_optional($executor)
                .await?)
            },
            async |after: $crate::pagination::Position| {
                Ok(::sqlx::query_as!(
                    $row,
                    $select + " WHERE (" + $created_at + ", " + $id + ") > ($1, $2) AND ("
                        + $filter + ") ORDER BY " + $created_at + ", " + $id + " LIMIT $3",
                    after.created_at,
                    after.id,
                    $page.fetch()
                    $(, $arg)*
                )
                .fetch_all($executor)
                .await?)
            },
            async |before: Option<$crate::pagination::Position>| {
                Ok(::sqlx::query_as!(
                    $row,
                    $select + " WHERE (" + $created_at + ", " + $id + ") < (COALESCE($1, \
                        'infinity'::timestamptz), COALESCE($2, '')) AND (" + $filter
                        + ") ORDER BY " + $created_at + " DESC, " + $id + " DESC LIMIT $3",
                    before.as_ref().map(|position| position.created_at),
                    before.as_ref().map(|position| position.id.as_str()),
                    $page.fetch()
                    $(, $arg)*
                )
                .fetch_all($executor)
                .await?)
            },
        )
    };
}

/// Why a page of a list could not be read: the request's page (a 400, or a 404 for a cursor that
/// names nothing), or the database.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Page(#[from] PageError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// The rows of one page of a list cut by keyset, for [`List::from_rows`]. The walk is the same for
/// every list; what each list reads is its own SQL, left to the caller so that `query_as!` checks it
/// at compile time:
/// - `position(id)` finds where the cursor stands among the list's objects, or `None` when it
///   names none of them (a 404; an id of another kind's shape can answer `None` without a query);
/// - `newer(position)` fetches up to [`PageRequest::fetch`] rows after it, oldest first
///   (`ending_before`);
/// - `older(position)` fetches up to [`PageRequest::fetch`] rows before it, newest first
///   (`starting_after`), or the newest rows given `None` (the first page).
///
/// [`keyset_page!`](crate::keyset_page) writes all three (the position and both fetches) from one
/// description of the list.
pub async fn keyset<R, E>(
    page: &PageRequest,
    position: impl AsyncFnOnce(&str) -> Result<Option<Position>, E>,
    newer: impl AsyncFnOnce(Position) -> Result<Vec<R>, E>,
    older: impl AsyncFnOnce(Option<Position>) -> Result<Vec<R>, E>,
) -> Result<Vec<R>, E>
where
    E: From<PageError>,
{
    let found = match &page.cursor {
        Cursor::First => None,
        Cursor::After(id) | Cursor::Before(id) => {
            Some(position(id).await?.ok_or_else(|| unknown_cursor(id))?)
        }
    };
    match (&page.cursor, found) {
        (Cursor::Before(_), Some(after)) => newer(after).await,
        (_, before) => older(before).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(limit: i64, cursor: Cursor) -> PageRequest {
        PageRequest { limit, cursor }
    }

    #[test]
    fn the_limit_defaults_to_ten_and_is_bounded() {
        let params = |limit| ListParams {
            limit,
            starting_after: None,
            ending_before: None,
        };
        assert_eq!(PageRequest::try_from(params(None)).unwrap().limit, 10);
        assert!(PageRequest::try_from(params(Some(0))).is_err());
        assert!(PageRequest::try_from(params(Some(101))).is_err());
        assert!(PageRequest::try_from(params(Some(100))).is_ok());
    }

    #[test]
    fn a_query_is_read_from_the_uri_and_a_malformed_one_is_invalid() {
        let uri = |text: &str| text.parse::<Uri>().unwrap();
        let page =
            PageRequest::from_uri(&uri("/v1/payments?limit=3&starting_after=pay_1")).unwrap();
        assert_eq!(
            (page.limit, page.cursor),
            (3, Cursor::After("pay_1".into()))
        );
        assert!(matches!(
            PageRequest::from_uri(&uri("/v1/payments?limit=many")),
            Err(PageError::Invalid(_))
        ));
        assert!(matches!(
            PageRequest::from_uri(&uri("/v1/payments?colour=red")),
            Err(PageError::Invalid(_))
        ));
        assert_eq!(
            unknown_cursor("pay_1").to_string(),
            "`pay_1` is no object of this list to page from."
        );
    }

    #[test]
    fn both_cursors_at_once_are_refused() {
        let params = ListParams {
            limit: None,
            starting_after: Some("a".into()),
            ending_before: Some("b".into()),
        };
        assert!(PageRequest::try_from(params).is_err());
    }

    #[test]
    fn one_row_beyond_the_limit_means_more() {
        let list = List::from_rows(vec![5, 4, 3], &page(2, Cursor::First));
        assert_eq!((list.data, list.has_more), (vec![5, 4], true));
        let list = List::from_rows(vec![5, 4], &page(2, Cursor::First));
        assert_eq!((list.data, list.has_more), (vec![5, 4], false));
    }

    #[test]
    fn a_page_before_a_cursor_is_returned_newest_first() {
        let list = List::from_rows(vec![6, 7, 8], &page(2, Cursor::Before("x".into())));
        assert_eq!((list.data, list.has_more), (vec![7, 6], true));
    }
}
