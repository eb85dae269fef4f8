use std::process::ExitCode;

use clap::Parser;
use idempay::cli::{Cli, run};

/// With glibc's allocator an eighth of a new key's CPU went to malloc and free (`make profile`),
/// much of it consolidating chunks freed on another thread than the one that allocated them;
/// mimalloc's per-thread pages make that cheap (about a tenth less CPU per new key in `make
/// bench`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    idempay::telemetry::init();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            error
                .downcast_ref::<idempay::exit::Exit>()
                .map_or(ExitCode::FAILURE, |exit| ExitCode::from(exit.code))
        }
    }
}
