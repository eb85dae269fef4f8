//! The cluster suite's Citus cluster (`IDEMPAY_TEST_CITUS=1`): a coordinator and two workers
//! started by `scripts/citus-cluster.sh`, and the template database on every node.
//!
//! Citus keeps its metadata (the nodes, the distributed tables, their shards) per database, and
//! routes a statement of database `d` on the coordinator to database `d` on the workers. So the
//! template is made on every node: the extension in each, the nodes registered on the
//! coordinator's, the schema migrated and distributed through the coordinator (which creates the
//! shards in the workers' templates). A test's database is then `CREATE DATABASE … TEMPLATE` on
//! every node, directly: the coordinator's copy has the template's metadata, the workers' copies
//! hold the same shards under the same names, and the coordinator finds them in the database of
//! the same name.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::{Connection, Executor, PgConnection};

/// The cluster's name (its containers' prefix): apart from the clusters a developer or the bench
/// runs.
const CLUSTER: &str = "idempay-test-citus";

/// The label the script puts on the cluster's containers, with the cluster's name.
const LABEL: &str = "org.idempay.citus-cluster";

/// Every node's password (the script's).
const PASSWORD: &str = "postgres";

/// Whether this run is the cluster suite.
pub fn enabled() -> bool {
    std::env::var("IDEMPAY_TEST_CITUS").is_ok_and(|value| !value.is_empty() && value != "0")
}

/// A running cluster; removed when dropped.
pub struct Cluster {
    /// Every node's port, the coordinator's first.
    ports: Vec<u16>,
}

impl Cluster {
    /// Starts the cluster with `scripts/citus-cluster.sh up` (which finds or builds the image).
    /// Whatever an interrupted run left under the suite's name is removed first, whole or in
    /// part: its nodes hold that run's template, and a coordinator without its workers would be
    /// taken for a running cluster.
    pub fn up() -> anyhow::Result<Self> {
        script("down")?;
        script("up")?;
        // From here on the cluster is removed when this value drops, whatever fails next.
        let mut cluster = Self { ports: Vec::new() };
        let ports = script("ports")?;
        let mut lines = ports.lines().map(|line| match line.split_once(' ') {
            Some((role, port)) => Ok((role, port.parse::<u16>()?)),
            None => bail!("not `ROLE PORT`: {line:?}"),
        });
        match lines.next() {
            Some(Ok(("coordinator", port))) => cluster.ports.push(port),
            other => bail!("the coordinator is not listed first: {other:?}"),
        }
        for line in lines {
            match line? {
                ("worker", port) => cluster.ports.push(port),
                (role, _) => bail!("unknown role {role}"),
            }
        }
        if cluster.ports.len() < 2 {
            bail!("the cluster has no worker: {ports}");
        }
        Ok(cluster)
    }

    /// The base of a connection string of the node on `port`, without the database.
    pub fn url_base(port: u16) -> String {
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:{port}")
    }

    /// Every node's port, the coordinator's first.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// Makes `template` on every node: the extension in each, the workers registered on the
    /// coordinator's, idempay's schema migrated and distributed through the coordinator; then
    /// closes it to connections, so that it can be copied.
    pub async fn create_template(&self, template: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        futures::future::try_join_all(self.ports.iter().map(|&port| async move {
            let mut admin = PgConnection::connect(&format!("{}/postgres", Self::url_base(port)))
                .await
                .with_context(|| format!("connect to the node on port {port}"))?;
            no_database_propagation(&mut admin).await?;
            admin
                .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {template}")))
                .await?;
            admin.close().await?;
            let mut database =
                PgConnection::connect(&format!("{}/{template}", Self::url_base(port))).await?;
            database.execute("CREATE EXTENSION citus").await?;
            database.close().await?;
            anyhow::Ok(())
        }))
        .await
        .context("create the template and the extension on every node")?;

        let (coordinator, workers) = self.ports.split_first().expect("a coordinator");
        let url = format!("{}/{template}", Self::url_base(*coordinator));
        let mut connection = PgConnection::connect(&url).await?;
        sqlx::query("SELECT citus_set_coordinator_host('127.0.0.1', $1)")
            .bind(i32::from(*coordinator))
            .execute(&mut connection)
            .await
            .context("citus_set_coordinator_host")?;
        for worker in workers {
            sqlx::query("SELECT citus_add_node('127.0.0.1', $1)")
                .bind(i32::from(*worker))
                .execute(&mut connection)
                .await
                .with_context(|| format!("citus_add_node of the worker on port {worker}"))?;
        }
        // The tests' own SQL, not idempay's, needs two things Citus refuses by default: joins of
        // idempay's keys with the processor's (other accounts, so other shards), and triggers the
        // tests put on distributed tables (ones that only raise). For the test role only.
        connection
            .execute(
                "ALTER ROLE CURRENT_USER SET citus.enable_repartition_joins = on;
                 ALTER ROLE CURRENT_USER SET citus.enable_unsafe_triggers = on",
            )
            .await
            .context("the tests' own settings")?;
        connection.close().await?;

        let pool = idempay::db::pool(&url)?;
        idempay::db::migrate(&pool).await?;
        idempay::db::distribute(&pool)
            .await
            .context("distribute the schema")?;
        pool.close().await;

        for &port in &self.ports {
            close_to_connections(&Self::url_base(port), template).await?;
        }
        Ok(started.elapsed())
    }

    /// What the nodes' logs say of server processes that crashed during the run (a signal, a
    /// PANIC) and the statement each was running, as `node: line`: after such a crash the node
    /// restarts and recovers, and every test that reaches it meanwhile fails, for that reason
    /// alone.
    pub fn crashes(&self) -> Vec<String> {
        let Ok(ids) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label={LABEL}={CLUSTER}")])
            .output()
        else {
            return Vec::new();
        };
        let mut crashes = Vec::new();
        for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
            let Ok(logs) = Command::new("docker").args(["logs", id]).output() else {
                continue;
            };
            let name = Command::new("docker")
                .args(["inspect", "-f", "{{.Name}}", id])
                .output()
                .map(|output| {
                    let name = String::from_utf8_lossy(&output.stdout);
                    name.trim().trim_start_matches('/').to_owned()
                })
                .unwrap_or_else(|_| id.to_owned());
            let logs = String::from_utf8_lossy(&logs.stderr);
            crashes.extend(
                logs.lines()
                    .filter(|line| {
                        line.contains("terminated by signal")
                            || line.contains("PANIC:")
                            || line.contains("Failed process was running")
                    })
                    .map(|line| format!("{name}: {line}")),
            );
        }
        crashes
    }

    fn down(&self) {
        if let Err(error) = script("down") {
            eprintln!("citus: could not remove the cluster {CLUSTER}: {error:#}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

/// Removes the cluster from a signal handler, where no [`Cluster`] is at hand.
pub fn down_now() {
    let _ = script("down");
}

/// Keeps Citus from propagating this session's `CREATE DATABASE` to the other nodes (off by
/// default in Citus 13; the suite makes each node's copy itself).
pub async fn no_database_propagation(admin: &mut PgConnection) -> Result<(), sqlx::Error> {
    admin
        .execute("SET citus.enable_create_database_propagation TO off")
        .await
        .map(drop)
}

/// Refuses new connections to `database` on the node whose connection string is `url_base` (no
/// database) and ends those it has: `CREATE DATABASE … TEMPLATE` refuses a template anybody is
/// connected to, and Citus's maintenance daemon keeps a connection to every database with the
/// extension (it is started again only by a session in that database, so it stays away).
pub async fn close_to_connections(url_base: &str, database: &str) -> anyhow::Result<()> {
    let mut admin = PgConnection::connect(&format!("{url_base}/postgres")).await?;
    admin
        .execute(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {database} WITH ALLOW_CONNECTIONS false"
        )))
        .await?;
    // Ended sessions may be followed by one that was starting; done once a pass finds nobody.
    for _ in 0..100 {
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1",
        )
        .bind(database)
        .fetch_one(&mut admin)
        .await?;
        if ended == 0 {
            admin.close().await?;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("sessions on {database} at {url_base} do not end")
}

/// Runs `scripts/citus-cluster.sh COMMAND` on the suite's cluster; its progress goes to the run's
/// stderr, its stdout is returned.
fn script(command: &str) -> anyhow::Result<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/citus-cluster.sh");
    let output = Command::new("bash")
        .arg(script)
        .arg(command)
        .env("IDEMPAY_CITUS_CLUSTER", CLUSTER)
        // Each node's data in memory (about 20 MB a test database on a worker, a few GB at most
        // in all): the suite copies a database on every node for each test, writes that stalled
        // this machine's disk to the point of connection and test timeouts.
        .env(
            "IDEMPAY_CITUS_TMPFS",
            std::env::var("IDEMPAY_CITUS_TMPFS").unwrap_or_else(|_| "4g".to_owned()),
        )
        .stdin(Stdio::null())
        .stderr(if command == "ports" {
            Stdio::null()
        } else {
            Stdio::inherit()
        })
        .output()
        .with_context(|| format!("run {script} {command}"))?;
    if !output.status.success() {
        bail!("{script} {command}: {}", output.status);
    }
    Ok(String::from_utf8(output.stdout)?)
}
