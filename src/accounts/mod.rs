//! Accounts are the merchants that call the API. Each authenticates with a secret API key
//! (`Authorization: Bearer sk_…`); only its SHA-256 hash is stored.

mod api_key;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header;
use axum::http::request::Parts;
use quick_cache::sync::Cache;
use sqlx::PgPool;

use crate::http::error::{ApiError, Problem, ProblemKind};
use crate::ids;

pub use api_key::ApiKey;

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

/// The authenticated account of a request, put into its extensions by [`authenticate`].
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

/// Accounts by the hash of their API key, kept for a short while so that a key in use costs no
/// query per request. Bounded in entries and in age: a key removed from the database stops working
/// within [`ACCOUNT_TTL`]. Only keys that authenticated are kept, so a new account works at once.
#[derive(Clone)]
pub struct AccountCache {
    pool: PgPool,
    cached: Arc<Cache<[u8; 32], (Account, Instant)>>,
}

/// How long a looked-up account is trusted without asking the database again.
pub const ACCOUNT_TTL: Duration = Duration::from_secs(60);
/// Accounts kept at most; the least recently useful ones make room for others.
const CACHED_ACCOUNTS: usize = 10_000;

impl AccountCache {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            cached: Arc::new(Cache::new(CACHED_ACCOUNTS)),
        }
    }

    /// The account whose key hashes to `hash`, if any.
    async fn find(&self, hash: [u8; 32]) -> Result<Option<Account>, sqlx::Error> {
        if let Some((account, fetched)) = self.cached.get(&hash) {
            if fetched.elapsed() < ACCOUNT_TTL {
                return Ok(Some(account));
            }
        }
        let account = sqlx::query_as!(
            Account,
            r#"SELECT id AS "id: _", name FROM accounts WHERE api_key_hash = $1"#,
            hash.as_slice(),
        )
        .fetch_optional(&self.pool)
        .await?;
        if let Some(account) = &account {
            self.cached.insert(hash, (account.clone(), Instant::now()));
        }
        Ok(account)
    }
}

impl fmt::Debug for AccountCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccountCache")
            .field("cached", &self.cached.len())
            .finish_non_exhaustive()
    }
}

/// The account of a request, from its bearer key; 401 without a valid one.
///
/// The lookup is by the key's hash, so no comparison ever runs over the secret itself. The account
/// is kept in the request's extensions, so extracting it again costs no second lookup.
impl<S> FromRequestParts<S> for Account
where
    AccountCache: FromRef<S>,
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
