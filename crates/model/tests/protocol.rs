//! The model checked at its small size, in a second or so even in a debug build: the exact
//! number of states (a change to the model that changes it is seen), every property, and each
//! defect caught by the property it breaks.

use model::check::PropertyOutcome;
use model::properties::{
    EVERY_CHARGE_RECORDED_OR_KEPT, NO_ACKNOWLEDGED_EVENT_LOST, NO_COMPLETION_CONTRADICTED,
    ONE_CHARGE_PER_INTENT, ONE_RELEASE_PER_AUTHORIZATION,
};
use model::protocol::{Action, Protocol};
use model::{Config, Defect, Size, check};
use stateright::Model;

/// The distinct states of the small size. A change of the model that changes it must say why in
/// its commit, and update this.
const SMALL_STATES: usize = 671_506;

#[test]
fn the_small_size_has_exactly_the_pinned_number_of_distinct_states() {
    let report = check(Config::correct(Size::small()), 1);
    assert!(report.complete);
    assert_eq!(report.states, SMALL_STATES);
}

#[test]
fn every_property_holds_and_every_example_is_found_at_the_small_size() {
    let report = check(Config::correct(Size::small()), 2);
    for result in &report.results {
        assert_eq!(result.outcome, PropertyOutcome::Holds, "{}", result.name);
    }
    assert!(report.passed());
}

/// Checks the small size with `defect` on and returns the counterexample of `property`.
fn counterexample(defect: Defect, property: &str) -> Vec<Action> {
    counterexample_at(Size::small(), defect, property)
}

/// Checks `size` with `defect` on and returns the counterexample of `property`, replayed.
fn counterexample_at(size: Size, defect: Defect, property: &str) -> Vec<Action> {
    let report = check(Config::correct(size.clone()).with(defect), 1);
    assert!(!report.passed(), "{defect:?} went unnoticed");
    let trace = report
        .violation(property)
        .unwrap_or_else(|| panic!("{defect:?} did not break {property:?}: {report:#?}"));
    // The trace ends at the first state that breaks the property: replayed, it holds before.
    let protocol = Protocol::new(Config::correct(size).with(defect));
    let condition = protocol
        .properties()
        .into_iter()
        .find(|candidate| candidate.name == property)
        .expect("the property exists")
        .condition;
    let mut state = protocol.init_states().remove(0);
    for &action in trace {
        assert!(
            condition(&protocol, &state),
            "{property:?} broken before the trace's end"
        );
        state = protocol
            .next_state(&state, action)
            .expect("each action of the trace is enabled");
    }
    assert!(
        !condition(&protocol, &state),
        "the trace does not break {property:?}"
    );
    trace.to_vec()
}

#[test]
fn a_refusal_believed_after_an_unknown_outcome_loses_a_charge() {
    counterexample(
        Defect::RefusalAfterUnknownBelieved,
        EVERY_CHARGE_RECORDED_OR_KEPT,
    );
}

#[test]
fn a_takeover_that_believes_no_earlier_call_loses_a_charge() {
    counterexample(
        Defect::TakeoverBelievesNoEarlierCall,
        EVERY_CHARGE_RECORDED_OR_KEPT,
    );
}

#[test]
fn a_suspension_without_bound_charges_twice_once_the_processor_forgot_its_key() {
    counterexample(Defect::UnboundedSuspension, ONE_CHARGE_PER_INTENT);
}

#[test]
fn a_completion_without_its_fence_records_a_payment_twice() {
    counterexample(Defect::UnfencedCompletion, ONE_CHARGE_PER_INTENT);
}

#[test]
fn an_early_event_acknowledged_loses_its_dispute() {
    let trace = counterexample(Defect::EarlyEventAcknowledged, NO_ACKNOWLEDGED_EVENT_LOST);
    // The event came before any payment recorded the charge it names.
    assert!(
        matches!(trace.last(), Some(Action::DeliverEvent)),
        "{trace:?}"
    );
}

/// The capture and the cancel both pass idempay's check; only the processor's check under its
/// charge's lock keeps the second from releasing the authorization again.
#[test]
fn a_processor_that_releases_twice_captures_and_voids_one_authorization() {
    let trace = counterexample_at(
        Size::capture(),
        Defect::ProcessorReleasesTwice,
        ONE_RELEASE_PER_AUTHORIZATION,
    );
    assert!(
        matches!(
            trace.last(),
            Some(Action::Deliver { .. } | Action::Settle { .. })
        ),
        "{trace:?}"
    );
}

#[test]
fn every_defect_has_a_name_the_command_line_parses() {
    for defect in Defect::ALL {
        assert_eq!(Defect::parse(defect.name()), Some(defect));
    }
    assert_eq!(Defect::parse("no-such-defect"), None);
}

/// The full size, as `make model`'s run of the model checks it (and fails on the same verdicts):
/// a minute and a half in a release build, far longer in a debug one.
#[test]
#[ignore = "the full size takes minutes; `make model` checks it once, by the model's run in release"]
fn every_property_holds_and_every_example_is_found_at_the_full_size() {
    let report = check(Config::correct(Size::full()), 2);
    for result in &report.results {
        assert_eq!(result.outcome, PropertyOutcome::Holds, "{}", result.name);
    }
    // A completion contradicted by the processor is one of the properties checked.
    assert!(report.result(NO_COMPLETION_CONTRADICTED).is_some());
}
