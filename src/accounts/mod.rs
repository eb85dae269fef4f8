//! Accounts are the merchants that call the API. Each authenticates with a secret API key
//! (`Authorization: Bearer sk_…`); only its SHA-256 hash is stored.

mod api_key;

use std::fmt;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header;
use axum::http::request::Parts;
use sqlx::PgPool;

use crate::error::{ApiError, Problem, ProblemKind};
use crate::ids;

pub use api_key::ApiKey;

/// An account id, `acct_` followed by random characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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

/// The account of a request, from its bearer key; 401 without a valid one.
///
/// The lookup is by the key's hash, so no comparison ever runs over the secret itself. The account
/// is kept in the request's extensions, so extracting it again costs no second lookup.
impl<S> FromRequestParts<S> for Account
where
    PgPool: FromRef<S>,
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
            .and_then(|value| value.strip_prefix("Bearer "))
            .and_then(ApiKey::parse)
            .ok_or_else(unauthorized)?;
        let hash = key.hash();
        let account = sqlx::query_as!(
            Account,
            r#"SELECT id AS "id: _", name FROM accounts WHERE api_key_hash = $1"#,
            hash.as_slice(),
        )
        .fetch_optional(&PgPool::from_ref(state))
        .await?
        .ok_or_else(unauthorized)?;
        tracing::Span::current().record("account", account.id.as_str());
        parts.extensions.insert(account.clone());
        Ok(account)
    }
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
