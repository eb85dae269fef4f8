//! What a payment's disputes hold: `amount_disputed` is derived from the disputes themselves,
//! never accumulated. Every dispute not won holds its amount, as far as the money is there: the
//! payment's disputes together hold at most what was captured and not refunded. So
//!
//! ```text
//! amount_disputed = min(Σ amount of the disputes not won, amount_captured − amount_refunded)
//! ```
//!
//! recounted in the transaction of every change that can move either side: a dispute recorded or
//! moved through its lifecycle, a refund made or failed, a capture or a cancel recorded (a dispute
//! that arrived while the payment still required capture holds nothing until the capture is
//! recorded, then what the capture took). An accumulated figure drifts: a dispute squeezed to what
//! was left and later won would give back its whole amount, more than it ever took. The schema
//! holds the bound (`payments_money_held`, migrations/20261210000001_money_invariants.sql).
//!
//! It lives with the payments, whose column it writes and whose capture recounts it; the dispute
//! states it reads are the `disputes` table's, named in its SQL, so that this domain does not
//! import the disputes' one, which builds on it.

use sqlx::PgConnection;
use sqlx::types::Json;

use super::{PaymentRow, PaymentStatus, payment_query};
use crate::metadata::Metadata;

/// A payment's `amount_disputed` before and after a recount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) before: i64,
    pub(crate) after: i64,
}

impl Held {
    /// The disputes hold less than before while none was won: a refund took money a dispute
    /// held, which an operator must look at.
    pub(crate) fn squeezed(self) -> bool {
        self.after < self.before
    }
}

/// A payment as a recount left it.
pub(crate) struct Recounted {
    pub(crate) held: Held,
    pub(crate) payment: PaymentRow,
}

/// A payment's row, locked for a recount, with what its disputes held when it was locked.
pub(crate) struct Locked<'a> {
    account: &'a str,
    payment: &'a str,
    before: i64,
}

/// Locks the payment `payment` of `account` for a recount, in the caller's transaction (which may
/// hold the lock already). A change that must write the payment's row between the lock and the
/// recount keeps the CHECK meanwhile (a refund caps `amount_disputed` at what still fits, and the
/// recount then sets it exactly).
pub(crate) async fn lock<'a>(
    conn: &mut PgConnection,
    account: &'a str,
    payment: &'a str,
) -> Result<Locked<'a>, sqlx::Error> {
    let before = sqlx::query_scalar!(
        "SELECT amount_disputed FROM payments WHERE account_id = $1 AND id = $2 FOR NO KEY UPDATE",
        account,
        payment,
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Locked {
        account,
        payment,
        before,
    })
}

/// The payment `payment` of `account`, whose row the caller's transaction has locked already, by a
/// statement that read `before`, what its disputes held then: a recount then takes no lock of its
/// own.
pub(crate) fn locked_by_caller<'a>(account: &'a str, payment: &'a str, before: i64) -> Locked<'a> {
    Locked {
        account,
        payment,
        before,
    }
}

/// Recounts `amount_disputed` of the payment `payment` of `account`, in the caller's transaction;
/// the payment as it then is.
pub(crate) async fn recount(
    conn: &mut PgConnection,
    account: &str,
    payment: &str,
) -> Result<Recounted, sqlx::Error> {
    lock(conn, account, payment).await?.recount(conn).await
}

impl Locked<'_> {
    /// Recounts the locked payment's `amount_disputed`; the payment as it then is.
    pub(crate) async fn recount(self, conn: &mut PgConnection) -> Result<Recounted, sqlx::Error> {
        // The sum is read in a statement after the one that took the row lock: under READ
        // COMMITTED its snapshot is taken once the lock is granted, so two changes of one
        // payment's disputes recount one after the other, the second seeing the first's commit.
        // One UPDATE with the sum inside would read the disputes in a snapshot taken before it
        // waited on the lock.
        let payment = payment_query!(
            r#"
            UPDATE payments p
            -- The sum is numeric (disputes' amounts may add up past a bigint: the bank
            -- claims what it claims); the least is within the payment's amount.
            SET amount_disputed = LEAST(
                (SELECT COALESCE(sum(d.amount), 0) FROM disputes d
                 -- `won`: of the disputes' lifecycle (the `disputes_lifecycle` CHECK).
                 WHERE d.account_id = $1 AND d.payment_id = $2 AND d.lifecycle <> 'won'),
                -- What was captured: NULL on the payments of the releases before manual
                -- capture, the whole amount then, or nothing for a decline.
                COALESCE(p.amount_captured, CASE WHEN p.status = $3 THEN 0 ELSE p.amount END)
                    - p.amount_refunded)::bigint
            WHERE p.account_id = $1 AND p.id = $2
            RETURNING"#,
            "",
            self.account,
            self.payment,
            PaymentStatus::Declined.as_str(),
        )
        .fetch_one(&mut *conn)
        .await?;
        let held = Held {
            before: self.before,
            after: payment.amount_disputed,
        };
        Ok(Recounted { held, payment })
    }

    /// Recounts after a change that took money the disputes may hold (a refund): if they hold
    /// less than when the row was locked, every dispute of the payment still `open` is flagged
    /// `needs_review`, with a warning, since the money may leave twice.
    pub(crate) async fn recount_flagging(
        self,
        conn: &mut PgConnection,
        why: &str,
    ) -> Result<Recounted, sqlx::Error> {
        let (account, payment) = (self.account, self.payment);
        let recounted = self.recount(conn).await?;
        let held = recounted.held;
        if held.squeezed() {
            tracing::warn!(
                payment,
                before = held.before,
                after = held.after,
                "{why} took money a dispute held: the payment's disputes need review"
            );
            // `open` and `needs_review`: the disputes' review (`disputes::Review`, the
            // `disputes_status_check` CHECK), named here, where the payments' ledger needs them,
            // rather than imported from the disputes' domain, which builds on this one.
            sqlx::query!(
                r#"
                UPDATE disputes SET status = 'needs_review'
                WHERE account_id = $2 AND payment_id = $1 AND status = 'open'
                "#,
                payment,
                account,
            )
            .execute(&mut *conn)
            .await?;
        }
        Ok(recounted)
    }
}
