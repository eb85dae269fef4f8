//! `idempay serve` stopped as an orchestrator stops it, by SIGTERM: the listener closes at once,
//! the request in flight is finished and answered, the background jobs stop, and the process
//! exits 0. `exactly_once::lifecycle` proves the same of the server in the test's process, stopped
//! from inside; this is the real process and the real signal.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use idempay_test_macros::api_test;

use crate::support::checks::{key_status, refuses_connections};
use crate::support::helpers::{TestApp, new_key, slow_payment, wait_until};
use crate::support::instance::{ANSWER_WITHIN, Instance, LogFile};
use crate::support::invariants::assert_exactly_once;

/// How long the charge in flight takes: long enough for the checks made while it runs, even on a
/// loaded machine.
const SLOW_CHARGE: &str = "3s";
/// How long the process may take to exit once its last request is answered: closing connections,
/// stopping its jobs and its embedded processor take milliseconds; the rest is for a loaded machine.
const EXITS_WITHIN: Duration = Duration::from_secs(10);

#[api_test]
async fn sigterm_finishes_the_request_in_flight_refuses_new_connections_and_exits_0() {
    let app = TestApp::spawn().await;
    // Only the process works on the key: the test's own server neither serves nor runs jobs.
    app.stop();
    let database_url = app.database_url();
    let (logs, log_file) = LogFile::create();
    let mut instance = Instance::start_logging_to(
        log_file,
        &database_url,
        &[("IDEMPAY_SLOW_CHARGE", SLOW_CHARGE), ("RUST_LOG", "info")],
    )
    .await;
    let address: SocketAddr = instance
        .address
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let key = new_key();
    let in_flight = tokio::spawn(
        instance
            .payment_request(&app.api_key, &key, &slow_payment(100))
            .timeout(ANSWER_WITHIN)
            .send(),
    );
    // The request is in the slow charge: its recovery point is committed, its payment not yet.
    wait_until("the payment is being charged", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT FROM idempotency_keys
                            WHERE scope NOT LIKE 'processor:%' AND status = 'in_progress'
                              AND recovery_point IS NOT NULL)",
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
    })
    .await;

    let pid = instance.child.id().expect("the process runs").to_string();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    assert!(signalled.success());
    let signalled_at = Instant::now();

    // The listener closes at once: a new connection is refused while the request still runs...
    wait_until("the stopping process refuses new connections", || {
        refuses_connections(address)
    })
    .await;
    assert_eq!(
        key_status(&app).await,
        "in_progress",
        "the charge is still running (else the checks came too late to mean anything)"
    );
    assert!(
        instance.child.try_wait().unwrap().is_none(),
        "the process exited while its request was in flight"
    );
    // ...and the request in flight is finished and answered.
    let answer = in_flight
        .await
        .unwrap()
        .expect("the request in flight is answered");
    assert_eq!(answer.status(), 201, "the request in flight was finished");
    let answered_at = Instant::now();
    let exit = tokio::time::timeout(EXITS_WITHIN, instance.child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!("the process did not exit within {EXITS_WITHIN:?} of its last answer")
        })
        .unwrap();
    eprintln!(
        "graceful stop: answered {:?} after SIGTERM, exited {:?} after the answer",
        answered_at - signalled_at,
        answered_at.elapsed()
    );
    assert!(exit.success(), "exits 0 on SIGTERM: {exit}");
    assert!(
        refuses_connections(address).await,
        "a stopped process accepts no connection"
    );

    // The key completed with its payment: nothing was left in progress for a takeover.
    assert_eq!(key_status(&app).await, "completed");
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
    // The jobs stopped because they were asked to, not by dying: the process ends only once each
    // has ended, and a job that ended otherwise is logged as an error.
    let logs = logs.read();
    assert!(
        logs.contains("shutting down: finishing in-flight requests"),
        "{logs}"
    );
    assert!(!logs.contains("a background job died"), "{logs}");
    assert!(!logs.contains("ERROR"), "{logs}");
}
