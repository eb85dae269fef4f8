//! Real server processes under faults: one aborted at a crash point or killed with SIGKILL in the
//! middle of a charge, and three racing on the same keys, or on one backlog of expired keys, in one
//! database. The invariants are checked after each.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use idempay_test_macros::api_test;

use crate::support::helpers::{
    TestApp, TestResponse, jobs_off, new_key, one_storm_at_a_time, retry_while_in_flight,
    slow_payment, wait_until,
};
use crate::support::instance::{Instance, LogFile};
use crate::support::invariants::assert_exactly_once;
// What only the crash tests use, which need the failpoints.
#[cfg(feature = "failpoints")]
use crate::support::{
    helpers::died_before_answering, helpers::payment, invariants::assert_every_charge_recorded_once,
};

/// SIGABRT, the signal `std::process::abort()` raises (6 on every Unix the service runs on).
#[cfg(feature = "failpoints")]
const SIGABRT: i32 = 6;

/// Kills an instance at `failpoint` during a payment, and proves it died there: by SIGABRT, its
/// last words the failpoint's, and the key left as a crash at that point leaves it. Then retries
/// on a healthy instance until the key is free; returns the retry's answer, with the takeover
/// counted where the key was left in progress, and the invariants checked.
#[cfg(feature = "failpoints")]
async fn crash_at(failpoint: &str) -> (TestApp, TestResponse) {
    use std::os::unix::process::ExitStatusExt;

    // Only after the commit are the payment and the completed key in the database.
    let committed = failpoint == "after-commit";
    // The healthy instance's retry must be what takes the key over.
    let app = TestApp::spawn_with(jobs_off()).await;
    let (logs, log_file) = LogFile::create();
    let mut crashing = Instance::start_logging_to(
        log_file,
        &app.database_url(),
        &[
            ("IDEMPAY_FAILPOINT", failpoint),
            // Start-up requires a lease of three acquire timeouts, and a shorter acquire timeout
            // would fail connecting to a loaded database.
            ("IDEMPAY_LEASE", "3s"),
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
        ],
    )
    .await;
    let key = new_key();
    let body = payment(4200);
    let sent = crashing
        .payment_request(&app.api_key, &key, &body)
        .send()
        .await;
    let exit = died_before_answering(sent, &mut crashing).await;
    let logs = logs.read();
    assert_eq!(
        exit.signal(),
        Some(SIGABRT),
        "{failpoint}: the process aborted ({exit}); its logs:\n{logs}"
    );
    assert_eq!(
        logs.lines().last(),
        Some(format!("failpoint {failpoint}: aborting").as_str()),
        "{failpoint}: the process aborted at its failpoint; its logs:\n{logs}"
    );

    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT status FROM idempotency_keys WHERE scope NOT LIKE 'processor:%'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    if committed {
        assert_eq!(keys, ["completed"], "{failpoint}: the key was completed");
        assert_eq!(app.payment_count().await, 1, "{failpoint}: and its payment");
    } else {
        assert_eq!(
            keys,
            ["in_progress"],
            "{failpoint}: the key is left in progress"
        );
        assert_eq!(
            app.payment_count().await,
            0,
            "{failpoint}: and nothing is paid"
        );
    }
    // The crash right after the reservation comes before the charge; the others after it.
    let charged = i64::from(failpoint != "after-reserve");
    assert_eq!(
        app.charge_count().await,
        charged,
        "{failpoint}: what the processor charged before the crash"
    );

    // Its recovery job would resume the key too; here the client's retry comes first.
    let healthy =
        Instance::start(&app.database_url(), &[("IDEMPAY_RECOVERY_INTERVAL", "1h")]).await;
    let retry = retry_while_in_flight(|| healthy.post_payment(&app.api_key, &key, &body)).await;
    assert_eq!(retry.status, 201, "{failpoint}");
    assert_eq!(app.payment_count().await, 1, "{failpoint}");
    let metrics = healthy.metrics().await;
    let outcome = |outcome: &str| {
        metrics
            .value(&format!(
                r#"idempay_idempotency_outcomes_total{{outcome="{outcome}"}}"#
            ))
            .unwrap_or_default()
    };
    let (took_over, replayed) = (outcome("takeover"), outcome("replayed"));
    if committed {
        assert_eq!(
            (took_over, replayed),
            (0.0, 1.0),
            "{failpoint}: the completed key is replayed, not taken over"
        );
    } else {
        assert_eq!(
            (took_over, replayed),
            (1.0, 0.0),
            "{failpoint}: the key left in progress is taken over once"
        );
    }
    assert_exactly_once(&app.db).await;
    assert_eq!(app.charge_count().await, 1, "{failpoint}: no second charge");
    assert_every_charge_recorded_once(&app.db).await;
    (app, retry)
}

#[cfg(feature = "failpoints")]
#[api_test(citus)]
async fn a_crash_right_after_the_reservation_is_taken_over_and_charged_once() {
    let (_, retry) = crash_at("after-reserve").await;
    assert!(
        !retry.replayed(),
        "nothing had been charged: the retry executes"
    );
}

#[cfg(feature = "failpoints")]
#[api_test(citus)]
async fn a_crash_between_the_charge_and_its_commit_leaves_nothing_and_is_charged_once() {
    let (_, retry) = crash_at("before-commit").await;
    assert!(
        !retry.replayed(),
        "the uncommitted charge was rolled back: the retry executes"
    );
}

#[cfg(feature = "failpoints")]
#[api_test(citus)]
async fn a_crash_after_the_commit_is_answered_by_a_replay() {
    let (_, retry) = crash_at("after-commit").await;
    assert!(
        retry.replayed(),
        "the charge committed: the retry gets its stored response"
    );
}

#[api_test(citus)]
async fn a_killed_instance_leaves_its_key_to_a_retry_that_takes_over_once() {
    // No recovery job: the retry is what must take the key over here (the recovery job's own
    // takeover is proven in two_hops), and on a slow run the job could come first.
    let app = TestApp::spawn_with(jobs_off()).await;
    let mut doomed = Instance::start(
        &app.database_url(),
        // The lease outlasts the early retry below even on a loaded machine.
        &[
            ("IDEMPAY_LEASE", "5s"),
            ("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
            ("IDEMPAY_SLOW_CHARGE", "30s"),
        ],
    )
    .await;
    let key = new_key();
    let slow = slow_payment(100);
    let request = doomed.payment_request(&app.api_key, &key, &slow).send();
    let in_flight = tokio::spawn(request);
    // In the middle of the charge: the charge was requested (the recovery point is committed and
    // the processor holds its own key for it), and no payment exists yet.
    wait_until("the charge is under way at the processor", || async {
        let requested: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM idempotency_keys \
             WHERE recovery_point = 'payment.charge_requested' \
                OR scope LIKE 'processor:%'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        requested == 2
    })
    .await;
    assert_eq!(app.payment_count().await, 0, "killed before the payment");

    doomed.child.kill().await.expect("SIGKILL");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the killed instance never answered"
    );

    // The lease is still running: the retry is told to wait.
    let early = app.post_payment(&key, &slow).await;
    early.assert_problem(409, "idempotency-key-in-use");
    assert_eq!(app.payment_count().await, 0);

    // Once the lease has run out, a retry takes the key over and charges exactly once.
    let survivor = Instance::start(
        &app.database_url(),
        &[
            ("IDEMPAY_SLOW_CHARGE", "100ms"),
            ("IDEMPAY_RECOVERY_INTERVAL", "1h"),
        ],
    )
    .await;
    let taken_over =
        retry_while_in_flight(|| survivor.post_payment(&app.api_key, &key, &slow)).await;
    assert_eq!(taken_over.status, 201);
    assert!(!taken_over.replayed(), "the takeover executed the charge");
    let replay = survivor.post_payment(&app.api_key, &key, &slow).await;
    assert!(replay.replayed());
    // Each retry that finds the processor still busy with the dead instance's charge is answered
    // 503 and keeps the key; the next retry takes it over again.
    let took_over = survivor
        .metrics()
        .await
        .value(r#"idempay_idempotency_outcomes_total{outcome="takeover"}"#);
    assert!(took_over >= Some(1.0), "the takeover is counted");
    assert_eq!(app.charge_count().await, 1, "one charge at the processor");
    assert_eq!(replay.body, taken_over.body);
    assert_eq!(app.payment_count().await, 1);
    assert_exactly_once(&app.db).await;
}

/// Every key sent COPIES times at once, the copies spread over three processes: they race on the
/// key (the slow card keeps it in progress while its copies arrive), and still make one payment.
#[api_test(citus)]
async fn three_instances_under_a_retry_storm_make_one_payment_per_key() {
    let _alone = one_storm_at_a_time().await;
    const KEYS: usize = 200;
    const COPIES: usize = 5;
    /// Keys per wave: a wave sends every copy of its keys at once, and ends when all are answered.
    const KEYS_PER_WAVE: usize = 20;
    let app = TestApp::spawn().await;
    let instances = three_instances(
        &app,
        &[
            ("IDEMPAY_EXPIRY_INTERVAL", "100ms"),
            ("IDEMPAY_SLOW_CHARGE", "500ms"),
        ],
    )
    .await;
    let keys: Vec<String> = (0..KEYS).map(|_| new_key()).collect();
    let body = slow_payment(4200);

    // The copies of a key go to instances i, i+1, i+2, i, i+1 (mod 3): each process gets one.
    let mut answers: HashMap<&String, Vec<(usize, TestResponse)>> = HashMap::new();
    for wave in keys.chunks(KEYS_PER_WAVE) {
        let sends: Vec<(usize, &String)> = wave
            .iter()
            .enumerate()
            .flat_map(|(i, key)| (0..COPIES).map(move |copy| ((i + copy) % 3, key)))
            .collect();
        let responses =
            join_all(sends.iter().map(|(instance, key)| {
                instances[*instance].post_payment(&app.api_key, key, &body)
            }))
            .await;
        for ((instance, key), response) in sends.into_iter().zip(responses) {
            answers.entry(key).or_default().push((instance, response));
        }
    }

    // A key none of whose copies was answered 201 (each 409, or 503: its instance too loaded to
    // answer within the request timeout, which asks for a retry) is retried with its key, as a
    // client told so does: the work of a copy answered 503 may have committed after the answer
    // (the retry replays it) or been let go (the retry makes the payment). Then there is one
    // payment per key, never more. (Counted before the retries, a key whose work committed late,
    // or whose every copy was sent away, read as a payment missing.)
    let mut retried = 0;
    for key in &keys {
        if answers[key].iter().any(|(_, r)| r.status == 201) {
            continue;
        }
        retried += 1;
        let settled =
            retry_while_in_flight(|| instances[0].post_payment(&app.api_key, key, &body)).await;
        assert_eq!(settled.status, 201, "{key}: {settled:?}");
    }
    println!("storm: {retried} of {KEYS} keys had no 201 among their copies and were retried");
    assert_eq!(app.payment_count().await, KEYS as i64);
    // The keys on which a process answered 409 while another process executed them.
    let mut raced = 0;
    for (key, responses) in &answers {
        // 503: an instance was too loaded to answer in time and asked for a retry. Never more.
        assert!(
            responses
                .iter()
                .all(|(_, r)| matches!(r.status, 201 | 409 | 503)),
            "{key}"
        );
        let created: Vec<_> = responses.iter().filter(|(_, r)| r.status == 201).collect();
        assert!(
            created.iter().all(|(_, r)| r.body == created[0].1.body),
            "{key}: one answer"
        );
        let executed: Vec<usize> = created
            .iter()
            .filter(|(_, r)| !r.replayed())
            .map(|(instance, _)| *instance)
            .collect();
        // The copy that executed may itself have been answered 503 (its instance too loaded to
        // answer within the request timeout, its work committed all the same): then no copy shows
        // the execution, and the payment count above is what proves it happened once.
        let timed_out = responses.iter().any(|(_, r)| r.status == 503);
        if timed_out {
            assert!(executed.len() <= 1, "{key}: executed at most once");
        } else {
            assert_eq!(executed.len(), 1, "{key}: executed once");
        }
        // The executor: the copy answered 201 that was no replay or, when the executing copy was
        // answered 503 (too loaded to answer in time, its work going on), one of those.
        let executors: Vec<usize> = match executed.first() {
            Some(&executor) => vec![executor],
            None => responses
                .iter()
                .filter(|(_, r)| r.status == 503)
                .map(|(instance, _)| *instance)
                .collect(),
        };
        if responses
            .iter()
            .any(|(instance, r)| r.status == 409 && !executors.contains(instance))
        {
            raced += 1;
        }
    }
    let conflicts: Vec<usize> = (0..3)
        .map(|instance| {
            answers
                .values()
                .flatten()
                .filter(|(i, r)| *i == instance && r.status == 409)
                .count()
        })
        .collect();
    let mut counted = Vec::new();
    for instance in &instances {
        let value = instance
            .metrics()
            .await
            .value(r#"idempay_idempotency_outcomes_total{outcome="conflict_in_flight"}"#)
            .unwrap_or_default();
        counted.push(value as usize);
    }
    eprintln!(
        "retry storm: {raced} of {KEYS} keys raced across processes; 409s by instance \
         {conflicts:?}, counted {counted:?}"
    );
    // Copies really were in flight together, on every process, and across processes.
    for (instance, (&answered, &counted)) in conflicts.iter().zip(&counted).enumerate() {
        assert!(
            answered > 0,
            "instance {instance} turned no copy away with 409"
        );
        assert!(
            counted >= answered,
            "instance {instance} counts its 409s ({counted} counted, {answered} answered)"
        );
    }
    assert!(
        raced >= KEYS / 2,
        "most keys raced across processes: {raced} of {KEYS}"
    );
    assert_exactly_once(&app.db).await;
}

/// The expiry job runs on every instance. Three of them, their jobs every 50 ms, meet a backlog of
/// expired keys that appears at once: between them they delete every expired key exactly once (the
/// deletions their metrics count add up to the backlog, and more than one of them deleted some: the
/// jobs really met on the backlog), leave every live key, and never deadlock (neither PostgreSQL's
/// count nor any instance's logs show one).
#[api_test(citus)]
async fn three_instances_drain_expired_keys_together_each_row_once_without_deadlocks() {
    let _alone = one_storm_at_a_time().await;
    const EXPIRED: i64 = 30_000;
    const LIVE: i64 = 1_000;
    // The test's own server must not be a fourth deleter, uncounted by the instances' metrics.
    let app = TestApp::spawn_with(jobs_off()).await;
    // Each instance logs to a file of its own, with the expiry job's runs (info) and any failure.
    let env = [
        ("IDEMPAY_EXPIRY_INTERVAL", "50ms"),
        ("RUST_LOG", "warn,service::sweeps=info"),
    ];
    let mut instances = Vec::new();
    let mut logs = Vec::new();
    for _ in 0..3 {
        let (log, file) = LogFile::create();
        instances.push(Instance::start_logging_to(file, &app.database_url(), &env).await);
        logs.push(log);
    }
    let deadlocks = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    let deadlocks_before = deadlocks().await;

    // One statement, so the whole backlog appears at once for the three jobs.
    sqlx::query(
        "INSERT INTO idempotency_keys
             (account_id, scope, idem_key, request_hash, status, response_code,
              response_headers, response_body, expires_at)
         SELECT 'acct_seeded', 'acct_seeded:POST /v1/payments', 'k' || i, sha256(i::text::bytea), 'completed',
                201, '{}'::jsonb, '{}'::bytea,
                CASE WHEN i <= $1 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
         FROM generate_series(1, $1 + $2) AS i",
    )
    .bind(EXPIRED)
    .bind(LIVE)
    .execute(&app.db)
    .await
    .unwrap();
    // Generous: on a loaded machine (CI runs eight tests at once) the drain takes seconds.
    for _ in 0..1_800 {
        if app.key_count().await == LIVE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let live: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE scope NOT LIKE 'processor:%' AND expires_at > now()")
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!(app.key_count().await, LIVE, "every expired key deleted");
    assert_eq!(live, LIVE, "every live key left");

    // A run counts its deletions when it ends: wait for the runs in progress to end.
    let mut shares = Vec::new();
    for _ in 0..100 {
        shares = deleted_by_each(&instances).await;
        if shares.iter().sum::<i64>() >= EXPIRED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("expiry on three instances: {EXPIRED} expired keys deleted as {shares:?}");
    assert_eq!(shares.iter().sum::<i64>(), EXPIRED, "each row deleted once");
    // On one server the batches skip each other's locked rows, so the jobs share the backlog. On
    // Citus they are read without locks (see `Idempotency::expire_batch`): the jobs pick the same
    // rows, and those that come second find them gone, so one job may well take them all.
    if !crate::support::citus::enabled() {
        assert!(
            shares.iter().filter(|&&deleted| deleted > 0).count() >= 2,
            "the jobs drained the backlog together, not one of them alone: {shares:?}"
        );
    }
    assert_eq!(deadlocks().await, deadlocks_before, "no deadlock");
    for (instance, (log, deleted)) in logs.iter().zip(&shares).enumerate() {
        // The logs are read: an instance that deleted rows said so (after counting them).
        if *deleted > 0 {
            wait_until(
                &format!("instance {instance} logs its deletions"),
                || async { log.read().contains("expired rows deleted") },
            )
            .await;
        }
        let log = log.read();
        assert!(
            !log.contains("40P01") && !log.to_lowercase().contains("deadlock"),
            "instance {instance} met a deadlock:\n{log}"
        );
    }
}

/// The expired keys each instance's job has deleted, from its metrics.
async fn deleted_by_each(instances: &[Instance]) -> Vec<i64> {
    let mut shares = Vec::new();
    for instance in instances {
        let deleted = instance
            .metrics()
            .await
            .value(r#"idempay_expiry_deleted_rows_total{table="idempotency_keys"}"#)
            .unwrap_or_default();
        shares.push(deleted as i64);
    }
    shares
}

/// Three `idempay serve` processes on the database of `app`, as three replicas.
async fn three_instances(app: &TestApp, env: &[(&str, &str)]) -> [Instance; 3] {
    [
        Instance::start(&app.database_url(), env).await,
        Instance::start(&app.database_url(), env).await,
        Instance::start(&app.database_url(), env).await,
    ]
}
