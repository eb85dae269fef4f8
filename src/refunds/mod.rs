//! Refunds: `POST /v1/payments/{id}/refunds` gives money back at most once per idempotency key,
//! and never more than was paid and is not disputed, however many refunds race for the same
//! payment. `GET /v1/refunds` lists the account's refunds, `GET /v1/payments/{id}/refunds` one
//! payment's, both filtered by status and creation time.

mod model;
mod refund_state;
mod refunding;

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::types::Json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts::{Account, AccountCache, RateLimit};
use crate::http::error::{ApiError, AuthenticatedProblems, IdempotencyProblems, Problem};
use crate::http::extract::{FilteredQuery, PathId};
use idempotency::{Idempotency, IdempotencyKey, Idempotent, Owners};
use service::ids::PublicId;
use service::pagination::{Created, CreatedParams, List, ListParams, PageRequest};

use crate::downstream::ProcessorClient;
use crate::metadata::Metadata;
use crate::payments::{Amount, PaymentId};

const MAX_REASON_LEN: usize = 500;

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Owners<Rejection = ApiError> + Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    Idempotency: FromRef<S>,
    ProcessorClient: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(create_refund, list_refunds))
        .routes(routes!(list_account_refunds))
        .routes(routes!(get_refund))
}

/// A refund to make. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "amount": 1000, "reason": "requested_by_customer" }))]
pub struct NewRefund {
    /// How much to refund, in minor units, at most `amount − amount_refunded − amount_disputed`
    /// of the payment; all of that when absent.
    #[serde(default)]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 99_999_999, example = 1000)]
    pub amount: Option<Amount>,
    /// Why the money goes back, for the merchant's records.
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 500, pattern = "^[^\\u0000]*$", example = "requested_by_customer")]
    pub reason: Option<Reason>,
    /// Key–value pairs of the merchant's own, returned with the refund and in its events.
    #[serde(default)]
    pub metadata: Metadata,
}

/// A refund's reason: at most 500 characters.
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "String")]
pub struct Reason(pub(crate) String);

impl TryFrom<String> for Reason {
    type Error = String;

    fn try_from(reason: String) -> Result<Self, Self::Error> {
        crate::payments::reject_nul("reason", &reason)?;
        if reason.chars().count() <= MAX_REASON_LEN {
            Ok(Self(reason))
        } else {
            Err(format!(
                "reason must be at most {MAX_REASON_LEN} characters"
            ))
        }
    }
}

pub(crate) use model::RefundRow;
pub use model::{Refund, RefundId, RefundStatus};
pub use refunding::{REFUND_REQUESTED, RefundAsked, RefundRequested, refund_and_record};

/// Refund a payment
///
/// Refunds part or all of a succeeded payment, at most once per `Idempotency-Key`. What remains
/// refundable is `amount − amount_refunded − amount_disputed`: disputed money is the cardholder's
/// bank's to take back, and is not refunded as well. The payment is locked while the refund is
/// written, so concurrent refunds with different keys can never refund more than that. The
/// payment becomes `refunded` once refunded in full.
///
/// A refusal (the payment is not refundable, the amount exceeds what remains) is a result: it is
/// stored with the key and replayed, like a refund.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/refunds",
    operation_id = "createRefund",
    tag = "refunds",
    params(("id" = String, Path, description = "The payment to refund, `pay_…`."), IdempotencyKey),
    request_body(content = Option<NewRefund>, content_type = "application/json",
        description = "What to refund; without a body (or with `{}`), all that remains."),
    security(("api_key" = [])),
    responses(
        (status = 201, description = "The refund was made, or this is the replay of the request that made it.",
            body = Refund, content_type = "application/json",
            headers(
                ("Location" = String, description = "Where the refund can be read: `/v1/refunds/{id}`."),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."),
            )),
        (status = 400, description = "The body or the key is invalid (`invalid-request`, `invalid-idempotency-key`); or the payment cannot be refunded (`payment-not-refundable`) or not by that much, or nothing remains refundable (`refund-exceeds-payment`), a stored result.",
            body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 404, description = "No such payment for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        IdempotencyProblems,
        AuthenticatedProblems,
    )
)]
async fn create_refund(
    State(pool): State<PgPool>,
    State(idempotency): State<Idempotency>,
    State(processor): State<ProcessorClient>,
    account: Account,
    PathId(payment): PathId<PaymentId>,
    Idempotent { request, body }: Idempotent<NewRefund>,
) -> Result<Response, ApiError> {
    let asked = RefundAsked {
        account: account.id().clone(),
        payment,
        amount: body.amount.map(i64::from),
        reason: body.reason.map(|reason| reason.0),
        metadata: body.metadata,
    };
    idempotency
        .run(request, move |lease| {
            refund_and_record(processor, pool, lease, asked)
        })
        .await
}

/// List a payment's refunds
///
/// The payment's refunds, newest first, paginated like the payments list, and filtered like the
/// account's refunds (`GET /v1/refunds`).
#[utoipa::path(
    get,
    path = "/v1/payments/{id}/refunds",
    operation_id = "listRefunds",
    tag = "refunds",
    params(("id" = String, Path, description = "The payment, `pay_…`."), ListParams, CreatedParams,
        ("status" = inline(Option<RefundStatus>), Query, description = "Only the refunds in this status.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of refunds.", body = List<Refund>, content_type = "application/json"),
        (status = 400, description = "A bad `limit`, `created` bound or `status`, an unknown parameter, or both cursors at once (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such payment for this account, or the cursor names none of its refunds (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_refunds(
    State(pool): State<PgPool>,
    account: Account,
    PathId(payment): PathId<PaymentId>,
    FilteredQuery(mut query): FilteredQuery,
) -> Result<Response, ApiError> {
    let status = query.take("status", RefundStatus::parse_listing_all)?;
    let (page, created) = query.finish()?;
    let payment = sqlx::query_scalar!(
        "SELECT id FROM payments WHERE id = $1 AND account_id = $2",
        payment.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| PaymentId::no_such(payment.as_str()))?;
    let filters = RefundFilters {
        payment: Some(payment),
        status,
        created,
    };
    Ok(axum::Json(refunds_page(&pool, &account, &page, &filters).await?).into_response())
}

/// List refunds
///
/// The account's refunds, newest first, paginated like the payments list; filtered by payment,
/// status and creation time, all combined. A `payment` that is not the account's has no refunds
/// here: the page is empty, as for one that has none. A cursor must be one of the account's
/// refunds, and with `payment` one of that payment's; a status or time it no longer matches does
/// not stop a walk.
#[utoipa::path(
    get,
    path = "/v1/refunds",
    operation_id = "listAccountRefunds",
    tag = "refunds",
    params(ListParams, CreatedParams,
        ("payment" = Option<String>, Query, description = "Only the refunds of this payment, `pay_…`.",
            pattern = "^pay_[0-9A-Za-z]{24}$", example = "pay_U5PgTqA02dYsv3cLANIGkqIs"),
        ("status" = inline(Option<RefundStatus>), Query, description = "Only the refunds in this status.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of refunds.", body = List<Refund>, content_type = "application/json"),
        (status = 400, description = "A bad `limit`, `created` bound, `payment` or `status`, an unknown parameter, or both cursors at once (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The cursor names none of the refunds listed (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_account_refunds(
    State(pool): State<PgPool>,
    account: Account,
    FilteredQuery(mut query): FilteredQuery,
) -> Result<Response, ApiError> {
    let payment = query.take("payment", |raw| PaymentId::try_from(raw.to_owned()))?;
    let status = query.take("status", RefundStatus::parse_listing_all)?;
    let (page, created) = query.finish()?;
    let filters = RefundFilters {
        payment: payment.map(|payment| payment.as_str().to_owned()),
        status,
        created,
    };
    Ok(axum::Json(refunds_page(&pool, &account, &page, &filters).await?).into_response())
}

/// What a list of refunds is narrowed to, beside the account.
struct RefundFilters {
    payment: Option<String>,
    status: Option<RefundStatus>,
    created: Created,
}

/// One page of the account's refunds that pass `filters`, with one statement per shape of the
/// filters and the index that serves it: one statement with `($n IS NULL OR status = $n)` may be
/// planned once for every shape after five runs (a prepared statement's generic plan), on the
/// index of the list without filters. The `created` range bounds the same scan in each.
async fn refunds_page(
    pool: &PgPool,
    account: &Account,
    page: &PageRequest,
    filters: &RefundFilters,
) -> Result<List<Refund>, ApiError> {
    let account = account.id().as_str();
    let status = filters.status.map(RefundStatus::as_str);
    let (from, until) = (filters.created.from, filters.created.until);
    // One page of the refunds that pass `filter`, with its arguments from $4 on; a cursor is
    // found among the same refunds (`payment` narrows it to one payment's).
    macro_rules! page {
        ($payment:expr, $filter:literal $(, $arg:expr)* $(,)?) => {
            service::keyset_page!(
                pool,
                page,
                RefundRow,
                position(cursor) if RefundId::fits(cursor) => r#"
                    SELECT created_at, id FROM refunds
                    WHERE id = $1 AND account_id = $2 AND ($3::text IS NULL OR payment_id = $3)
                "#, cursor, account, $payment;
                select: r#"SELECT id, payment_id, amount, reason, status, processor_refund, created_at,
                                  metadata AS "metadata: Json<Metadata>"
                           FROM refunds"#,
                created_at: "created_at",
                id: "id",
                filter: $filter $(, $arg)*
            )
        };
    }
    let rows = match (filters.payment.as_deref(), status) {
        // `refunds_payment_id_created_at`: a payment's refunds are few, and a status is checked
        // on each.
        (Some(payment), status) => {
            page!(
                Some(payment),
                "account_id = $4 AND payment_id = $5 AND ($6::text IS NULL OR status = $6)
                 AND created_at >= COALESCE($7, '-infinity'::timestamptz)
                 AND created_at < COALESCE($8, 'infinity'::timestamptz)",
                account,
                payment,
                status,
                from,
                until,
            )
            .await?
        }
        // `refunds_account_status_created`.
        (None, Some(status)) => {
            page!(
                None::<&str>,
                "account_id = $4 AND status = $5
                 AND created_at >= COALESCE($6, '-infinity'::timestamptz)
                 AND created_at < COALESCE($7, 'infinity'::timestamptz)",
                account,
                status,
                from,
                until,
            )
            .await?
        }
        // `refunds_account_created`.
        (None, None) => {
            page!(
                None::<&str>,
                "account_id = $4
                 AND created_at >= COALESCE($5, '-infinity'::timestamptz)
                 AND created_at < COALESCE($6, 'infinity'::timestamptz)",
                account,
                from,
                until,
            )
            .await?
        }
    };
    Ok(List::parse_rows(rows, page, RefundRow::parse)?)
}

/// Retrieve a refund
///
/// One of the account's refunds, where a refund's `Location` points.
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    operation_id = "getRefund",
    tag = "refunds",
    params(("id" = String, Path, description = "The refund's id, `re_…`.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The refund.", body = Refund, content_type = "application/json"),
        (status = 404, description = "No such refund for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn get_refund(
    State(pool): State<PgPool>,
    account: Account,
    PathId(id): PathId<RefundId>,
) -> Result<Response, ApiError> {
    let row = sqlx::query_as!(
        RefundRow,
        r#"
        SELECT id, payment_id, amount, reason, status, processor_refund, created_at,
               metadata AS "metadata: Json<Metadata>"
        FROM refunds
        WHERE id = $1 AND account_id = $2
        "#,
        id.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| RefundId::no_such(id.as_str()))?;
    Ok(axum::Json(row.parse()?).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    #[test]
    fn a_stored_refund_status_that_is_none_of_ours_is_an_error() {
        let row = |status: &str| RefundRow {
            id: "re_Jx8bq2LkR5Vn0Ww3Zt7YcA1d".to_owned(),
            payment_id: "pay_U5PgTqA02dYsv3cLANIGkqIs".to_owned(),
            amount: 1000,
            reason: None,
            status: status.to_owned(),
            processor_refund: None,
            created_at: Utc::now(),
            metadata: Json(Metadata::default()),
        };
        for status in RefundStatus::ALL {
            assert_eq!(row(status.as_str()).parse().unwrap().status, *status);
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
        // An unknown status is refused, never read as `succeeded`.
        let unknown = row("pending").parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown refund status `pending`"),
            "{unknown}"
        );
    }
}
