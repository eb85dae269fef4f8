//! Events: what happened to a merchant's payments and refunds, each written in the transaction of
//! the change it describes (a transactional outbox), so an event exists if and only if its change
//! committed. The feed (`GET /v1/events`) serves them in commit order; the statement that writes an
//! event also queues it for the account's webhook endpoints. How the order is kept is in `src/events/README.md`.

mod feed;

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::PgConnection;
use utoipa::ToSchema;
use utoipa::openapi::schema::{OneOfBuilder, Schema};
use utoipa::openapi::{Ref, RefOr};

use crate::db::Engine;
use service::vocabulary::vocabulary;

pub use feed::router;

vocabulary! {
    // In the order the documentation lists them; the names as the API, the `events.type` column
    // and the metrics spell them.
    /// What happened: the event's `type`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
    pub enum EventType: "event type" {
        /// A payment was created and its charge succeeded; or the processor's success event moved a
        /// failed payment back to succeeded.
        PaymentSucceeded => "payment.succeeded",
        /// A payment was created and its charge was declined.
        PaymentDeclined => "payment.declined",
        /// The processor's failure event moved a payment to failed.
        PaymentFailed => "payment.failed",
        /// A payment was refunded, partially or fully: the payment after the refund.
        PaymentRefunded => "payment.refunded",
        /// A new dispute of the payment was recorded: the payment with its disputed amount.
        PaymentDisputed => "payment.disputed",
        /// A refund was made.
        RefundCreated => "refund.created",
        /// The processor reported a refund failed: its amount is refundable again.
        RefundFailed => "refund.failed",
        /// A manual payment was authorized: its amount is held on the card (`requires_capture`).
        PaymentAuthorized => "payment.authorized",
        /// A manual payment was captured (`succeeded`, with its `amount_captured`).
        PaymentCaptured => "payment.captured",
        /// A manual payment's authorization was released: by a cancel, or by the processor once it
        /// expired uncaptured (`cancellation_reason` `expired`).
        PaymentCanceled => "payment.canceled",
        /// A dispute's evidence was submitted: `under_review`.
        DisputeUpdated => "dispute.updated",
        /// The cardholder's bank decided a dispute: `won` (its amount is the payment's again) or
        /// `lost`.
        DisputeClosed => "dispute.closed",
        /// A webhook endpoint was changed, or its secret rolled: the endpoint after the change,
        /// never its secret, and `data.previous_attributes` with what the change replaced.
        WebhookEndpointUpdated => "webhook_endpoint.updated",
    }
}

/// An event, as the feed serves it and endpoints receive it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "id": "evt_Hq2Lm8Rt0VbX4nWc6Zp1KsYd",
    "object": "event",
    "type": "refund.created",
    "created_at": "2026-11-29T19:05:12.118230Z",
    "data": { "object": {
        "id": "re_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
        "object": "refund",
        "payment": "pay_U5PgTqA02dYsv3cLANIGkqIs",
        "amount": 1000,
        "reason": "requested_by_customer",
        "status": "succeeded",
        "processor_refund": "pyr_Jx8bq2LkR5Vn0Ww3Zt7YcA1d",
        "created_at": "2026-11-29T19:05:12.118230Z"
    } }
}))]
pub struct Event {
    /// The event's id, `evt_` followed by 24 characters: the `webhook-id` of its deliveries,
    /// which receivers deduplicate on.
    #[schema(pattern = "^evt_[0-9A-Za-z]{24}$")]
    pub id: String,
    /// Always `event`.
    #[schema(value_type = String, pattern = "^event$")]
    pub object: &'static str,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When the change happened, on the database's clock.
    pub created_at: DateTime<Utc>,
    pub data: EventData,
}

/// What the event is about.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventData {
    /// The object as it was right after the change: a payment for `payment.*` events, a refund
    /// for `refund.*` ones, a dispute for `dispute.*` ones, a webhook endpoint for
    /// `webhook_endpoint.updated`.
    pub object: EventObject,
    /// Of an `*.updated` event, the fields the change replaced, with their values before it, as
    /// Stripe's events give them; absent from the other events.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub previous_attributes: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The object of an event, as the API represents it: a payment, a refund, a dispute or a webhook
/// endpoint, serialized by the domain that changed it. Events import none of those domains (they
/// write events), so the description names their schemas, `Payment`, `Refund`, `Dispute` and
/// `WebhookEndpoint`, which their own routes register.
#[derive(Debug, Serialize)]
#[serde(transparent)]
pub struct EventObject(Box<RawValue>);

impl utoipa::PartialSchema for EventObject {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(Ref::from_schema_name("Payment"))
            .item(Ref::from_schema_name("Refund"))
            .item(Ref::from_schema_name("Dispute"))
            .item(Ref::from_schema_name("WebhookEndpoint"))
            .description(Some("The object of an event, as the API represents it."))
            .into()
    }
}

impl ToSchema for EventObject {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EventObject")
    }
}

/// An event to write, its body serialized once: the feed serves these bytes and every delivery
/// sends them.
#[derive(Debug)]
pub struct NewEvent {
    pub id: String,
    pub kind: EventType,
    pub created_at: DateTime<Utc>,
    pub body: Vec<u8>,
}

impl NewEvent {
    /// The event `kind` about `object` (the payment of a `payment.*` event, the refund of a
    /// `refund.*` one), as it is after the change made at `created_at`.
    pub fn new(
        kind: EventType,
        object: &impl Serialize,
        created_at: DateTime<Utc>,
    ) -> Result<Self, serde_json::Error> {
        Self::build(kind, object, None, created_at)
    }

    /// The event `kind` about `object` as a change at `created_at` left it, with the fields it
    /// replaced (`previous_attributes`, their values before the change).
    pub fn updated(
        kind: EventType,
        object: &impl Serialize,
        previous_attributes: serde_json::Map<String, serde_json::Value>,
        created_at: DateTime<Utc>,
    ) -> Result<Self, serde_json::Error> {
        Self::build(kind, object, Some(previous_attributes), created_at)
    }

    fn build(
        kind: EventType,
        object: &impl Serialize,
        previous_attributes: Option<serde_json::Map<String, serde_json::Value>>,
        created_at: DateTime<Utc>,
    ) -> Result<Self, serde_json::Error> {
        let object = EventObject(serde_json::value::to_raw_value(object)?);
        let event = Event {
            id: EventId::generate().into(),
            object: "event",
            kind,
            created_at,
            data: EventData {
                object,
                previous_attributes,
            },
        };
        let body = serde_json::to_vec(&event)?;
        Ok(Self {
            id: event.id,
            kind,
            created_at,
            body,
        })
    }
}

/// Writes `events` of `account` in the caller's transaction, in this order, and queues each for
/// every enabled endpoint of the account that subscribes to its type, with one statement: no event
/// commits without its deliveries. Count them with [`written`] once that transaction committed.
///
/// On Citus each event is a few statements that name the account, which Citus routes to its node:
/// a statement that modifies in a CTE, or inserts what a function returns, it plans in steps
/// whose results it sends to every node, and the transaction then commits by two-phase commit on
/// all of them.
pub async fn write(
    conn: &mut PgConnection,
    engine: Engine,
    account: &str,
    events: &[NewEvent],
) -> Result<(), sqlx::Error> {
    if engine == Engine::Citus {
        for event in events {
            write_routed(conn, account, event).await?;
        }
        return Ok(());
    }
    let ids: Vec<&str> = events.iter().map(|event| event.id.as_str()).collect();
    let kinds: Vec<&str> = events.iter().map(|event| event.kind.as_str()).collect();
    let bodies: Vec<&[u8]> = events.iter().map(|event| event.body.as_slice()).collect();
    let times: Vec<DateTime<Utc>> = events.iter().map(|event| event.created_at).collect();
    // `seq` is taken in the order the rows are produced: ORDER BY the arrays' ordinality keeps
    // the caller's order (a refund's `refund.created` before its `payment.refunded`).
    // The endpoints are read by the account, not through the inserted rows: on Citus that keeps
    // the read on the account's shard. Their status is named as text (`enabled`, which the
    // endpoints' own tests hold to be `EndpointStatus::Enabled`): `webhooks`, which owns the type,
    // builds on this module.
    sqlx::query!(
        r#"
        WITH event AS (
            INSERT INTO events (id, account_id, type, body, created_at)
            SELECT event.id, $1, event.type, event.body, event.created_at
            FROM unnest($2::text[], $3::text[], $4::bytea[], $5::timestamptz[])
                WITH ORDINALITY AS event (id, type, body, created_at, n)
            ORDER BY event.n
            RETURNING id, type, body
        )
        INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id)
        SELECT endpoint.account_id, event.id, endpoint.url, event.body, endpoint.id
        FROM event
        JOIN webhook_endpoints AS endpoint
            ON event.type = ANY (endpoint.enabled_events) OR '*' = ANY (endpoint.enabled_events)
        WHERE endpoint.account_id = $1 AND endpoint.status = 'enabled'
        "#,
        account,
        &ids as &[&str],
        &kinds as &[&str],
        &bodies as &[&[u8]],
        &times,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// One event and its deliveries, each statement routed by Citus to the account's node.
async fn write_routed(
    conn: &mut PgConnection,
    account: &str,
    event: &NewEvent,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        r#"
        INSERT INTO events (id, account_id, type, body, created_at)
        VALUES ($1, $2, $3, $4, $5)
        "#,
        event.id,
        account,
        event.kind.as_str(),
        &event.body,
        event.created_at,
    )
    .execute(&mut *conn)
    .await?;
    // The endpoints are read, then each delivery inserted with its values: an `INSERT … SELECT`
    // into this table (its id comes from a sequence) is run through the coordinator on a
    // connection of its own, and the transaction then commits by two-phase commit. The status is
    // text, as above.
    let endpoints = sqlx::query!(
        r#"
        SELECT id, url FROM webhook_endpoints
        WHERE account_id = $1 AND status = 'enabled'
          AND ($2 = ANY (enabled_events) OR '*' = ANY (enabled_events))
        ORDER BY id
        "#,
        account,
        event.kind.as_str(),
    )
    .fetch_all(&mut *conn)
    .await?;
    for endpoint in endpoints {
        sqlx::query!(
            r#"
            INSERT INTO webhook_deliveries (account_id, event_id, url, body, endpoint_id)
            VALUES ($1, $2, $3, $4, $5)
            "#,
            account,
            event.id,
            endpoint.url,
            &event.body,
            endpoint.id,
        )
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

const EVENTS_WRITTEN: &str = "idempay_events_written_total";

/// Counts events whose transaction committed, by type.
pub fn written<'a>(events: impl IntoIterator<Item = &'a NewEvent>) {
    for event in events {
        metrics::counter!(EVENTS_WRITTEN, "type" => event.kind.as_str()).increment(1);
    }
}

/// Describes the events' series to the recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        EVENTS_WRITTEN,
        "Events written (their change committed), by type."
    );
}

service::public_id!(
    /// An event's id: `evt_` and 24 base62 characters, checked before any query sees it.
    pub EventId, "evt", 24, "an event id"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_parses_back_from_its_name() {
        for &kind in EventType::ALL {
            assert_eq!(kind.as_str().parse(), Ok(kind));
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.as_str())
            );
        }
        assert_eq!(
            "payment.created"
                .parse::<EventType>()
                .unwrap_err()
                .to_string(),
            "unknown event type `payment.created`"
        );
    }

    #[test]
    fn event_ids_have_their_shape() {
        assert!(EventId::fits(EventId::generate().as_str()));
        assert!(!EventId::fits("evt_short"));
        assert!(!EventId::fits("pay_U5PgTqA02dYsv3cLANIGkqIs"));
    }
}
