//! Accounts are the merchants that call the API. Each authenticates with a secret API key
//! (`Authorization: Bearer sk_…`, or HTTP Basic with the key as the user name, as Stripe takes
//! it); only its SHA-256 hash is stored.

mod account;
mod api_key;
mod cache;
pub mod metrics;
mod rate_limit;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header;
use axum::http::request::Parts;
use sqlx::PgPool;

use crate::http::error::{ApiError, Problem, ProblemKind};

pub use account::{Account, AccountId};
pub use api_key::ApiKey;
pub use cache::{ACCOUNT_TTL, AccountCache, CHANNEL, UNKNOWN_TTL, listen};
pub use rate_limit::RateLimit;

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
        let key = credentials(parts.headers.get(header::AUTHORIZATION))
            .map_err(|refused| unauthorized(refused.detail()))?;
        let account = AccountCache::from_ref(state)
            .find(key.hash())
            .await?
            .ok_or_else(|| unauthorized(Refused::Unknown.detail()))?;
        tracing::Span::current().record("account", account.id.as_str());
        RateLimit::from_ref(state).check(&account.id)?;
        parts.extensions.insert(account.clone());
        Ok(account)
    }
}

/// Why a request's credentials were refused, each told apart in the 401's `detail` so that a
/// developer sees at once what to fix. None of them says anything of other accounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// No `Authorization` header.
    Missing,
    /// A scheme other than Bearer or Basic, or a header that is not text.
    UnknownScheme,
    /// Basic with the key as the password (`curl -u :sk_…`), or a password beside it.
    KeyNotUserName,
    /// Something that is not the shape of an API key.
    Malformed,
    /// A well-formed key that no account has.
    Unknown,
}

impl Refused {
    fn detail(self) -> &'static str {
        match self {
            Self::Missing => {
                "No API key was sent. Send the account's secret key as `Authorization: Bearer \
                 sk_…`, or as the user name of HTTP Basic authentication with an empty password \
                 (`curl -u sk_…:`)."
            }
            Self::UnknownScheme => {
                "The Authorization header is neither Bearer nor Basic. Send `Authorization: \
                 Bearer sk_…`."
            }
            Self::KeyNotUserName => {
                "HTTP Basic authentication takes the API key as the user name and an empty \
                 password (`curl -u sk_…:`)."
            }
            Self::Malformed => {
                "The API key is malformed: a secret key is `sk_` followed by 40 letters and \
                 digits, as it was shown when issued."
            }
            Self::Unknown => {
                "No account has this API key: it was rotated, revoked, or never issued."
            }
        }
    }
}

/// The API key of an `Authorization` header: `Bearer sk_…`, or Stripe's convention, HTTP Basic
/// with the key as the user name and an empty password. Schemes are case-insensitive (RFC 9110,
/// 11.1).
fn credentials(authorization: Option<&header::HeaderValue>) -> Result<ApiKey, Refused> {
    let authorization = authorization.ok_or(Refused::Missing)?;
    let authorization = authorization.to_str().map_err(|_| Refused::UnknownScheme)?;
    let (scheme, token) = authorization
        .trim()
        .split_once(' ')
        .ok_or(Refused::UnknownScheme)?;
    let token = token.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return ApiKey::parse(token).ok_or(Refused::Malformed);
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(Refused::UnknownScheme);
    }
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| Refused::Malformed)?;
    let decoded = String::from_utf8(decoded).map_err(|_| Refused::Malformed)?;
    let (user, password) = decoded.split_once(':').ok_or(Refused::Malformed)?;
    match (user, password) {
        (user, "") => ApiKey::parse(user).ok_or(Refused::Malformed),
        _ => Err(Refused::KeyNotUserName),
    }
}

fn unauthorized(detail: &str) -> Problem {
    Problem::new(ProblemKind::Unauthorized, detail)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use base64::Engine as _;

    use super::{ApiKey, Refused, credentials};

    fn read(header: &str) -> Result<String, Refused> {
        credentials(Some(&HeaderValue::from_str(header).unwrap()))
            .map(|key| key.expose().to_owned())
    }

    fn basic(user_and_password: &str) -> String {
        let encoded = base64::engine::general_purpose::STANDARD.encode(user_and_password);
        format!("Basic {encoded}")
    }

    #[test]
    fn a_key_is_read_from_bearer_whatever_its_case_and_from_basic_as_the_user_name() {
        let key = ApiKey::generate();
        let key = key.expose();
        for header in [
            format!("Bearer {key}"),
            format!("bearer {key}"),
            format!("BEARER  {key}"),
            basic(&format!("{key}:")),
            basic(&format!("{key}:")).replace("Basic", "basic"),
        ] {
            assert_eq!(read(&header).as_deref(), Ok(key), "{header}");
        }
    }

    #[test]
    fn each_refusal_says_what_is_wrong() {
        let key = ApiKey::generate();
        let key = key.expose();
        assert_eq!(credentials(None).err(), Some(Refused::Missing));
        for (header, refused) in [
            (format!("Token {key}"), Refused::UnknownScheme),
            (key.to_owned(), Refused::UnknownScheme),
            ("Bearer sk_1".to_owned(), Refused::Malformed),
            ("Bearer".to_owned(), Refused::UnknownScheme),
            ("Basic !!!".to_owned(), Refused::Malformed),
            (basic(&format!(":{key}")), Refused::KeyNotUserName),
            (basic(&format!("{key}:secret")), Refused::KeyNotUserName),
            (basic("sk_1:"), Refused::Malformed),
        ] {
            assert_eq!(read(&header).err(), Some(refused), "{header}");
        }
    }
}
