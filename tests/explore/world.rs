//! The real processes a schedule runs on: the database ([`Database`]: PostgreSQL in a container of
//! the explorer's own, or a Citus cluster with `EXPLORE_CITUS`; either can be restarted),
//! `idempay processor` and 1–3 `idempay serve` on fixed ports of 127.0.0.1 (so a killed one comes
//! back where its clients and the processor's webhooks look for it).

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
    free_ports(1)[0]
}

/// `count` distinct TCP ports of 127.0.0.1 that nothing listens on now: all held open together
/// while they are chosen, since a port let go is free to be handed out again at once (seed 4 once
/// drew the processor's port for an instance too, which then could not bind it).
pub fn free_ports(count: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    held.iter()
        .map(|listener| listener.local_addr().expect("a bound port").port())
        .collect()
}

/// Where the schedules' databases live: each schedule makes one of its own there.
pub enum Database {
    Postgres(Postgres),
    Citus(Citus),
}

impl Database {
    /// A Citus cluster when `citus`, else PostgreSQL in a container.
    pub async fn start(citus: bool) -> Self {
        if citus {
            Self::Citus(Citus::start().await)
        } else {
            Self::Postgres(Postgres::start().await)
        }
    }

    /// The URL of database `database`: on Citus, the coordinator's, which every instance, the
    /// processor and the checks use, as an application would.
    pub fn url(&self, database: &str) -> String {
        match self {
            Self::Postgres(postgres) => postgres.url(database),
            Self::Citus(citus) => citus.url(database),
        }
    }

    /// A fresh database for one schedule.
    pub async fn create_database(&self, name: &str) {
        match self {
            Self::Postgres(postgres) => postgres.create_database(name).await,
            Self::Citus(citus) => citus.create_database(name).await,
        }
    }

    /// The arguments of the `idempay` command that makes the schema: on Citus the migrations are
    /// followed by their distribution by account, as an operator runs them there.
    pub fn migrate_args(&self) -> &'static [&'static str] {
        match self {
            Self::Postgres(_) => &["migrate"],
            Self::Citus(_) => &["migrate", "--citus"],
        }
    }

    /// A restart of the server every process connects to (on Citus, the coordinator's), stopped
    /// as `how` says.
    pub async fn restart(&self, how: Stop) -> Result<(), String> {
        match self {
            Self::Postgres(postgres) => postgres.restart(how).await,
            Self::Citus(citus) => citus.restart(how).await,
        }
    }
}

/// How a database server is stopped before it starts again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// As in a failover or an upgrade: SIGINT, PostgreSQL's fast shutdown, which rolls back
    /// every open transaction, closes every connection and writes a checkpoint.
    Fast,
    /// A crash: SIGKILL of the container's first process, the postmaster, which takes its
    /// children with it at once. No checkpoint, no goodbye to a client: the server replays its
    /// WAL when it starts, and keeps exactly the transactions whose commit reached it.
    Crash,
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
            // Durable, as production runs: a commit is on disk before its answer, so a crash
            // ([`Stop::Crash`]) loses nothing a client was told (the server's defaults, said
            // here because every test database of the project turns them off).
            "-c",
            "fsync=on",
            "-c",
            "synchronous_commit=on",
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
        wait_until_connectable(&postgres.url("postgres")).await;
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
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name}"
        )))
        .execute(&mut connection)
        .await
        .expect("drop");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut connection)
            .await
            .expect("create");
    }

    /// A stop as `how` says, the container's exit, then a start.
    pub async fn restart(&self, how: Stop) -> Result<(), String> {
        restart_container(&self.id, &self.url("postgres"), how).await
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

/// The Citus cluster's name (its containers' prefix): apart from the cluster suite's and from
/// those a developer or the bench runs, so that either can run beside the explorer.
const CITUS_CLUSTER: &str = "idempay-explore-citus";

/// A Citus cluster, a coordinator and two workers started by `scripts/citus-cluster.sh` (each a
/// container on the host's network), removed when dropped.
///
/// Citus keeps its metadata (the nodes, the distributed tables, their shards) per database and
/// routes a statement of database `d` on the coordinator to database `d` on the workers, so a
/// schedule's database is made on every node, as the cluster suite makes its template: the
/// database and the extension on each node, the nodes registered in the coordinator's, then
/// `idempay migrate --citus` through the coordinator, which distributes the tables by account.
pub struct Citus {
    /// Every node's port, the coordinator's first.
    ports: Vec<u16>,
}

impl Citus {
    /// Starts the cluster. Whatever an interrupted run left under the explorer's cluster name is
    /// removed first: a coordinator without its workers would be taken for a running cluster.
    pub async fn start() -> Self {
        citus_cluster("down")
            .await
            .expect("remove a leftover cluster");
        citus_cluster("up").await.expect("a Citus cluster");
        // From here on the cluster is removed when this value drops, whatever fails next.
        let mut citus = Self { ports: Vec::new() };
        let listed = citus_cluster("ports").await.expect("the cluster's ports");
        for (n, line) in listed.lines().enumerate() {
            let (role, port) = line
                .split_once(' ')
                .unwrap_or_else(|| panic!("not `ROLE PORT`: {line:?}"));
            let expected = if n == 0 { "coordinator" } else { "worker" };
            assert_eq!(role, expected, "the nodes are listed coordinator first");
            citus.ports.push(port.parse().expect("a port"));
        }
        assert!(citus.ports.len() > 1, "the cluster has no worker: {listed}");
        citus
    }

    fn url_on(port: u16, database: &str) -> String {
        format!("postgres://postgres:postgres@127.0.0.1:{port}/{database}")
    }

    pub fn url(&self, database: &str) -> String {
        Self::url_on(self.ports[0], database)
    }

    /// The database and the extension on every node, and the workers registered in the
    /// coordinator's: what `idempay migrate --citus` needs to distribute the schema.
    pub async fn create_database(&self, name: &str) {
        futures::future::join_all(self.ports.iter().map(|&port| async move {
            let mut admin = PgConnection::connect(&Self::url_on(port, "postgres"))
                .await
                .unwrap_or_else(|error| panic!("connect to the node on port {port}: {error}"));
            // Each node's copy is made here, directly (Citus 13 does not propagate it by
            // default; said, so that a change of that default cannot make a copy twice).
            for statement in [
                "SET citus.enable_create_database_propagation TO off".to_owned(),
                format!("DROP DATABASE IF EXISTS {name}"),
                format!("CREATE DATABASE {name}"),
            ] {
                sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                    .execute(&mut admin)
                    .await
                    .unwrap_or_else(|error| panic!("{statement} on port {port}: {error}"));
            }
            admin.close().await.ok();
            let mut database = PgConnection::connect(&Self::url_on(port, name))
                .await
                .expect("connect to the new database");
            sqlx::query("CREATE EXTENSION citus")
                .execute(&mut database)
                .await
                .unwrap_or_else(|error| panic!("the extension on port {port}: {error}"));
            database.close().await.ok();
        }))
        .await;
        let (coordinator, workers) = self.ports.split_first().expect("a coordinator");
        let mut connection = PgConnection::connect(&self.url(name))
            .await
            .expect("connect to the coordinator");
        sqlx::query("SELECT citus_set_coordinator_host('127.0.0.1', $1)")
            .bind(i32::from(*coordinator))
            .execute(&mut connection)
            .await
            .expect("citus_set_coordinator_host");
        for worker in workers {
            sqlx::query("SELECT citus_add_node('127.0.0.1', $1)")
                .bind(i32::from(*worker))
                .execute(&mut connection)
                .await
                .unwrap_or_else(|error| panic!("citus_add_node of port {worker}: {error}"));
        }
        connection.close().await.ok();
    }

    /// The coordinator restarted as [`Postgres::restart`] restarts its server: every process
    /// reaches the cluster through it. The workers keep running, as they would when only the
    /// coordinator fails over.
    pub async fn restart(&self, how: Stop) -> Result<(), String> {
        restart_container(
            &format!("{CITUS_CLUSTER}-coordinator"),
            &self.url("postgres"),
            how,
        )
        .await
    }
}

impl Drop for Citus {
    fn drop(&mut self) {
        let removed = std::process::Command::new("bash")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/scripts/citus-cluster.sh"
            ))
            .arg("down")
            .env("IDEMPAY_CITUS_CLUSTER", CITUS_CLUSTER)
            .stdin(Stdio::null())
            .status();
        if !removed.is_ok_and(|status| status.success()) {
            eprintln!(
                "explore: the cluster {CITUS_CLUSTER} was not removed: \
                 IDEMPAY_CITUS_CLUSTER={CITUS_CLUSTER} scripts/citus-cluster.sh down"
            );
        }
    }
}

/// Runs `scripts/citus-cluster.sh COMMAND` on the explorer's cluster; its progress goes to the
/// run's stderr, its stdout is returned. The nodes keep their data on disk, never in memory
/// (`IDEMPAY_CITUS_TMPFS`): a container's tmpfs is emptied when it stops, and the coordinator's
/// restart must find its database and its metadata where it left them.
async fn citus_cluster(command: &str) -> Result<String, String> {
    let output = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/citus-cluster.sh"
        ))
        .arg(command)
        .env("IDEMPAY_CITUS_CLUSTER", CITUS_CLUSTER)
        .env_remove("IDEMPAY_CITUS_TMPFS")
        // Durable on every node, as [`Postgres::start`]'s server.
        .env(
            "IDEMPAY_CITUS_PG_OPTS",
            "-c fsync=on -c synchronous_commit=on -c max_connections=300 -c max_worker_processes=64",
        )
        .stdin(Stdio::null())
        .stderr(if command == "ports" {
            Stdio::null()
        } else {
            Stdio::inherit()
        })
        .output()
        .await
        .map_err(|error| format!("scripts/citus-cluster.sh {command}: {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "scripts/citus-cluster.sh {command}: {}",
            output.status
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Restarts the container `id`: stopped as `how` says, its exit, then a start; done once `url`
/// (the server's `postgres` database) answers again.
async fn restart_container(id: &str, url: &str, how: Stop) -> Result<(), String> {
    let signal = match how {
        Stop::Fast => "SIGINT",
        Stop::Crash => "SIGKILL",
    };
    docker(&["kill", "--signal", signal, id]).await?;
    docker(&["wait", id]).await?;
    docker(&["start", id]).await?;
    wait_until_connectable(url).await;
    Ok(())
}

async fn wait_until_connectable(url: &str) {
    let started = Instant::now();
    loop {
        if let Ok(mut connection) = PgConnection::connect(url).await {
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
            "the database never accepted connections"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    /// The `idempay` binary it runs: [`binary`], or, during a deploy, the previous release's.
    binary: String,
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
            binary: binary(),
        }
    }

    /// The binary its next start runs.
    pub fn binary(&self) -> &str {
        &self.binary
    }

    /// Runs `binary` from its next start on: a release rolled out, or back.
    pub fn set_binary(&mut self, binary: &str) {
        binary.clone_into(&mut self.binary);
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
            let mut command = Command::new(&self.binary);
            command
                .args(&self.args)
                // The recovery job's resumes at info: the explorer counts them from the logs.
                .env(
                    "RUST_LOG",
                    "warn,idempay::downstream::client=info,idempotency::recovery=info",
                )
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .kill_on_drop(true);
            for (name, value) in self.env.iter().chain(more) {
                command.env(name, value);
            }
            let mut child = command
                .spawn()
                .map_err(|error| format!("{} does not start: {error}", self.binary))?;
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

    /// SIGTERM, as a deploy stops an instance, then SIGKILL if it has not exited within `grace`
    /// (the orchestrator's termination grace period). False when it had to be killed.
    pub async fn stop(&mut self, grace: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        if let Some(pid) = child.id() {
            std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .ok();
        }
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return true;
        }
        child.kill().await.ok();
        false
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
    idempay_of(&binary(), args, env).await
}

/// Runs `BINARY ARGS` (an `idempay` of some release) with `env` and waits for it.
pub async fn idempay_of(binary: &str, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(binary);
    command.args(args).env("RUST_LOG", "off");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().await.expect("the binary runs")
}

/// Creates an account named `name` in the database at `url` as an operator does (`idempay account
/// create`): its API key (the last line it prints) and its id (`acct_…`, in what it says on
/// stderr).
pub async fn create_account(url: &str, name: &str) -> (String, String) {
    let created = idempay(
        &["account", "create", "--name", name],
        &[("DATABASE_URL", url)],
    )
    .await;
    assert!(created.status.success(), "account create: {created:?}");
    let key = String::from_utf8_lossy(&created.stdout)
        .lines()
        .last()
        .expect("the API key")
        .to_owned();
    let id = String::from_utf8_lossy(&created.stderr)
        .split_whitespace()
        .find(|word| word.starts_with("acct_"))
        .expect("the account's id")
        .to_owned();
    (key, id)
}

/// The link between the schedule's processes and the database: a TCP proxy on a port of
/// 127.0.0.1 that passes every byte, and delays the server's while a slow-link fault is in force
/// (its answers late, as over a congested network or from a server short of CPU): the window
/// between a statement sent and its answer read widens, and a client that hangs up meanwhile
/// drops a request in it. It stops accepting when dropped; a connection ends with either side.
pub struct Link {
    port: u16,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Link {
    /// A link to the server of `database_url` (a `postgres://…@host:port/…` URL).
    pub async fn to(database_url: &str) -> Self {
        let target = database_url
            .rsplit_once('@')
            .and_then(|(_, rest)| rest.split('/').next())
            .expect("host:port in the URL")
            .to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the link's port");
        let port = listener.local_addr().expect("its address").port();
        let delay_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let accepting = tokio::spawn({
            let delay_ms = std::sync::Arc::clone(&delay_ms);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (target, delay_ms) = (target.clone(), std::sync::Arc::clone(&delay_ms));
                    tokio::spawn(async move {
                        if let Ok(server) = tokio::net::TcpStream::connect(&target).await {
                            pass(client, server, delay_ms).await;
                        }
                    });
                }
            }
        });
        Self {
            port,
            delay_ms,
            accepting,
        }
    }

    /// `database_url` through the link.
    pub fn url(&self, database_url: &str) -> String {
        let (before, rest) = database_url.rsplit_once('@').expect("a URL with a user");
        let path = rest.split_once('/').map_or("", |(_, path)| path);
        format!("{before}@127.0.0.1:{}/{path}", self.port)
    }

    /// Delays every answer of the server by `delay` from now on (zero: none).
    pub fn delay(&self, delay: Duration) {
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms
            .store(millis, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn pass(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::io::copy(&mut client_read, &mut server_write);
    let down = async move {
        let mut buffer = vec![0; 64 * 1024];
        loop {
            let read = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => read,
            };
            let delay = delay_ms.load(std::sync::atomic::Ordering::Acquire);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if client_write.write_all(&buffer[..read]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = up => {}
        () = down => {}
    }
}
