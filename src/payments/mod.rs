//! Payments: `POST /v1/payments` charges exactly once per idempotency key, and
//! `GET /v1/payments/{id}` reads one back.

mod currency;
mod model;
mod processor;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use sqlx::PgConnection;

use crate::accounts::{Account, AccountId};
use crate::app::AppState;
use crate::error::{ApiError, Problem, ProblemKind};
use crate::idempotency::{IdempotencyKey, Idempotent, StoredResponse};

pub use currency::Currency;
pub use model::{Amount, NewPayment, Payment, PaymentId, PaymentMethod, PaymentStatus};
pub use processor::{ChargeOutcome, Processor};

use model::PaymentRow;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/payments", post(create_payment))
        .route("/v1/payments/{id}", get(get_payment))
}

/// Creates a payment, at most once per `Idempotency-Key`.
///
/// The processor is called before the transaction opens; the payment row and the key's
/// completion then commit together, so a stored "completed" response never outlives a failed
/// charge.
async fn create_payment(
    State(state): State<AppState>,
    account: Account,
    Idempotent { request, body }: Idempotent<NewPayment>,
) -> Result<Response, ApiError> {
    let processor = state.processor.clone();
    state
        .idempotency
        .run(request, move |lease| async move {
            let outcome = processor.charge(body.payment_method).await;
            let mut tx = lease.begin().await?;
            let payment = insert(&mut tx, account.id(), &body, outcome, lease.key()).await?;
            let response = match outcome {
                ChargeOutcome::Succeeded => StoredResponse::json(StatusCode::CREATED, &payment)
                    .map_err(anyhow::Error::from)?
                    .with_header(header::LOCATION, payment.location()),
                ChargeOutcome::Declined { decline_code } => StoredResponse::problem(
                    &Problem::new(
                        ProblemKind::CardDeclined,
                        format!("The card was declined ({decline_code})."),
                    )
                    .with("payment", payment.id.as_str())
                    .with("decline_code", decline_code),
                ),
            };
            Ok(lease.complete(tx, response).await?)
        })
        .await
}

/// Returns one of the account's payments; another account's payment is not found.
async fn get_payment(
    State(state): State<AppState>,
    account: Account,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let not_found = || Problem::new(ProblemKind::NotFound, format!("No payment `{id}`."));
    let Some(payment_id) = PaymentId::parse(&id) else {
        return Err(not_found().into());
    };
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        SELECT id, amount, currency, status, payment_method, order_ref, description, created_at
        FROM payments
        WHERE id = $1 AND account_id = $2
        "#,
        payment_id.as_str(),
        account.id().as_str(),
    )
    .fetch_optional(&state.pool)
    .await?
    .ok_or_else(not_found)?;
    Ok(axum::Json(Payment::from(row)).into_response())
}

async fn insert(
    conn: &mut PgConnection,
    account: &AccountId,
    new: &NewPayment,
    outcome: ChargeOutcome,
    key: &IdempotencyKey,
) -> Result<Payment, sqlx::Error> {
    let id = PaymentId::generate();
    let row = sqlx::query_as!(
        PaymentRow,
        r#"
        INSERT INTO payments
            (id, account_id, amount, currency, status, payment_method, order_ref, description,
             idempotency_key)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
        RETURNING id, amount, currency, status, payment_method, order_ref, description, created_at
        "#,
        id.as_str(),
        account.as_str(),
        i64::from(new.amount),
        new.currency.as_str(),
        outcome.status().as_str(),
        new.payment_method.as_str(),
        new.order.clone().map(String::from),
        new.description.clone().map(String::from),
        key.as_str(),
    )
    .fetch_one(conn)
    .await?;
    Ok(row.into())
}
