//! The client idempay calls the processor with, against a real processor and each fault: "not
//! done" only when certain, "unknown" whenever the call may have happened, and the same key
//! always leading back to the first result.

use std::time::Duration;

use ::processor::{ChargeStatus, Fraction, ProcessorSettings};
use idempay::downstream::{ChargeRequest, ProcessorClient, ProcessorOutcome, ProcessorRefusal};
use idempay_test_macros::api_test;

use super::{API_KEY, TestProcessor, settings};
use crate::support::helpers::{fresh_database, new_key, wait_until};
use crate::support::instance::free_port;

fn visa(amount: i64) -> ChargeRequest {
    ChargeRequest {
        capture: true,
        amount,
        currency: "eur".into(),
        payment_method: "pm_card_visa".into(),
    }
}

/// A client of the processor at `address` with `api_key`, whose calls time out after 5 s.
fn client_of(address: &str, api_key: String) -> ProcessorClient {
    ProcessorClient::new(address, api_key, Duration::from_secs(5)).unwrap()
}

/// Asserts the call is known not done, refused with `status` (`None`: nothing was answered).
#[track_caller]
fn assert_not_done<T: std::fmt::Debug>(outcome: &ProcessorOutcome<T>, status: Option<u16>) {
    assert!(
        matches!(outcome, ProcessorOutcome::NotDone(refusal) if refusal.status == status),
        "{outcome:?}"
    );
}

fn with(configure: impl FnOnce(&mut ProcessorSettings)) -> ProcessorSettings {
    let mut settings = settings();
    configure(&mut settings);
    settings
}

#[api_test]
async fn a_charge_is_done_and_a_decline_is_done_as_a_declined_charge() {
    let processor = TestProcessor::spawn().await;
    let client = processor.client(Duration::from_secs(5));

    let ProcessorOutcome::Done(charge) = client.charge(&new_key(), &visa(4200)).await else {
        panic!("the charge is done");
    };
    let declined_request = ChargeRequest {
        payment_method: "pm_card_chargeDeclined".into(),
        ..visa(4200)
    };
    let ProcessorOutcome::Done(declined) = client.charge(&new_key(), &declined_request).await
    else {
        panic!("a decline is a result");
    };

    assert!(charge.id.starts_with("ch_"));
    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!((charge.amount, charge.currency.as_str()), (4200, "eur"));
    assert_eq!(declined.status, ChargeStatus::Declined);
    assert_eq!(declined.decline_code.as_deref(), Some("generic_decline"));
    assert_eq!(declined.payment_method, "pm_card_chargeDeclined");
}

#[api_test]
async fn a_refused_connection_is_not_done() {
    let client = client_of(
        &format!("http://127.0.0.1:{}", free_port()),
        API_KEY.to_owned(),
    );

    let outcome = client.charge(&new_key(), &visa(100)).await;

    assert_not_done(&outcome, None);
}

#[api_test]
async fn a_lost_answer_is_unknown_and_the_same_key_then_gets_the_charge() {
    let processor = TestProcessor::spawn_with(with(|settings| {
        settings.faults.lose_answers = Fraction::ALWAYS;
    }))
    .await;
    let client = processor.client(Duration::from_secs(5));
    let key = new_key();

    let lost = client.charge(&key, &visa(4200)).await;
    let retried = client.charge(&key, &visa(4200)).await;

    assert!(matches!(lost, ProcessorOutcome::Unknown(_)), "{lost:?}");
    let ProcessorOutcome::Done(charge) = retried else {
        panic!("the replay is answered: {retried:?}");
    };
    let recorded: String = sqlx::query_scalar("SELECT id FROM processor_charges")
        .fetch_one(&processor.db)
        .await
        .unwrap();
    assert_eq!(charge.id, recorded);
    assert_eq!(processor.count("processor_charges").await, 1);
}

#[api_test]
async fn a_lost_answer_is_a_transport_error_after_sending_never_a_status() {
    let processor = TestProcessor::spawn_with(with(|settings| {
        settings.faults.lose_answers = Fraction::ALWAYS;
    }))
    .await;

    let sent = processor
        .http()
        .post(format!("{}/v1/charges", processor.address))
        .bearer_auth(API_KEY)
        .header("idempotency-key", new_key())
        .json(&super::charge(100, "pm_card_visa"))
        .send()
        .await;

    let error = sent.expect_err("no answer at all");
    assert!(!error.is_connect(), "{error:?}");
    assert!(error.status().is_none(), "{error:?}");
    assert_eq!(processor.count("processor_charges").await, 1);
}

#[api_test]
async fn a_failing_processor_is_unknown_and_charges_nothing() {
    let processor = TestProcessor::spawn_with(with(|settings| {
        settings.faults.fail = Fraction::ALWAYS;
    }))
    .await;
    let client = processor.client(Duration::from_secs(5));

    let outcome = client.charge(&new_key(), &visa(100)).await;
    let refund = client
        .refund(&new_key(), "ch_aaaaaaaaaaaaaaaaaaaaaaaa", None)
        .await;

    assert!(
        matches!(outcome, ProcessorOutcome::Unknown(_)),
        "{outcome:?}"
    );
    assert!(matches!(refund, ProcessorOutcome::Unknown(_)), "{refund:?}");
    assert_eq!(processor.count("processor_charges").await, 0);
    assert_eq!(processor.count("idempotency_keys").await, 0);
}

/// The charge is held at its insert by a lock the test takes on the processor's ledger, so the
/// client's timeout ends the wait while the charge is surely under way: with a latency of 800 ms
/// and a timeout of 200 ms instead, a loaded machine timed the client out before the request
/// reached the processor, and no charge ever came.
#[api_test]
async fn a_timeout_shorter_than_the_latency_is_unknown_and_the_charge_still_happens() {
    let processor = TestProcessor::spawn().await;
    let mut ledger = idempotency::connections::begin(&processor.db)
        .await
        .unwrap();
    sqlx::query("LOCK TABLE processor_charges IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *ledger)
        .await
        .unwrap();
    let impatient = processor.client(Duration::from_secs(3));
    let key = new_key();

    let charging = tokio::spawn({
        let key = key.clone();
        async move { impatient.charge(&key, &visa(100)).await }
    });
    crate::support::helpers::wait_until("the charge waits at its insert", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT FROM pg_stat_activity
                            WHERE datname = current_database() AND wait_event_type = 'Lock'
                              AND query LIKE '%INSERT INTO processor_charges%')",
        )
        .fetch_one(&processor.db)
        .await
        .unwrap()
    })
    .await;
    let outcome = charging.await.unwrap();
    ledger.commit().await.unwrap();

    assert!(
        matches!(outcome, ProcessorOutcome::Unknown(_)),
        "{outcome:?}"
    );
    crate::support::helpers::wait_until("the charge commits", || async {
        processor.count("processor_charges").await == 1
    })
    .await;
    let patient = processor.client(Duration::from_secs(5));
    assert!(matches!(
        patient.charge(&key, &visa(100)).await,
        ProcessorOutcome::Done(_)
    ));
    assert_eq!(processor.count("processor_charges").await, 1);
}

#[api_test]
async fn a_refund_is_done_once_per_key_and_one_beyond_the_charge_is_not_done() {
    let processor = TestProcessor::spawn().await;
    let client = processor.client(Duration::from_secs(5));
    let ProcessorOutcome::Done(charge) = client.charge(&new_key(), &visa(5000)).await else {
        panic!("charged");
    };
    let key = new_key();

    let first = client.refund(&key, &charge.id, Some(3000)).await;
    let again = client.refund(&key, &charge.id, Some(3000)).await;
    let beyond = client.refund(&new_key(), &charge.id, Some(2001)).await;
    let rest = client.refund(&new_key(), &charge.id, None).await;

    let (ProcessorOutcome::Done(first), ProcessorOutcome::Done(again)) = (first, again) else {
        panic!("refunded");
    };
    assert_eq!(first, again);
    assert_eq!(
        (first.charge.as_str(), first.amount),
        (charge.id.as_str(), 3000)
    );
    let ProcessorOutcome::NotDone(refusal) = beyond else {
        panic!("refused: {beyond:?}");
    };
    assert_eq!(refusal.status, Some(400));
    assert_eq!(
        refusal.problem_type.as_deref(),
        Some("/problems/refund-exceeds-payment")
    );
    assert!(
        matches!(rest, ProcessorOutcome::Done(ref refund) if refund.amount == 2000),
        "{rest:?}"
    );
}

#[api_test]
async fn the_client_lists_every_charge_and_refund_across_pages() {
    let processor = TestProcessor::spawn().await;
    // More than a page of 100, written straight to the ledger.
    sqlx::query(
        "INSERT INTO processor_charges (id, amount, currency, status, payment_method, idempotency_key)
         SELECT 'ch_' || lpad(n::text, 24, '0'), 100, 'eur', 'succeeded', 'pm_card_visa', n::text
         FROM generate_series(1, 230) AS n",
    )
    .execute(&processor.db)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO processor_refunds (id, charge_id, amount, status, idempotency_key)
         SELECT 'pyr_' || lpad(n::text, 24, '0'), 'ch_' || lpad(n::text, 24, '0'), 10, 'succeeded', n::text
         FROM generate_series(1, 150) AS n",
    )
    .execute(&processor.db)
    .await
    .unwrap();
    let client = processor.client(Duration::from_secs(5));

    let charges = client.charges().await.unwrap();
    let refunds = client.refunds().await.unwrap();

    let mut ids: Vec<&str> = charges.iter().map(|charge| charge.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 230);
    assert_eq!(refunds.len(), 150);
    assert!(
        refunds
            .iter()
            .all(|refund| refund.charge.starts_with("ch_"))
    );
}

#[api_test]
async fn a_wrong_api_key_is_not_done() {
    let processor = TestProcessor::spawn().await;
    let client = client_of(&processor.address, "pk_wrong".into());

    let outcome = client.charge(&new_key(), &visa(100)).await;

    assert_not_done(&outcome, Some(401));
}

/// `idempay processor` as a process of its own on a fresh database, listening on a free port, with
/// `env` added; and its base URL.
async fn processor_process(env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    let database = fresh_database().await;
    let port = free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idempay"))
        .arg("processor")
        .env(
            "DATABASE_URL",
            crate::support::harness::database_url(&database),
        )
        .env("IDEMPAY_PROCESSOR_LISTEN", format!("127.0.0.1:{port}"))
        .env("IDEMPAY_PROCESSOR_API_KEY", API_KEY)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("idempay processor starts");
    (child, format!("http://127.0.0.1:{port}"))
}

/// A charge by `client`, asked until the process listens (30 s for a slow debug start): not
/// listening yet is "not done".
async fn charge_once_up(
    client: &ProcessorClient,
    key: &str,
) -> ProcessorOutcome<::processor::Charge> {
    let mut outcome = client.charge(key, &visa(4200)).await;
    for _ in 0..300 {
        if !matches!(
            outcome,
            ProcessorOutcome::NotDone(ProcessorRefusal { status: None, .. })
        ) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        outcome = client.charge(key, &visa(4200)).await;
    }
    outcome
}

#[api_test]
async fn idempay_processor_serves_charges_as_a_process_of_its_own() {
    let (mut child, address) = processor_process(&[]).await;
    let client = client_of(&address, API_KEY.to_owned());

    let outcome = charge_once_up(&client, &new_key()).await;

    let ProcessorOutcome::Done(charge) = outcome else {
        panic!("charged by the process: {outcome:?}");
    };
    assert_eq!(client.charges().await.unwrap(), vec![charge]);
    child.kill().await.ok();
}

/// The processor reports as itself, not as idempay, whose crate of shared plumbing it runs on:
/// alone in its process, its `/metrics` names every series `processor_…` (its keys, jobs, expiry
/// and outbox) and none `idempay_…`, and its webhooks carry `User-Agent: processor/…`. Before,
/// the plumbing named its series and its deliveries idempay's whichever service ran it.
#[api_test]
async fn idempay_processor_names_its_series_and_its_user_agent_its_own() {
    let receiver = crate::delivery::Receiver::start(0).await;
    let (mut child, address) = processor_process(&[
        ("IDEMPAY_PROCESSOR_WEBHOOK_URL", receiver.url.as_str()),
        (
            "IDEMPAY_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwdGVzdA==",
        ),
        ("IDEMPAY_EXPIRY_INTERVAL", "1s"),
    ])
    .await;
    let client = client_of(&address, API_KEY.to_owned());
    let outcome = charge_once_up(&client, &new_key()).await;
    assert!(matches!(outcome, ProcessorOutcome::Done(_)), "{outcome:?}");

    wait_until("the charge's event is delivered", || async {
        receiver.count() > 0
    })
    .await;
    let agents: Vec<String> = receiver
        .deliveries()
        .iter()
        .map(|(headers, _)| headers["user-agent"].to_str().unwrap().to_owned())
        .collect();
    assert!(
        agents
            .iter()
            .all(|agent| agent.starts_with("processor/") && agent.ends_with(" (+webhooks)")),
        "{agents:?}"
    );

    // Scraped until the expiry job has run once and the delivery is counted.
    let http = reqwest::Client::new();
    let mut text = String::new();
    for _ in 0..100 {
        text = http
            .get(format!("{address}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("processor_expiry_run_duration_seconds_count")
            && text.contains(
                r#"processor_webhook_deliveries_total{sender="processor",outcome="delivered"} 1"#,
            )
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let series: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .collect();
    for name in [
        "processor_idempotency_outcomes_total{",
        r#"processor_job_up{job="processor-expiry"} 1"#,
        r#"processor_job_up{job="processor-outbox"} 1"#,
        "processor_job_last_success_timestamp_seconds{",
        "processor_expiry_deleted_rows_total{",
        "processor_expiry_run_duration_seconds_count",
        r#"processor_webhook_deliveries_total{sender="processor",outcome="delivered"} 1"#,
        "processor_webhook_deliveries_in_flight{",
    ] {
        assert!(
            series.iter().any(|line| line.starts_with(name)),
            "no {name}:\n{text}"
        );
    }
    let idempay: Vec<&&str> = series
        .iter()
        .filter(|line| !line.starts_with("processor_"))
        .collect();
    assert!(
        idempay.is_empty(),
        "series not the processor's: {idempay:?}"
    );
    child.kill().await.ok();
}

/// A call carries its key's deadline (`Call-Deadline`), and the processor checks it right before
/// it acts, after its latency: a deadline that passes during the latency refuses the call, 422
/// `call-deadline-passed`, known not done. Nothing is stored under the key: no charge, no key left
/// to replay, so a read of what was made under it answers "nothing" at once, and the same key
/// with a later deadline makes the charge.
#[api_test]
async fn a_call_that_reaches_its_deadline_before_it_acts_is_refused_and_stores_nothing() {
    let processor = TestProcessor::spawn_with(with(|settings| {
        settings.faults.latency = Duration::from_millis(600);
    }))
    .await;
    let client = processor.client(Duration::from_secs(5));
    let key = new_key();
    let soon = chrono::Utc::now() + chrono::Duration::milliseconds(200);

    let late = client.until(soon).charge(&key, &visa(4200)).await;

    let ProcessorOutcome::NotDone(refusal) = &late else {
        panic!("{late:?}");
    };
    assert_eq!(refusal.status, Some(422), "{refusal:?}");
    assert_eq!(
        refusal.problem(),
        Some(::processor::problem::ProblemKind::CallDeadlinePassed),
        "{refusal:?}"
    );
    assert_eq!(processor.count("processor_charges").await, 0);
    assert_eq!(
        processor.count("idempotency_keys").await,
        0,
        "the key released"
    );
    assert!(client.charges_made_under(&key).await.unwrap().is_empty());

    let later = chrono::Utc::now() + chrono::Duration::seconds(30);
    let made = client.until(later).charge(&key, &visa(4200)).await;
    assert!(matches!(made, ProcessorOutcome::Done(_)), "{made:?}");
    assert_eq!(processor.count("processor_charges").await, 1);
}

/// A `Call-Deadline` that is no instant is refused before anything, 400 naming the header.
#[api_test]
async fn a_malformed_call_deadline_is_refused_naming_the_header() {
    let processor = TestProcessor::spawn().await;
    let request = processor
        .http()
        .post(format!("{}/v1/charges", processor.address))
        .bearer_auth(API_KEY)
        .header("idempotency-key", new_key())
        .header("call-deadline", "tomorrow")
        .json(&serde_json::json!({
            "amount": 100, "currency": "eur", "payment_method": "pm_card_visa"
        }));

    let refused = processor.send(request).await;

    refused.assert_problem(400, "invalid-request");
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap()
            .contains("Call-Deadline"),
        "{}",
        refused.json()
    );
    assert_eq!(processor.count("processor_charges").await, 0);
}
