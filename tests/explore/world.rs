//! The real processes a schedule runs on: PostgreSQL in a container of the explorer's own (so it
//! can be restarted), `idempay processor` and 1–3 `idempay serve` on fixed ports of 127.0.0.1 (so a
//! killed one comes back where its clients and the processor's webhooks look for it).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};
use tokio::process::{Child, Command};

/// The binary under test: this build's, or `IDEMPAY_BIN` (another commit's build, to explore old
/// code with today's explorer).
pub fn binary() -> String {
    std::env::var("IDEMPAY_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_idempay").to_owned())
}

/// A TCP port of 127.0.0.1 that nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// PostgreSQL in a container on the host's network, listening on a free port of 127.0.0.1.
pub struct Postgres {
    id: String,
    port: u16,
}

impl Postgres {
    pub async fn start() -> Self {
        let image = idempay::dev::postgres::ensure_image()
            .await
            .expect("a PostgreSQL image");
        let port = free_port();
        let id = docker(&[
            "run",
            "--detach",
            "--label",
            "org.testcontainers.managed-by=testcontainers",
            "--network",
            "host",
            "--env",
            "POSTGRES_PASSWORD=postgres",
            &image,
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=300",
            "-c",
            &format!("port={port}"),
        ])
        .await
        .expect("docker run");
        let postgres = Self {
            id: id.trim().to_owned(),
            port,
        };
        postgres.wait_until_connectable().await;
        postgres
    }

    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://postgres:postgres@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// A fresh database for one schedule.
    pub async fn create_database(&self, name: &str) {
        let mut connection = PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect");
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&mut connection)
            .await
            .expect("drop");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut connection)
            .await
            .expect("create");
    }

    /// A restart as in a failover or an upgrade: SIGINT (PostgreSQL's fast shutdown closes every
    /// connection), the container's exit, then a start.
    pub async fn restart(&self) -> Result<(), String> {
        docker(&["kill", "--signal", "SIGINT", &self.id]).await?;
        docker(&["wait", &self.id]).await?;
        docker(&["start", &self.id]).await?;
        self.wait_until_connectable().await;
        Ok(())
    }

    async fn wait_until_connectable(&self) {
        let started = Instant::now();
        loop {
            if let Ok(mut connection) = PgConnection::connect(&self.url("postgres")).await {
                if sqlx::query("SELECT 1")
                    .execute(&mut connection)
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "PostgreSQL never accepted connections"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["rm", "--force", "--volumes", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

async fn docker(args: &[&str]) -> Result<String, String> {
    let output = Command::new("docker")
        .args(args)
        .output()
        .await
        .map_err(|error| format!("docker {args:?}: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "docker {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// How a process says it is ready.
#[derive(Clone, Debug)]
pub enum Ready {
    /// `GET /readyz` answers 200 (`idempay serve`).
    Readyz,
    /// `GET /v1/test/faults` answers 200 with this key (`idempay processor`, which has no
    /// readiness route).
    Processor { api_key: String },
}

/// One `idempay` process, on a fixed port, with its logs appended to a file across restarts.
pub struct Process {
    pub name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    pub port: u16,
    pub log: PathBuf,
    ready: Ready,
    child: Option<Child>,
}

impl Process {
    pub fn new(
        name: &str,
        args: &[&str],
        env: Vec<(String, String)>,
        port: u16,
        logs: &Path,
        ready: Ready,
    ) -> Self {
        Self {
            name: name.to_owned(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            env,
            port,
            log: logs.join(format!("{name}.log")),
            ready,
            child: None,
        }
    }

    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process with `more` added to its environment and waits until it is ready. One
    /// that exits first (the database down while it migrates, its port not yet let go) is started
    /// again, for up to 60 s.
    pub async fn start(&mut self, more: &[(String, String)]) -> Result<(), String> {
        let started = Instant::now();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a client");
        loop {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|error| format!("{}: {error}", self.log.display()))?;
            let mut command = Command::new(binary());
            command
                .args(&self.args)
                .env("RUST_LOG", "warn,idempay::downstream::client=info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true);
            for (name, value) in self.env.iter().chain(more) {
                command.env(name, value);
            }
            let mut child = command
                .spawn()
                .map_err(|error| format!("{} does not start: {error}", binary()))?;
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if self.ready(&client).await {
                    self.child = Some(child);
                    return Ok(());
                }
                if started.elapsed() > Duration::from_secs(60) {
                    child.kill().await.ok();
                    return Err(format!("{} never became ready", self.name));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!(
                    "{} kept exiting at start (see {})",
                    self.name,
                    self.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn ready(&self, client: &reqwest::Client) -> bool {
        let request = match &self.ready {
            Ready::Readyz => client.get(format!("{}/readyz", self.address())),
            Ready::Processor { api_key } => client
                .get(format!("{}/v1/test/faults", self.address()))
                .bearer_auth(api_key),
        };
        request
            .send()
            .await
            .is_ok_and(|response| response.status().is_success())
    }

    /// Sends `signal` (`STOP`, `CONT`) to the running process; false when none runs. A stopped
    /// process is one paused by its host (a long stall, a VM migrated, a frozen container): it
    /// keeps its connections, its locks and its leases' tokens, and answers nothing; continued,
    /// it carries on as if no time had passed, with leases that others may have taken over.
    pub fn signal(&self, signal: &str) -> bool {
        let Some(pid) = self.child.as_ref().and_then(Child::id) else {
            return false;
        };
        std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// SIGKILL, as a crash or an OOM kill: no graceful shutdown, no answer to what is in flight.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.ok();
        }
    }
}

/// Runs `idempay ARGS` with `env` and waits for it.
pub async fn idempay(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(binary());
    command.args(args).env("RUST_LOG", "off");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().await.expect("the binary runs")
}
