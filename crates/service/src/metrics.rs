//! The process's Prometheus recorder and its rendering for `GET /metrics`, which both services
//! serve: idempay's and the processor's (standalone, each its own process; embedded in idempay,
//! one recorder for both, as the metrics macros report to one global recorder).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency buckets in seconds: a replay takes well under a millisecond, a slow charge seconds.
const BUCKETS: [f64; 14] = [
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// How often histograms are folded into the exported state, which bounds their memory.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process-wide recorder. The first service to install it describes the series with
/// `describe`, every series it records, its jobs' and outbox's with theirs (tests start several
/// applications in one process; they share it).
fn handle(describe: impl FnOnce()) -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
            .and_then(PrometheusBuilder::install_recorder)
            .expect("no other metrics recorder is installed");
        describe();
        let upkeep = handle.clone();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                upkeep.run_upkeep();
            }
        });
        handle
    })
}

/// Installs the recorder, so metrics recorded before the first scrape are kept, and describes the
/// series with `describe` (once a process: a later call describes nothing).
pub fn install(describe: impl FnOnce()) {
    handle(describe);
}

/// The metrics in the Prometheus text format, and the content type to serve them with.
pub fn render() -> String {
    handle(|| {}).render()
}

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";
