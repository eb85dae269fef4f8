//! A rolling deploy during a schedule (`EXPLORE_PREVIOUS_BIN`; `make deploy-test` builds the
//! previous release and runs it). The schedule's database is migrated by the previous release, and
//! the processor and every instance start on it, as production runs before a deploy. Then, while
//! the schedule's intents and faults go on, the deploy replaces each process, one at a time, by
//! this build: stopped with SIGTERM (killed after a grace period, as an orchestrator does), started
//! on the new binary, which migrates the schema further as `serve` does. An instance killed by a
//! fault while it still runs the previous release comes back on the previous release, on the
//! schema the new one expanded: what a crash mid-deploy does.
//!
//! With `EXPLORE_ROLLBACK=1` the deploy is rolled back once done: every instance back on the
//! previous release, which then alone drives every intent to its final answer, keys the new
//! release wrote among them. (No format gate was opened: a rollback before it loses nothing.)
//!
//! What a deploy adds to the schedule's invariants: every step's process starts (a release that
//! refuses the schema the other left is a failed deploy), and no answer is a 5xx but 503, the
//! retryable one (`Retry-After`): a 500 during a deploy is one release failing on the other's data.

use std::time::Duration;

use crate::plan::Target;
use crate::run::Schedule;

/// How long a process stopped by the deploy may take to finish what it serves: a graceful stop
/// drains its requests within its own request timeout (10 s).
const GRACE: Duration = Duration::from_secs(15);

/// The deploy a run makes, as the environment asks for it.
#[derive(Clone, Debug)]
pub struct Deploy {
    /// The previous release's `idempay` binary.
    pub previous: String,
    /// This build's: what the deploy rolls out.
    pub current: String,
    /// Whether the deploy is rolled back once done.
    pub rollback: bool,
}

/// The release a step puts a process on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    Previous,
    Current,
}

impl Deploy {
    /// `EXPLORE_PREVIOUS_BIN` names the previous release's binary; `EXPLORE_ROLLBACK=1` rolls
    /// the deploy back. `None` without a previous binary: no deploy.
    pub fn from_env() -> Option<Self> {
        let previous = std::env::var("EXPLORE_PREVIOUS_BIN").ok()?;
        let previous = previous.trim();
        if previous.is_empty() {
            return None;
        }
        assert!(
            std::path::Path::new(previous).is_file(),
            "EXPLORE_PREVIOUS_BIN={previous}: no such file"
        );
        Some(Self {
            previous: previous.to_owned(),
            current: crate::world::binary(),
            rollback: std::env::var("EXPLORE_ROLLBACK").is_ok_and(|value| value.trim() == "1"),
        })
    }

    pub fn binary(&self, release: Release) -> &str {
        match release {
            Release::Previous => &self.previous,
            Release::Current => &self.current,
        }
    }

    /// The deploy's steps, each at a fraction of the schedule's duration: the processor first
    /// (it is the world idempay calls, run from the same binary), then each instance in turn, over
    /// the middle of the schedule, so that every instance serves under each release while the
    /// faults strike; then, for a rollback, every instance back to the previous release.
    pub fn steps(&self, instances: usize) -> Vec<(f64, Target, Release)> {
        let mut steps = vec![(0.15, Target::Processor, Release::Current)];
        #[allow(clippy::cast_precision_loss)]
        let each = 0.5 / instances as f64;
        for index in 0..instances {
            #[allow(clippy::cast_precision_loss)]
            let at = 0.2 + each * (index as f64 + 0.5);
            steps.push((at, Target::Instance(index), Release::Current));
        }
        if self.rollback {
            for index in 0..instances {
                #[allow(clippy::cast_precision_loss)]
                let at = 0.75 + 0.02 * index as f64;
                steps.push((at, Target::Instance(index), Release::Previous));
            }
        }
        steps
    }
}

impl std::fmt::Display for Deploy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a rolling deploy from {} to {}{}",
            self.previous,
            self.current,
            if self.rollback { ", rolled back" } else { "" }
        )
    }
}

/// Runs the deploy's steps at their times.
pub async fn roll(s: &Schedule, deploy: &Deploy) {
    let duration = s.plan.duration;
    for (at, target, release) in deploy.steps(s.plan.instances.len()) {
        tokio::time::sleep_until((s.started + duration.mul_f64(at)).into()).await;
        step(s, target, deploy.binary(release), release).await;
    }
}

/// Puts `target` on `binary`: stopped, then started on it; one down (killed by a fault) starts on
/// it when its restart comes. A paused one is waited for (a deploy's SIGTERM reaches a frozen
/// process only once it thaws).
async fn step(s: &Schedule, target: Target, binary: &str, release: Release) {
    let waited = tokio::time::Instant::now();
    while s.is_paused(target) && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut process = s.process(target).lock().await;
    let was_up = process.is_up();
    s.timeline.log(format!(
        "DEPLOY {target} to the {} release{}",
        match release {
            Release::Previous => "previous",
            Release::Current => "new",
        },
        if was_up {
            ""
        } else {
            " (down now: it starts on it)"
        }
    ));
    if was_up && !process.stop(GRACE).await {
        s.timeline
            .log(format!("  {target} not stopped within {GRACE:?}: killed"));
    }
    process.set_binary(binary);
    if !was_up {
        return;
    }
    let env = match target {
        Target::Processor => s.processor_fault_env(),
        Target::Instance(_) => Vec::new(),
    };
    match process.start(&env).await {
        Ok(()) => s.timeline.log(format!("  {target} up on {binary}")),
        Err(error) => s.trouble(
            "deploy step failed",
            format!("{target} on {binary}: {error}"),
        ),
    }
}
