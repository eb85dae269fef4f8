//! A list request's whole query: the page ([`PageRequest`]), the `created` range every list
//! filters by ([`Created`]), and the filters of the list's own, each taken by name and parsed by the
//! list ([`ListQuery::take`]). A parameter no one took is refused ([`ListQuery::finish`]), as the
//! lists always refused one they do not know.

use axum::extract::Query;
use axum::http::Uri;
use chrono::{DateTime, TimeDelta, Utc};
use utoipa::IntoParams;

use super::{ListParams, PageError, PageRequest};

/// The latest `created` a filter accepts: the last second of year 9999, as far as a timestamp of
/// the database goes in RFC 3339.
const MAX_TIMESTAMP: i64 = 253_402_300_799;

/// The `created` range of a list request, in Stripe's words: `created[gt]`, `created[gte]`,
/// `created[lt]`, `created[lte]` (and `created`, the one second), each a unix timestamp in seconds,
/// all of them combined. An object's `created_at` is compared by its second, as Stripe's `created`
/// counts them: `created[gt]=T` starts at the second after T, `created[lte]=T` ends with T's.
///
/// It is held as a half-open range, `from <= created_at < until`, which is what an index on
/// `created_at` serves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Created {
    /// The earliest `created_at` listed, if any bound gives one.
    pub from: Option<DateTime<Utc>>,
    /// The first `created_at` past the range, if any bound gives one.
    pub until: Option<DateTime<Utc>>,
}

impl Created {
    /// The range narrowed by the bound `name` (`created`, `created[gt]`, …) of `value`, or `None`
    /// if `name` is no bound of `created`.
    fn narrow(self, name: &str, value: &str) -> Option<Result<Self, PageError>> {
        let bound = |seconds: i64| DateTime::from_timestamp(seconds, 0);
        let second = |value: &str| {
            value
                .parse::<i64>()
                .ok()
                .filter(|seconds| (0..=MAX_TIMESTAMP).contains(seconds))
                .and_then(bound)
                .ok_or_else(|| {
                    PageError::Invalid(format!(
                        "`{name}` must be a unix timestamp in seconds, from 0 to {MAX_TIMESTAMP}; \
                         got `{value}`."
                    ))
                })
        };
        if !matches!(
            name,
            "created" | "created[gt]" | "created[gte]" | "created[lt]" | "created[lte]"
        ) {
            return None;
        }
        Some(second(value).map(|at| {
            // The second T is [T, T + 1 s): `gt` and `lte` bound by its end, `gte` and `lt` by its
            // start; the bare `created` is the whole second.
            let end = at + TimeDelta::seconds(1);
            let (low, high) = match name {
                "created" => (Some(at), Some(end)),
                "created[gt]" => (Some(end), None),
                "created[gte]" => (Some(at), None),
                "created[lt]" => (None, Some(at)),
                _ => (None, Some(end)),
            };
            Self {
                from: self.from.max(low),
                until: match (self.until, high) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                },
            }
        }))
    }
}

/// The `created` parameters as the OpenAPI description lists them: [`ListQuery`] reads them from
/// the query itself, beside the list's own filters.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CreatedParams {
    /// Only objects created in this second, a unix timestamp.
    #[param(example = 1_765_065_600, minimum = 0.0, maximum = 253_402_300_799.0)]
    pub created: Option<i64>,
    /// Only objects created after this second, a unix timestamp.
    #[param(rename = "created[gt]", minimum = 0.0, maximum = 253_402_300_799.0)]
    pub gt: Option<i64>,
    /// Only objects created in this second or after, a unix timestamp.
    #[param(rename = "created[gte]", minimum = 0.0, maximum = 253_402_300_799.0)]
    pub gte: Option<i64>,
    /// Only objects created before this second, a unix timestamp.
    #[param(rename = "created[lt]", minimum = 0.0, maximum = 253_402_300_799.0)]
    pub lt: Option<i64>,
    /// Only objects created in this second or before, a unix timestamp.
    #[param(rename = "created[lte]", minimum = 0.0, maximum = 253_402_300_799.0)]
    pub lte: Option<i64>,
}

/// A list request's query, read once: the page and the `created` range at once, the list's own
/// filters as the list takes them.
#[derive(Debug)]
pub struct ListQuery {
    page: PageRequest,
    created: Created,
    /// The parameters not read yet: the list's filters, or parameters it does not know.
    rest: Vec<(String, String)>,
}

impl ListQuery {
    /// The query of `uri`. A parameter given twice is refused, as is a malformed page or bound.
    pub fn from_uri(uri: &Uri) -> Result<Self, PageError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|rejection| PageError::Invalid(rejection.body_text()))?;
        let mut seen: Vec<&str> = Vec::with_capacity(pairs.len());
        for (name, _) in &pairs {
            if seen.contains(&name.as_str()) {
                return Err(PageError::Invalid(format!(
                    "{name} is given more than once."
                )));
            }
            seen.push(name);
        }
        let (mut limit, mut starting_after, mut ending_before) = (None, None, None);
        let mut created = Created::default();
        let mut rest = Vec::new();
        for (name, value) in pairs {
            match name.as_str() {
                "limit" => {
                    limit = Some(value.parse::<i64>().map_err(|_| {
                        PageError::Invalid(format!("`limit` must be an integer, got `{value}`."))
                    })?);
                }
                "starting_after" => starting_after = Some(value),
                "ending_before" => ending_before = Some(value),
                _ => match created.narrow(&name, &value) {
                    Some(narrowed) => created = narrowed?,
                    None => rest.push((name, value)),
                },
            }
        }
        let page = PageRequest::try_from(ListParams::new(limit, starting_after, ending_before))?;
        Ok(Self {
            page,
            created,
            rest,
        })
    }

    /// The list's filter `name`, parsed by `parse`, whose error says what `name` accepts: `None`
    /// when the query has none, a 400 naming `name` when `parse` refuses it.
    pub fn take<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, PageError> {
        let Some(at) = self.rest.iter().position(|(given, _)| given == name) else {
            return Ok(None);
        };
        let (_, value) = self.rest.swap_remove(at);
        parse(&value)
            .map(Some)
            .map_err(|why| PageError::Invalid(format!("{name}: {why}")))
    }

    /// The page and the `created` range, once the list took its filters; any parameter left is
    /// none the list knows, and refused.
    pub fn finish(self) -> Result<(PageRequest, Created), PageError> {
        match self.rest.first() {
            None => Ok((self.page, self.created)),
            Some((name, _)) => Err(PageError::Invalid(format!(
                "unknown parameter `{name}`; a list takes limit, starting_after, ending_before, \
                 created, created[gt], created[gte], created[lt], created[lte] and its own filters."
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(text: &str) -> Result<ListQuery, PageError> {
        ListQuery::from_uri(&format!("/v1/things?{text}").parse::<Uri>().unwrap())
    }

    fn at(seconds: i64) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(seconds, 0)
    }

    #[test]
    fn the_created_bounds_are_seconds_and_combine_into_one_half_open_range() {
        let range = |text| query(text).unwrap().finish().unwrap().1;
        assert_eq!(range(""), Created::default());
        assert_eq!(
            range("created[gt]=10&created[lte]=20"),
            Created {
                from: at(11),
                until: at(21)
            }
        );
        assert_eq!(
            range("created[gte]=10&created[lt]=20"),
            Created {
                from: at(10),
                until: at(20)
            }
        );
        assert_eq!(
            range("created=10"),
            Created {
                from: at(10),
                until: at(11)
            }
        );
        // The tightest of two bounds on one side wins.
        assert_eq!(
            range("created[gte]=10&created[gt]=12&created[lt]=30&created[lte]=15"),
            Created {
                from: at(13),
                until: at(16)
            }
        );
    }

    #[test]
    fn a_malformed_bound_or_filter_is_refused_naming_its_parameter() {
        let refusal = |text| match query(text).and_then(|mut query| {
            query.take("status", |value| {
                (value == "paid")
                    .then_some(())
                    .ok_or("one of paid".to_owned())
            })?;
            query.finish()
        }) {
            Err(PageError::Invalid(why)) => why,
            other => panic!("{text}: {other:?}"),
        };
        assert!(refusal("created[gte]=yesterday").starts_with("`created[gte]` must be"));
        assert!(refusal("created[lt]=-1").starts_with("`created[lt]` must be"));
        assert!(refusal("created=1.5").starts_with("`created` must be"));
        assert!(refusal("created[after]=1").contains("`created[after]`"));
        assert!(refusal("colour=red").contains("`colour`"));
        assert_eq!(refusal("status=lost"), "status: one of paid");
        assert!(refusal("limit=many").starts_with("`limit` must be"));
        assert!(refusal("limit=0").starts_with("`limit` must be"));
        assert!(refusal("created[gt]=1&created[gt]=2").contains("more than once"));
        assert!(refusal("starting_after=a&ending_before=b").contains("not both"));
    }

    #[test]
    fn a_filter_taken_is_parsed_and_one_absent_is_none() {
        let mut given = query("status=paid&limit=3").unwrap();
        assert_eq!(
            given.take("status", |value| Ok::<_, String>(value.to_owned())),
            Ok(Some("paid".to_owned()))
        );
        assert_eq!(given.take("payment", |_| Ok::<_, String>(())), Ok(None));
        assert_eq!(given.finish().unwrap().0.limit, 3);
    }
}
