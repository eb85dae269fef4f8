//! Payments: `POST /v1/payments` charges exactly once per idempotency key (or, with
//! `capture_method: manual`, authorizes: `POST /v1/payments/{id}/capture` then takes the money, or
//! `…/cancel` releases it, each once per key, capturing.rs), and `GET /v1/payments/{id}` reads one
//! back.

mod authorization_state;
mod capturing;
mod charge_state;
mod charging;
mod currency;
pub(crate) mod disputed;
mod model;

use axum::extract::{FromRef, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sqlx::PgPool;
use sqlx::types::Json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts::{Account, AccountCache, RateLimit};
use crate::downstream::ProcessorClient;
use crate::downstream::call;
use crate::http::error::{ApiError, AuthenticatedProblems, IdempotencyProblems, Problem};
use crate::http::extract::{FilteredQuery, PathId};
use crate::metadata::Metadata;
use idempotency::{Idempotency, IdempotencyKey, Idempotent, Owners};
use service::ids::PublicId;
use service::pagination::{CreatedParams, List, ListParams};

pub use capturing::{CANCEL_REQUESTED, CAPTURE_REQUESTED, CancelRequested, CaptureRequested};
pub use charging::{CHARGE_REQUESTED, ChargeRequested};
pub use currency::Currency;
pub use model::{
    Amount, CancellationReason, CaptureMethod, Description, NewPayment, Payment, PaymentId,
    PaymentMethod, PaymentStatus, reject_nul,
};

pub(crate) use model::{PaymentRow, payment_not_found, payment_query};

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
        .routes(routes!(create_payment, list_payments))
        .routes(routes!(get_payment))
        .routes(routes!(capture_payment))
        .routes(routes!(cancel_payment))
}

/// A capture of a manual payment. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "amount_to_capture": 3000 }))]
pub struct CapturePayment {
    /// How much to take, in minor units, at most the payment's `amount_capturable`; all of it when
    /// absent. The rest of the authorization is released.
    #[serde(default)]
    #[schema(value_type = Option<i64>, minimum = 1, maximum = 99_999_999, example = 3000)]
    pub amount_to_capture: Option<Amount>,
}

/// A cancel of a manual payment. Unknown fields are refused.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "cancellation_reason": "requested_by_customer" }))]
pub struct CancelPayment {
    // Why, for the merchant's records (the type says so: a field's own description would turn the
    // inline enum into an `allOf` with an object, which code generators cannot read).
    #[serde(default)]
    #[schema(inline, nullable = false)]
    pub cancellation_reason: Option<RequestedCancellation>,
}

/// Why a merchant cancels, for its records: one of Stripe's reasons (`expired` is the processor's
/// alone).
#[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RequestedCancellation {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
    Abandoned,
}

impl From<RequestedCancellation> for CancellationReason {
    fn from(reason: RequestedCancellation) -> Self {
        match reason {
            RequestedCancellation::Duplicate => Self::Duplicate,
            RequestedCancellation::Fraudulent => Self::Fraudulent,
            RequestedCancellation::RequestedByCustomer => Self::RequestedByCustomer,
            RequestedCancellation::Abandoned => Self::Abandoned,
        }
    }
}

/// Capture a payment
///
/// Takes the money a manual payment (`capture_method: manual`) authorized, all of it or
/// `amount_to_capture`; the rest is released. The payment becomes `succeeded`, with
/// `amount_captured`, and refunds and disputes apply to what was captured. At most once per
/// `Idempotency-Key`, like every keyed route: a retry receives the first answer again, and the
/// processor is asked with idempay's own key, so it captures once however often it is asked.
///
/// A payment in another state is refused with 409 `payment-unexpected-state`, a stored result:
/// a capture under a new key after a capture is that 409, never a second capture.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/capture",
    operation_id = "capturePayment",
    tag = "payments",
    params(("id" = String, Path, description = "The payment to capture, `pay_…`."), IdempotencyKey),
    request_body(content = Option<CapturePayment>, content_type = "application/json",
        description = "How much to capture; without a body (or with `{}`), all that is authorized."),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The payment, captured (`succeeded`); or the replay of the request that captured it.",
            body = Payment, content_type = "application/json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 400, description = "The body or the key is invalid (`invalid-request`, `invalid-idempotency-key`); or `amount_to_capture` exceeds `amount_capturable` (`capture-exceeds-authorization`), a stored result.",
            body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 404, description = "No such payment for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        IdempotencyProblems,
        // After the mechanism's own 409, which it replaces for this operation: one status, one
        // entry, naming every kind.
        (status = 409, description = "The payment does not `require_capture` (`payment-unexpected-state`, naming its state): nothing was captured; a stored result. Or a request with this key is still being processed (`idempotency-key-in-use`): retry after `Retry-After` seconds with the same key and body to receive its result.",
            body = Problem, content_type = "application/problem+json",
            headers(
                ("Retry-After" = i64, description = "Seconds to wait before retrying with the same key (`idempotency-key-in-use` only)."),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."),
            )),
        AuthenticatedProblems,
    )
)]
async fn capture_payment(
    State(pool): State<PgPool>,
    State(idempotency): State<Idempotency>,
    State(processor): State<ProcessorClient>,
    account: Account,
    PathId(payment): PathId<PaymentId>,
    Idempotent { request, body }: Idempotent<CapturePayment>,
) -> Result<Response, ApiError> {
    let asked = capturing::Asked::Capture {
        amount: body.amount_to_capture.map(i64::from),
    };
    capture_or_cancel(
        pool,
        idempotency,
        processor,
        account,
        payment,
        request,
        asked,
    )
    .await
}

/// Cancel a payment
///
/// Releases the money a manual payment authorized: the payment becomes `canceled`, with
/// `canceled_at` and the `cancellation_reason` given, and the authorization is voided at the
/// processor. At most once per `Idempotency-Key`, like every keyed route.
///
/// A payment in another state (captured, canceled already) is refused with 409
/// `payment-unexpected-state`, a stored result.
#[utoipa::path(
    post,
    path = "/v1/payments/{id}/cancel",
    operation_id = "cancelPayment",
    tag = "payments",
    params(("id" = String, Path, description = "The payment to cancel, `pay_…`."), IdempotencyKey),
    request_body(content = Option<CancelPayment>, content_type = "application/json",
        description = "Why; without a body (or with `{}`), no reason."),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The payment, canceled; or the replay of the request that canceled it.",
            body = Payment, content_type = "application/json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        (status = 400, description = "The body or the key is invalid (`invalid-request`, `invalid-idempotency-key`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such payment for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        IdempotencyProblems,
        // After the mechanism's own 409, which it replaces for this operation.
        (status = 409, description = "The payment does not `require_capture` (`payment-unexpected-state`, naming its state): nothing was canceled; a stored result. Or a request with this key is still being processed (`idempotency-key-in-use`): retry after `Retry-After` seconds with the same key and body to receive its result.",
            body = Problem, content_type = "application/problem+json",
            headers(
                ("Retry-After" = i64, description = "Seconds to wait before retrying with the same key (`idempotency-key-in-use` only)."),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."),
            )),
        AuthenticatedProblems,
    )
)]
async fn cancel_payment(
    State(pool): State<PgPool>,
    State(idempotency): State<Idempotency>,
    State(processor): State<ProcessorClient>,
    account: Account,
    PathId(payment): PathId<PaymentId>,
    Idempotent { request, body }: Idempotent<CancelPayment>,
) -> Result<Response, ApiError> {
    let asked = capturing::Asked::Cancel {
        reason: body.cancellation_reason.map(CancellationReason::from),
    };
    capture_or_cancel(
        pool,
        idempotency,
        processor,
        account,
        payment,
        request,
        asked,
    )
    .await
}

/// Both routes' work, under the key.
async fn capture_or_cancel(
    pool: PgPool,
    idempotency: Idempotency,
    processor: ProcessorClient,
    account: Account,
    payment: PaymentId,
    request: idempotency::KeyedRequest,
    asked: capturing::Asked,
) -> Result<Response, ApiError> {
    let account = account.id().clone();
    idempotency
        .run(request, move |lease| {
            capturing::capture_or_cancel(processor, pool, lease, account, payment, asked)
        })
        .await
}

/// Create a payment
///
/// Charges the payment method at most once per `Idempotency-Key`. A retry with the same key and
/// body, whatever happened to the first answer, receives the first result again (status, headers
/// and body byte for byte) with `Idempotent-Replayed: true`, and nothing is charged twice.
///
/// The charge is sent to the processor with a key of idempay's own, the same for every attempt at
/// this key, so the processor charges once however often it is asked. The payment row and the
/// key's completion then commit together. When the processor's answer is lost, the request
/// answers 503 and keeps the key: the retry (or the recovery job) asks the processor again and
/// records the one charge it made.
#[utoipa::path(
    post,
    path = "/v1/payments",
    operation_id = "createPayment",
    tag = "payments",
    params(IdempotencyKey),
    request_body(content = NewPayment, content_type = "application/json"),
    security(("api_key" = [])),
    responses(
        (status = 201, description = "The payment succeeded, or this is the replay of the request that created it.",
            body = Payment, content_type = "application/json",
            headers(
                ("Location" = String, description = "Where the payment can be read: `/v1/payments/{id}`."),
                ("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."),
            )),
        (status = 400, description = "The body or the `Idempotency-Key` is invalid (`invalid-request`, `invalid-idempotency-key`). Nothing was reserved: the key can still be used.",
            body = Problem, content_type = "application/problem+json"),
        (status = 402, description = "The card was declined (`card-declined`). The payment was recorded as `declined`; this result is replayed like a success.",
            body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored response of an earlier request with the same key."))),
        IdempotencyProblems,
        AuthenticatedProblems,
    )
)]
async fn create_payment(
    State(idempotency): State<Idempotency>,
    State(processor): State<ProcessorClient>,
    account: Account,
    Idempotent { request, body }: Idempotent<NewPayment>,
) -> Result<Response, ApiError> {
    let account = account.id().clone();
    // The charge is the work's first step: the reservation records its recovery point, so a new
    // key costs no round trip more for it (and a replay never makes it, nor the payment's id).
    let request = call::starting_at(request, move || ChargeRequested::new(account, body));
    idempotency
        .run(request, move |lease| {
            call::resume::<ChargeRequested>(processor, lease)
        })
        .await
}

/// Retrieve a payment
///
/// Returns one of the account's payments, declined ones included. Another account's payment is
/// not found.
#[utoipa::path(
    get,
    path = "/v1/payments/{id}",
    operation_id = "getPayment",
    tag = "payments",
    params(("id" = String, Path, description = "The payment's id, `pay_…`.", example = "pay_U5PgTqA02dYsv3cLANIGkqIs")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "The payment.", body = Payment, content_type = "application/json"),
        (status = 404, description = "No such payment for this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn get_payment(
    State(pool): State<PgPool>,
    account: Account,
    PathId(id): PathId<PaymentId>,
) -> Result<Response, ApiError> {
    let row = payment_query!(
        "SELECT",
        "FROM payments WHERE id = $1 AND account_id = $2",
        id.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&pool)
    .await?
    .ok_or_else(|| PaymentId::no_such(id.as_str()))?;
    Ok(axum::Json(row.parse()?).into_response())
}

/// List payments
///
/// The account's payments, newest first, a page at a time: pass the last id of a page as
/// `starting_after` for the next (older) one, or the first id as `ending_before` for the previous
/// one. Pages are cut by keyset on `created_at`, so a walk never repeats a payment nor skips one
/// that existed when it began. `created_at` is taken just before the payment is written, not when
/// its transaction commits: a payment whose write waited commits after a newer one but sorts
/// behind it, so polling with `ending_before` for new payments can miss it; read the list again
/// to find it.
///
/// With `status`, only the payments in it; with the `created` bounds, only those created then;
/// all combined. A cursor may be any of the account's payments.
#[utoipa::path(
    get,
    path = "/v1/payments",
    operation_id = "listPayments",
    tag = "payments",
    params(ListParams, CreatedParams,
        ("status" = inline(Option<PaymentStatus>), Query, description = "Only the payments in this status.")),
    security(("api_key" = [])),
    responses(
        (status = 200, description = "A page of payments.", body = List<Payment>, content_type = "application/json"),
        (status = 400, description = "A bad `limit`, `created` bound or `status`, an unknown parameter, or both cursors at once (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The cursor names no payment of this account (`not-found`).",
            body = Problem, content_type = "application/problem+json"),
        AuthenticatedProblems,
    )
)]
async fn list_payments(
    State(pool): State<PgPool>,
    account: Account,
    FilteredQuery(mut query): FilteredQuery,
) -> Result<Response, ApiError> {
    let status = query.take("status", PaymentStatus::parse_listing_all)?;
    let (page, created) = query.finish()?;
    let account = account.id().as_str();
    let (from, until) = (created.from, created.until);
    // One page of the account's payments that pass `filter`, with its arguments from $4 on.
    macro_rules! page {
        ($filter:literal $(, $arg:expr)* $(,)?) => {
            service::keyset_page!(
                &pool,
                &page,
                PaymentRow,
                position(id) if PaymentId::fits(id) =>
                    "SELECT created_at, id FROM payments WHERE id = $1 AND account_id = $2", id, account;
                select: r#"SELECT id, amount, currency, status, payment_method, order_ref, description,
                                  amount_refunded, amount_disputed, charge, created_at,
                                  metadata AS "metadata: Json<Metadata>", capture_method, amount_captured,
                                  amount_capturable, canceled_at, cancellation_reason
                           FROM payments"#,
                created_at: "created_at",
                id: "id",
                filter: $filter $(, $arg)*
            )
        };
    }
    // One statement per shape of the filter, each with the index that serves it: one statement
    // with `($5 IS NULL OR status = $5)` may be planned once for both after five runs (a
    // prepared statement's generic plan), on the index that serves the list without a status. The
    // `created` range bounds the same scan in each.
    let rows = match status {
        // `payments_account_status_created`.
        Some(status) => {
            page!(
                "account_id = $4 AND status = $5
                 AND created_at >= COALESCE($6, '-infinity'::timestamptz)
                 AND created_at < COALESCE($7, 'infinity'::timestamptz)",
                account,
                status.as_str(),
                from,
                until,
            )
            .await?
        }
        // `payments_account_id_created_at`.
        None => {
            page!(
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
    Ok(axum::Json(List::parse_rows(rows, &page, PaymentRow::parse)?).into_response())
}
