//! Structured logs through `tracing`: human-readable by default, JSON lines with
//! `IDEMPAY_LOG_FORMAT=json`, filtered by `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

pub fn init() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("idempay=info,tower_http=info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let json = std::env::var("IDEMPAY_LOG_FORMAT").is_ok_and(|format| format == "json");
    // A second init (tests that build several apps) keeps the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
