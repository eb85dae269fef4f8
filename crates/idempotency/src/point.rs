//! Recovery points as a key keeps them: the point itself, whether its downstream key may have
//! been sent, the version of its state, and the recovery job's bounds. The lease records them,
//! the store reads and writes them, and the recovery job resumes from them; they name none of
//! those, so all three can name them.

use std::fmt;
use std::time::Duration;

use uuid::Uuid;

use crate::KeyedRequest;

/// Where work that calls another system can be resumed, recorded on its key before the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPoint {
    /// The step the work reached, named by the work: the recovery job picks the resumer by it.
    pub name: String,
    /// What resuming needs, as the work recorded it: a JSON object in the format its `version`
    /// member names ([`StateVersion`]).
    pub state: serde_json::Value,
    /// The key to send downstream as the call's `Idempotency-Key`: the same for every attempt,
    /// takeover and restart of this key, so the other system answers them all with one result.
    pub downstream_key: String,
    /// Whether a call with that key may already have reached the other system.
    pub earlier_calls: EarlierCalls,
}

/// Whether a call with a recovery point's downstream key may have reached the other system before
/// this lease: what decides if a "nothing happened" answer can be believed. A refused connection
/// or a 4xx speaks of the attempt it answers, not of the downstream key: after an earlier attempt
/// that may have gone through, it proves nothing, and forgetting the key then lets the retry
/// charge a second time under a new one. The downstream key is forever once it may have been sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarlierCalls {
    /// This lease recorded the point and its downstream key (the reservation, a recycled key, or a
    /// first point recorded by the work): no call has used the key yet.
    None,
    /// An earlier holder of the key recorded it (a request that answered 503, one whose process
    /// died, the recovery job): a call with the key may have reached the other system.
    Possible,
}

impl EarlierCalls {
    /// For a point holding `recorded` as its downstream key, where this lease offered `made_here`:
    /// a key this lease made is new; one the row already held was made, and maybe sent, by an
    /// earlier holder (the statements keep a row's downstream key over the one offered).
    pub(super) fn of(recorded: &str, made_here: Option<&str>) -> Self {
        if made_here == Some(recorded) {
            Self::None
        } else {
            Self::Possible
        }
    }
}

/// The version of a recovery state's format: its `version` member, a positive integer. A state
/// without one is version 1, the format of the releases before versions (which wrote none).
///
/// The version travels inside the state, in the one column that holds it, so that no statement of
/// any release, those before versions included, can write a state and leave beside it a version
/// that is not its own. A resumer reads the versions it names
/// ([`Resumers::on`](crate::Resumers::on)); a key whose state is in another (a later release
/// wrote it) is left alone by this release: not taken over by a retry (answered 503 with
/// `Retry-After`), not claimed by the recovery job, never released nor its call resent, and
/// reported ([`report_unknown_states`](crate::Idempotency::report_unknown_states)). Past the
/// recovery window it is held for an operator like any other key: the window is the other
/// system's memory, not the format's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateVersion(u16);

impl StateVersion {
    /// The format of the states recorded before versions: no `version` member.
    pub const FIRST: Self = Self(1);

    /// Version `version`, a positive integer.
    pub const fn new(version: u16) -> Self {
        assert!(version > 0, "state versions start at 1");
        Self(version)
    }

    pub fn get(self) -> u16 {
        self.0
    }

    /// The version of `state`: its `version` member, [`StateVersion::FIRST`] without one. `None`
    /// when the member is not a positive integer that fits: no resumer reads such a state.
    pub fn of(state: &serde_json::Value) -> Option<Self> {
        Self::of_member(state.get("version"))
    }

    fn of_member(member: Option<&serde_json::Value>) -> Option<Self> {
        match member {
            None => Some(Self::FIRST),
            Some(member) => member
                .as_u64()
                .and_then(|version| u16::try_from(version).ok())
                .filter(|version| *version > 0)
                .map(Self),
        }
    }

    /// How the statements compare a state's version with the ones a resumer reads: the text of
    /// its `version` member (`COALESCE(recovery_state -> 'version', '1')::text`, so `2`, never
    /// `2.0` nor `"2"`), a space, the point's name.
    pub(crate) fn paired_with(self, point: &str) -> String {
        format!("{} {point}", self.0)
    }
}

/// The recovery point a key is at, as the reservation reads it: its name and its state's version,
/// for the decision to take the key over or leave it alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PointAt {
    pub(crate) name: String,
    /// `None` for a `version` member that is no version.
    pub(crate) version: Option<StateVersion>,
    /// The member as written, for the report of a key left alone.
    pub(crate) written: String,
}

impl PointAt {
    /// The point `name` whose state's `version` member is `member`.
    pub(crate) fn new(name: String, member: Option<&serde_json::Value>) -> Self {
        Self {
            version: StateVersion::of_member(member),
            written: member.map_or_else(|| "1".to_owned(), ToString::to_string),
            name,
        }
    }
}

impl fmt::Display for StateVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl RecoveryPoint {
    /// The version of the point's state; `None` for a state no release reads.
    pub fn version(&self) -> Option<StateVersion> {
        StateVersion::of(&self.state)
    }

    /// The point a request starts at (see [`KeyedRequest::starting_at`]), with a fresh downstream
    /// key, for the reservation to record.
    pub(super) fn first(request: &KeyedRequest) -> Option<Self> {
        let (name, state) = request.first_point.as_ref()?;
        Some(Self {
            name: (*name).to_owned(),
            state: state.clone(),
            downstream_key: new_downstream_key(),
            earlier_calls: EarlierCalls::None,
        })
    }

    /// The point as a statement that may have installed `made_here`'s downstream key returned it.
    pub(super) fn from_columns(
        name: Option<String>,
        state: Option<serde_json::Value>,
        downstream_key: Option<String>,
        made_here: Option<&str>,
    ) -> Option<Self> {
        let downstream_key = downstream_key?;
        Some(Self {
            name: name?,
            state: state?,
            earlier_calls: EarlierCalls::of(&downstream_key, made_here),
            downstream_key,
        })
    }
}

/// A key for calls downstream: random, so no two key rows (nor a row recycled after expiry) ever
/// share one.
pub(super) fn new_downstream_key() -> String {
    format!("idk_{}", Uuid::new_v4().simple())
}

/// The recovery job's bounds: the window above, and the wait between its tries at one key, from
/// `first_backoff` doubling up to `longest_backoff`.
#[derive(Clone, Copy, Debug)]
pub(super) struct RecoveryBounds {
    pub(super) window: Duration,
    pub(super) first_backoff: Duration,
    pub(super) longest_backoff: Duration,
}

impl RecoveryBounds {
    /// The wait after the recovery job's try number `tries + 1` at a key: the first backoff,
    /// doubled for each earlier try, at most the longest (the statements of a single server
    /// compute the same in SQL).
    pub(super) fn backoff(&self, tries: i32) -> Duration {
        let doublings = u32::try_from(tries.clamp(0, 30)).unwrap_or(30);
        self.first_backoff
            .saturating_mul(1 << doublings)
            .min(self.longest_backoff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_downstream_key_this_lease_did_not_make_may_have_been_sent_before() {
        assert_eq!(EarlierCalls::of("idk_a", Some("idk_a")), EarlierCalls::None);
        assert_eq!(
            EarlierCalls::of("idk_a", Some("idk_b")),
            EarlierCalls::Possible
        );
        assert_eq!(EarlierCalls::of("idk_a", None), EarlierCalls::Possible);
    }

    #[test]
    fn a_point_is_read_from_its_columns_and_a_request_starts_at_its_first() {
        use crate::{Fingerprints, IdempotencyKey, Scope, Target};

        let state = serde_json::json!({ "version": 2, "payment": "pay_1" });
        let read = |made_here| {
            RecoveryPoint::from_columns(
                Some("payment.charge_requested".to_owned()),
                Some(state.clone()),
                Some("idk_a".to_owned()),
                made_here,
            )
        };
        let point = read(Some("idk_a")).expect("every column");
        assert_eq!(
            (
                point.name.as_str(),
                &point.state,
                point.downstream_key.as_str()
            ),
            ("payment.charge_requested", &state, "idk_a")
        );
        assert_eq!(point.earlier_calls, EarlierCalls::None);
        assert_eq!(point.version(), Some(StateVersion::new(2)));
        assert_eq!(read(None).unwrap().earlier_calls, EarlierCalls::Possible);
        assert_eq!(
            RecoveryPoint::from_columns(None, Some(state.clone()), Some("idk_a".into()), None),
            None
        );

        let request = KeyedRequest::new(
            Scope::new("acct_1", &axum::http::Method::POST, "/v1/payments"),
            IdempotencyKey::parse(b"k1").unwrap(),
            Fingerprints::of_request(Target::same("/v1/payments"), &serde_json::json!({})),
        );
        assert_eq!(RecoveryPoint::first(&request), None, "no first point");
        let made = state.clone();
        let mut request = request.starting_at("payment.created", move || Ok(made));
        assert_eq!(
            RecoveryPoint::first(&request),
            None,
            "not made before it is prepared"
        );
        request.prepare().unwrap();
        let first = RecoveryPoint::first(&request).expect("its first point");
        assert_eq!(
            (first.name.as_str(), &first.state),
            ("payment.created", &state)
        );
        assert!(first.downstream_key.starts_with("idk_"));
        assert_eq!(first.earlier_calls, EarlierCalls::None);
    }

    #[test]
    fn a_state_version_is_written_and_compared_as_its_number() {
        let second = StateVersion::new(2);
        assert_eq!((second.get(), second.to_string()), (2, "2".to_owned()));
        assert_eq!(
            second.paired_with("payment.charge_requested"),
            "2 payment.charge_requested"
        );
        assert_eq!(
            StateVersion::of(&serde_json::json!({ "version": 3 })).map(StateVersion::get),
            Some(3)
        );
    }
}
