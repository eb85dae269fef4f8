//! The background jobs beside the API (expiry, recovery, webhook delivery, the API key listener,
//! the embedded processor): a setting that would break one is refused at start, naming itself,
//! and a job that dies anyway takes readiness down with it, instead of the instance answering
//! 200 at `/readyz` while nothing expires again.

use std::process::Stdio;
use std::time::Duration;

use idempay_test_macros::api_test;
use tokio::process::Command;

use crate::support::helpers::bare_database;
use crate::support::instance::free_port;

/// Asks `instance` for `/readyz` until it no longer answers 200 (a job died), within 30 s; that
/// answer. The failure shows the instance's log, which says what became of the job.
#[cfg(feature = "failpoints")]
async fn readiness_lost(
    instance: &crate::support::instance::Instance,
    logs: &crate::support::instance::LogFile,
) -> crate::support::helpers::TestResponse {
    let started = std::time::Instant::now();
    loop {
        let ready = instance.get("/readyz").await;
        if ready.status != 200 {
            return ready;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "/readyz still 200 after {:?}; logs:\n{}",
            started.elapsed(),
            logs.read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long a process refused at start may take to exit: a parse error exits at once, and a
/// debug build on a loaded machine starts in a few seconds. One still running then is serving.
const EXITS_WITHIN: Duration = Duration::from_secs(20);

/// `serve` with a zero or nonsensical duration exits at once with status 2 (a usage error) and a
/// message naming the variable; so does `processor`. Before, `IDEMPAY_EXPIRY_INTERVAL=0s` started
/// the service, whose expiry job panicked on its first tick while `/healthz` and `/readyz` went
/// on answering 200; and `IDEMPAY_WEBHOOK_RETRY_SCHEDULE=550000000000years` panicked, exit 101.
#[api_test]
async fn a_zero_interval_or_timeout_is_refused_at_start_naming_its_setting() {
    let database_url = bare_database().await;
    let refused = [
        ("serve", "IDEMPAY_EXPIRY_INTERVAL", "0s"),
        ("serve", "IDEMPAY_REQUEST_TIMEOUT", "0s"),
        ("serve", "IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "0s"),
        ("serve", "IDEMPAY_KEY_TTL", "0s"),
        ("serve", "IDEMPAY_RECOVERY_INTERVAL", "0s"),
        ("serve", "IDEMPAY_EXPIRY_INTERVAL", "300000000000years"),
        (
            "serve",
            "IDEMPAY_WEBHOOK_RETRY_SCHEDULE",
            "550000000000years",
        ),
        ("processor", "IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT", "0s"),
        (
            "processor",
            "IDEMPAY_WEBHOOK_RETRY_SCHEDULE",
            "5s,550000000000years",
        ),
    ];
    for (command, setting, value) in refused {
        let message = refused_at_start(&database_url, command, &[(setting, value)]).await;
        assert!(
            message.contains(setting),
            "{command} with {setting}={value}, the message names the setting: {message}"
        );
    }
}

/// Settings each valid alone but not together are refused as one that cannot be read is (exit
/// 2), the message naming each setting with its value. Before, `IDEMPAY_RECOVERY_WINDOW=2s`
/// started `serve`, whose keys were then held for an operator before anything could resume them,
/// and a processor that gives its events up within hours started too.
#[api_test]
async fn settings_that_contradict_each_other_are_refused_at_start_naming_each() {
    let database_url = bare_database().await;
    let message =
        refused_at_start(&database_url, "serve", &[("IDEMPAY_RECOVERY_WINDOW", "2s")]).await;
    for named in [
        "IDEMPAY_RECOVERY_WINDOW (2s)",
        "IDEMPAY_PROCESSOR_TIMEOUT (10s)",
        "IDEMPAY_LEASE (30s)",
    ] {
        assert!(message.contains(named), "names {named}: {message}");
    }
    let message = refused_at_start(
        &database_url,
        "processor",
        &[
            (
                "IDEMPAY_PROCESSOR_WEBHOOK_URL",
                "http://127.0.0.1:9/v1/webhooks/processor",
            ),
            (
                "IDEMPAY_WEBHOOK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwdGVzdA==",
            ),
            ("IDEMPAY_WEBHOOK_RETRY_SCHEDULE", "5s,5m,30m,2h"),
        ],
    )
    .await;
    assert!(
        message.contains("IDEMPAY_WEBHOOK_RETRY_SCHEDULE (5s,5m,30m,2h)")
            && message.contains("(1day)"),
        "{message}"
    );
}

/// Runs `idempay command` with `env` on `database_url` and asserts that it exits with status 2
/// (a usage error) within [`EXITS_WITHIN`]; returns what it printed on stderr.
async fn refused_at_start(database_url: &str, command: &str, env: &[(&str, &str)]) -> String {
    let port = free_port().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_idempay"));
    child
        .arg(command)
        .env("DATABASE_URL", database_url)
        .env("IDEMPAY_LISTEN", format!("127.0.0.1:{port}"))
        .env("IDEMPAY_PROCESSOR_LISTEN", format!("127.0.0.1:{port}"))
        .env("IDEMPAY_PROCESSOR_API_KEY", "pk_test")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        child.env(name, value);
    }
    let mut child = child.spawn().expect("idempay runs");
    let stderr = child.stderr.take().expect("stderr");
    let read = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        let mut stderr = stderr;
        stderr.read_to_string(&mut text).await.ok();
        text
    });
    let Ok(status) = tokio::time::timeout(EXITS_WITHIN, child.wait()).await else {
        child.kill().await.ok();
        panic!("`idempay {command}` with {env:?} was still running after {EXITS_WITHIN:?}");
    };
    let status = status.expect("an exit status");
    let message = read.await.expect("stderr read");
    assert_eq!(status.code(), Some(2), "{command} with {env:?}: {message}");
    message
}

/// The expiry job panics (a crash point of the `failpoints` feature, after a run that deleted a
/// key) on an instance that was ready: `/readyz` turns 503 naming the job, `/healthz` stays 200
/// (the process serves), and the instance logs the death as an error.
#[cfg(feature = "failpoints")]
#[api_test]
async fn a_background_job_that_dies_takes_readiness_down() {
    use crate::support::helpers::{new_key, payment};
    use crate::support::instance::{Instance, LogFile};

    let database_url = bare_database().await;
    let (logs, log_file) = LogFile::create();
    let instance = Instance::start_logging_to(
        log_file,
        &database_url,
        &[
            ("IDEMPAY_FAILPOINT", "expiry-job-panic"),
            // The key expires at once, and the next run deletes it and hits the crash point.
            ("IDEMPAY_KEY_TTL", "1s"),
            ("IDEMPAY_EXPIRY_INTERVAL", "1s"),
        ],
    )
    .await;
    let api_key = Instance::create_account(&database_url).await;
    assert_eq!(instance.get("/readyz").await.status, 200, "ready at first");
    let answer = instance
        .post_payment(&api_key, &new_key(), &payment(4200))
        .await;
    assert_eq!(answer.status, 201);

    let ready = readiness_lost(&instance, &logs).await;
    let problem = ready.assert_problem(503, "service-unavailable");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("expiry"), "names the job: {detail}");
    assert_eq!(instance.get("/healthz").await.status, 200, "still alive");
    // Still 503 later: a dead job does not come back by itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    instance
        .get("/readyz")
        .await
        .assert_problem(503, "service-unavailable");

    let logs = logs.read();
    assert!(
        logs.contains("failpoint expiry-job-panic: panicking"),
        "the crash point was hit: {logs}"
    );
    assert!(
        logs.lines()
            .any(|line| line.contains("ERROR") && line.contains("expiry")),
        "the death is logged as an error: {logs}"
    );
}

/// The embedded processor's own expiry job panics (a crash point of the `failpoints` feature, on
/// its first run): idempay's `/readyz` turns 503 naming it, as for a job of idempay's own, and
/// `/healthz` stays 200. Before, the processor watched its jobs for itself: the death was logged,
/// and `/readyz` went on answering 200 while the processor's deliveries were never pruned again.
#[cfg(feature = "failpoints")]
#[api_test]
async fn a_job_of_the_embedded_processor_that_dies_takes_readiness_down() {
    use crate::support::instance::{Instance, LogFile};

    let database_url = bare_database().await;
    let (logs, log_file) = LogFile::create();
    // No IDEMPAY_PROCESSOR_URL: `serve` embeds the processor.
    let instance = Instance::start_alive_logging_to(
        log_file,
        &database_url,
        &[("IDEMPAY_FAILPOINT", "processor:expiry-job-panic")],
    )
    .await;

    let ready = readiness_lost(&instance, &logs).await;
    let problem = ready.assert_problem(503, "service-unavailable");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("`processor-expiry`"),
        "names the job: {detail}"
    );
    // Watched by idempay, its series still the processor's, in idempay's scrape.
    let metrics = instance.metrics().await;
    assert_eq!(
        metrics.value(r#"processor_job_up{job="processor-expiry"}"#),
        Some(0.0),
        "{}",
        metrics.text()
    );
    assert_eq!(
        metrics.value(r#"idempay_job_up{job="processor-expiry"}"#),
        None
    );
    assert_eq!(metrics.value(r#"idempay_job_up{job="expiry"}"#), Some(1.0));
    assert_eq!(instance.get("/healthz").await.status, 200, "still alive");
    let logs = logs.read();
    assert!(
        logs.contains("failpoint processor:expiry-job-panic: panicking"),
        "the crash point was hit: {logs}"
    );
}
