//! An account and its id: what the cache keeps, the rate limit counts by, and the routes of
//! `mod.rs` create, rotate and authenticate.

use std::fmt;

use service::ids;

/// An account id, `acct_` followed by random characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct AccountId(pub(super) String);

impl AccountId {
    pub(super) fn generate() -> Self {
        Self(ids::generate("acct", 16))
    }

    /// An account id as an operator types it: `acct_` and letters and digits. Whether the account
    /// exists is the database's to say.
    pub fn parse(raw: &str) -> Option<Self> {
        let random = raw.trim().strip_prefix("acct_")?;
        (!random.is_empty()
            && random.len() <= 64
            && random.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| Self(raw.trim().to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id as a record kept it (a recovery state): an account's, when it was written.
    pub fn kept(id: String) -> Self {
        Self(id)
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The authenticated account of a request, kept in its extensions once extracted.
#[derive(Clone, Debug)]
pub struct Account {
    pub(super) id: AccountId,
    pub(super) name: String,
}

impl Account {
    pub fn id(&self) -> &AccountId {
        &self.id
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl sqlx::Type<sqlx::Postgres> for AccountId {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <String as sqlx::Type<sqlx::Postgres>>::type_info()
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for AccountId {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(Self(<String as sqlx::Decode<sqlx::Postgres>>::decode(
            value,
        )?))
    }
}
