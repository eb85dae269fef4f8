//! Webhook intake: the same idempotency on the way in. The processor delivers each event at least
//! once, signed, with a stable `webhook-id`; the event's effect and the record that it was
//! processed commit together, and the record's primary key makes a redelivery apply nothing.
//!
//! That record is forgotten after `IDEMPAY_EVENT_TTL`, so effects do not lean on it alone: a
//! dispute is a row keyed by the processor's dispute id (the same dispute under any event id, at
//! any time, counts once), and a payment's status moves only for an event newer than the last one
//! it applied (an older one is `stale`), so a late redelivery cannot undo a later change. See
//! `events.rs` for each event's rule.
//!
//! The other way is the outbox both services share (`service::outbox`, crates/service/): any sender
//! writes its events to it (the simulated processor, and idempay itself for the merchants'
//! [`endpoints`]), and its loop delivers them, signed, until they are acknowledged or the retry
//! schedule runs out; `retry.rs` queues one more delivery of an event when a merchant asks for it.
//! The delivery contract a merchant's receiver must keep is in `README.md` beside this file.

mod attempts;
mod changes;
pub mod endpoints;
mod events;
pub mod metrics;
pub mod parked;
pub mod retention;
mod retry;
mod settings;
mod unknown;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRef, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::accounts::{AccountCache, RateLimit};
use crate::db::Engine;
use crate::http::error::{ApiError, Problem, ProblemKind};
use idempotency::{Idempotency, Owners};
use service::outbox::{Rejection, WebhookSecrets};

pub use events::{Envelope, EventOutcome, IntakeType, NotRecorded, unreadable};
pub use settings::WebhookSettings;

pub fn router<S>() -> OpenApiRouter<S>
where
    S: Owners<Rejection = ApiError> + Clone + Send + Sync + 'static,
    PgPool: FromRef<S>,
    Idempotency: FromRef<S>,
    WebhookSettings: FromRef<S>,
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
{
    OpenApiRouter::new()
        .routes(routes!(receive))
        .merge(endpoints::router())
        .merge(changes::router())
        .merge(attempts::router())
        .merge(retry::router())
}

/// The answer to a delivery.
#[derive(Debug, Serialize, ToSchema)]
pub struct Acknowledgement {
    /// The `webhook-id` of the delivery.
    pub event: String,
    #[schema(inline)]
    pub outcome: EventOutcome,
}

/// Receive a processor event
///
/// Takes in the payment processor's events, signed per the Standard Webhooks specification
/// (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256 of
/// "{id}.{timestamp}.{body}">`), with the `standardwebhooks` crate. The signature is verified on
/// the raw body, in constant time, before anything parses it; a timestamp more than
/// {webhook_tolerance} away is refused, and so is a `webhook-signature` of more than
/// {max_signatures} entries, before any signature is computed. `IDEMPAY_WEBHOOK_SECRET` may list
/// several secrets, space separated, while one is rotated: a delivery signed with any of them is
/// accepted.
///
/// Each event is applied exactly once: a redelivery of the same `webhook-id` answers 200 with
/// outcome `duplicate` and applies nothing. Processed event ids are remembered for the event TTL
/// ({event_ttl} by default, longer than senders retry); a dispute is also keyed by the processor's
/// dispute id (`data.dispute`), so the same dispute under another event id, or after its event
/// id expired, is a `duplicate` too. A payment's status follows only events newer than the last
/// one applied to it (by the envelope's `timestamp`): an older one is recorded as `stale`. A
/// dispute over more than remains of the payment is recorded and flagged: `needs_review`. Events
/// with data that cannot apply, or naming an id of idempay's own that does not exist, are
/// acknowledged with outcome `ignored` and recorded, so the processor stops redelivering them.
/// An event of a type this release does not know is refused with 503
/// `webhook-event-type-unknown` and recorded nowhere: during a deploy, a newer release may know
/// it, and the processor's redeliveries reach it.
///
/// An event naming an object of the processor's that idempay has not recorded yet (a charge no
/// payment names, a processor refund no refund names) is kept and acknowledged with outcome
/// `parked`: the processor's event can arrive before idempay has its answer (a payment answered
/// 503 `processor-outcome-unknown` is recorded by the client's retry, the recovery job or an
/// operator), and it is applied once, when the object is recorded, whatever the sender does; a
/// redelivery of it is a `duplicate`. At most {max_parked} events wait per account (and as many
/// whose account is not known yet); past that one is refused with 409
/// `webhook-object-not-recorded`, recorded nowhere, for the sender to deliver again.
#[utoipa::path(
    post,
    path = "/v1/webhooks/processor",
    operation_id = "receiveProcessorEvent",
    tag = "webhooks",
    params(
        ("webhook-id" = String, Header, description = "The event's id, the same on every delivery of it."),
        ("webhook-timestamp" = i64, Header, description = "When this delivery was sent, in seconds since the Unix epoch."),
        ("webhook-signature" = String, Header, description = "Space-separated `v1,<base64>` signatures, at most {max_signatures}: one per secret the sender signs with."),
    ),
    request_body(content = Envelope, content_type = "application/json"),
    responses(
        (status = 200, description = "The event was applied, ignored, already processed, stale, recorded for review, or parked until its object is recorded.",
            body = Acknowledgement, content_type = "application/json"),
        (status = 409, description = "The event names a charge or refund of the processor's that idempay has not recorded yet, and {max_parked} events of its account (or of no known account) already wait (`webhook-object-not-recorded`); nothing was applied or recorded: deliver it again.",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = i64, description = "Seconds to wait before delivering again."))),
        (status = 400, description = "The timestamp is more than {webhook_tolerance} away (`webhook-timestamp-out-of-range`); a header is missing or malformed, `webhook-signature` has more than {max_signatures} entries, or the body is not UTF-8 or no event envelope (`invalid-request`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No signature matches (`webhook-signature-invalid`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body stopped arriving before it was complete (`request-timeout`); nothing was applied, deliver again.",
            body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body is over {body_limit} (`payload-too-large`).",
            body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "A fault of ours (`internal`); nothing was applied, deliver again.",
            body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The database is unreachable, or no webhook secret is configured (`service-unavailable`); or the event's type is one this release does not know (`webhook-event-type-unknown`): nothing was applied or recorded, deliver it again for a release that knows it.",
            body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = i64, description = "Seconds to wait before delivering again."))),
    )
)]
async fn receive(
    State(pool): State<PgPool>,
    State(idempotency): State<Idempotency>,
    State(settings): State<WebhookSettings>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let unconfigured = || {
        ApiError::from(
            Problem::new(
                ProblemKind::ServiceUnavailable,
                "No webhook secret is configured (IDEMPAY_WEBHOOK_SECRET).",
            )
            .retry_after(Duration::from_secs(60)),
        )
    };
    let (secrets, configured) = match (&settings.secrets, &settings.embedded) {
        (Some(secrets), _) => (secrets, true),
        (None, Some(embedded)) => (embedded, false),
        (None, None) => return Err(unconfigured()),
    };
    let body = body.map_err(Problem::from)?;
    let verified = secrets.verify(&headers, &body);
    if verified.is_err() && !configured {
        // Only the embedded processor holds the made-up secret: to anyone else, the intake has
        // no secret, as without an embedded processor.
        return Err(unconfigured());
    }
    let id = verified.map_err(|rejection| {
        let kind = match rejection {
            Rejection::MissingHeader(_) | Rejection::TooManySignatures | Rejection::NotUtf8 => {
                ProblemKind::InvalidRequest
            }
            Rejection::OutOfTolerance => ProblemKind::WebhookTimestampOutOfRange,
            Rejection::BadSignature => ProblemKind::WebhookSignatureInvalid,
        };
        Problem::new(kind, format!("The delivery was refused: {rejection}."))
    })?;
    // Parsed only now that the sender is known to hold the secret.
    let envelope: Envelope = serde_json::from_slice(&body)
        .map_err(|error| Problem::invalid_body::<Envelope>(&body, &error))?;
    let length = envelope.kind.chars().count();
    if !(1..=100).contains(&length) || envelope.kind.contains('\0') {
        return Err(Problem::new(
            ProblemKind::InvalidRequest,
            "The event type must have 1 to 100 characters and no NUL.",
        )
        .into());
    }
    // Before anything is recorded: an event of a type this build does not know is left for a
    // release that knows it (unknown.rs).
    if !events::is_known_type(&envelope.kind) {
        return Err(unknown::refuse(&id, &envelope.kind).into());
    }
    let engine = idempotency.engine().await?;
    let processed = process(&pool, engine, &id, &envelope, &body, settings.event_ttl).await?;
    let outcome = match processed {
        Ok(outcome) => outcome,
        Err(not_recorded) => {
            metrics::webhook_event_not_recorded();
            tracing::warn!(event = %id, kind = %envelope.kind, object = %not_recorded.object, "webhook refused: its object is not recorded yet, and the parked events are at their bound");
            return Err(not_recorded_problem(&not_recorded).into());
        }
    };
    metrics::webhook_event(outcome);
    tracing::info!(event = %id, kind = %envelope.kind, ?outcome, "webhook processed");
    Ok(axum::Json(Acknowledgement { event: id, outcome }).into_response())
}

/// When a sender that reads `Retry-After` should deliver an event about an object not recorded
/// again, once the parked events are at their bound: about the default interval of the recovery
/// job, which records a payment or refund whose outcome was unknown if its client does not retry
/// first; by then the park may have room again.
const NOT_RECORDED_RETRY_AFTER: Duration = Duration::from_secs(10);

/// The refusal of an event about an object not recorded, when no more can be parked
/// ([`parked::MAX_PARKED`]): what the intake answered to every such event before it parked them.
/// Nothing is recorded, so the sender delivers it again, and the delivery that finds room, or its
/// object recorded, is the one recorded. 409, not 503: the service is well; the event conflicts
/// with what it has recorded so far.
fn not_recorded_problem(not_recorded: &NotRecorded) -> Problem {
    Problem::new(
        ProblemKind::WebhookObjectNotRecorded,
        format!(
            "The {} event names `{}`, which idempay has not recorded yet; nothing was applied or \
             recorded. Deliver it again.",
            not_recorded.kind, not_recorded.object
        ),
    )
    .retry_after(NOT_RECORDED_RETRY_AFTER)
}

/// Records the event and applies it in one transaction. The insert comes first: a concurrent
/// redelivery waits on its primary key until this transaction ends, then finds the event recorded.
/// An event about an object not recorded yet is parked (its verified `body` kept) in the same
/// transaction, recorded as `parked`; if the park is at its bound, all of it rolls back and its id
/// stays unprocessed.
async fn process(
    pool: &PgPool,
    engine: Engine,
    id: &str,
    envelope: &Envelope,
    body: &[u8],
    ttl: Duration,
) -> Result<Result<EventOutcome, NotRecorded>, sqlx::Error> {
    let mut tx = idempotency::connections::begin(pool).await?;
    let recorded = sqlx::query_scalar!(
        r#"
        INSERT INTO processed_events (id, type, outcome, expires_at)
        VALUES ($1, $2, $4, now() + $3::bigint * interval '1 millisecond')
        ON CONFLICT (id) DO NOTHING
        RETURNING id
        "#,
        id,
        envelope.kind,
        i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
        EventOutcome::Applied.as_str(),
    )
    .fetch_optional(&mut *tx)
    .await?;
    if recorded.is_none() {
        return Ok(Ok(EventOutcome::Duplicate));
    }
    let applied = match envelope.apply(&mut tx, engine, id).await? {
        Ok(applied) => applied,
        // `apply` wrote nothing: the transaction holds the event's record alone.
        Err(not_recorded) => {
            let outcome = match parked::park(&mut tx, id, envelope, body, &not_recorded).await? {
                parked::Parking::Parked => EventOutcome::Parked,
                parked::Parking::AlreadyParked => EventOutcome::Duplicate,
                parked::Parking::Full => {
                    tx.rollback().await?;
                    return Ok(Err(not_recorded));
                }
            };
            // Recorded as `parked` either way: the event waits, whichever delivery parked it.
            sqlx::query!(
                "UPDATE processed_events SET outcome = $2 WHERE id = $1",
                id,
                EventOutcome::Parked.as_str(),
            )
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            tracing::info!(event = %id, kind = %envelope.kind, object = %not_recorded.object, "webhook parked: its object is not recorded yet");
            // The object may have been recorded while this transaction ran, and its recorder have
            // looked for parked events before this one committed: looked for again now, one of
            // the two sees the other. (An error leaves it to the sweep.)
            if outcome == EventOutcome::Parked {
                parked::apply_waiting_detached(pool, engine, ttl, &not_recorded.object).await;
            }
            return Ok(Ok(outcome));
        }
    };
    let outcome = applied.outcome;
    if outcome != EventOutcome::Applied {
        sqlx::query!(
            "UPDATE processed_events SET outcome = $2 WHERE id = $1",
            id,
            outcome.as_str(),
        )
        .execute(&mut *tx)
        .await?;
    }
    // A process that dies here has applied the event, written its event for merchants and
    // recorded it as processed, all uncommitted: none of it stays, and the redelivery applies it.
    service::failpoint::hit("webhook-before-commit");
    tx.commit().await?;
    crate::events::written(&applied.event);
    // A dispute just recorded may have its later changes parked (redelivered ahead of it): they
    // apply now rather than at the sweep. (An error leaves them to the sweep.)
    if let Some(dispute) = envelope.recorded_dispute(outcome) {
        parked::apply_waiting_detached(pool, engine, ttl, dispute).await;
    }
    Ok(Ok(outcome))
}

/// Deletes up to [`EXPIRY_BATCH`](idempotency::EXPIRY_BATCH) expired event records, as
/// [`Idempotency::expire_batch`](idempotency::Idempotency::expire_batch) does for keys
/// (where the literal batch size and the batch locked once in `ARRAY(…)` are explained).
pub async fn expire_batch(pool: &PgPool) -> Result<u64, sqlx::Error> {
    let deleted = sqlx::query!(
        r#"
        DELETE FROM processed_events
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM processed_events
            WHERE expires_at <= now()
            LIMIT 1000
            FOR UPDATE SKIP LOCKED
        ))
        "#,
    )
    .execute(pool)
    .await?;
    Ok(deleted.rows_affected())
}

/// Signs an event as the processor would (with the first of the secrets) and delivers it to
/// `url`: what `idempay webhook send` does. Returns the response's status and body.
pub async fn send(
    url: &str,
    secrets: &WebhookSecrets,
    id: &str,
    kind: &str,
    data: serde_json::Value,
) -> Result<(u16, String), anyhow::Error> {
    let body = serde_json::to_vec(&serde_json::json!({
        "type": kind,
        "timestamp": chrono::Utc::now(),
        "data": data,
    }))?;
    let timestamp = chrono::Utc::now().timestamp();
    let signature = secrets.sign(id, timestamp, &body)?;
    let response = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp)
        .header("webhook-signature", signature)
        .body(body)
        .send()
        .await?;
    let status = response.status().as_u16();
    Ok((status, response.text().await?))
}

#[cfg(test)]
mod tests {
    use super::IntakeType;
    use crate::downstream::ProcessorEventType;

    #[test]
    fn every_event_the_processor_sends_is_one_the_intake_understands() {
        for kind in ProcessorEventType::ALL {
            assert!(kind.as_str().parse::<IntakeType>().is_ok(), "{kind}");
        }
    }
}
