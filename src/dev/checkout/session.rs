//! Demo sessions: a random token in an HttpOnly, SameSite=Strict cookie, valid for minutes,
//! known only to the process that started it. A session names no account: it only lets the page's
//! calls through, always as the demo account.
//!
//! They live in memory, timed by the process's monotonic clock rather than the database's: a
//! session is this process's own business, dies with it, and is never compared with a time
//! stored elsewhere.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::header::{self, HeaderMap, HeaderValue};

use service::ids;

/// How long a session lasts: time to play with the page, short enough that a copied cookie is
/// soon worthless. The page says to reload once it has run out.
pub const SESSION_TTL: Duration = Duration::from_secs(15 * 60);

/// The cookie's name.
pub const SESSION_COOKIE: &str = "idempay_demo_session";

/// At most this many sessions live at once; starting one more ends the oldest. Reloading the page
/// in a loop therefore costs a bounded amount of memory.
const MAX_SESSIONS: usize = 1024;

/// Random characters of a token (about 190 bits): not guessable.
const TOKEN_CHARS: usize = 32;

/// The live sessions, by token, with the instant each ends.
#[derive(Debug, Default)]
pub(super) struct Sessions(Mutex<HashMap<String, Instant>>);

impl Sessions {
    /// Starts a session; returns the `Set-Cookie` value that carries it.
    pub(super) fn start(&self) -> HeaderValue {
        let token = ids::generate("ds", TOKEN_CHARS);
        let now = Instant::now();
        {
            let mut sessions = self.lock();
            sessions.retain(|_, ends| *ends > now);
            if sessions.len() >= MAX_SESSIONS {
                let oldest = sessions
                    .iter()
                    .min_by_key(|(_, ends)| **ends)
                    .map(|(token, _)| token.clone());
                if let Some(oldest) = oldest {
                    sessions.remove(&oldest);
                }
            }
            sessions.insert(token.clone(), now + SESSION_TTL);
        }
        // Path=/demo: the cookie goes with the page's calls and nowhere else on the server.
        let mut cookie = HeaderValue::from_str(&format!(
            "{SESSION_COOKIE}={token}; Path=/demo; Max-Age={}; HttpOnly; SameSite=Strict",
            SESSION_TTL.as_secs()
        ))
        .expect("a token of letters and digits makes a valid header");
        cookie.set_sensitive(true);
        cookie
    }

    /// Whether the request carries a live session of this process.
    pub(super) fn admits(&self, headers: &HeaderMap) -> bool {
        let now = Instant::now();
        let sessions = self.lock();
        tokens(headers).any(|token| sessions.get(token).is_some_and(|ends| *ends > now))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        // The map is consistent after any panic (each change is one call), so a poisoned lock
        // is still usable.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The values of the session cookie in the request's `Cookie` headers.
fn tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::COOKIE)
        .into_iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|cookies| cookies.split(';'))
        .filter_map(|cookie| cookie.trim().split_once('='))
        .filter(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, token)| token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookie_header(set_cookie: &HeaderValue) -> HeaderMap {
        let pair = set_cookie.to_str().unwrap().split(';').next().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {pair}")).unwrap(),
        );
        headers
    }

    #[test]
    fn a_started_session_is_admitted_and_a_made_up_one_is_not() {
        let sessions = Sessions::default();
        let started = sessions.start();
        assert!(sessions.admits(&cookie_header(&started)));
        assert!(!sessions.admits(&HeaderMap::new()));
        let made_up = HeaderValue::from_static("idempay_demo_session=ds_made_up");
        assert!(!sessions.admits(&cookie_header(&made_up)));
        assert!(!Sessions::default().admits(&cookie_header(&started)));
    }

    #[test]
    fn starting_more_sessions_than_the_bound_ends_the_oldest() {
        let sessions = Sessions::default();
        let first = sessions.start();
        for _ in 0..MAX_SESSIONS {
            sessions.start();
        }
        assert_eq!(sessions.lock().len(), MAX_SESSIONS);
        assert!(!sessions.admits(&cookie_header(&first)));
    }
}
