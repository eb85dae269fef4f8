//! Runs the checker breadth-first over the whole state space of a configuration and reports, for
//! each property, whether it held (an `always`), was found (a `sometimes`), and the trace that
//! shows it otherwise.

use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path, Property};

use crate::config::Config;
use crate::protocol::{Action, Protocol};
use crate::state::State;

/// How one property came out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PropertyOutcome {
    /// An `always` with no counterexample, or a `sometimes` with an example.
    Holds,
    /// An `always` with a counterexample: the actions from the start to the violating state.
    Violated(Vec<Action>),
    /// A `sometimes` never seen in the whole space: the model allows too little.
    NeverSeen,
    /// A `sometimes` not seen before a counterexample stopped the search.
    NotReached,
}

#[derive(Clone, Debug)]
pub struct PropertyResult {
    pub name: &'static str,
    pub always: bool,
    pub outcome: PropertyOutcome,
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
    /// Every `always` held and every `sometimes` was seen (a search stopped by a counterexample
    /// has not passed).
    pub fn passed(&self) -> bool {
        self.results
            .iter()
            .all(|result| result.outcome == PropertyOutcome::Holds)
    }

    pub fn result(&self, name: &str) -> Option<&PropertyResult> {
        self.results.iter().find(|result| result.name == name)
    }

    /// The counterexample of `name`, if the checker found one.
    pub fn violation(&self, name: &str) -> Option<&[Action]> {
        match &self.result(name)?.outcome {
            PropertyOutcome::Violated(trace) => Some(trace),
            PropertyOutcome::Holds | PropertyOutcome::NeverSeen | PropertyOutcome::NotReached => {
                None
            }
        }
    }
}

/// The actions of `path` up to the first state that violates `property`: the checker may report
/// a path that goes on past it (it goes on expanding a violating state's successors, and a later
/// discovery replaces an earlier one), and the steps after the violation only distract.
fn up_to_first_violation(
    protocol: &Protocol,
    property: &Property<Protocol>,
    path: &Path<State, Action>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    for (state, action) in path.clone().into_vec() {
        if !(property.condition)(protocol, &state) {
            break;
        }
        actions.extend(action);
    }
    actions
}

/// Checks `config` breadth-first on `threads` threads. The search stops at the first
/// counterexample; without one it visits every state. The counterexample is a short one, not
/// always the shortest: the checker's threads (and the batches of one) may replace it by another
/// found before they stop.
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
    let complete = !properties.iter().any(|property| {
        property.expectation == Expectation::Always && discoveries.contains_key(property.name)
    });
    let results: Vec<PropertyResult> = properties
        .iter()
        .map(|property| {
            let always = property.expectation == Expectation::Always;
            let found = discoveries.get(property.name);
            let outcome = match (always, found) {
                (true, None) | (false, Some(_)) => PropertyOutcome::Holds,
                (true, Some(path)) => PropertyOutcome::Violated(up_to_first_violation(
                    checker.model(),
                    property,
                    path,
                )),
                (false, None) if complete => PropertyOutcome::NeverSeen,
                (false, None) => PropertyOutcome::NotReached,
            };
            PropertyResult {
                name: property.name,
                always,
                outcome,
            }
        })
        .collect();
    Report {
        states: checker.unique_state_count(),
        elapsed,
        complete,
        results,
    }
}
