//! A throwaway PostgreSQL in a container, for `idempay dev` and the integration tests.
//!
//! The image is found or made by `scripts/pg-image.sh`, compiled into the binary so it runs from
//! anywhere: the official `postgres:15` where it can be pulled, else an equivalent image built from
//! Debian's packages. `IDEMPAY_PG_IMAGE` chooses another image.
//!
//! The container shares the host's network and PostgreSQL listens on a free port of 127.0.0.1, so
//! the database is reached as production reaches it: a published port would route every byte
//! through Docker's userland proxy, a process of its own that halved the round trips per second
//! here.

use std::borrow::Cow;
use std::net::{Ipv4Addr, TcpListener};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::Connection;
use sqlx::postgres::PgConnection;
use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, Image, ImageExt};

const IMAGE_SCRIPT: &str = include_str!("../../scripts/pg-image.sh");
const PASSWORD: &str = "postgres";

/// Makes sure the PostgreSQL image exists locally and returns its reference (`name:tag`).
pub async fn ensure_image() -> anyhow::Result<String> {
    let output = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(IMAGE_SCRIPT)
        .arg("pg-image.sh")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .context("cannot run bash to find the PostgreSQL image")?;
    if !output.status.success() {
        bail!(
            "could not find or build a PostgreSQL image ({})",
            output.status
        );
    }
    let stdout = String::from_utf8(output.stdout).context("image name is not UTF-8")?;
    stdout
        .lines()
        .last()
        .map(str::to_owned)
        .context("the image script printed no image name")
}

/// PostgreSQL as the official image runs it: configured by `POSTGRES_*` variables, extra
/// arguments passed to the server, ready when the server says so on stderr.
#[derive(Clone, Debug)]
struct PostgresImage {
    name: String,
    tag: String,
    /// The host port it listens on, on 127.0.0.1.
    port: String,
}

impl Image for PostgresImage {
    fn name(&self) -> &str {
        &self.name
    }

    fn tag(&self) -> &str {
        &self.tag
    }

    fn ready_conditions(&self) -> Vec<WaitFor> {
        vec![WaitFor::message_on_stderr(
            "database system is ready to accept connections",
        )]
    }

    fn env_vars(
        &self,
    ) -> impl IntoIterator<Item = (impl Into<Cow<'_, str>>, impl Into<Cow<'_, str>>)> {
        [
            ("POSTGRES_USER", "postgres"),
            ("POSTGRES_PASSWORD", PASSWORD),
        ]
    }

    fn cmd(&self) -> impl IntoIterator<Item = impl Into<Cow<'_, str>>> {
        // Throwaway data: durability is not needed, speed is. Tests open many pools at once.
        [
            "-c",
            "listen_addresses=127.0.0.1",
            "-p",
            &self.port,
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=500",
        ]
    }
}

/// A running PostgreSQL container, listening on 127.0.0.1 only.
pub struct Postgres {
    container: ContainerAsync<PostgresImage>,
    port: u16,
}

impl Postgres {
    /// Starts a container and waits until it accepts connections.
    pub async fn start() -> anyhow::Result<Self> {
        let reference = ensure_image().await?;
        let (name, tag) = reference.rsplit_once(':').unwrap_or((&reference, "latest"));
        let port = free_loopback_port()?;
        let image = PostgresImage {
            name: name.to_owned(),
            tag: tag.to_owned(),
            port: port.to_string(),
        };
        let container = image
            .with_network("host")
            .start()
            .await
            .with_context(|| format!("cannot start a container from {reference}"))?;
        let postgres = Self { container, port };
        postgres.wait_until_connectable().await?;
        Ok(postgres)
    }

    /// The connection string of `database` in this server.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// Stops and removes the container.
    pub async fn remove(self) -> anyhow::Result<()> {
        self.container.rm().await?;
        Ok(())
    }

    async fn wait_until_connectable(&self) -> anyhow::Result<()> {
        let url = self.url("postgres");
        let mut attempts = 0;
        loop {
            match PgConnection::connect(&url).await {
                Ok(connection) => {
                    connection.close().await?;
                    return Ok(());
                }
                Err(error) if attempts < 50 => {
                    attempts += 1;
                    tracing::debug!(%error, "PostgreSQL not connectable yet");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error).context("PostgreSQL never accepted connections"),
            }
        }
    }
}

/// A port of 127.0.0.1 that nothing listens on now (the system picks it).
fn free_loopback_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("no free loopback port")?;
    Ok(listener.local_addr()?.port())
}
