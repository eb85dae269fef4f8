//! Runs the checker breadth-first over the whole state space of a configuration and reports, for
//! each property, whether it held (an `always`), was found (a `sometimes`), and the trace that
//! shows it otherwise.

use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model};

use crate::config::Config;
use crate::protocol::{Action, Protocol};

/// How one property came out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An `always` with no counterexample, or a `sometimes` with an example.
    Holds,
    /// An `always` with a counterexample: the actions from the start to the violating state.
    Violated(Vec<Action>),
    /// A `sometimes` never seen: the model allows too little.
    NeverSeen,
}

#[derive(Clone, Debug)]
pub struct PropertyResult {
    pub name: &'static str,
    pub always: bool,
    pub outcome: Outcome,
}

#[derive(Clone, Debug)]
pub struct Report {
    /// Distinct states visited.
    pub states: usize,
    pub elapsed: Duration,
    /// Whether the whole space was visited (no counterexample stopped the search early).
    pub complete: bool,
    pub results: Vec<PropertyResult>,
}

impl Report {
    /// Every `always` held and every `sometimes` was seen.
    pub fn passed(&self) -> bool {
        self.results
            .iter()
            .all(|result| result.outcome == Outcome::Holds)
    }

    pub fn result(&self, name: &str) -> Option<&PropertyResult> {
        self.results.iter().find(|result| result.name == name)
    }

    /// The counterexample of `name`, if the checker found one.
    pub fn violation(&self, name: &str) -> Option<&[Action]> {
        match &self.result(name)?.outcome {
            Outcome::Violated(trace) => Some(trace),
            Outcome::Holds | Outcome::NeverSeen => None,
        }
    }
}

/// Checks `config` breadth-first on `threads` threads. The search stops at the first
/// counterexample (breadth-first, so it is a shortest one); without one it visits every state.
pub fn check(config: Config, threads: usize) -> Report {
    let protocol = Protocol::new(config);
    let properties = protocol.properties();
    let started = Instant::now();
    let checker = protocol
        .checker()
        .threads(threads)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let elapsed = started.elapsed();
    let discoveries = checker.discoveries();
    let results: Vec<PropertyResult> = properties
        .iter()
        .map(|property| {
            let always = property.expectation == Expectation::Always;
            let found = discoveries.get(property.name);
            let outcome = match (always, found) {
                (true, None) | (false, Some(_)) => Outcome::Holds,
                (true, Some(path)) => Outcome::Violated(path.clone().into_actions()),
                (false, None) => Outcome::NeverSeen,
            };
            PropertyResult {
                name: property.name,
                always,
                outcome,
            }
        })
        .collect();
    let complete = !results
        .iter()
        .any(|result| matches!(result.outcome, Outcome::Violated(_)));
    Report {
        states: checker.unique_state_count(),
        elapsed,
        complete,
        results,
    }
}
