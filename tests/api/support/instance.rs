//! The `idempay` binary as a process of its own: `idempay serve` as production runs it (it can be
//! killed, several can share a database, and it can be pointed at a database the test stops), and
//! any other command as a user runs it.

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::support::helpers::{TestResponse, send};

/// Longer than any answer may take: a request still unanswered by then is a hang, and fails the test.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// An `idempay serve` process on a free port of 127.0.0.1; killed when dropped.
pub struct Instance {
    pub child: Child,
    pub address: String,
}

impl Instance {
    pub async fn start(database_url: &str, env: &[(&str, &str)]) -> Self {
        // IDEMPAY_TEST_LOGS=1 shows the instances' logs, for a failing fault scenario.
        if std::env::var_os("IDEMPAY_TEST_LOGS").is_some() {
            return Self::start_logging_to(Stdio::inherit(), database_url, env).await;
        }
        // Otherwise they go to a file that is read only if the instance exits before it is ready:
        // its last lines say why (the file goes when this returns; the instance's writes go on
        // into the unlinked file).
        let (log, file) = LogFile::create();
        Self::start_answering("/readyz", file, database_url, env, Some(&log)).await
    }

    /// Starts an instance whose logs (stderr) go to `logs`.
    pub async fn start_logging_to(
        logs: impl Into<Stdio>,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_answering("/readyz", logs, database_url, env, None).await
    }

    /// Starts an instance whose logs go to `logs`, and returns once it is alive (`/healthz`), ready
    /// or not: for a test of an instance whose readiness goes down as soon as it starts.
    pub async fn start_alive_logging_to(
        logs: impl Into<Stdio>,
        database_url: &str,
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_answering("/healthz", logs, database_url, env, None).await
    }

    /// Starts an instance and waits until `probe` answers 2xx; an instance that exits first fails
    /// the test with the last lines of `log`, the file its logs go to, when there is one.
    async fn start_answering(
        probe: &str,
        logs: impl Into<Stdio>,
        database_url: &str,
        env: &[(&str, &str)],
        log: Option<&LogFile>,
    ) -> Self {
        let port = free_port();
        let mut command = Command::new(env!("CARGO_BIN_EXE_idempay"));
        command
            .arg("serve")
            .env("DATABASE_URL", database_url)
            .env("IDEMPAY_LISTEN", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(logs)
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut instance = Self {
            child: command.spawn().expect("idempay serve starts"),
            address: format!("http://127.0.0.1:{port}"),
        };
        // Up to 30 s: on a loaded machine a debug build starts slowly.
        for _ in 0..600 {
            // An instance that exited (its port taken meanwhile, a setting refused) will never
            // answer: say so now, with how it ended (IDEMPAY_TEST_LOGS=1 shows why).
            if let Ok(Some(status)) = instance.child.try_wait() {
                let said = log.map(LogFile::read).unwrap_or_default();
                let last: Vec<&str> = said.lines().rev().take(5).collect();
                panic!(
                    "idempay serve exited before it was ready: {status}; its last lines:\n{}",
                    last.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            if reqwest::get(format!("{}{probe}", instance.address))
                .await
                .is_ok_and(|response| response.status().is_success())
            {
                return instance;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("idempay serve never became ready");
    }

    /// Creates an account in the instance's database with `idempay account create`; returns
    /// its API key.
    pub async fn create_account(database_url: &str) -> String {
        let output = idempay(
            &["account", "create", "--name", "outage merchant"],
            &[("DATABASE_URL", database_url)],
        )
        .await;
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout)
            .expect("UTF-8")
            .lines()
            .last()
            .expect("the key on the last line")
            .to_owned()
    }

    /// Waits until the instance listens for API key changes: until then its account cache is off
    /// (every request looks its key up), and a test of what the cache keeps would prove nothing.
    pub async fn listening_for_key_changes(&self) {
        let started = std::time::Instant::now();
        while self
            .metrics()
            .await
            .value("idempay_api_key_listener_connected")
            != Some(1.0)
        {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the instance never listened for API key changes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The instance's metrics, as `GET /metrics` serves them now.
    pub async fn metrics(&self) -> Metrics {
        Metrics::new(self.get("/metrics").await.body)
    }

    pub async fn get(&self, path: &str) -> TestResponse {
        send(
            reqwest::Client::new()
                .get(format!("{}{path}", self.address))
                .timeout(ANSWER_WITHIN),
        )
        .await
    }

    /// `POST /v1/payments`, answered within [`ANSWER_WITHIN`] and checked against the API
    /// description.
    pub async fn post_payment(
        &self,
        api_key: &str,
        key: &str,
        body: &serde_json::Value,
    ) -> TestResponse {
        send(
            self.payment_request(api_key, key, body)
                .timeout(ANSWER_WITHIN),
        )
        .await
    }

    /// A `POST /v1/payments` to send as the test needs: from a task of its own, or to an instance
    /// that may die before it answers.
    pub fn payment_request(
        &self,
        api_key: &str,
        key: &str,
        body: &serde_json::Value,
    ) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .post(format!("{}/v1/payments", self.address))
            .bearer_auth(api_key)
            .header("idempotency-key", key)
            .json(body)
    }
}

/// Runs `idempay ARGS` with `env` added to its environment (and its logs off), and waits for it.
pub async fn idempay(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idempay"));
    command.args(args).env("RUST_LOG", "off");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().await.expect("the binary runs")
}

/// A TCP port of 127.0.0.1 that nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A scrape of `/metrics`, in the Prometheus text format.
pub struct Metrics(String);

impl Metrics {
    pub fn new(body: Vec<u8>) -> Self {
        Self(String::from_utf8(body).expect("metrics are UTF-8"))
    }

    /// The value of a series named with its labels as the exporter writes them, e.g.
    /// `idempay_idempotency_outcomes_total{outcome="replayed"}`: the labels given are a subset,
    /// and the series that have them all are summed (every route's, above). `None` when no series
    /// has them.
    pub fn value(&self, series: &str) -> Option<f64> {
        let (name, wanted) = split_series(series);
        self.0
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let (found, labels) = split_series(series);
                (found == name && wanted.iter().all(|label| labels.contains(label)))
                    .then(|| value.trim().parse::<f64>().ok())
                    .flatten()
            })
            .fold(None, |sum, value| Some(sum.unwrap_or(0.0) + value))
    }

    pub fn text(&self) -> &str {
        &self.0
    }
}

/// A series' name and its labels (`name="value"` each), as the exporter writes them.
fn split_series(series: &str) -> (&str, Vec<&str>) {
    match series.split_once('{') {
        Some((name, labels)) => (
            name,
            labels
                .trim_end_matches('}')
                .split("\",")
                .filter(|label| !label.is_empty())
                .map(|label| label.trim_end_matches('"'))
                .collect(),
        ),
        None => (series, Vec::new()),
    }
}

/// A file an instance's logs (stderr) go to; removed when dropped.
pub struct LogFile(std::path::PathBuf);

impl LogFile {
    /// The file, and its handle to give an instance.
    pub fn create() -> (Self, std::fs::File) {
        let path = std::env::temp_dir().join(format!("idempay-{}.log", uuid::Uuid::new_v4()));
        let file = std::fs::File::create(&path).expect("a log file");
        (Self(path), file)
    }

    pub fn read(&self) -> String {
        std::fs::read_to_string(&self.0).expect("the log file")
    }
}

impl Drop for LogFile {
    fn drop(&mut self) {
        std::fs::remove_file(&self.0).ok();
    }
}
