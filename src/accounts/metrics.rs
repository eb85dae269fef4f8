//! The accounts' series: API keys looked up in the database, the API key listener's connection,
//! and the requests the rate limit refused.

use metrics::{counter, describe_counter, describe_gauge, gauge};

const ACCOUNT_LOOKUPS: &str = "idempay_account_lookups_total";
const API_KEY_LISTENER: &str = "idempay_api_key_listener_connected";
const THROTTLED: &str = "idempay_rate_limited_requests_total";

/// Describes the accounts' series to the recorder.
pub fn describe() {
    describe_counter!(
        ACCOUNT_LOOKUPS,
        "API keys looked up in the database, the account cache unable to answer, by result \
         (found, unknown)."
    );
    describe_gauge!(
        API_KEY_LISTENER,
        "1 while the instance listens for API key changes; at 0 its account cache is off and every \
         request looks its key up."
    );
    describe_counter!(
        THROTTLED,
        "Requests refused with 429 because their account was over its rate limit."
    );
}

/// Counts a lookup of an API key in the database.
pub(super) fn account_lookup(found: bool) {
    let result = if found { "found" } else { "unknown" };
    counter!(ACCOUNT_LOOKUPS, "result" => result).increment(1);
}

/// Records whether the API key listener is connected.
pub(super) fn api_key_listener(connected: bool) {
    gauge!(API_KEY_LISTENER).set(if connected { 1.0 } else { 0.0 });
}

/// Counts a request refused by its account's rate limit.
pub(super) fn throttled() {
    counter!(THROTTLED).increment(1);
}
