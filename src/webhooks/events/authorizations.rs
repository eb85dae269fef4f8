//! The processor's `charge.expired`: an authorization nobody captured within the processor's limit
//! was released, so the manual payment that holds it is `canceled` (`cancellation_reason`
//! `expired`), with its `payment.canceled`. Its `charge.captured` and `charge.voided` only confirm
//! what idempay recorded from the processor's answer to its own capture or cancel (`Confirms`).

use sqlx::PgConnection;
use sqlx::types::Json;

use super::{
    Applied, Applying, Envelope, EventOutcome, NoEffect, Target, ignored, now, unencodable,
};
use crate::db::Engine;
use crate::events::{self, EventType, NewEvent};
use crate::metadata::Metadata;
use crate::payments::{CancellationReason, PaymentRow, PaymentStatus, payment_query};

impl Envelope {
    /// Cancels the payment whose authorization `charge` expired, if it still `requires_capture`.
    /// One that does not changes nothing: canceled already (a redelivery, or a cancel of the
    /// merchant's that the processor's lock put first), or never manual. The processor's row lock
    /// decided between the expiry and a capture, so a payment captured meanwhile cannot be one
    /// whose authorization expired.
    pub(super) async fn authorization_expired(
        &self,
        conn: &mut PgConnection,
        engine: Engine,
        charge: &str,
    ) -> Result<Applying, sqlx::Error> {
        let target = Target::Charge(charge.to_owned());
        let Some(account) = target.account(conn).await? else {
            return Ok(target.unmatched(&self.kind));
        };
        let canceled = payment_query!(
            "UPDATE payments
             SET status = $4, amount_capturable = 0, amount_captured = 0,
                 canceled_at = now(), cancellation_reason = $3
             WHERE account_id = $2 AND charge = $1 AND status = $5
             RETURNING",
            "",
            charge,
            account,
            CancellationReason::Expired.as_str(),
            PaymentStatus::Canceled.as_str(),
            PaymentStatus::RequiresCapture.as_str(),
        )
        .fetch_optional(&mut *conn)
        .await?;
        let Some(canceled) = canceled else {
            let reason = format!(
                "{} changes nothing: the payment of charge `{charge}` no longer requires capture",
                self.kind
            );
            return Ok(Ok(Applied::without_event(ignored(NoEffect::Expected(
                reason,
            )))));
        };
        let event = NewEvent::new(
            EventType::PaymentCanceled,
            &canceled.parse()?,
            now(conn).await?,
        )
        .map_err(unencodable)?;
        events::write(conn, engine, &account, std::slice::from_ref(&event)).await?;
        Ok(Ok(Applied {
            outcome: EventOutcome::Applied,
            event: Some(event),
        }))
    }
}
