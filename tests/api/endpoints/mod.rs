//! What each route answers a client: the payment, refund and dispute resources, their lists, the
//! events, webhook intake, the refusals of bad input, and the API's description of itself.

mod captures;
mod disputes;
mod docs;
mod errors;
mod events;
mod filters;
mod forms;
mod idempotency_keys;
mod listing;
mod payments;
mod refunds;
mod webhooks;
mod webhooks_effects;
mod webhooks_once;
mod webhooks_refusals;
mod webhooks_send_command;

/// Asserts `problem` refuses an amount for its fraction: the text had one, though as a float it
/// may read as whole.
fn assert_refuses_a_fractional_amount(problem: &serde_json::Value) {
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("amount must be an integer in minor units"),
        "{detail}"
    );
}

/// Holds the processor's charge of `payment` (its row locked until the transaction ends), as a
/// capture, a void or a refund must lock it: the test keeps them waiting at the processor for as
/// long as it holds it.
async fn hold_the_charge(
    app: &crate::support::helpers::TestApp,
    payment: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let charge: String = sqlx::query_scalar("SELECT charge FROM payments WHERE id = $1")
        .bind(payment)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let mut barrier = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("SELECT FROM processor_charges WHERE id = $1 FOR UPDATE")
        .bind(&charge)
        .execute(&mut *barrier)
        .await
        .unwrap();
    barrier
}
