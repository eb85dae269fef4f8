//! A key's life as its owner may see it, one entry per route the key was used on (a key's scope
//! is the owner and the endpoint, so one key may name a payment and a refund). Read-only:
//! inspecting a key never changes it. The service serves it on a route of its own, naming the
//! routes whose keys its owners may see.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::store::KeyStatus;
use super::{Idempotency, IdempotencyKey};

/// An idempotency key of the account, on every route it was used on.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "key": "5f0c8b1e-2a3d-4c6f-9b21-7d0e4a9c1f88",
    "uses": [{
        "route": "POST /v1/payments",
        "state": "completed",
        "created_at": "2026-12-01T10:00:00.000000Z",
        "completed_at": "2026-12-01T10:00:00.120000Z",
        "expires_at": "2026-12-02T10:00:00.120000Z",
        "locked_until": null,
        "recovery_point": null,
        "recovery_state": null,
        "downstream_key": "5b1e0c8f-7d0e-4a9c-9b21-2a3d4c6f1f88",
        "recovery_attempts": 0,
        "next_recovery_at": null,
        "response_status": 201,
        "response_location": "/v1/payments/pay_U5PgTqA02dYsv3cLANIGkqIs",
        "fingerprint": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "takeovers": 0
    }]
}))]
pub struct KeyInspection {
    /// The key, as the path named it (unquoted).
    key: String,
    /// One entry per route the key was used on, by route.
    uses: Vec<KeyUse>,
}

/// Whether a request is still working on the key, or its response is stored.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyUseState {
    /// A request holds the key under a lease (`locked_until`) and is working on it.
    InProgress,
    /// The work's call downstream has an unknown outcome and no request holds the key: its
    /// client's retry, or the recovery job at `next_recovery_at`, resumes it from its recovery
    /// point with the same downstream key.
    Suspended,
    /// The response is stored: every repeat with the same body receives it.
    Completed,
    /// The work's call downstream stayed unresolved past the recovery window: nothing
    /// resumes it by itself, and an operator settles it (`idempotency-key-held`).
    Held,
}

/// The key on one route.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyUse {
    /// The method and route template the key was used on, e.g. `POST /v1/payments`.
    route: String,
    state: KeyUseState,
    /// When the key was reserved.
    created_at: DateTime<Utc>,
    /// When the key completed; `null` while in progress (and for keys completed before this
    /// time was recorded).
    completed_at: Option<DateTime<Utc>>,
    /// When the key and its stored response are deleted; the key is new again after that.
    expires_at: DateTime<Utc>,
    /// While in progress: until when the request holding the key may work without renewing its
    /// lease. Past it, the next retry (or the recovery job) takes the key over.
    locked_until: Option<DateTime<Utc>>,
    /// The step the work recorded before its call downstream, from which the next attempt
    /// resumes (e.g. `payment.charge_requested`).
    recovery_point: Option<String>,
    /// What resuming the work needs, as it recorded it with its recovery point (for a payment,
    /// say, its id chosen before the call and the charge asked for); what an operator's settle
    /// recorded, for a settled key.
    #[schema(value_type = Option<Object>)]
    recovery_state: Option<serde_json::Value>,
    /// The key this service sends downstream for this key's work, the same on every attempt.
    downstream_key: Option<String>,
    /// How many times the recovery job tried to resume the key.
    recovery_attempts: i32,
    /// While suspended: the recovery job's next try at the key (each try doubles the wait).
    next_recovery_at: Option<DateTime<Utc>>,
    /// When the key was held for an operator; `null` unless `state` is `held`.
    held_at: Option<DateTime<Utc>>,
    /// The stored response's status code, once completed.
    response_status: Option<u16>,
    /// The stored response's `Location`, if it has one.
    response_location: Option<String>,
    /// The request's fingerprint: hex SHA-256 of its target and canonical JSON body. A retry with
    /// another fingerprint is refused (422).
    fingerprint: String,
    /// How many times another request, or the recovery job, took the key over from a holder
    /// whose lease ran out.
    takeovers: i32,
}

impl Idempotency {
    /// The key of `owner` on each of `routes` (method and route template, `POST /v1/payments`) it
    /// was used on: each an index lookup on `(account_id, scope, idem_key)`. `None` when it is on
    /// none of them: never used, or expired.
    pub async fn inspect(
        &self,
        owner: &str,
        key: &IdempotencyKey,
        routes: &[&str],
    ) -> Result<Option<KeyInspection>, sqlx::Error> {
        let scopes: Vec<String> = routes
            .iter()
            .map(|route| format!("{owner}:{route}"))
            .collect();
        let rows = sqlx::query!(
            r#"
        SELECT scope, status AS "status: KeyStatus", created_at, completed_at, expires_at,
               locked_until, recovery_point, recovery_state, downstream_key, held_at,
               response_code,
               response_headers ->> 'location' AS response_location, request_hash, takeovers,
               recoveries, recover_after, COALESCE(locked_until <= now(), false) AS "lapsed!"
        FROM idempotency_keys
        WHERE account_id = $3 AND scope = ANY($1) AND idem_key = $2
          -- What the reservation treats as expired (new again) is not shown; a key whose call
          -- downstream is unsettled is, past its expires_at too.
          AND NOT (expires_at <= now()
                   AND (status = 'completed'
                        OR (locked_until <= now() AND recovery_point IS NULL)))
        ORDER BY scope
        "#,
            &scopes,
            key.as_str(),
            owner,
        )
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let prefix = format!("{owner}:");
        let uses = rows
            .into_iter()
            .map(|row| KeyUse {
                route: row
                    .scope
                    .strip_prefix(&prefix)
                    .unwrap_or(&row.scope)
                    .to_owned(),
                state: match row.status {
                    KeyStatus::InProgress if row.lapsed && row.recovery_point.is_some() => {
                        KeyUseState::Suspended
                    }
                    KeyStatus::InProgress => KeyUseState::InProgress,
                    KeyStatus::Completed => KeyUseState::Completed,
                    KeyStatus::Held => KeyUseState::Held,
                },
                next_recovery_at: match row.status {
                    KeyStatus::InProgress if row.recovery_point.is_some() => {
                        row.recover_after.or(row.locked_until)
                    }
                    _ => None,
                },
                created_at: row.created_at,
                completed_at: row.completed_at,
                expires_at: row.expires_at,
                locked_until: row.locked_until,
                recovery_point: row.recovery_point,
                recovery_state: row.recovery_state,
                downstream_key: row.downstream_key,
                recovery_attempts: row.recoveries,
                held_at: row.held_at,
                response_status: row.response_code.and_then(|code| u16::try_from(code).ok()),
                response_location: row.response_location,
                fingerprint: hex::encode(row.request_hash),
                takeovers: row.takeovers,
            })
            .collect();
        Ok(Some(KeyInspection {
            key: key.as_str().to_owned(),
            uses,
        }))
    }
}
