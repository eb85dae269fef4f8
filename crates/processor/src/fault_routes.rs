//! `GET` and `PUT /v1/test/faults`: the faults in force (faults.rs), read and changed at run time.
//! A test helper, like disputes.

use std::time::Duration;

use axum::extract::State;
use serde::Serialize;

use crate::ProcessorState;
use crate::extract::Authorized;
use crate::faults::{Faults, Fraction};
use crate::problem::{Error, Problem, ProblemKind};

/// The faults as `GET` and `PUT /v1/test/faults` show and take them.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FaultsBody {
    /// The fraction (0 to 1) of answers lost after the effect committed.
    #[serde(default)]
    lose_answers: f64,
    /// The fraction (0 to 1) of calls refused with 503 before anything happens.
    #[serde(default)]
    fail: f64,
    /// Milliseconds added to every charge and refund.
    #[serde(default)]
    latency_ms: u64,
}

impl From<Faults> for FaultsBody {
    fn from(faults: Faults) -> Self {
        Self {
            lose_answers: faults.lose_answers.value(),
            fail: faults.fail.value(),
            latency_ms: u64::try_from(faults.latency.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

/// `GET /v1/test/faults`: the faults in force.
pub(crate) async fn get_faults(
    State(state): State<ProcessorState>,
    _: Authorized,
) -> axum::Json<FaultsBody> {
    axum::Json(state.faults().into())
}

/// `PUT /v1/test/faults`: replaces the faults in force, as `IDEMPAY_PROCESSOR_*` set them at start
/// (`idempay demo --processor-loss` uses it to make a running processor lose answers).
pub(crate) async fn set_faults(
    State(state): State<ProcessorState>,
    _: Authorized,
    body: Result<axum::Json<FaultsBody>, axum::extract::rejection::JsonRejection>,
) -> Result<axum::Json<FaultsBody>, Error> {
    let axum::Json(body) =
        body.map_err(|rejection| Problem::new(ProblemKind::InvalidRequest, rejection.body_text()))?;
    let fraction = |name: &str, value: f64| {
        Fraction::parse(&value.to_string())
            .map_err(|error| Problem::new(ProblemKind::InvalidRequest, format!("{name}: {error}")))
    };
    let faults = Faults {
        lose_answers: fraction("lose_answers", body.lose_answers)?,
        fail: fraction("fail", body.fail)?,
        latency: Duration::from_millis(body.latency_ms),
    };
    *state
        .faults
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = faults;
    tracing::warn!(?faults, "faults changed at run time");
    Ok(axum::Json(faults.into()))
}
