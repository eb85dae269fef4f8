//! ISO 4217 currency codes, lowercase as payment APIs write them.

use std::fmt;

/// The active ISO 4217 currency codes (funds and precious metals excluded), sorted for lookup.
const ISO_4217: &[&str] = &[
    "aed", "afn", "all", "amd", "ang", "aoa", "ars", "aud", "awg", "azn", "bam", "bbd", "bdt",
    "bgn", "bhd", "bif", "bmd", "bnd", "bob", "brl", "bsd", "btn", "bwp", "byn", "bzd", "cad",
    "cdf", "chf", "clp", "cny", "cop", "crc", "cuc", "cup", "cve", "czk", "djf", "dkk", "dop",
    "dzd", "egp", "ern", "etb", "eur", "fjd", "fkp", "gbp", "gel", "ghs", "gip", "gmd", "gnf",
    "gtq", "gyd", "hkd", "hnl", "htg", "huf", "idr", "ils", "inr", "iqd", "irr", "isk", "jmd",
    "jod", "jpy", "kes", "kgs", "khr", "kmf", "kpw", "krw", "kwd", "kyd", "kzt", "lak", "lbp",
    "lkr", "lrd", "lsl", "lyd", "mad", "mdl", "mga", "mkd", "mmk", "mnt", "mop", "mru", "mur",
    "mvr", "mwk", "mxn", "myr", "mzn", "nad", "ngn", "nio", "nok", "npr", "nzd", "omr", "pab",
    "pen", "pgk", "php", "pkr", "pln", "pyg", "qar", "ron", "rsd", "rub", "rwf", "sar", "sbd",
    "scr", "sdg", "sek", "sgd", "shp", "sle", "sll", "sos", "srd", "ssp", "stn", "svc", "syp",
    "szl", "thb", "tjs", "tmt", "tnd", "top", "try", "ttd", "twd", "tzs", "uah", "ugx", "usd",
    "uyu", "uzs", "ved", "ves", "vnd", "vuv", "wst", "xaf", "xcd", "xcg", "xof", "xpf", "yer",
    "zar", "zmw", "zwg", "zwl",
];

/// A lowercase ISO 4217 currency code such as `eur`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Currency(String);

impl TryFrom<String> for Currency {
    type Error = String;

    fn try_from(code: String) -> Result<Self, Self::Error> {
        if ISO_4217.binary_search(&code.as_str()).is_ok() {
            return Ok(Self(code));
        }
        if ISO_4217
            .binary_search(&code.to_ascii_lowercase().as_str())
            .is_ok()
        {
            return Err(format!(
                "currency must be written in lowercase: `{}`",
                code.to_ascii_lowercase()
            ));
        }
        Err(format!(
            "`{code}` is not an ISO 4217 currency code (such as `eur` or `usd`)"
        ))
    }
}

impl utoipa::PartialSchema for Currency {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("A lowercase ISO 4217 currency code."))
            .enum_values(Some(ISO_4217.iter().copied()))
            .examples([serde_json::json!("eur")])
            .into()
    }
}

impl utoipa::ToSchema for Currency {}

impl From<Currency> for String {
    fn from(currency: Currency) -> Self {
        currency.0
    }
}

impl Currency {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_sorted_and_without_duplicates_so_binary_search_works() {
        assert!(ISO_4217.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn real_codes_are_currencies_and_others_are_not() {
        assert!(Currency::try_from("eur".to_owned()).is_ok());
        assert!(Currency::try_from("jpy".to_owned()).is_ok());
        assert!(Currency::try_from("xyz".to_owned()).is_err());
        assert!(Currency::try_from("euro".to_owned()).is_err());
        assert!(Currency::try_from(String::new()).is_err());
    }

    #[test]
    fn uppercase_codes_are_refused_with_a_hint() {
        let error = Currency::try_from("EUR".to_owned()).unwrap_err();
        assert!(error.contains("`eur`"), "{error}");
    }
}
