//! The processor an operator's command talks to (`idempay reconcile`, `idempay keys settle`): the
//! one `IDEMPAY_PROCESSOR_URL` names or, without a URL, the processor embedded in this database
//! (as `serve` runs it), started on a loopback port for the command and stopped after it.

use std::time::Duration;

use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::ProcessorClient;
use processor::{Processor, ProcessorApiKey, ProcessorSettings};
use service::ids;

/// A client of the processor, and the embedded processor it talks to if the command started one.
pub struct Linked {
    pub client: ProcessorClient,
    embedded: Option<(CancellationToken, JoinHandle<std::io::Result<()>>)>,
}

impl Linked {
    /// `configured`, the client of the processor the settings name, or, without one, a client of
    /// a processor embedded in `pool`'s database, serving until [`Linked::stop`], each call of it
    /// given `timeout`.
    pub async fn to(
        pool: &PgPool,
        configured: Option<ProcessorClient>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        if let Some(client) = configured {
            return Ok(Self {
                client,
                embedded: None,
            });
        }
        let api_key = ids::generate("sk_operator", 32);
        let settings =
            ProcessorSettings::new(ProcessorApiKey::parse(&api_key).map_err(anyhow::Error::msg)?);
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let processor = Processor::build(settings, pool.clone(), listener)?.sharing_expiry();
        let client = ProcessorClient::new(
            &format!("http://{}", processor.local_addr()?),
            api_key,
            timeout,
        )?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let serving =
            tokio::spawn(processor.run_until_stopped(async move { stopped.cancelled().await }));
        Ok(Self {
            client,
            embedded: Some((stop, serving)),
        })
    }

    /// Stops the embedded processor, if the command started one.
    pub async fn stop(self) -> anyhow::Result<()> {
        if let Some((stop, serving)) = self.embedded {
            stop.cancel();
            serving.await??;
        }
        Ok(())
    }
}
