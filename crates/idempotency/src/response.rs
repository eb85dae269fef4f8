//! A response as it was sent, kept with its key so every replay is the same bytes.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;

/// The header a replayed response carries, as Stripe and the IETF draft's examples name it.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The status, the headers a client relies on and the exact body bytes of a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResponse {
    status: StatusCode,
    headers: BTreeMap<String, String>,
    body: Bytes,
}

impl StoredResponse {
    /// A JSON response, serialized once: these bytes are sent now and on every replay.
    pub fn json(status: StatusCode, value: &impl Serialize) -> Result<Self, serde_json::Error> {
        Ok(Self::new(
            status,
            "application/json",
            serde_json::to_vec(value)?,
        ))
    }

    /// A response of any media type: its status and body bytes, with no header yet; add its
    /// `Content-Type` (and any other header that is part of the result) with
    /// [`StoredResponse::with_header`].
    pub fn raw(status: StatusCode, body: Bytes) -> Self {
        Self {
            status,
            headers: BTreeMap::new(),
            body,
        }
    }

    fn new(status: StatusCode, content_type: &str, body: Vec<u8>) -> Self {
        Self {
            status,
            headers: BTreeMap::from([(header::CONTENT_TYPE.to_string(), content_type.to_owned())]),
            body: body.into(),
        }
    }

    /// Adds a header that is part of the result, such as `Location`.
    pub fn with_header(mut self, name: HeaderName, value: impl Into<String>) -> Self {
        self.headers.insert(name.to_string(), value.into());
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// A header of the result, such as `Location`.
    pub fn header(&self, name: HeaderName) -> Option<&str> {
        self.headers.get(name.as_str()).map(String::as_str)
    }

    pub(crate) fn body_bytes(&self) -> Bytes {
        self.body.clone()
    }

    pub(crate) fn headers_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.headers).expect("a string map always serializes")
    }

    /// Rebuilds a stored response from its columns. A row that cannot be one is a fault.
    pub(crate) fn from_row(
        code: Option<i16>,
        headers: Option<serde_json::Value>,
        body: Option<Vec<u8>>,
    ) -> Result<Self, anyhow::Error> {
        let status = code
            .and_then(|code| u16::try_from(code).ok())
            .and_then(|code| StatusCode::from_u16(code).ok())
            .ok_or_else(|| anyhow::anyhow!("stored response has no valid status: {code:?}"))?;
        let headers = serde_json::from_value(headers.unwrap_or_default())?;
        let body = body.ok_or_else(|| anyhow::anyhow!("stored response has no body"))?;
        Ok(Self {
            status,
            headers,
            body: body.into(),
        })
    }

    /// The stored response again, marked as a replay and otherwise unchanged.
    pub fn replay(self) -> Response {
        let mut response = self.into_response();
        response.headers_mut().insert(
            HeaderName::from_static(IDEMPOTENT_REPLAYED),
            HeaderValue::from_static("true"),
        );
        response
    }
}

impl IntoResponse for StoredResponse {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        for (name, value) in &self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::try_from(name.as_str()),
                HeaderValue::try_from(value.as_str()),
            ) {
                response.headers_mut().insert(name, value);
            }
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_response_survives_its_columns_unchanged() {
        let stored =
            StoredResponse::json(StatusCode::CREATED, &serde_json::json!({"b": 1, "a": 2}))
                .unwrap()
                .with_header(header::LOCATION, "/v1/payments/pay_1");
        let rebuilt = StoredResponse::from_row(
            Some(201),
            Some(stored.headers_json()),
            Some(stored.body_bytes().to_vec()),
        )
        .unwrap();
        assert_eq!(rebuilt, stored);
    }

    #[test]
    fn a_replay_adds_only_the_replayed_header() {
        let stored = StoredResponse::json(StatusCode::CREATED, &serde_json::json!({})).unwrap();
        let original = stored.clone().into_response();
        let replay = stored.replay();
        assert_eq!(replay.status(), original.status());
        assert_eq!(replay.headers().len(), original.headers().len() + 1);
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
    }
}
