use clap::Parser;
use idempay::cli::{Cli, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    idempay::telemetry::init();
    run(Cli::parse()).await
}
