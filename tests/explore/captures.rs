//! The manual payments' checks: each authorization, and its capture or cancel (one of them, or
//! both racing), against both ledgers.

use crate::check::made_nothing;
use crate::coverage::Seen;
use crate::plan::Want;
use crate::run::{Answer, Schedule};

/// Where a charge's money is, at the processor.
#[derive(Debug, sqlx::FromRow)]
struct HeldCharge {
    id: String,
    amount: i64,
    capture_state: String,
    amount_captured: Option<i64>,
}

/// Where a payment's money is, at idempay.
#[derive(Debug, sqlx::FromRow)]
struct HeldPayment {
    id: String,
    amount: i64,
    status: String,
    amount_captured: Option<i64>,
    charge: Option<String>,
}

/// Each authorization against its intent, and its capture or cancel: one charge and one payment of
/// the authorization's unique amount, answered 201; a capture answered 200 leaves the payment
/// `succeeded` with `amount_captured` the intent's amount, and the processor's charge `captured` of
/// that amount; a cancel answered 200 leaves it `canceled` and the charge `voided`. At the
/// processor, no more capture (or void) keys than capture (or cancel) intents: each intent sends
/// one downstream key however often it is retried, and a second one would be a second capture asked.
/// Returns the authorizations' amounts (their charges are no strays) and what is broken.
pub async fn captures_as_asked(
    s: &Schedule,
    answers: &[Option<Answer>],
) -> (Vec<i64>, Vec<(&'static str, String)>) {
    let mut broken = Vec::new();
    let charges: Vec<HeldCharge> =
        sqlx::query_as("SELECT id, amount, capture_state, amount_captured FROM processor_charges")
            .fetch_all(&s.db)
            .await
            .expect("the processor's charges");
    let payments: Vec<HeldPayment> =
        sqlx::query_as("SELECT id, amount, status, amount_captured, charge FROM payments")
            .fetch_all(&s.db)
            .await
            .expect("the payments");
    let keys = |route: &'static str| {
        let db = s.db.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM idempotency_keys WHERE scope = 'processor:' || $1",
            )
            .bind(route)
            .fetch_one(&db)
            .await
            .expect("the processor's keys")
        }
    };
    let mut amounts = Vec::new();
    let (mut capture_intents, mut cancel_intents) = (0, 0);
    for (k, intent) in s.plan.intents.iter().enumerate() {
        let name = format!("intent {k} ({:?}, key {})", intent.want, s.key(k));
        match intent.want {
            Want::Authorize { amount } => {
                amounts.push(amount);
                let cs = charges.iter().filter(|c| c.amount == amount).count();
                let ps = payments.iter().filter(|p| p.amount == amount).count();
                if cs > 1 || ps > 1 {
                    broken.push((
                        "double charge",
                        format!("{name}: {cs} charges and {ps} payments of its amount"),
                    ));
                }
                match &answers[k] {
                    None => broken.push(("no final answer", format!("{name}: none"))),
                    Some(answer) if answer.status != 201 && !made_nothing(answer) => broken.push((
                        "unexpected answer",
                        format!("{name}: answered {answer}, an authorization of the Visa card"),
                    )),
                    Some(_) => {}
                }
            }
            Want::Capture { of, .. } | Want::Cancel { of } => {
                let capture = matches!(intent.want, Want::Capture { .. });
                if capture {
                    capture_intents += 1;
                } else {
                    cancel_intents += 1;
                }
                let Some(payment) = answers[of]
                    .as_ref()
                    .filter(|answer| answer.status == 201)
                    .and_then(|answer| answer.id.clone())
                else {
                    continue;
                };
                let Some(answer) = &answers[k] else {
                    broken.push(("no final answer", format!("{name}: none")));
                    continue;
                };
                let ours = payments.iter().find(|p| p.id == payment);
                let theirs =
                    ours.and_then(|p| charges.iter().find(|c| Some(&c.id) == p.charge.as_ref()));
                // The other capture or cancel of the same authorization (a race), and what it
                // was answered.
                let rival = s
                    .plan
                    .intents
                    .iter()
                    .enumerate()
                    .filter(|(j, other)| {
                        *j != k
                            && matches!(other.want,
                                Want::Capture { of: o, .. } | Want::Cancel { of: o } if o == of)
                    })
                    .find_map(|(j, _)| answers[j].as_ref());
                let lapsed = s.plan.authorization_ttl.is_some()
                    && ours.is_some_and(|p| p.status == "canceled")
                    && theirs.is_some_and(|c| c.capture_state == "expired");
                if answer.status != 200 {
                    // Refused, as the payment's state says: the rival won, or the authorization
                    // lapsed first. Anything else is a release refused for no reason.
                    let refused = answer.status == 409
                        && answer
                            .problem
                            .as_deref()
                            .is_some_and(|problem| problem.ends_with("payment-unexpected-state"));
                    let rival_won = rival.is_some_and(|rival| rival.status == 200);
                    if refused && rival_won {
                        s.coverage.saw(Seen::Raced);
                    } else if refused && lapsed {
                        s.coverage.saw(Seen::Lapsed);
                    } else if made_nothing(answer) {
                        // Settled by an operator from the processor's ledger: nothing released
                        // under its key (reconcile compares the payment with the charge).
                    } else {
                        broken.push((
                            "unexpected answer",
                            format!(
                                "{name}: answered {answer}; its rival {}; payment {ours:?}, \
                                 charge {theirs:?}",
                                rival.map_or("none".to_owned(), ToString::to_string)
                            ),
                        ));
                    }
                    continue;
                }
                if rival.is_some_and(|rival| rival.status == 200) {
                    broken.push((
                        "double release",
                        format!(
                            "{name}: answered 200, and so was the other release of intent {of}"
                        ),
                    ));
                }
                let (status, state, captured) = match intent.want {
                    Want::Capture { amount, .. } => ("succeeded", "captured", amount),
                    _ => ("canceled", "voided", 0),
                };
                let as_asked = ours
                    .is_some_and(|p| p.status == status && p.amount_captured == Some(captured))
                    && theirs.is_some_and(|c| {
                        c.capture_state == state && c.amount_captured == Some(captured)
                    });
                if !as_asked {
                    broken.push((
                        if capture {
                            "capture not as asked"
                        } else {
                            "cancel not as asked"
                        },
                        format!(
                            "{name}: answered {answer}; payment {ours:?}, charge {theirs:?}, \
                             where it should be {status} and {state}, {captured} captured"
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    for (route, intents, what) in [
        (
            "POST /v1/charges/{id}/capture",
            capture_intents,
            "double capture",
        ),
        ("POST /v1/charges/{id}/void", cancel_intents, "double void"),
    ] {
        let made = keys(route).await;
        if made > intents {
            broken.push((
                what,
                format!("{made} keys at the processor's {route}, for {intents} intent(s)"),
            ));
        }
    }
    (amounts, broken)
}
