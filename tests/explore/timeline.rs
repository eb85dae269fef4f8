//! What a schedule did, when: the lines its faults, clients and checks log, printed as its
//! timeline when it fails (or with `EXPLORE_VERBOSE`).

use std::sync::Mutex;
use std::time::Instant;

/// What happened, when, as one list of timestamped lines.
#[derive(Default)]
pub struct Timeline {
    lines: Mutex<Vec<(Instant, String)>>,
}

impl Timeline {
    pub fn log(&self, line: impl Into<String>) {
        self.lines
            .lock()
            .unwrap()
            .push((Instant::now(), line.into()));
    }

    /// The lines, timed from `zero` (the start of the faults: the setup's lines come before it).
    pub fn render(&self, zero: Instant) -> String {
        let mut lines = self.lines.lock().unwrap().clone();
        lines.sort_by_key(|(at, _)| *at);
        lines
            .iter()
            .map(|(at, line)| {
                let seconds = if *at >= zero {
                    (*at - zero).as_secs_f64()
                } else {
                    -(zero - *at).as_secs_f64()
                };
                format!("  {seconds:>+8.3}s {line}\n")
            })
            .collect()
    }
}
