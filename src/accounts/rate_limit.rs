//! A limit on each account's requests, so that one merchant's runaway client cannot take the
//! service from the others. Checked right after authentication, before anything else of the
//! request runs: a throttled request reserves no idempotency key, so its retry runs as if it were
//! the first.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};

use super::account::AccountId;
use super::metrics;
use crate::http::error::{Problem, ProblemKind};

/// Requests per second per account, with a burst of as many: a generic cell rate (GCRA) that lets
/// an idle account send a second's worth at once, then one request per 1/rate seconds.
///
/// The simulated processor has no such limit: its one client is idempay, whose accounts are
/// limited here, and a throttled charge would only turn into a 503 for the merchant.
///
/// The limit is kept by each instance in its memory: behind a load balancer spreading an account's
/// requests over N instances, the account gets up to N times the rate. A limit shared exactly
/// would cost a round trip to a shared store per request; this one costs none.
#[derive(Clone)]
pub struct RateLimit(Option<Arc<DefaultKeyedRateLimiter<AccountId>>>);

impl RateLimit {
    /// `per_second` requests a second per account; 0 turns the limit off.
    pub fn per_second(per_second: u32) -> Self {
        // One cell per account that called: bounded by the accounts table, a few dozen bytes each.
        Self(
            NonZeroU32::new(per_second)
                .map(|rate| Arc::new(DefaultKeyedRateLimiter::dashmap(Quota::per_second(rate)))),
        )
    }

    /// Counts a request of `account`; a 429 problem with `Retry-After` when it is over its limit.
    pub fn check(&self, account: &AccountId) -> Result<(), Problem> {
        let Some(limiter) = &self.0 else {
            return Ok(());
        };
        limiter.check_key(account).map_err(|not_until| {
            metrics::throttled();
            let wait = not_until.wait_time_from(limiter.clock().now());
            Problem::new(
                ProblemKind::RateLimited,
                "This account sent more requests than its rate limit allows. Nothing was done, and \
                 an Idempotency-Key sent with this request was not used: retry after \
                 `Retry-After` seconds.",
            )
            .retry_after(wait)
        })
    }
}

impl fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimit")
            .field(&self.0.as_ref().map(|limiter| limiter.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_account_over_its_burst_is_refused_with_retry_after_and_another_is_not() {
        let limit = RateLimit::per_second(2);
        let (busy, other) = (AccountId::generate(), AccountId::generate());
        assert!(limit.check(&busy).is_ok());
        assert!(limit.check(&busy).is_ok());

        let refused = limit.check(&busy).unwrap_err();

        assert_eq!(refused.kind(), ProblemKind::RateLimited);
        assert!(
            refused
                .extra_headers()
                .iter()
                .any(|(name, _)| name == axum::http::header::RETRY_AFTER)
        );
        assert!(limit.check(&other).is_ok());
    }

    #[test]
    fn a_limit_of_zero_is_no_limit() {
        let limit = RateLimit::per_second(0);
        let account = AccountId::generate();
        assert!((0..10_000).all(|_| limit.check(&account).is_ok()));
    }
}
