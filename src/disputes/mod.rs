//! Disputes: what the cardholders' banks claimed back, as the processor's `dispute.created` and
//! `charge.dispute.created` events recorded them (`src/webhooks/events.rs` writes the rows, once
//! per processor dispute id), then moved through Stripe's lifecycle by `charge.dispute.updated`
//! and `.closed` (`src/webhooks/events/disputes.rs`). `GET /v1/disputes` lists the account's, a
//! page at a time, and `GET /v1/disputes/{id}` reads one.

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts::{Account, AccountCache, RateLimit};
use crate::http::error::{ApiError, AuthenticatedProblems, Problem};
use crate::http::extract::{FilteredQuery, PathId};
use crate::payments::PaymentId;
use service::ids::PublicId;
use service::pagination::{CreatedParams, List, ListParams};
use service::vocabulary::{stored, vocabulary};

/// The longest dispute id, as the table's CHECK bounds it: the processor chooses them.
const MAX_ID_LEN: usize = 100;

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(list_disputes))
        .routes(routes!(get_dispute))
}

vocabulary! {
    /// Where a dispute stands, as Stripe's lifecycle has it: opened (`needs_response`), the merchant's
    /// evidence submitted (`under_review`), then decided by the cardholder's bank: `won` (its amount
    /// comes back to the payment: `amount_disputed` falls) or `lost` (it stays with the cardholder).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum DisputeStatus: "dispute status" {
        NeedsResponse => "needs_response",
        UnderReview => "under_review",
        Won => "won",
        Lost => "lost",
    }
}

vocabulary! {
    /// Whether the payment's `amount_disputed` took all of a dispute (the `disputes.status`
    /// column).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Review: "dispute review" {
        /// It did.
        Open => "open",
        /// It claims more than remained of the payment after its refunds and other disputes: the
        /// payment's `amount_disputed` took only what remained, and the money may leave twice, so
        /// an operator must look.
        NeedsReview => "needs_review",
    }
}

/// A dispute, as the API returns it.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "id": "dp_Yq3tNw8LbV0cXk2RmA7s",
    "object": "dispute",
    "payment": "pay_U5PgTqA02dYsv3cLANIGkqIs",
    "amount": 1500,
    "currency": "eur",
    "status": "needs_response",
    "needs_review": false,
    "created_at": "2026-12-01T02:05:12.118230Z"
}))]
pub struct Dispute {
    /// The processor's id of the dispute, which its events name it by.
    #[schema(max_length = 100)]
    pub id: String,
    /// Always `dispute`.
    #[schema(value_type = String, pattern = "^dispute$")]
    pub object: &'static str,
    /// The disputed payment, `pay_…`.
    #[schema(pattern = "^pay_[0-9A-Za-z]{24}$")]
    pub payment: String,
    /// The amount the processor reported as disputed, in minor units of `currency`, whether or
    /// not the payment could take it all (see `status`).
    #[schema(minimum = 1)]
    pub amount: i64,
    /// The payment's currency.
    #[schema(value_type = String, example = "eur")]
    pub currency: String,
    #[schema(inline)]
    pub status: DisputeStatus,
    /// `true` when it claims more than remained of the payment after its refunds and other
    /// disputes: the payment's `amount_disputed` took only what remained, and the money may
    /// leave twice, so an operator must look.
    pub needs_review: bool,
    /// When idempay recorded it.
    pub created_at: DateTime<Utc>,
}

/// A `disputes` row with its payment's currency, as the queries read it.
struct DisputeRow {
    id: String,
    payment_id: String,
    amount: i64,
    currency: String,
    status: String,
    lifecycle: String,
    created_at: DateTime<Utc>,
}

impl Dispute {
    /// A dispute from a `disputes` row's columns and its payment's currency, as the intake reads
    /// it back after a change; a decoding error if its status or review is none the API knows.
    pub(crate) fn of_row(
        id: String,
        payment_id: String,
        amount: i64,
        currency: String,
        status: &str,
        lifecycle: &str,
        created_at: DateTime<Utc>,
    ) -> Result<Self, sqlx::Error> {
        DisputeRow {
            id,
            payment_id,
            amount,
            currency,
            status: status.to_owned(),
            lifecycle: lifecycle.to_owned(),
            created_at,
        }
        .parse()
    }
}

impl DisputeRow {
    /// The dispute this row holds; a decoding error if its status is none the API knows.
    fn parse(self) -> Result<Dispute, sqlx::Error> {
        Ok(Dispute {
            id: self.id,
            object: "dispute",
            payment: self.payment_id,
            amount: self.amount,
            currency: self.currency,
            status: stored(&self.lifecycle)?,
            needs_review: stored::<Review>(&self.status)? == Review::NeedsReview,
            created_at: self.created_at,
        })
    }
}

/// List disputes
///
/// The account's disputes, newest first, paginated like the payments list; with `payment`, only
/// that payment's (a payment that is not the account's has none: the page is empty), with
/// `status` only those in it, with the `created` bounds only those created then; all combined. A
/// cursor must be one of the account's disputes, and with `payment` one of that payment's; a
/// status it has left since does not stop a walk.
#[utoipa::path(
    get,
    path = "/v1/disputes",
    operation_id = "listDisputes",
    tag = "disputes",
    params(ListParams, CreatedParams,
        ("payment" = Option<String>, Query, description = "Only the disputes of this payment, `pay_…`.",
            pattern = "^pay_[0-9A-Za-z]{24}$", example = "pay_U5PgTqA02dYsv3cLANIGkqIs"),
        ("status" = inline(Option<DisputeStatus>), Query, description = "Only the disputes in this status.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of disputes.", body = List<Dispute>, content_type = "application/json"),
        (status = 400, description = "A bad `limit`, `created` bound, `payment` or `status`, an unknown parameter, or both cursors at once (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The cursor names none of the disputes listed (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_disputes(
    State(pool): State<PgPool>,
    account: Account,
    FilteredQuery(mut query): FilteredQuery,
) -> Result<Response, ApiError> {
    let payment = query.take("payment", |raw| PaymentId::try_from(raw.to_owned()))?;
    let status = query.take("status", DisputeStatus::parse_listing_all)?;
    let (page, created) = query.finish()?;
    let account = account.id().as_str();
    let status = status.map(DisputeStatus::as_str);
    let (from, until) = (created.from, created.until);
    // One page of the disputes that pass `filter`, with its arguments from $4 on; a cursor is
    // found among the same disputes (`payment` narrows it to one payment's).
    macro_rules! page {
        ($payment:expr, $filter:literal $(, $arg:expr)* $(,)?) => {
            service::keyset_page!(
                &pool,
                &page,
                DisputeRow,
                position(cursor) if is_dispute_id(cursor) => r#"
                    SELECT created_at, id FROM disputes
                    WHERE id = $1 AND account_id = $2 AND ($3::text IS NULL OR payment_id = $3)
                "#, cursor, account, $payment;
                select: r#"SELECT d.id, d.payment_id, d.amount, p.currency, d.status, d.lifecycle, d.created_at
                           FROM disputes d
                           JOIN payments p ON p.account_id = d.account_id AND p.id = d.payment_id"#,
                created_at: "d.created_at",
                id: "d.id",
                filter: $filter $(, $arg)*
            )
        };
    }
    // One statement per shape of the filters, each with the index that serves it: one statement
    // with `($n IS NULL OR d.lifecycle = $n)` may be planned once for every shape after five runs
    // (a prepared statement's generic plan), on the index of the list without filters. The
    // `created` range bounds the same scan in each.
    let rows = match (payment.as_ref().map(PaymentId::as_str), status) {
        // `disputes_payment_id`: a payment's disputes are few, and a status is checked on each.
        (Some(payment), status) => {
            page!(
                Some(payment),
                "d.account_id = $4 AND d.payment_id = $5 AND ($6::text IS NULL OR d.lifecycle = $6)
                 AND d.created_at >= COALESCE($7, '-infinity'::timestamptz)
                 AND d.created_at < COALESCE($8, 'infinity'::timestamptz)",
                account,
                payment,
                status,
                from,
                until,
            )
            .await?
        }
        // `disputes_account_lifecycle_created`.
        (None, Some(status)) => {
            page!(
                None::<&str>,
                "d.account_id = $4 AND d.lifecycle = $5
                 AND d.created_at >= COALESCE($6, '-infinity'::timestamptz)
                 AND d.created_at < COALESCE($7, 'infinity'::timestamptz)",
                account,
                status,
                from,
                until,
            )
            .await?
        }
        // `disputes_account_created`.
        (None, None) => {
            page!(
                None::<&str>,
                "d.account_id = $4
                 AND d.created_at >= COALESCE($5, '-infinity'::timestamptz)
                 AND d.created_at < COALESCE($6, 'infinity'::timestamptz)",
                account,
                from,
                until,
            )
            .await?
        }
    };
    Ok(axum::Json(List::parse_rows(rows, &page, DisputeRow::parse)?).into_response())
}

/// Retrieve a dispute
///
/// One of the account's disputes, by the processor's id of it. Another account's dispute is not
/// found, like an unknown one.
#[utoipa::path(
    get,
    path = "/v1/disputes/{id}",
    operation_id = "getDispute",
    tag = "disputes",
    params(("id" = String, Path, description = "The dispute's id, the processor's (`dp_…`).",
        example = "dp_Yq3tNw8LbV0cXk2RmA7s")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The dispute.", body = Dispute, content_type = "application/json"),
        (status = 404, description = "No such dispute for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn get_dispute(
    State(pool): State<PgPool>,
    account: Account,
    PathId(DisputeId(id)): PathId<DisputeId>,
) -> Result<Response, ApiError> {
    let row = sqlx::query_as!(
        DisputeRow,
        r#"
        SELECT d.id, d.payment_id, d.amount, p.currency, d.status, d.lifecycle, d.created_at
        FROM disputes d
        JOIN payments p ON p.account_id = d.account_id AND p.id = d.payment_id
        WHERE d.account_id = $1 AND d.id = $2
        "#,
        account.id().as_str(),
        id,
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| DisputeId::no_such(&id))?;
    Ok(axum::Json(row.parse()?).into_response())
}

/// A dispute's id: the processor chooses them, so only what the table admits is checked (1 to 100
/// characters), and a NUL, which PostgreSQL refuses in text.
struct DisputeId(String);

impl PublicId for DisputeId {
    fn object() -> &'static str {
        "dispute"
    }

    fn parse(raw: &str) -> Option<Self> {
        is_dispute_id(raw).then(|| Self(raw.to_owned()))
    }
}

fn is_dispute_id(id: &str) -> bool {
    (1..=MAX_ID_LEN).contains(&id.chars().count()) && !id.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_dispute_status_or_review_that_is_none_of_ours_is_an_error() {
        let row = |status: &str, lifecycle: &str| DisputeRow {
            id: "dp_1".to_owned(),
            payment_id: "pay_U5PgTqA02dYsv3cLANIGkqIs".to_owned(),
            amount: 1500,
            currency: "eur".to_owned(),
            status: status.to_owned(),
            lifecycle: lifecycle.to_owned(),
            created_at: Utc::now(),
        };
        for status in DisputeStatus::ALL {
            let read = row("open", status.as_str()).parse().unwrap();
            assert_eq!((read.status, read.needs_review), (*status, false));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::Value::from(status.as_str())
            );
        }
        assert!(row("needs_review", "won").parse().unwrap().needs_review);
        let unknown = row("open", "closed").parse().unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("unknown dispute status `closed`"),
            "{unknown}"
        );
        let unknown = row("won", "won").parse().unwrap_err();
        assert!(
            unknown.to_string().contains("unknown dispute review `won`"),
            "{unknown}"
        );
    }

    #[test]
    fn a_dispute_id_is_any_text_the_table_admits() {
        assert!(is_dispute_id("dp_Yq3tNw8LbV0cXk2RmA7s"));
        assert!(is_dispute_id(&"d".repeat(100)));
        assert!(!is_dispute_id(&"d".repeat(101)));
        assert!(!is_dispute_id(""));
        assert!(!is_dispute_id("dp_\0"));
    }
}
