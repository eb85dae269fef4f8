//! A real Prometheus (Debian's package) scrapes a running idempay and its processor with the rules
//! of `ops/prometheus/idempay.rules.yml` loaded; a key is held and an endpoint stalls, and the
//! Prometheus API reports `IdempayKeyHeld` and `IdempayWebhookDeliveryLagging` firing. Every metric
//! a rule or a dashboard panel names is one the services export, and every panel's query is
//! answered by that Prometheus.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use ::processor::{Fraction, ProcessorSettings};
use idempay::config::{ProcessorLink, Settings};
use idempay_test_macros::api_test;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use super::{prometheus_dir, root};
use crate::delivery::endpoint_for_all;
use crate::processor::{self, API_KEY, TestProcessor};
use crate::support::helpers::{TestApp, new_key, payment, retry_while_in_flight, wait_until};
use crate::support::instance::free_port;

/// Long enough for the first request's attempts at the processor (its timeout is short), short
/// enough to wait out; and long enough for the later payments, each retried until the processor
/// started after the failing one answers: in CI, beside the suite's other tests on two cores, a
/// 2 s window ran out on one of them, which was then held for an operator.
const WINDOW: Duration = Duration::from_secs(5);

/// Events for the stalled endpoint: more than the sends one endpoint may have in flight.
const DELIVERIES: i64 = 20;

/// How long Prometheus gets to report both alerts firing: a few scrapes and evaluations at 1 s.
const ALERTS_WITHIN: Duration = Duration::from_secs(45);

/// A Prometheus server on a loopback port, its configuration and data in a directory of its own;
/// killed, and the directory removed, when dropped.
struct Prometheus {
    child: Child,
    address: String,
    dir: PathBuf,
    http: reqwest::Client,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `idempay` and `processor` (their base URLs) every second, with
    /// the project's rules evaluated every second.
    async fn start(idempay: &str, processor: &str) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("idempay-prometheus-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the Prometheus directory");
        // The rules as shipped, but that every `for:` is 0 s: a test cannot wait the minutes an
        // alert holds in production before it fires; the expressions, thresholds, labels and
        // annotations are the shipped ones.
        let rules = std::fs::read_to_string(prometheus_dir().join("idempay.rules.yml"))
            .expect("the rules")
            .lines()
            .map(|line| match line.find("for: ") {
                Some(at) if line.trim_start().starts_with("for: ") => {
                    format!("{}for: 0s", &line[..at])
                }
                _ => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(dir.join("idempay.rules.yml"), rules).expect("the rules' copy");
        let target = |url: &str| url.trim_start_matches("http://").to_owned();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n\
             \x20 - job_name: idempay\n    static_configs:\n      - targets: ['{idempay}']\n\
             \x20 - job_name: processor\n    static_configs:\n      - targets: ['{processor}']\n",
            rules = dir.join("idempay.rules.yml").display(),
            idempay = target(idempay),
            processor = target(processor),
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("the configuration");
        let logs = if std::env::var_os("IDEMPAY_TEST_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        };
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(logs)
            .kill_on_drop(true)
            .spawn()
            .expect(
                "prometheus runs (Debian's prometheus package: bash scripts/install-prometheus.sh)",
            );
        let prometheus = Self {
            child,
            address: format!("http://127.0.0.1:{port}"),
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client"),
        };
        let ready = format!("{}/-/ready", prometheus.address);
        wait_until("Prometheus is ready", || async {
            prometheus
                .http
                .get(&ready)
                .send()
                .await
                .is_ok_and(|response| response.status().is_success())
        })
        .await;
        prometheus
    }

    /// `GET /api/v1/{path}`'s `data`, once its status is success.
    async fn api(&self, path: &str, query: &[(&str, &str)]) -> Result<Value, String> {
        let response = self
            .http
            .get(format!("{}/api/v1/{path}", self.address))
            .query(query)
            .send()
            .await
            .map_err(|error| error.to_string())?;
        let body: Value = response.json().await.map_err(|error| error.to_string())?;
        if body["status"] == "success" {
            Ok(body["data"].clone())
        } else {
            Err(body.to_string())
        }
    }

    /// The names of the alerts firing now.
    async fn firing(&self) -> BTreeSet<String> {
        let Ok(data) = self.api("alerts", &[]).await else {
            return BTreeSet::new();
        };
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|alert| alert["state"] == "firing")
            .filter_map(|alert| alert["labels"]["alertname"].as_str().map(str::to_owned))
            .collect()
    }
}

/// The metric names a PromQL expression reads: the words outside quotes that start with
/// `idempay_` or `processor_`, each service's prefix (recording rules' names hold a colon,
/// `idempay:…`, and Prometheus's own series, such as `up`, do not start so).
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let mut quoted = None;
    let mut word = String::new();
    for c in expr.chars().chain([' ']) {
        if let Some(quote) = quoted {
            if c == quote {
                quoted = None;
            }
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if word.starts_with("idempay_") || word.starts_with("processor_") {
            into.insert(std::mem::take(&mut word));
        }
        word.clear();
        if matches!(c, '"' | '\'' | '`') {
            quoted = Some(c);
        }
    }
}

/// The dashboard's queries: every panel's targets' `expr`, with the panel's title.
fn panel_queries() -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("ops/grafana/idempay.json")).expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target's expr");
            queries.push((
                panel["title"].as_str().unwrap_or("").to_owned(),
                expr.to_owned(),
            ));
        }
    }
    queries
}

/// The metric families a `/metrics` text declares (`# TYPE name kind`), with the series names a
/// histogram or summary adds (`_bucket`, `_count`, `_sum`).
fn exported(text: &str, into: &mut BTreeSet<String>) {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        into.insert(name.to_owned());
        if matches!(kind, "histogram" | "summary") {
            for suffix in ["_bucket", "_count", "_sum"] {
                into.insert(format!("{name}{suffix}"));
            }
        }
    }
}

fn failing() -> ProcessorSettings {
    let mut settings = processor::settings();
    settings.faults.fail = Fraction::ALWAYS;
    settings
}

#[api_test]
async fn a_live_prometheus_fires_the_held_key_and_stalled_endpoint_alerts_and_answers_every_panel()
{
    // The processor's port first: idempay is built knowing its address. It fails every call at
    // first, so the payment's outcome is unknown and, past the recovery window, its key is held.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let processor_address = format!("http://{}", listener.local_addr().unwrap());
    let mut settings = Settings {
        recovery_window: WINDOW,
        recovery_interval: Duration::from_secs(1),
        webhook_allow_private: true,
        processor: ProcessorLink {
            url: Some(processor_address.clone()),
            api_key: Some(API_KEY.to_owned()),
            ..Settings::default().processor
        },
        ..crate::delivery::local("1h")
    };
    settings.processor.timeout = Duration::from_millis(300);
    let app = TestApp::spawn_with(settings).await;
    let failing_processor = TestProcessor::beside_on(&app, failing(), listener).await;

    // An endpoint that accepts connections and never answers.
    let stalled = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let stalled_url = format!("http://{}/hooks", stalled.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = stalled.accept().await {
            held.push(socket);
        }
    });
    let (endpoint, _) = endpoint_for_all(&app, &stalled_url).await;

    // The held key.
    let key = new_key();
    app.post_payment(&key, &payment(4200))
        .await
        .assert_problem(503, "processor-outcome-unknown");
    // Past the window the recovery job holds the key. It may be resuming the key just then, so
    // the test waits for the hold rather than for a fixed time.
    wait_until("the key is held past the recovery window", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM idempotency_keys
                            WHERE idem_key = $1 AND scope NOT LIKE 'processor:%' AND status = 'held')",
        )
        .bind(&key)
        .fetch_one(&app.db)
        .await
        .unwrap()
    })
    .await;
    app.post_payment(&key, &payment(4200))
        .await
        .assert_problem(409, "idempotency-key-held");

    // A healthy processor on the same port and database: payments go through, each an event for
    // the stalled endpoint. The held key stays held (nothing but a settle takes it).
    let port: u16 = processor_address
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    failing_processor.stop();
    let mut rebound = None;
    for _ in 0..200 {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            rebound = Some(listener);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It sends its events (to a receiver that takes them), so that its outbox's series exist,
    // under its own names.
    let events = crate::delivery::Receiver::start(0).await;
    let mut healthy = processor::settings();
    healthy.webhook_url = Some(events.url.clone());
    healthy.shared.webhook_secrets = Some(::service::outbox::WebhookSecrets::generate());
    let processor = TestProcessor::beside_on(&app, healthy, rebound.expect("the port again")).await;
    // More deliveries than an endpoint may have in flight, so that some stay due.
    for _ in 0..DELIVERIES {
        // Retried with its key, as a client would: on a loaded machine the processor just
        // started may answer past idempay's timeout (503, an unknown outcome).
        let (key, body) = (new_key(), payment(1000));
        let paid = retry_while_in_flight(|| app.post_payment(&key, &body)).await;
        paid.assert_status(201);
    }
    let pending = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND delivered_at IS NULL",
        )
        .bind(&endpoint)
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    wait_until("deliveries are queued for the stalled endpoint", || async {
        pending().await >= DELIVERIES
    })
    .await;
    // Backdated by two hours: an endpoint stalled for over an hour, without waiting an hour. The
    // sends in flight to it never end, and the rest stay due, their age now over the bound.
    sqlx::query(
        "UPDATE webhook_deliveries
         SET created_at = created_at - interval '2 hours',
             next_attempt_at = LEAST(next_attempt_at, now()) - interval '2 hours'
         WHERE endpoint_id = $1 AND delivered_at IS NULL",
    )
    .bind(&endpoint)
    .execute(&app.db)
    .await
    .unwrap();
    // A manual retry, so that its counter has a sample.
    let event: String = sqlx::query_scalar(
        "SELECT event_id FROM webhook_deliveries WHERE endpoint_id = $1 LIMIT 1",
    )
    .bind(&endpoint)
    .fetch_one(&app.db)
    .await
    .unwrap();
    app.send(
        app.client()
            .post(app.url(&format!("/v1/events/{event}/retry")))
            .bearer_auth(&app.api_key)
            .header("idempotency-key", new_key())
            .json(&json!({ "endpoint": endpoint })),
    )
    .await;

    let started = Instant::now();
    let prometheus = Prometheus::start(&app.address, &processor.address).await;
    let wanted = ["IdempayKeyHeld", "IdempayWebhookDeliveryLagging"];
    let mut firing = BTreeSet::new();
    while started.elapsed() < ALERTS_WITHIN {
        firing = prometheus.firing().await;
        if wanted.iter().all(|alert| firing.contains(*alert)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Every check below runs, and the test fails at its end with all that went wrong: a missing
    // metric shows as both an alert that never fired and a name no service exports.
    let mut problems = Vec::new();
    for alert in wanted {
        if !firing.contains(alert) {
            problems.push(format!(
                "{alert} did not fire within {ALERTS_WITHIN:?}; firing: {firing:?}"
            ));
        }
    }

    // Prometheus loaded every rule of the file, and every rule is healthy (its query runs).
    let groups = prometheus.api("rules", &[]).await.expect("the rules");
    let mut names = BTreeSet::new();
    let mut unhealthy = Vec::new();
    let mut rules = 0;
    for group in groups["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            rules += 1;
            metric_names(rule["query"].as_str().expect("a rule's query"), &mut names);
            if rule["health"] == "err" {
                unhealthy.push(format!("{}: {}", rule["name"], rule["lastError"]));
            }
        }
    }
    if rules < 20 {
        problems.push(format!("Prometheus loaded {rules} rules"));
    }
    if !unhealthy.is_empty() {
        problems.push(format!("rules that fail: {unhealthy:?}"));
    }

    // Every panel's query is answered.
    let mut refused = Vec::new();
    for (title, expr) in panel_queries() {
        metric_names(&expr, &mut names);
        if let Err(error) = prometheus.api("query", &[("query", &expr)]).await {
            refused.push(format!("{title}: {expr}: {error}"));
        }
    }
    if !refused.is_empty() {
        problems.push(format!("panel queries refused:\n{}", refused.join("\n")));
    }

    // Every metric named is one the services declare in their /metrics.
    let mut declared = BTreeSet::new();
    for base in [&app.address, &processor.address] {
        let response = app
            .client()
            .get(format!("{base}/metrics"))
            .send()
            .await
            .expect("/metrics answers");
        if !response.status().is_success() {
            problems.push(format!("{base}/metrics answered {}", response.status()));
        }
        exported(
            &response.text().await.expect("/metrics text"),
            &mut declared,
        );
    }
    let missing: Vec<&String> = names.difference(&declared).collect();
    if names.len() < 15 {
        problems.push(format!(
            "the rules and panels name these metrics only: {names:?}"
        ));
    }
    if !missing.is_empty() {
        problems.push(format!(
            "metrics the rules or the dashboard name but neither service exports: {missing:?}"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[api_test]
async fn metric_names_read_from_a_query_are_the_idempay_and_processor_words_outside_quotes() {
    let mut names = BTreeSet::new();
    metric_names(
        r#"sum by (route) (rate(idempay_http_requests_total{route=~"idempay_x", job="idempay"}[5m])) / idempay:availability_errors:ratio_rate5m + up or processor_job_up{job="processor_y"}"#,
        &mut names,
    );
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["idempay_http_requests_total", "processor_job_up"]
    );
}
