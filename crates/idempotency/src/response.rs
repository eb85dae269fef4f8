//! A response as it was sent, kept with its key so every replay is the same bytes.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;

use crate::formats::UnknownFormat;

/// The header a replayed response carries, as Stripe and the IETF draft's examples name it.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The format of a stored response's columns, recorded with it (`response_version`; none on the
/// responses of the releases before versions, which are version 1). A change of how the status,
/// the headers or the body are kept is a new version: the releases that do not read it leave such a
/// key alone (503 with `Retry-After`), never replay it as something else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseVersion(i16);

impl ResponseVersion {
    /// The headers as one JSON object, `{"content-type": "application/json", "location": …}`.
    pub const V1: Self = Self(1);
    /// The version this release stores.
    pub const CURRENT: Self = Self::V1;

    /// The version a key's `response_version` column names: none is version 1.
    pub(crate) fn stored(column: Option<i16>) -> Self {
        column.map_or(Self::V1, Self)
    }

    /// The version as the column stores it.
    pub fn get(self) -> i16 {
        self.0
    }
}

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

    /// Rebuilds a stored response from its columns, in the format `version` names: an
    /// [`UnknownFormat`] for a version this release does not read (a later release stored it),
    /// which is left alone, never replayed as something else. A row that cannot be what its
    /// version says is a fault.
    pub(crate) fn from_row(
        version: Option<i16>,
        code: Option<i16>,
        headers: Option<serde_json::Value>,
        body: Option<Vec<u8>>,
    ) -> Result<Result<Self, UnknownFormat>, anyhow::Error> {
        match ResponseVersion::stored(version) {
            ResponseVersion::V1 => Self::from_v1(code, headers, body).map(Ok),
            other => Ok(Err(UnknownFormat::response(other.get()))),
        }
    }

    /// Version 1: the status, the body's bytes, and the headers as one JSON object of lower-case
    /// names to values (one value per name).
    fn from_v1(
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
            Some(ResponseVersion::CURRENT.get()),
            Some(201),
            Some(stored.headers_json()),
            Some(stored.body_bytes().to_vec()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(rebuilt, stored);
    }

    #[test]
    fn a_stored_response_of_a_version_this_release_does_not_read_is_not_rebuilt() {
        let columns = || {
            (
                Some(201),
                Some(serde_json::json!({ "content-type": "application/json" })),
                Some(b"{}".to_vec()),
            )
        };
        // No version is version 1, the responses stored before versions.
        let (code, headers, body) = columns();
        let before_versions = StoredResponse::from_row(None, code, headers, body).unwrap();
        assert_eq!(before_versions.unwrap().status(), StatusCode::CREATED);
        let (code, headers, body) = columns();
        let later = StoredResponse::from_row(Some(2), code, headers, body).unwrap();
        assert_eq!(later.unwrap_err(), UnknownFormat::response(2));
    }

    #[tokio::test]
    async fn a_stored_response_is_sent_with_its_status_headers_and_exact_bytes() {
        let stored = StoredResponse::json(StatusCode::CREATED, &serde_json::json!({"b": 1}))
            .unwrap()
            .with_header(header::LOCATION, "/v1/payments/pay_1");
        assert_eq!(stored.header(header::LOCATION), Some("/v1/payments/pay_1"));
        assert_eq!(stored.header(header::ETAG), None);
        let response = stored.into_response();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()[header::LOCATION], "/v1/payments/pay_1");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let sent = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(sent.as_ref(), br#"{"b":1}"#);
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
