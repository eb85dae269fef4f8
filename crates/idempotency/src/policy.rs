//! How long keys live and how long a request may hold one, and the one rule that ties the lease to
//! the service's pool.

use std::time::Duration;

/// How long keys live and how long a request may hold one without renewing it.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// How long a key and its stored response live after completion.
    pub key_ttl: Duration,
    /// How long an in-progress key blocks retries before a retry may take it over.
    pub lease: Duration,
    /// How long after its creation a key suspended at a recovery point is still resumed (by a
    /// retry, a takeover, the recovery job). It must end before the other system forgets the
    /// downstream key; after it, the key is held for an operator.
    pub recovery_window: Duration,
}

impl Policy {
    /// Refuses a lease the service's pool could not renew in time, given how long a request may
    /// wait for a connection (`acquire_timeout`): what a service checks once, at start. The lease
    /// is renewed every third of its length by the heartbeat beside each request's work, each
    /// renewal abandoned when the next is due, and a renewal first waits for a connection. A
    /// third of the lease must cover that wait: otherwise, under load, renewals are abandoned while the pool
    /// would still serve them, and a slow but alive request loses its key to a takeover (safely,
    /// the completion is fenced, but its work is then done for nothing and its client answered
    /// 409). Statement and lock timeouts do not enter: a renewal is one UPDATE of one row by its
    /// primary key, which runs in a millisecond or waits for that row's lock, held only by another
    /// one-row statement (a completion, a takeover) or by nobody, and its third bounds that wait.
    pub fn check_lease(&self, acquire_timeout: Duration) -> Result<(), LeaseTooShort> {
        let needed = acquire_timeout * 3;
        if self.lease < needed {
            return Err(LeaseTooShort {
                lease: self.lease,
                acquire_timeout,
                needed,
            });
        }
        Ok(())
    }
}

/// How far apart the clocks of the keys' database and of another system called under a key may
/// be: a call's deadline ([`Lease::call_deadline`]) is this much before the end of the key's
/// recovery window, so that the other system, reading its own clock, refuses a late call before
/// the database's clock lets the key be held (and an operator settle it from what the other
/// system made). Clocks kept by NTP differ by milliseconds; a second leaves room for a
/// commit that takes a while too.
///
/// [`Lease::call_deadline`]: crate::Lease::call_deadline
pub const CLOCK_MARGIN: Duration = Duration::from_secs(1);

/// A lease shorter than three times the pool's acquire timeout ([`Policy::check_lease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTooShort {
    pub lease: Duration,
    pub acquire_timeout: Duration,
    /// Three times the acquire timeout: the shortest lease the pool can renew in time.
    pub needed: Duration,
}

/// A key replays for 24 hours after it completed, as the IETF draft suggests; a silent holder
/// blocks retries for 30 s; a key suspended at a recovery point is resumed for 12 hours, well
/// inside the 24 hours a processor that remembers its keys for a day gives.
impl Default for Policy {
    fn default() -> Self {
        Self {
            key_ttl: Duration::from_secs(24 * 60 * 60),
            lease: Duration::from_secs(30),
            recovery_window: Duration::from_secs(12 * 60 * 60),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_must_cover_three_waits_for_a_connection() {
        let policy = Policy {
            lease: Duration::from_secs(15),
            ..Policy::default()
        };
        assert_eq!(policy.check_lease(Duration::from_secs(5)), Ok(()));
        assert_eq!(
            policy.check_lease(Duration::from_secs(6)),
            Err(LeaseTooShort {
                lease: Duration::from_secs(15),
                acquire_timeout: Duration::from_secs(6),
                needed: Duration::from_secs(18),
            })
        );
        assert_eq!(
            Policy::default().check_lease(Duration::from_secs(10)),
            Ok(())
        );
    }
}
