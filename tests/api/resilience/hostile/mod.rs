//! Hostile input against the live server, over raw TCP so that bytes no HTTP client would send can
//! be sent: junk, repeated and oversized headers, keys with control characters and invalid UTF-8,
//! bodies that are not UTF-8, nested 10 000 deep, with numbers no integer holds or fields given
//! twice, wrong content types, truncated and chunked bodies, random methods and paths, unsigned and
//! badly signed webhooks.
//!
//! The requests come from a seeded generator, so a failure reproduces: the seed is printed, and
//! `HOSTILE_SEED=<seed>` runs the same requests again (`HOSTILE_DEBUG=1` also prints every request
//! left unanswered). The server must never answer 5xx, every error it produces must be a problem
//! document, and it must still take payments exactly once afterwards.
//!
//! [`generate`] draws the requests, [`judge`] decides whether an answer is one the server may
//! give; the raw client that sends them is `support::raw_http`.

mod generate;
mod judge;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ::service::shared_settings::SharedArgs;
use futures::StreamExt;
use idempay::config::Settings;
use idempay_test_macros::api_test;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use service::outbox::WebhookSecrets;

use crate::support::helpers::{TestApp, new_key, one_storm_at_a_time, payment, with_slow_charge};
use crate::support::invariants::assert_exactly_once;
use crate::support::raw_http::{self, Outcome, RawResponse, socket_address};

use generate::{Hostile, Target, duplicate_fields, reordered_payment};
use judge::{Summary, judge};

/// How many hostile requests the storm sends, and how many are in flight at once.
const STORM: usize = 500;
const IN_FLIGHT: usize = 16;
/// How long a request that should be answered may take before it counts as a hang: longer than
/// the server's own request timeout (10 s, after which it answers 503), so that no answer within
/// it is a broken promise, never a slow answer on a loaded machine (CI runs eight tests at once,
/// and a valid payment once took more than 5 s there).
const PATIENCE: Duration = Duration::from_secs(15);
/// How long to wait on a request the server may rightly never answer (a body that never comes).
const STALL_PATIENCE: Duration = Duration::from_secs(1);
/// The seed used unless `HOSTILE_SEED` gives another.
const DEFAULT_SEED: u64 = 0x1de3_7a9e;

fn seed() -> u64 {
    std::env::var("HOSTILE_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

#[api_test(citus)]
async fn a_bounded_storm_of_hostile_requests_gets_no_5xx_and_leaves_payments_exactly_once() {
    // A storm too: beside another one on the cluster, a request waited past the request timeout.
    let _alone = one_storm_at_a_time().await;
    let started = Instant::now();
    let seed = seed();
    eprintln!("hostile: seed {seed} (HOSTILE_SEED={seed} reproduces this run)");
    let secret = WebhookSecrets::generate();
    let app = TestApp::spawn_with(Settings {
        shared: SharedArgs {
            slow_charge: Duration::from_millis(50),
            webhook_secrets: Some(secret.clone()),
            ..SharedArgs::default()
        },
        ..Settings::default()
    })
    .await;
    let (_, other_api_key) = app.create_account("another merchant").await;
    let paid = vec![app.paid(5000).await, app.paid(100).await];
    let target = Target {
        address: socket_address(&app),
        api_key: app.api_key.clone(),
        other_api_key,
        paid,
        keys: (0..12).map(|_| new_key()).collect(),
        secret,
    };

    let mut rng = StdRng::seed_from_u64(seed);
    let requests: Vec<Hostile> = (0..STORM).map(|_| target.hostile(&mut rng)).collect();
    let target = &target;
    let exchanges: Vec<(Hostile, Outcome, Duration)> = futures::stream::iter(requests)
        .map(|request| async move {
            let sent = Instant::now();
            let outcome = send(target.address, &request).await;
            (request, outcome, sent.elapsed())
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;

    let mut summary = Summary::default();
    let mut failures = Vec::new();
    for (request, outcome, elapsed) in &exchanges {
        summary.count(request, outcome, *elapsed);
        if std::env::var("HOSTILE_DEBUG").is_ok() && !matches!(outcome, Outcome::Answered(_)) {
            eprintln!("DEBUG {}: {outcome:?}\n  {request}", request.kind);
        }
        if let Err(failure) = judge(request, outcome, &[&target.api_key, &target.other_api_key]) {
            failures.push(format!(
                "{}: {failure}\n  request: {}",
                request.kind, request
            ));
        }
    }
    eprintln!("{summary}");
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {STORM} hostile requests were mishandled:\n{}",
        failures.len(),
        failures
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        summary.statuses.get(&201).is_some_and(|count| *count > 0)
            && summary.statuses.keys().any(|status| *status >= 400),
        "the storm reached both the payments and the refusals: {summary}"
    );
    // Forged webhooks were refused (judged above, each with its problem) and recorded nowhere: no
    // id that only a forged delivery carried is among the processed events.
    let signed: HashSet<&str> = exchanges
        .iter()
        .filter(|(request, ..)| request.refused_as.is_none())
        .filter_map(|(request, ..)| request.webhook_id.as_deref())
        .collect();
    let forged: HashSet<&str> = exchanges
        .iter()
        .filter(|(request, ..)| request.refused_as.is_some())
        .filter_map(|(request, ..)| request.webhook_id.as_deref())
        .filter(|id| !signed.contains(id))
        .collect();
    assert!(
        forged.len() >= 10,
        "the storm forged webhooks: {}",
        forged.len()
    );
    let processed: Vec<String> = sqlx::query_scalar("SELECT id FROM processed_events")
        .fetch_all(&app.db)
        .await
        .unwrap();
    let recorded: Vec<&String> = processed
        .iter()
        .filter(|id| forged.contains(id.as_str()))
        .collect();
    assert!(
        recorded.is_empty(),
        "forged webhooks were recorded as processed: {recorded:?}"
    );
    eprintln!(
        "hostile: {} forged webhooks refused and recorded nowhere; {} events processed",
        forged.len(),
        processed.len()
    );

    // The server still takes a payment, replays it and charges it once.
    let key = new_key();
    let created = app.post_payment(&key, &payment(4200)).await;
    assert_eq!(created.status, 201, "after the storm");
    let replay = app.post_payment(&key, &payment(4200)).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, created.body);
    assert_exactly_once(&app.db).await;
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the storm is bounded in time: {:?}",
        started.elapsed()
    );
}

/// Bodies that give a field twice, in every spelling, sent with the same keys as valid bodies,
/// many at once: a duplicate is refused before the key is reserved, and a key never names two
/// payments whatever the order of arrival.
#[api_test(citus)]
async fn bodies_with_duplicate_fields_never_make_two_payments_for_one_key() {
    let seed = seed() ^ 0xd0b1e;
    eprintln!("hostile: duplicate fields, seed {seed}");
    let app = TestApp::spawn_with(with_slow_charge(Duration::from_millis(30))).await;
    let address = socket_address(&app);
    let mut rng = StdRng::seed_from_u64(seed);
    let keys: Vec<String> = (0..16).map(|_| new_key()).collect();
    // Every key gets one amount for its valid bodies, so valid copies are the same request.
    let amounts: HashMap<&String, i64> = keys
        .iter()
        .map(|key| (key, rng.random_range(1..=99_999_999)))
        .collect();
    let mut requests = Vec::new();
    for key in &keys {
        for _ in 0..8 {
            let amount = amounts[key];
            let (body, duplicated) = if rng.random_bool(0.6) {
                (duplicate_fields(&mut rng, amount), true)
            } else {
                (reordered_payment(&mut rng, amount), false)
            };
            let mut request = Hostile::new("duplicate-fields")
                .post("/v1/payments")
                .bearer(&app.api_key)
                .header("idempotency-key", key)
                .header("content-type", "application/json")
                .body(body);
            request.key = Some((key.clone(), duplicated));
            requests.push(request);
        }
    }
    let exchanges: Vec<(Hostile, Outcome)> = futures::stream::iter(requests)
        .map(|request| async move {
            let outcome = send(address, &request).await;
            (request, outcome)
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;

    let mut created: HashMap<String, Vec<RawResponse>> = HashMap::new();
    for (request, outcome) in &exchanges {
        let Outcome::Answered(response) = outcome else {
            panic!("no answer to {request}: {outcome:?}");
        };
        let (key, duplicated) = request.key.clone().unwrap();
        if duplicated {
            assert_eq!(response.status, 400, "{request}\n{response:?}");
            let problem: Value = serde_json::from_slice(&response.body).unwrap();
            assert_eq!(problem["type"], "/problems/invalid-request", "{request}");
        } else {
            assert!(
                [201, 409].contains(&response.status),
                "{request}\n{response:?}"
            );
            if response.status == 201 {
                created.entry(key).or_default().push(response.clone());
            }
        }
    }
    for (key, answers) in &created {
        assert!(
            answers.iter().all(|answer| answer.body == answers[0].body),
            "{key}: one payment, one answer"
        );
        let executed = answers
            .iter()
            .filter(|answer| answer.header("idempotent-replayed") != Some("true"))
            .count();
        assert_eq!(executed, 1, "{key}: executed once");
    }
    let per_key: Vec<(String, i64)> = sqlx::query_as(
        "SELECT idempotency_key, count(*) FROM payments GROUP BY idempotency_key HAVING count(*) > 1",
    )
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert!(per_key.is_empty(), "keys with two payments: {per_key:?}");
    let payments = app.payment_count().await;
    assert!(
        payments <= keys.len() as i64,
        "{payments} payments for {} keys",
        keys.len()
    );
    assert_eq!(payments, created.len() as i64);
    // A key whose every body was refused was never reserved: it is still free.
    for key in keys.iter().filter(|key| !created.contains_key(*key)) {
        let fresh = app.post_payment(key, &payment(amounts[key])).await;
        assert_eq!(fresh.status, 201, "{key} was not burned by refused bodies");
        assert!(!fresh.replayed());
    }
    assert_exactly_once(&app.db).await;
}

/// Sends one request on its own connection and reads its answer, waiting as long as an answer
/// may rightly take.
async fn send(address: std::net::SocketAddr, request: &Hostile) -> Outcome {
    let patience = if request.may_go_unanswered {
        STALL_PATIENCE
    } else {
        PATIENCE
    };
    raw_http::exchange(address, &request.bytes(), request.is_head(), patience).await
}
