//! Exactly once across two hops: idempay charges at a processor over HTTP, and the processor
//! misbehaves (it loses answers, refuses connections, fails, is slower than idempay waits, keeps
//! charging while idempay is killed or loses its lease, delivers its webhooks while idempay is
//! down). After each scenario the two ledgers agree: by the invariants as SQL, and by
//! `idempay reconcile` run as an operator runs it.
//!
//! The processor runs in the test process on the test's database, so that it outlives the idempay
//! instances killed here, can be restarted on the same port, and its ledger joins idempay's.
//!
//! The scenarios are in the `two_hops_*.rs` files beside this one (the charge, outages, recovery,
//! refunds, reconcile); this holds what they share, with `early_events.rs`, `forever.rs` and
//! `suspension.rs`.

use std::time::Duration;

use ::processor::{Fraction, ProcessorSettings};
use ::service::shared_settings::SharedArgs;
use idempay::config::{ProcessorLink, Settings};
use service::outbox::{RetrySchedule, WebhookSecrets};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::processor::{self, API_KEY, TestProcessor};
use crate::support::helpers::{TestApp, WAIT_LIMIT};
use crate::support::instance::{Instance, idempay};
use crate::support::invariants::{assert_every_charge_recorded_once, assert_exactly_once};

/// idempay's settings, calling the processor at `address`. Its recovery job is kept out of the
/// way: the scenarios that prove recovery run instances of their own.
pub(crate) fn linked_to(address: &str, settings: Settings) -> Settings {
    Settings {
        processor: ProcessorLink {
            url: Some(address.to_owned()),
            api_key: Some(API_KEY.to_owned()),
            ..settings.processor
        },
        recovery_interval: Duration::from_secs(60 * 60),
        ..settings
    }
}

/// idempay's default settings but for its wait for each attempt at the processor: `timeout`.
pub(crate) fn waiting_at_most(timeout: Duration) -> Settings {
    Settings {
        processor: ProcessorLink {
            timeout,
            ..ProcessorLink::default()
        },
        ..Settings::default()
    }
}

/// idempay on a fresh database, and a processor with `processor` settings keeping its ledger in
/// that database; idempay calls it with `settings` (its link filled in).
pub(crate) async fn idempay_and_processor(
    settings: Settings,
    processor: ProcessorSettings,
) -> (TestApp, TestProcessor) {
    // The processor's port is bound first: idempay is built knowing its address, the processor
    // serving on the database idempay's test created.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", listener.local_addr().unwrap());
    let app = TestApp::spawn_with(linked_to(&address, settings)).await;
    let processor = TestProcessor::beside_on(&app, processor, listener).await;
    (app, processor)
}

/// Environment for an `idempay serve` process calling `processor`.
pub(crate) fn instance_env<'a>(
    processor: &'a TestProcessor,
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("IDEMPAY_PROCESSOR_URL", processor.address.as_str()),
        ("IDEMPAY_PROCESSOR_API_KEY", API_KEY),
    ];
    env.extend_from_slice(more);
    env
}

/// Runs `idempay reconcile` against `processor` over its list API and asserts it finds the two
/// ledgers equal: exit 0 and the one summary line, with `payments` charges and payments, and the
/// refunds and disputes idempay recorded.
pub(crate) async fn assert_reconciled(app: &TestApp, processor: &TestProcessor, payments: usize) {
    let (refunds, disputes): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM refunds), (SELECT count(*) FROM disputes)")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let output = reconcile(app, processor).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "reconcile found differences ({}):\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        stdout,
        format!(
            "reconciled {payments} charges, {payments} payments, {refunds} refunds and {disputes} disputes: 0 difference(s)\n"
        )
    );
}

pub(crate) async fn reconcile(app: &TestApp, processor: &TestProcessor) -> std::process::Output {
    idempay(
        &["reconcile"],
        &[
            ("DATABASE_URL", &app.database_url()),
            ("IDEMPAY_PROCESSOR_URL", &processor.address),
            ("IDEMPAY_PROCESSOR_API_KEY", API_KEY),
        ],
    )
    .await
}

/// Runs `idempay reconcile` and asserts it succeeds; the failure shows the differences it found.
pub(crate) async fn assert_reconcile_succeeds(app: &TestApp, processor: &TestProcessor) {
    let output = reconcile(app, processor).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

/// Runs `idempay reconcile` and asserts it says exactly `said` and succeeds.
pub(crate) async fn assert_reconcile_says(app: &TestApp, processor: &TestProcessor, said: &str) {
    let output = reconcile(app, processor).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), said);
    assert!(output.status.success());
}

/// Runs `idempay reconcile` and asserts it exits `code` (1: it found differences); what it said.
pub(crate) async fn reconcile_said(app: &TestApp, processor: &TestProcessor, code: i32) -> String {
    let output = reconcile(app, processor).await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        output.status.code(),
        Some(code),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Runs `idempay reconcile` and asserts it exits `code` with the lines `expected`, in any order
/// (it reports by table, not in the order the test broke them), then its summary `summary`.
pub(crate) async fn assert_reconcile_reports(
    app: &TestApp,
    processor: &TestProcessor,
    code: i32,
    mut expected: Vec<String>,
    summary: &str,
) {
    let stdout = reconcile_said(app, processor, code).await;
    let mut lines: Vec<&str> = stdout.lines().collect();
    let said = lines.pop();
    lines.sort_unstable();
    expected.sort_unstable();
    assert_eq!(lines, expected);
    assert_eq!(said, Some(summary));
}

/// The invariants as SQL, then reconcile: every scenario ends here.
pub(crate) async fn assert_ledgers_agree(app: &TestApp, processor: &TestProcessor, payments: i64) {
    assert_eq!(app.payment_count().await, payments, "payments");
    assert_eq!(app.charge_count().await, payments, "charges");
    assert_exactly_once(&app.db).await;
    assert_every_charge_recorded_once(&app.db).await;
    assert_reconciled(app, processor, payments as usize).await;
}

/// idempay's settings taking the events signed with `secret`.
pub(crate) fn taking_events_signed_with(secret: WebhookSecrets) -> Settings {
    Settings {
        shared: SharedArgs {
            webhook_secrets: Some(secret),
            ..SharedArgs::default()
        },
        ..Settings::default()
    }
}

/// A processor delivering its events, signed, to an idempay whose intake will listen on `intake`
/// (nothing needs to listen there yet), retrying every 200 ms for 20 s: longer than a scenario's
/// idempay is down or takes to start. Its settings, and idempay's taking those events.
pub(crate) fn delivering_to(intake: u16) -> (ProcessorSettings, Settings) {
    let secret = WebhookSecrets::generate();
    let mut settings = processor::settings();
    settings.webhook_url = Some(format!("http://127.0.0.1:{intake}/v1/webhooks/processor"));
    settings.shared.webhook_secrets = Some(secret.clone());
    settings.shared.webhook_retry_schedule =
        RetrySchedule::new(vec![Duration::from_millis(200); 100]).unwrap();
    (settings, taking_events_signed_with(secret))
}

/// A processor's settings with these faults.
pub(crate) fn faulty(faults: impl FnOnce(&mut ProcessorSettings)) -> ProcessorSettings {
    let mut settings = processor::settings();
    faults(&mut settings);
    settings
}

/// The key row's state: its status, recovery point and downstream key.
pub(crate) async fn key_row(
    app: &TestApp,
    key: &str,
) -> Option<(String, Option<String>, Option<String>)> {
    sqlx::query_as(
        "SELECT status, recovery_point, downstream_key FROM idempotency_keys
         WHERE idem_key = $1 AND scope NOT LIKE 'processor:%'",
    )
    .bind(key)
    .fetch_optional(&app.db)
    .await
    .unwrap()
}

/// One column (or expression over the columns) of the key row of idempay's key `key`.
pub(crate) async fn key_column<T>(app: &TestApp, key: &str, column: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {column} FROM idempotency_keys WHERE idem_key = $1 AND scope NOT LIKE 'processor:%'"
    )))
    .bind(key)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Whether the payment under `key` is in the middle of its charge: its recovery point is committed
/// (the reservation records it) and the processor holds its own key for the charge's downstream
/// key, in progress: the call has reached the processor and is not answered yet.
pub(crate) async fn charge_under_way(app: &TestApp, key: &str) -> bool {
    under_way(
        app,
        "processor:POST /v1/charges",
        "payment.charge_requested",
        key,
    )
    .await
}

/// Whether the call idempay's key `key` made at its recovery point `point` is under way at the
/// processor: the processor's key for it, in a scope `LIKE` `scope`, in progress.
pub(crate) async fn under_way(app: &TestApp, scope: &str, point: &str, key: &str) -> bool {
    sqlx::query_scalar(
        // The processor's key is looked up by the downstream key, not joined to idempay's: they
        // belong to other owners, so on Citus to other shards.
        "SELECT EXISTS (
             SELECT 1 FROM idempotency_keys p
             WHERE p.scope LIKE $2 AND p.status = 'in_progress'
               AND p.idem_key = (
                   SELECT k.downstream_key FROM idempotency_keys k
                   WHERE k.idem_key = $1 AND k.scope NOT LIKE 'processor:%'
                     AND k.recovery_point = $3))",
    )
    .bind(key)
    .bind(scope)
    .bind(point)
    .fetch_one(&app.db)
    .await
    .unwrap()
}

/// Environment for instances whose recovery jobs resume a dead instance's keys within the test:
/// a lease of 3 s to run out, a connection waited for 1 s at most (on a loaded cluster a request
/// is answered 503 rather than held, and resent), and a recovery job every `interval`.
pub(crate) fn recovering_env<'a>(
    processor: &'a TestProcessor,
    interval: &'a str,
) -> Vec<(&'a str, &'a str)> {
    instance_env(
        processor,
        &[
            ("IDEMPAY_LEASE", "3s"),
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
            ("IDEMPAY_RECOVERY_INTERVAL", interval),
        ],
    )
}

/// Two instances whose recovery jobs run every 500 ms: one to kill in a crash test's window, and
/// the one that survives it and recovers what it left.
pub(crate) async fn doomed_and_survivor(
    app: &TestApp,
    processor: &TestProcessor,
) -> (Instance, Instance) {
    let recovering = recovering_env(processor, "500ms");
    let doomed = Instance::start(&app.database_url(), &recovering).await;
    let survivor = Instance::start(&app.database_url(), &recovering).await;
    (doomed, survivor)
}

/// Kills `doomed` with SIGKILL while its request `in_flight` is held in its window, and asserts
/// that request was never answered: the crash, not an answer, ended it.
pub(crate) async fn kill_in_the_window(doomed: &mut Instance, in_flight: InFlight) {
    doomed.child.kill().await.expect("SIGKILL");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance never answered"
    );
}

/// A request in flight, held in the window its test aims at.
pub(crate) type InFlight = JoinHandle<reqwest::Result<reqwest::Response>>;

/// Sends `request` and returns once `under_way` holds: the window the test aims at, such as the
/// call under way at the processor with nothing recorded yet, where a crash test kills the
/// instance.
///
/// On a loaded cluster (three nodes on two cores) getting there has taken more than 10 s, and a
/// new connection can take longer than the instance's 1 s acquire timeout: an answer of 503 or 409
/// before the window is resent with the same key, as a client would resend it (neither recorded
/// anything). Any other answer before the window fails the test with that answer and the keys,
/// since the kill would then miss the window.
pub(crate) async fn sent_into_the_window<F, Fut>(
    app: &TestApp,
    what: &str,
    request: impl Fn() -> reqwest::RequestBuilder,
    under_way: F,
) -> InFlight
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = std::time::Instant::now();
    let mut in_flight: InFlight = tokio::spawn(request().send());
    let mut resent = 0;
    loop {
        if under_way().await {
            return in_flight;
        }
        if in_flight.is_finished() {
            let answer = (&mut in_flight).await.expect("the request's task");
            match answer.as_ref().map(reqwest::Response::status) {
                Ok(status) if status == 503 || status == 409 => {
                    resent += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    in_flight = tokio::spawn(request().send());
                }
                _ => {
                    let answer = match answer {
                        Ok(response) => format!(
                            "{} {}",
                            response.status(),
                            response.text().await.unwrap_or_default()
                        ),
                        Err(error) => error.to_string(),
                    };
                    panic!(
                        "{what}: answered before the window ({answer}); keys: {:?}",
                        keys(app).await
                    );
                }
            }
        }
        if started.elapsed() >= WAIT_LIMIT {
            panic!(
                "{what}: not within {WAIT_LIMIT:?} ({resent} resent after a 503 or 409); keys: {:?}",
                keys(app).await
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every key of the test's database, for a failure's message: scope, status, recovery point and
/// downstream key.
async fn keys(app: &TestApp) -> Vec<(String, String, Option<String>, Option<String>)> {
    sqlx::query_as("SELECT scope, status, recovery_point, downstream_key FROM idempotency_keys")
        .fetch_all(&app.db)
        .await
        .unwrap()
}

/// The processor's charge idempay recorded for `payment`.
pub(crate) async fn charge_of(app: &TestApp, payment: &str) -> String {
    app.get_payment(payment).await.json()["charge"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The processor's only charge: its id and the idempotency key it was made with.
pub(crate) async fn the_charge(app: &TestApp) -> (String, String) {
    sqlx::query_as("SELECT id, idempotency_key FROM processor_charges")
        .fetch_one(&app.db)
        .await
        .unwrap()
}

/// Replaces the processor `old` by one with `settings` on the same port and database: idempay,
/// which knows the processor by its address, calls the new one.
pub(crate) async fn replace_processor(
    app: &TestApp,
    old: TestProcessor,
    settings: ProcessorSettings,
) -> TestProcessor {
    let port = port_of(&old);
    old.stop();
    TestProcessor::beside_on(app, settings, rebind(port).await).await
}

/// A processor's settings under which every call fails (503) before anything is made.
pub(crate) fn failing() -> ProcessorSettings {
    faulty(|s| s.faults.fail = Fraction::ALWAYS)
}

/// The port a processor serves on, to start another there once it stopped.
pub(crate) fn port_of(processor: &TestProcessor) -> u16 {
    processor
        .address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("the processor's port")
}

/// Binds `port` again once the processor that served there has let it go.
pub(crate) async fn rebind(port: u16) -> TcpListener {
    for _ in 0..200 {
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)).await {
            return listener;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("port {port} never came free");
}
