//! The clients: each intent sent with the crate `client` (one key per intent, the same body on
//! every retry) over the instances, the cardholder's bank opening disputes at the processor, and
//! processor events delivered again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{AttemptResult, Client, ClientError, NewPayment, NewRefund, RetryPolicy};
use serde_json::{Value, json};

use crate::coverage::Seen;
use crate::plan::{Rng, Want};
use crate::run::{Answer, PROCESSOR_KEY, Schedule};

/// The retrying client of the fault phase: its deadline is short, so that an intent whose
/// instance is down moves to another one; the final phase gives each a minute. Each attempt waits
/// `hang_up_after` for its answer, while the clients hang up ([`Schedule::hang_up_after`]), else
/// 15 s.
fn policy(deadline: Duration, hang_up_after: Option<Duration>) -> RetryPolicy {
    RetryPolicy {
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
        attempt_timeout: hang_up_after.unwrap_or(Duration::from_secs(15)),
        deadline,
    }
}

/// One call of intent `k` (a payment or a refund) through instance `instance`, retried by the
/// client until a final answer or `deadline`. `None`: no final answer (outcome unknown, or not
/// sent), and the intent is tried again.
pub async fn send(
    s: &Arc<Schedule>,
    k: usize,
    instance: usize,
    deadline: Duration,
) -> Option<Answer> {
    let intent = &s.plan.intents[k];
    let hang_up_after = s.hang_up_after();
    let observer = {
        let s = Arc::clone(s);
        move |attempt: &client::Attempt| {
            let result = match attempt.result {
                AttemptResult::NotSent => "not sent".to_owned(),
                AttemptResult::NoAnswer if hang_up_after.is_some() => {
                    s.coverage.saw(Seen::HungUp);
                    format!("hung up after {:?}", hang_up_after.unwrap_or_default())
                }
                AttemptResult::NoAnswer => "no answer".to_owned(),
                AttemptResult::Status { status, .. } => {
                    // During a deploy, a 5xx but the retryable 503 is one release failing on
                    // what the other wrote (deploy.rs).
                    if s.deploy.is_some() && status >= 500 && status != 503 {
                        s.trouble(
                            "5xx during a deploy",
                            format!(
                                "intent {k} @i{instance} attempt {}: {status}",
                                attempt.number
                            ),
                        );
                    }
                    status.to_string()
                }
            };
            let next = attempt
                .retry_in
                .map_or(String::new(), |delay| format!(", retry in {delay:.1?}"));
            s.timeline.log(format!(
                "  intent {k} @i{instance} attempt {}: {result}{next}",
                attempt.number
            ));
        }
    };
    let client = Client::new(s.instance_address(instance), &s.api_key)
        .with_policy(policy(deadline, hang_up_after))
        .on_attempt(observer);
    let key = Some(s.key_sent(k));
    let (what, result) = match &intent.want {
        Want::Pay { amount, method } => {
            let payment = NewPayment {
                amount: *amount,
                currency: "eur".to_owned(),
                payment_method: Some((*method).to_owned()),
                ..NewPayment::default()
            };
            let result = client.create_payment(&payment, key).await;
            (format!("pay {amount}"), answer(result, |p| p.id.clone()))
        }
        Want::Refund { of, amount } => {
            let payment = s.answer(*of)?.id?;
            let refund = NewRefund {
                amount: Some(*amount),
                ..NewRefund::default()
            };
            let result = client.refund_payment(&payment, &refund, key).await;
            (
                format!("refund {amount} of intent {of} ({payment})"),
                answer(result, |r| r.id.clone()),
            )
        }
        Want::Authorize { amount } => {
            let payment = NewPayment {
                amount: *amount,
                currency: "eur".to_owned(),
                capture_method: Some("manual".to_owned()),
                ..NewPayment::default()
            };
            let result = client.create_payment(&payment, key).await;
            (
                format!("authorize {amount}"),
                answer(result, |p| p.id.clone()),
            )
        }
        Want::Capture { of, amount } => {
            let payment = s.answer(*of)?.id?;
            let result = client.capture_payment(&payment, Some(*amount), key).await;
            (
                format!("capture {amount} of intent {of} ({payment})"),
                answer(result, |p| p.id.clone()),
            )
        }
        Want::Cancel { of } => {
            let payment = s.answer(*of)?.id?;
            let result = client
                .cancel_payment(&payment, Some("abandoned"), key)
                .await;
            (
                format!("cancel intent {of} ({payment})"),
                answer(result, |p| p.id.clone()),
            )
        }
        Want::Reuse { of, amount } => {
            let payment = NewPayment {
                amount: *amount,
                currency: "eur".to_owned(),
                payment_method: Some("pm_card_visa".to_owned()),
                ..NewPayment::default()
            };
            let result = client.create_payment(&payment, key).await;
            (
                format!("pay {amount} under the key of intent {of}"),
                answer(result, |p| p.id.clone()),
            )
        }
        Want::Twin { of } => {
            let Want::Pay { amount, method } = s.plan.intents[*of].want else {
                unreachable!("a twin is of a payment intent")
            };
            let payment = NewPayment {
                amount,
                currency: "eur".to_owned(),
                payment_method: Some(method.to_owned()),
                ..NewPayment::default()
            };
            let result = client.create_payment(&payment, key).await;
            (
                format!("pay {amount} as intent {of}'s second client"),
                answer(result, |p| p.id.clone()),
            )
        }
        Want::Dispute { .. } => unreachable!("disputes are not sent to idempay"),
    };
    match result {
        Ok(answer) => {
            s.timeline
                .log(format!("intent {k} {what} @i{instance} → {answer}"));
            Some(answer)
        }
        Err(why) => {
            s.timeline.log(format!(
                "intent {k} {what} @i{instance} → no final answer: {why}"
            ));
            None
        }
    }
}

/// [`send`], and when the answer is that the key is held for an operator
/// (`idempotency-key-held`), the operator's part: `idempay keys settle` from the processor's
/// ledger, as ops/runbooks.md says, then the client's retry, which gets the settled result. A
/// settle that does not settle (the processor unreachable, or the key being settled by another
/// operator: two clients of one intent each call one) is run again a second later, as the runbook
/// says, until `deadline`.
pub async fn send_settling(
    s: &Arc<Schedule>,
    k: usize,
    instance: usize,
    deadline: Duration,
) -> Option<Answer> {
    let until = Instant::now() + deadline;
    loop {
        let answer = send(
            s,
            k,
            instance,
            until.saturating_duration_since(Instant::now()),
        )
        .await?;
        let held = answer
            .problem
            .as_deref()
            .is_some_and(|problem| problem.ends_with("idempotency-key-held"));
        if !held {
            return Some(answer);
        }
        if settle(s, k).await {
            s.coverage.saw(Seen::Settled);
            return send(
                s,
                k,
                instance,
                until.saturating_duration_since(Instant::now()),
            )
            .await;
        }
        // Not settled: the key stays held (or another settle holds it), and the client's next
        // attempt meets it again, or its settled answer.
        if Instant::now() + Duration::from_secs(1) >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `idempay keys settle` of intent `k`'s key, as an operator runs it; whether it settled the key.
async fn settle(s: &Arc<Schedule>, k: usize) -> bool {
    let key = s.key_sent(k);
    let account: Option<String> =
        sqlx::query_scalar("SELECT account_id FROM idempotency_keys WHERE idem_key = $1 LIMIT 1")
            .bind(&key)
            .fetch_optional(&s.db)
            .await
            .unwrap_or(None);
    let Some(account) = account else {
        s.trouble(
            "settle not run",
            format!("held key {key}: its account not found"),
        );
        return false;
    };
    let env = s.operator_env();
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    let settled =
        crate::world::idempay(&["keys", "settle", &key, "--account", &account], &env).await;
    let said = String::from_utf8_lossy(&settled.stderr);
    s.timeline.log(format!(
        "OPERATOR settles held key {key}: {} {}",
        settled.status,
        said.lines().last().unwrap_or("")
    ));
    settled.status.success()
}

/// A client's result as a final answer, or why it is none.
fn answer<T>(
    result: Result<client::Answer<T>, ClientError>,
    id: impl Fn(&T) -> String,
) -> Result<Answer, String> {
    match result {
        Ok(answer) => Ok(Answer {
            status: answer.status,
            problem: None,
            id: Some(id(&answer.value)),
            replayed: answer.replayed,
        }),
        Err(ClientError::Api {
            problem, replayed, ..
        }) => Ok(Answer {
            status: problem.status,
            id: problem
                .extensions
                .get("payment")
                .and_then(Value::as_str)
                .map(str::to_owned),
            problem: Some(problem.type_uri),
            replayed,
        }),
        Err(ClientError::Unexpected { status, body }) => Ok(Answer {
            status,
            problem: Some(format!("undocumented answer: {body}")),
            id: None,
            replayed: false,
        }),
        Err(error) => Err(error.to_string()),
    }
}

/// Intent `k` during the fault phase: sent at its time, to its instance first, then to others
/// while it has no final answer, until the phase ends.
pub async fn during_faults(s: Arc<Schedule>, k: usize) {
    let intent = s.plan.intents[k].clone();
    tokio::time::sleep_until((s.started + intent.at).into()).await;
    let mut rng = Rng::new(s.plan.seed ^ (k as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
    let mut instance = intent.instance;
    match intent.want {
        Want::Pay { .. }
        | Want::Refund { .. }
        | Want::Authorize { .. }
        | Want::Capture { .. }
        | Want::Cancel { .. }
        | Want::Reuse { .. }
        | Want::Twin { .. } => {
            if let Some(of) = intent.want.waits_for() {
                // A refund waits for its payment's answer: only a paid payment is refunded; a
                // capture or cancel for its authorization's.
                loop {
                    match s.answer(of) {
                        Some(paid) if paid.status == 201 => break,
                        Some(_) => return s.skip(k, "its payment was not paid or authorized"),
                        None if Instant::now() >= s.phase_end => return,
                        None => tokio::time::sleep(Duration::from_millis(200)).await,
                    }
                }
            }
            while Instant::now() < s.phase_end {
                if let Some(answer) = send_settling(&s, k, instance, Duration::from_secs(8)).await {
                    s.set_answer(k, answer);
                    return;
                }
                instance = rng.pick(s.plan.instances.len());
            }
        }
        Want::Dispute { of, amount, early } => dispute(&s, k, of, amount, early, s.phase_end).await,
    }
}

/// Opens the dispute of intent `k` at the processor, on the charge of payment intent `of`, as
/// soon as that charge exists (whether idempay recorded it or not), until `until`; an `early`
/// one waits for a charge idempay has not recorded, while the payment has no final answer.
pub async fn dispute(
    s: &Arc<Schedule>,
    k: usize,
    of: usize,
    amount: i64,
    early: bool,
    until: Instant,
) {
    let Want::Pay { amount: paid, .. } = s.plan.intents[of].want else {
        unreachable!("a dispute names a payment intent")
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client");
    while Instant::now() < until {
        if s.answer(of).is_some_and(|answer| answer.status != 201) {
            return s.skip(k, "its payment was not paid");
        }
        // The charge, then whether idempay recorded it: two plain statements, as on Citus the
        // processor's ledger is a table of the coordinator's and `payments` is distributed across
        // the workers, and a subquery over both (or an `EXISTS` of `payments` alone) is refused
        // there.
        let charge: Option<String> = match sqlx::query_scalar(
            "SELECT id FROM processor_charges
             WHERE amount = $1 AND status = 'succeeded' ORDER BY created_at LIMIT 1",
        )
        .bind(paid)
        .fetch_optional(&s.db)
        .await
        {
            Ok(charge) => charge,
            Err(error) => {
                s.timeline
                    .log(format!("  intent {k}: the charge not read: {error}"));
                None
            }
        };
        let Some(charge) = charge else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let recorded =
            match sqlx::query_scalar::<_, i64>("SELECT count(*) FROM payments WHERE charge = $1")
                .bind(&charge)
                .fetch_one(&s.db)
                .await
            {
                Ok(count) => count > 0,
                Err(error) => {
                    s.timeline
                        .log(format!("  intent {k}: the payment not read: {error}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
        if early && recorded && s.answer(of).is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // Not keyed at the processor: a call whose answer was lost may have opened it.
        // A failed read (the database just crashed) is asked again, never taken for "not
        // opened": that would open the dispute a second time.
        let opened: Option<String> = match sqlx::query_scalar(
            "SELECT id FROM processor_disputes WHERE charge_id = $1 AND amount = $2",
        )
        .bind(&charge)
        .bind(amount)
        .fetch_optional(&s.db)
        .await
        {
            Ok(opened) => opened,
            Err(error) => {
                s.timeline
                    .log(format!("  intent {k}: the disputes not read: {error}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(dispute) = opened {
            return s.set_answer(k, Answer::made(dispute));
        }
        let sent = http
            .post(format!(
                "{}/v1/charges/{charge}/disputes",
                s.processor_address
            ))
            .bearer_auth(PROCESSOR_KEY)
            .json(&json!({ "amount": amount }))
            .send()
            .await;
        match sent {
            Ok(response) if response.status() == 201 => {
                let body: Value = response.json().await.unwrap_or_default();
                let dispute = body["id"].as_str().unwrap_or_default().to_owned();
                s.timeline.log(format!(
                    "intent {k} dispute {amount} of intent {of}: {dispute} on {charge} at the \
                     processor ({})",
                    if recorded {
                        "its payment recorded"
                    } else {
                        "its payment NOT recorded yet: an early event"
                    }
                ));
                if !recorded {
                    deliver_now(s, &dispute).await;
                }
                return s.set_answer(k, Answer::made(dispute));
            }
            Ok(response) => s.timeline.log(format!(
                "intent {k} dispute on {charge}: {} {}",
                response.status(),
                response.text().await.unwrap_or_default()
            )),
            Err(error) => s
                .timeline
                .log(format!("intent {k} dispute on {charge}: {error}")),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Delivers the event of `dispute` from the processor's outbox to instance 0 at once, as a fast
/// sender would: before idempay has recorded the charge it names. The outbox's own delivery of it
/// follows, with the same `webhook-id`. Answered, it must be acknowledged (parked, or applied if
/// the charge was recorded meanwhile): a refusal would leave the event to the sender's patience.
/// Unanswered (instance 0 down or paused), or answered 503 (its database restarting), the outbox
/// delivers it later.
async fn deliver_now(s: &Schedule, dispute: &str) {
    // The processor committed the dispute and its event in one transaction before it answered, so
    // a read that finds no event is a lost event. A read that fails is no answer at all: the
    // database crashed just before (the explorer's connections with it) and is coming back. It is
    // read again, for up to READ_WAIT, rather than taken for an empty outbox.
    const READ_WAIT: Duration = Duration::from_secs(10);
    let reading = Instant::now();
    let event: Option<(String, Vec<u8>)> = loop {
        let read = sqlx::query_as(
            "SELECT event_id, body FROM webhook_deliveries
             WHERE url LIKE '%/v1/webhooks/processor'
               AND convert_from(body, 'UTF8')::jsonb -> 'data' ->> 'dispute' = $1",
        )
        .bind(dispute)
        .fetch_optional(&s.db)
        .await;
        match read {
            Ok(event) => break event,
            Err(error) if reading.elapsed() < READ_WAIT => {
                s.timeline
                    .log(format!("  the event of {dispute} not read yet: {error}"));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Not an early event after all: the outbox delivers it when its time comes.
            Err(error) => {
                return s.timeline.log(format!(
                    "  the event of {dispute} not read within {READ_WAIT:?}: {error}; not sent early"
                ));
            }
        }
    };
    let Some((id, body)) = event else {
        return s.trouble(
            "early event not sent",
            format!("the event of {dispute} is not in the processor's outbox"),
        );
    };
    match deliver(s, &id, &body, 0).await {
        Some(200) => s.coverage.saw(Seen::EarlyEvent),
        // An outage's answer (the database restarting), not a refusal of the event: the sender
        // delivers it again, as when it is not answered at all.
        Some(503) | None => {}
        Some(status) => s.trouble(
            "early event refused",
            format!("{id}, about {dispute} before its charge was recorded, answered {status}"),
        ),
    }
}

/// Delivers one processor event, signed now, to an instance, and logs its answer; its status, if
/// it was answered.
async fn deliver(s: &Schedule, id: &str, body: &[u8], instance: usize) -> Option<u16> {
    let timestamp = chrono::Utc::now().timestamp();
    let signature = s.secrets.sign(id, timestamp, body).expect("UTF-8 ids");
    let kind = serde_json::from_slice::<Value>(body).unwrap_or_default()["type"].clone();
    let hang_up_after = s.hang_up_after();
    let sent = reqwest::Client::new()
        .post(format!(
            "{}/v1/webhooks/processor",
            s.instance_address(instance)
        ))
        .timeout(hang_up_after.unwrap_or(Duration::from_secs(5)))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp)
        .header("webhook-signature", signature)
        .body(body.to_vec())
        .send()
        .await;
    let (status, outcome) = match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (Some(status), format!("{status} {text}"))
        }
        Err(error) if error.is_timeout() && hang_up_after.is_some() => {
            s.coverage.saw(Seen::HungUp);
            (None, format!("hung up after {hang_up_after:?}"))
        }
        Err(error) => (None, error.to_string()),
    };
    s.timeline
        .log(format!("  delivered {id} ({kind}) @i{instance}: {outcome}"));
    status
}

/// Sends `count` processor events already delivered once again, picked and ordered by `rng`
/// (so some twice, most out of order), each to an instance `rng` picks, signed anew as a
/// redelivery is.
pub async fn redeliver(s: &Schedule, count: usize, rng: &mut Rng) {
    let delivered: Vec<(String, Vec<u8>)> = match sqlx::query_as(
        "SELECT event_id, body FROM webhook_deliveries
         WHERE url LIKE '%/v1/webhooks/processor' AND delivered_at IS NOT NULL ORDER BY id",
    )
    .fetch_all(&s.db)
    .await
    {
        Ok(rows) => rows,
        Err(error) => return s.timeline.log(format!("  redelivery: {error}")),
    };
    if delivered.is_empty() {
        return s.timeline.log("  redelivery: no event delivered yet");
    }
    for _ in 0..count {
        let (id, body) = &delivered[rng.pick(delivered.len())];
        let instance = rng.pick(s.plan.instances.len());
        // Counted once acknowledged: a redelivery answered 503 or not at all met no dedupe.
        if deliver(s, id, body, instance)
            .await
            .is_some_and(|status| (200..300).contains(&status))
        {
            s.coverage.saw(Seen::Redelivered);
        }
    }
}
