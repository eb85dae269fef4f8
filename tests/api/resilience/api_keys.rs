//! API keys that change while instances serve: a rotated or revoked key stops working on every
//! running instance, which had it in its account cache, as soon as the change commits; a key that
//! matches no account costs one query, not one per request.

use std::time::{Duration, Instant};

use idempay_test_macros::api_test;
use sha2::{Digest, Sha256};

use crate::support::helpers::{TestApp, TestResponse, new_key as idempotency_key, payment, send};
use crate::support::instance::{Instance, idempay};

/// How long a changed key may go on working where no promise is timed (a listener reconnecting, a
/// key given to an account). Far more than a notification takes, far less than the account
/// cache's own expiry (60 s), after which a key would stop working even unnotified.
const TOLD_WITHIN: Duration = Duration::from_secs(5);

/// The README's promise: a rotated or revoked key stops working on every instance within a second
/// of the change's commit. Measured from before the commit to the end of the first request each
/// instance refused, so the figure includes that request's round trip and is an upper bound.
const PROMISED_WITHIN: Duration = Duration::from_secs(1);

/// `GET /v1/payments` on `instance` with `api_key`.
async fn list(instance: &Instance, api_key: &str) -> TestResponse {
    send(
        reqwest::Client::new()
            .get(format!("{}/v1/payments", instance.address))
            .bearer_auth(api_key),
    )
    .await
}

/// Asserts that `api_key` is refused by `instance` within [`TOLD_WITHIN`].
async fn refused_soon(instance: &Instance, api_key: &str) {
    first_refusal(instance, api_key, Instant::now(), Duration::from_millis(20)).await;
}

/// Asks `instance` with `api_key`, every `every`, until it refuses the key, which it must within
/// [`TOLD_WITHIN`] of `since` (until then the key works); how long after `since` the refusal ended.
async fn first_refusal(
    instance: &Instance,
    api_key: &str,
    since: Instant,
    every: Duration,
) -> Duration {
    loop {
        let answer = list(instance, api_key).await;
        if answer.status == 401 {
            answer.assert_problem(401, "unauthorized");
            return since.elapsed();
        }
        assert_eq!(answer.status, 200, "{answer:?}");
        assert!(
            since.elapsed() < TOLD_WITHIN,
            "the changed key still works on {} after {TOLD_WITHIN:?}",
            instance.address
        );
        tokio::time::sleep(every).await;
    }
}

/// Two `idempay serve` instances on the app's database, each told of key changes and with the
/// app's key in its account cache (it has served it).
async fn two_instances_serving_the_key(app: &TestApp) -> [Instance; 2] {
    let database_url = app.database_url();
    let instances = [
        Instance::start(&database_url, &[]).await,
        Instance::start(&database_url, &[]).await,
    ];
    for instance in &instances {
        instance.listening_for_key_changes().await;
        assert_eq!(list(instance, &app.api_key).await.status, 200);
    }
    instances
}

/// An `idempay serve` instance on the app's database, told of key changes, whose pool has 8
/// connections: at most half of them, 4, look keys up at once.
async fn with_a_pool_of_8(app: &TestApp) -> Instance {
    let instance = Instance::start(
        &app.database_url(),
        &[("IDEMPAY_DATABASE_MAX_CONNECTIONS", "8")],
    )
    .await;
    instance.listening_for_key_changes().await;
    instance
}

/// Runs `idempay account SUBCOMMAND --api-key KEY`, which changes the app's key, while the test
/// holds the account's row: the command's UPDATE waits for it, and every instance still serves the
/// key. Then the test lets the row go, which is the last moment before the change can commit, and
/// every instance is asked at once, again and again, until it refuses the key. Returns the
/// command's output and, per instance, how long after the release its first refusal ended: what
/// the promise is measured by.
async fn change_key_and_time_its_end(
    app: &TestApp,
    instances: &[Instance],
    subcommand: &str,
) -> (std::process::Output, Vec<Duration>) {
    let api_key = app.api_key.as_str();
    let args = [subcommand, "--api-key", api_key];
    let mut holder = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("SELECT FROM accounts WHERE id = $1 FOR UPDATE")
        .bind(&app.account_id)
        .execute(&mut *holder)
        .await
        .unwrap();
    let database_url = app.database_url();
    let args: Vec<String> = ["account"]
        .iter()
        .chain(&args)
        .map(|arg| (*arg).to_owned())
        .collect();
    let command = tokio::spawn(async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        idempay(&args, &[("DATABASE_URL", database_url.as_str())]).await
    });
    app.until_a_statement_waits(
        "the command's change waits for the account's row",
        "UPDATE accounts SET api_key_hash%",
    )
    .await;
    for instance in instances {
        assert_eq!(
            list(instance, api_key).await.status,
            200,
            "the key works while its change is not committed"
        );
    }

    let released = Instant::now();
    holder.commit().await.unwrap();
    let refused_after = futures::future::join_all(
        instances
            .iter()
            .map(|instance| first_refusal(instance, api_key, released, Duration::from_millis(10))),
    )
    .await;
    let output = command.await.unwrap();
    eprintln!(
        "api keys: after `{subcommand}`, refused by each of {} instances after {:?} (promised: \
         {PROMISED_WITHIN:?})",
        instances.len(),
        refused_after
    );
    (output, refused_after)
}

/// Asserts that every instance refused the key within [`PROMISED_WITHIN`].
fn assert_promise_kept(refused_after: &[Duration]) {
    for (instance, after) in refused_after.iter().enumerate() {
        assert!(
            *after <= PROMISED_WITHIN,
            "instance {instance} refused the changed key only {after:?} after its change \
             committed, not within {PROMISED_WITHIN:?}: {refused_after:?}"
        );
    }
}

/// Runs `idempay account SUBCOMMAND ARGS` on the app's database.
async fn account_command(app: &TestApp, args: &[&str]) -> std::process::Output {
    let database_url = app.database_url();
    let args = [&["account"], args].concat();
    idempay(&args, &[("DATABASE_URL", database_url.as_str())]).await
}

/// The key a command printed as its last line.
fn printed_key(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .expect("the key on the last line")
        .trim()
        .to_owned()
}

#[api_test(citus)]
async fn a_rotated_key_stops_working_on_every_running_instance_and_the_new_one_works() {
    let app = TestApp::spawn().await;
    let instances = two_instances_serving_the_key(&app).await;

    let (rotated, refused_after) =
        change_key_and_time_its_end(&app, &instances, "rotate-key").await;

    assert_promise_kept(&refused_after);
    let new_key = printed_key(&rotated);
    assert_ne!(new_key, app.api_key);
    for instance in &instances {
        assert_eq!(list(instance, &new_key).await.status, 200);
    }
}

#[api_test(citus)]
async fn a_revoked_key_stops_working_on_a_running_instance_until_the_account_gets_a_new_one() {
    let app = TestApp::spawn().await;
    let instances = two_instances_serving_the_key(&app).await;

    let (revoked, refused_after) =
        change_key_and_time_its_end(&app, &instances, "revoke-key").await;

    assert!(revoked.status.success(), "{revoked:?}");
    assert_promise_kept(&refused_after);
    let instance = &instances[0];
    let again = account_command(&app, &["revoke-key", "--api-key", &app.api_key]).await;
    assert!(!again.status.success(), "{again:?}");
    let issued = account_command(&app, &["rotate-key", "--account", &app.account_id]).await;
    let new_key = printed_key(&issued);
    assert_eq!(list(instance, &new_key).await.status, 200);
    // The account keeps its payments through it all.
    let paid = instance
        .post_payment(&new_key, &idempotency_key(), &payment(100))
        .await;
    assert_eq!(paid.status, 201, "{paid:?}");
}

#[api_test]
async fn a_key_changed_after_the_listener_lost_its_connection_is_not_trusted_from_the_cache() {
    let app = TestApp::spawn().await;
    let instance = Instance::start(&app.database_url(), &[]).await;
    instance.listening_for_key_changes().await;
    assert_eq!(list(&instance, &app.api_key).await.status, 200);

    // Every listener on this database loses its connection (the in-process app's too).
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(!terminated.is_empty(), "no listener found");
    let rotated = account_command(&app, &["rotate-key", "--api-key", &app.api_key]).await;

    let new_key = printed_key(&rotated);
    refused_soon(&instance, &app.api_key).await;
    assert_eq!(list(&instance, &new_key).await.status, 200);
    // It listens again.
    instance.listening_for_key_changes().await;
}

#[api_test]
async fn a_repeated_unknown_key_costs_one_lookup_and_works_as_soon_as_an_account_has_it() {
    let app = TestApp::spawn().await;
    let instance = with_a_pool_of_8(&app).await;
    let lookups = |metrics: &crate::support::instance::Metrics| {
        metrics
            .value(r#"idempay_account_lookups_total{result="unknown"}"#)
            .unwrap_or(0.0)
    };
    let unknown = format!("sk_{}", "x".repeat(40));
    let before = lookups(&instance.metrics().await);

    for _ in 0..20 {
        list(&instance, &unknown)
            .await
            .assert_problem(401, "unauthorized");
    }

    assert_eq!(
        lookups(&instance.metrics().await) - before,
        1.0,
        "20 requests with one unknown key looked it up"
    );
    // A flood of one unknown key at once costs a query per lookup allowed at once, at most: half
    // the pool's 8 connections.
    let flood = format!("sk_{}", "y".repeat(40));
    let before = lookups(&instance.metrics().await);
    let answers = futures::future::join_all((0..20).map(|_| list(&instance, &flood))).await;
    assert!(answers.iter().all(|answer| answer.status == 401));
    let flooded = lookups(&instance.metrics().await) - before;
    assert!((1.0..=4.0).contains(&flooded), "{flooded} lookups");

    // The key is given to an account (as `account create` would, with a key of the test's
    // choosing): the notification of the change evicts its hash, and it works at once.
    let hash: [u8; 32] = Sha256::digest(unknown.as_bytes()).into();
    sqlx::query(
        "INSERT INTO accounts (id, name, api_key_hash) VALUES ('acct_chosen', 'chosen', $1)",
    )
    .bind(hash.as_slice())
    .execute(&app.db)
    .await
    .unwrap();
    let started = Instant::now();
    while list(&instance, &unknown).await.status != 200 {
        assert!(
            started.elapsed() < TOLD_WITHIN,
            "a key given to an account still refused after {TOLD_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lookups of keys the cache cannot answer take at most half the pool's connections: while a flood
/// of random keys waits on its lookups (the test holds the accounts table), the other half still
/// serves a key the cache knows.
#[api_test]
async fn a_flood_of_random_keys_looks_up_on_half_the_pool_and_known_keys_are_still_served() {
    let app = TestApp::spawn().await;
    let instance = with_a_pool_of_8(&app).await;
    assert_eq!(
        list(&instance, &app.api_key).await.status,
        200,
        "now cached"
    );

    let mut holder = idempotency::connections::begin(&app.db).await.unwrap();
    sqlx::query("LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let flood: Vec<_> = (0..20)
        .map(|_| {
            let url = format!("{}/v1/payments", instance.address);
            // An API key's shape (40 letters and digits), matching no account.
            let random = uuid::Uuid::new_v4().simple().to_string();
            let random = format!("sk_{random}{}", &random[..8]);
            tokio::spawn(
                async move { send(reqwest::Client::new().get(url).bearer_auth(random)).await },
            )
        })
        .collect();

    let waiting = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%FROM accounts WHERE api_key_hash%'",
        )
        .fetch_one(&app.db)
        .await
        .unwrap()
    };
    let started = Instant::now();
    while waiting().await < 4 {
        assert!(
            started.elapsed() < TOLD_WITHIN,
            "the flood never reached the database"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The other 16 requests had every chance to take a connection too: they wait their turn.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(waiting().await, 4, "lookups at once, of a pool of 8");
    let known = list(&instance, &app.api_key).await;
    assert_eq!(
        known.status, 200,
        "a known key is served beside the flood: {known:?}"
    );

    holder.commit().await.unwrap();
    for answer in futures::future::join_all(flood).await {
        answer.unwrap().assert_problem(401, "unauthorized");
    }
}
