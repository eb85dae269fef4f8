//! Who a service is, to what it runs on from this crate: the prefix of the series its jobs, expiry
//! and outbox record, and the `User-Agent` its webhook deliveries carry. The crate names no
//! service, so each passes its own [`ServiceName`]; idempay's and its processor's then report
//! apart, even embedded in one process with one recorder.

/// A service's name and version. Checked when declared (a `const` that fails the check does not
/// compile): a name is a Prometheus metric name's prefix and an HTTP product token at once, so
/// lower-case ASCII letters, digits and `_`, starting with a letter; a version is a product
/// version (no space, `/`, `(` or `)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceName {
    name: &'static str,
    version: &'static str,
}

impl ServiceName {
    /// Panics (at compile time, in a `const`) when `name` or `version` is not of the shape above.
    pub const fn new(name: &'static str, version: &'static str) -> Self {
        assert!(is_name(name), "a service name is [a-z][a-z0-9_]*");
        assert!(
            is_version(version),
            "a version holds no space, '/', '(' or ')'"
        );
        Self { name, version }
    }

    /// The name, as metric names begin with it (`idempay`, `processor`).
    pub const fn as_str(&self) -> &'static str {
        self.name
    }

    /// The series `suffix` of this service: `{name}_{suffix}`, as in `idempay_job_up`.
    pub fn metric(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.name)
    }

    /// The `User-Agent` of its webhook deliveries, for the receiver's logs:
    /// `{name}/{version} (+webhooks)`.
    pub fn user_agent(&self) -> String {
        format!("{}/{} (+webhooks)", self.name, self.version)
    }
}

const fn is_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    if bytes.is_empty() || !bytes[0].is_ascii_lowercase() {
        return false;
    }
    let mut at = 1;
    while at < bytes.len() {
        let byte = bytes[at];
        if !(byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_') {
            return false;
        }
        at += 1;
    }
    true
}

const fn is_version(version: &str) -> bool {
    let bytes = version.as_bytes();
    if bytes.is_empty() {
        return false;
    }
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        if !byte.is_ascii_graphic() || matches!(byte, b'/' | b'(' | b')') {
            return false;
        }
        at += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHOP: ServiceName = ServiceName::new("shop_2", "1.4.0-rc.1");

    #[test]
    fn a_name_prefixes_its_series_and_makes_its_user_agent() {
        assert_eq!(SHOP.metric("job_up"), "shop_2_job_up");
        assert_eq!(SHOP.user_agent(), "shop_2/1.4.0-rc.1 (+webhooks)");
        assert_eq!(SHOP.as_str(), "shop_2");
    }

    #[test]
    fn a_name_or_version_that_fits_no_series_or_product_token_is_refused() {
        for name in ["", "Shop", "2shop", "shop-api", "shop api", "_shop"] {
            assert!(!is_name(name), "{name:?}");
        }
        for version in ["", "1.0 beta", "1/2", "(1)"] {
            assert!(!is_version(version), "{version:?}");
        }
        assert!(is_name("idempay") && is_version(env!("CARGO_PKG_VERSION")));
    }
}
