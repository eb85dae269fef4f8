use std::process::ExitCode;

use clap::Parser;
use idempay::cli::{Cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    idempay::telemetry::init();
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            error
                .downcast_ref::<idempay::cli::Exit>()
                .map_or(ExitCode::FAILURE, |exit| ExitCode::from(exit.code))
        }
    }
}
