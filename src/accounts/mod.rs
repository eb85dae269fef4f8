//! Accounts are the merchants that call the API. Each authenticates with a secret API key
//! (`Authorization: Bearer sk_…`); only its SHA-256 hash is stored.

mod api_key;
mod cache;
mod rate_limit;

use std::fmt;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header;
use axum::http::request::Parts;
use sqlx::PgPool;

use crate::http::error::{ApiError, Problem, ProblemKind};
use crate::ids;

pub use api_key::ApiKey;
pub use cache::{ACCOUNT_TTL, AccountCache, CHANNEL, UNKNOWN_TTL, listen};
pub use rate_limit::RateLimit;

/// An account id, `acct_` followed by random characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct AccountId(String);

impl AccountId {
    fn generate() -> Self {
        Self(ids::generate("acct", 16))
    }

    pub fn as_str(&self) -> &str {
        &self.0
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
    id: AccountId,
    name: String,
}

impl Account {
    pub fn id(&self) -> &AccountId {
        &self.id
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Creates an account and returns it with its new secret key, shown this once.
pub async fn create(pool: &PgPool, name: &str) -> Result<(Account, ApiKey), anyhow::Error> {
    let name = name.trim();
    anyhow::ensure!(
        (1..=255).contains(&name.chars().count()),
        "an account name has 1 to 255 characters"
    );
    let id = AccountId::generate();
    let key = ApiKey::generate();
    let hash = key.hash();
    sqlx::query!(
        "INSERT INTO accounts (id, name, api_key_hash) VALUES ($1, $2, $3)",
        id.as_str(),
        name,
        hash.as_slice(),
    )
    .execute(pool)
    .await?;
    let account = Account {
        id,
        name: name.to_owned(),
    };
    Ok((account, key))
}

/// Whose API key a command changes.
#[derive(Debug)]
pub enum KeyHolder {
    /// The account this key authenticates.
    Key(ApiKey),
    /// An account by its id (`acct_…`): how an account whose key was revoked gets a new one.
    Account(String),
}

/// Gives the holder's account a new key, which replaces its key at once: the old one (if it has
/// one) stops authenticating on every instance as soon as this commits. One key per account keeps
/// the model simple; a client rolls over by deploying the new key right after the rotation (Stripe
/// can let a rolled key live on for a while, which needs several keys per account).
pub async fn rotate_key(pool: &PgPool, holder: &KeyHolder) -> anyhow::Result<(Account, ApiKey)> {
    let key = ApiKey::generate();
    let hash = key.hash();
    // One statement: the trigger on `accounts` tells every instance in its transaction, so the
    // notification goes out only if the change committed.
    let account = match holder {
        KeyHolder::Key(old) => {
            let old = old.hash();
            sqlx::query_as!(
                Account,
                r#"UPDATE accounts SET api_key_hash = $2 WHERE api_key_hash = $1
                   RETURNING id AS "id: _", name"#,
                old.as_slice(),
                hash.as_slice(),
            )
            .fetch_optional(pool)
            .await?
        }
        KeyHolder::Account(id) => {
            sqlx::query_as!(
                Account,
                r#"UPDATE accounts SET api_key_hash = $2 WHERE id = $1
                   RETURNING id AS "id: _", name"#,
                id,
                hash.as_slice(),
            )
            .fetch_optional(pool)
            .await?
        }
    };
    let account = account.ok_or_else(|| match holder {
        KeyHolder::Key(_) => no_such_key(),
        KeyHolder::Account(id) => anyhow::anyhow!("no account has the id {id:?}"),
    })?;
    Ok((account, key))
}

/// Revokes an API key: it stops authenticating on every instance as soon as this commits, and
/// its account has no key until [`rotate_key`] gives it one. The account and its payments stay.
pub async fn revoke_key(pool: &PgPool, key: &ApiKey) -> anyhow::Result<Account> {
    let hash = key.hash();
    sqlx::query_as!(
        Account,
        r#"UPDATE accounts SET api_key_hash = NULL WHERE api_key_hash = $1
           RETURNING id AS "id: _", name"#,
        hash.as_slice(),
    )
    .fetch_optional(pool)
    .await?
    .ok_or_else(no_such_key)
}

fn no_such_key() -> anyhow::Error {
    anyhow::anyhow!("no account has this API key (it was rotated, revoked, or never issued)")
}

/// The account of a request, from its bearer key; 401 without a valid one, 429 when the account is
/// over its rate limit.
///
/// The lookup is by the key's hash, so no comparison ever runs over the secret itself. The account
/// is kept in the request's extensions, so extracting it again costs no second lookup, and counts
/// the request against the rate limit once.
impl<S> FromRequestParts<S> for Account
where
    AccountCache: FromRef<S>,
    RateLimit: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(account) = parts.extensions.get::<Account>() {
            return Ok(account.clone());
        }
        let key = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(bearer_token)
            .and_then(ApiKey::parse)
            .ok_or_else(unauthorized)?;
        let account = AccountCache::from_ref(state)
            .find(key.hash())
            .await?
            .ok_or_else(unauthorized)?;
        tracing::Span::current().record("account", account.id.as_str());
        RateLimit::from_ref(state).check(&account.id)?;
        parts.extensions.insert(account.clone());
        Ok(account)
    }
}

/// The token of `Bearer <token>`; the scheme's name is case-insensitive (RFC 9110, 11.1).
fn bearer_token(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

fn unauthorized() -> Problem {
    Problem::new(
        ProblemKind::Unauthorized,
        "Send a valid API key as `Authorization: Bearer sk_…`.",
    )
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

#[cfg(test)]
mod tests {
    use super::bearer_token;

    #[test]
    fn the_bearer_scheme_is_matched_whatever_its_case() {
        for header in ["Bearer sk_1", "bearer sk_1", "BEARER sk_1"] {
            assert_eq!(bearer_token(header), Some("sk_1"), "{header}");
        }
        for header in ["Basic sk_1", "Bearer", "Bearersk_1", "sk_1"] {
            assert_eq!(bearer_token(header), None, "{header}");
        }
    }
}
