//! The processor's dispute events: `charge.dispute.created` records a dispute (once per processor
//! dispute id); `charge.dispute.updated` and `charge.dispute.closed` move it through Stripe's
//! lifecycle. After each, the payment's `amount_disputed` is recounted from its disputes
//! (`payments::disputed`): a `won` one holds nothing, so it gives back what it held, never more.
//! Each change writes idempay's own event in its transaction (`payment.disputed`,
//! `dispute.updated`, `dispute.closed`).

use sqlx::PgConnection;

use super::{
    Applied, Applying, Envelope, EventOutcome, IntakeType, NoEffect, NotRecorded, Target, ignored,
    now, unencodable,
};
use crate::db::Engine;
use crate::disputes::{Dispute, DisputeStatus};
use crate::events::{self, EventType, NewEvent};
use crate::payments::disputed;
use service::vocabulary::stored;

impl Envelope {
    /// The processor's id of the dispute this event recorded, when it recorded one (`outcome`
    /// applied, or flagged for review): what events parked for it wait for.
    pub(in crate::webhooks) fn recorded_dispute(&self, outcome: EventOutcome) -> Option<&str> {
        let recorded = matches!(outcome, EventOutcome::Applied | EventOutcome::NeedsReview);
        let creates = matches!(
            self.kind.parse(),
            Ok(IntakeType::ChargeDisputeCreated | IntakeType::DisputeCreated)
        );
        if recorded && creates {
            self.data.get("dispute").and_then(serde_json::Value::as_str)
        } else {
            None
        }
    }

    /// Records a dispute by the processor's dispute id; the payment's disputed amount takes it as
    /// far as it fits: `amount_refunded + amount_disputed` never exceeds what was captured (the
    /// recount's rule, and a CHECK holds that line). A dispute over more than remains is still recorded, in full, with
    /// the status `needs_review`: the bank takes what it claims, whatever our books say, so an
    /// operator must see it rather than the event being dropped.
    pub(super) async fn dispute(
        &self,
        conn: &mut PgConnection,
        engine: Engine,
        event_id: &str,
        payment: &Target,
        dispute: &str,
        amount: i64,
    ) -> Result<Applying, sqlx::Error> {
        let Some(account) = payment.account(conn).await? else {
            return Ok(payment.unmatched(&self.kind));
        };
        let (id, charge) = payment.columns();
        // The row lock orders this dispute with refunds and other disputes of the payment; the
        // lock of an UPDATE, so that it does not deadlock with a refund whose insert holds the key
        // share lock of its foreign key.
        let Some(paid) = sqlx::query!(
            r#"
            SELECT id, account_id, amount_disputed,
                   -- What the payment can have captured: an authorization still held
                   -- counts at its amount, since the processor disputes only captured money
                   -- (the capture's answer is still on its way here).
                   COALESCE(amount_captured, amount) + amount_capturable - amount_refunded
                       - amount_disputed AS "remaining!"
            FROM payments
            WHERE account_id = $3 AND (id = $1 OR charge = $2)
            FOR NO KEY UPDATE
            "#,
            id,
            charge,
            account,
        )
        .fetch_optional(&mut *conn)
        .await?
        else {
            let reason = format!("{} names no payment of ours", self.kind);
            return Ok(Ok(Applied::without_event(ignored(NoEffect::Unexpected(
                reason,
            )))));
        };
        let fits = amount <= paid.remaining;
        let recorded = sqlx::query_scalar!(
            r#"
            INSERT INTO disputes (id, payment_id, account_id, amount, status, event_id)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT (account_id, id) DO NOTHING
            RETURNING id
            "#,
            dispute,
            paid.id,
            paid.account_id,
            amount,
            if fits { "open" } else { "needs_review" },
            event_id,
        )
        .fetch_optional(&mut *conn)
        .await?;
        if recorded.is_none() {
            tracing::info!(dispute, event = event_id, "dispute already recorded");
            return Ok(Ok(Applied::without_event(EventOutcome::Duplicate)));
        }
        // What the payment's disputes hold now, this one with them (`payments::disputed`).
        // Under the row lock the first statement took.
        let row = disputed::locked_by_caller(&paid.account_id, &paid.id, paid.amount_disputed)
            .recount(conn)
            .await?
            .payment;
        let event = NewEvent::new(EventType::PaymentDisputed, &row.parse()?, now(conn).await?)
            .map_err(unencodable)?;
        events::write(conn, engine, &paid.account_id, std::slice::from_ref(&event)).await?;
        let outcome = if fits {
            EventOutcome::Applied
        } else {
            tracing::warn!(
                dispute,
                payment = paid.id,
                amount,
                remaining = paid.remaining,
                "a dispute over what remains of the payment needs review"
            );
            EventOutcome::NeedsReview
        };
        Ok(Ok(Applied {
            outcome,
            event: Some(event),
        }))
    }

    /// Moves the dispute to `status` (`under_review`, `won` or `lost`), with `dispute.updated` or
    /// `dispute.closed`; a `won` one gives back what it held (the recount leaves it out). Each
    /// processor event applies once and in order: a closed dispute changes no more (`duplicate`
    /// for its own status again), and an event older than the last one applied
    /// to the dispute (by the envelope's `timestamp`) is `stale`. A dispute not recorded yet (its
    /// `charge.dispute.created` still on its way) is [`NotRecorded`]: the intake parks the event
    /// until the dispute is recorded.
    pub(super) async fn dispute_changed(
        &self,
        conn: &mut PgConnection,
        engine: Engine,
        dispute: &str,
        status: DisputeStatus,
    ) -> Result<Applying, sqlx::Error> {
        // The dispute's account and payment, read without a lock (neither ever changes), as a
        // payment's account is.
        let Some(owner) = sqlx::query!(
            "SELECT account_id, payment_id FROM disputes WHERE id = $1 LIMIT 1",
            dispute
        )
        .fetch_optional(&mut *conn)
        .await?
        else {
            return Ok(Err(NotRecorded {
                object: dispute.to_owned(),
                kind: self.kind.clone(),
            }));
        };
        let account = owner.account_id;
        // The payment's row lock before the dispute's, the order of every path that changes both
        // (a dispute recorded, a refund that flags the payment's disputes): the other order could
        // deadlock with a refund.
        let locked = disputed::lock(conn, &account, &owner.payment_id).await?;
        let changed = sqlx::query_scalar!(
            r#"
            UPDATE disputes d SET lifecycle = $3, last_event_at = $4
            FROM (
                SELECT account_id, id, lifecycle FROM disputes
                WHERE account_id = $2 AND id = $1
                FOR NO KEY UPDATE
            ) prior
            WHERE d.account_id = $2 AND d.account_id = prior.account_id AND d.id = prior.id
              AND d.lifecycle NOT IN ($5, $6)
              AND (d.last_event_at IS NULL OR d.last_event_at < $4
                   -- At the same instant, the bank's decision comes after the evidence.
                   OR (d.last_event_at = $4 AND $3 IN ($5, $6)))
            RETURNING d.id
            "#,
            dispute,
            account,
            status.as_str(),
            self.timestamp,
            DisputeStatus::Won.as_str(),
            DisputeStatus::Lost.as_str(),
        )
        .fetch_optional(&mut *conn)
        .await?;
        if changed.is_none() {
            let now = sqlx::query!(
                "SELECT lifecycle, last_event_at FROM disputes WHERE account_id = $2 AND id = $1",
                dispute,
                account,
            )
            .fetch_one(&mut *conn)
            .await?;
            let was: DisputeStatus = stored(&now.lifecycle)?;
            let outcome = if was == status {
                EventOutcome::Duplicate
            } else if now.last_event_at.is_some_and(|last| last >= self.timestamp) {
                // Older than the change applied last (or as old, and no decision after evidence).
                EventOutcome::Stale
            } else {
                ignored(NoEffect::Expected(format!(
                    "{} changes nothing: dispute `{dispute}` is {was}",
                    self.kind
                )))
            };
            return Ok(Ok(Applied::without_event(outcome)));
        }
        // A won dispute holds nothing any more; the others, what they held (`payments::disputed`).
        locked.recount(conn).await?;
        let read = sqlx::query!(
            r#"
            SELECT d.id, d.payment_id, d.amount, p.currency, d.status, d.lifecycle, d.created_at
            FROM disputes d
            JOIN payments p ON p.account_id = d.account_id AND p.id = d.payment_id
            WHERE d.account_id = $2 AND d.id = $1
            "#,
            dispute,
            account,
        )
        .fetch_one(&mut *conn)
        .await?;
        let object = Dispute::of_row(
            read.id,
            read.payment_id,
            read.amount,
            read.currency,
            &read.status,
            &read.lifecycle,
            read.created_at,
        )?;
        let kind = if matches!(status, DisputeStatus::Won | DisputeStatus::Lost) {
            EventType::DisputeClosed
        } else {
            EventType::DisputeUpdated
        };
        let event = NewEvent::new(kind, &object, now(conn).await?).map_err(unencodable)?;
        events::write(conn, engine, &account, std::slice::from_ref(&event)).await?;
        Ok(Ok(Applied {
            outcome: EventOutcome::Applied,
            event: Some(event),
        }))
    }
}
