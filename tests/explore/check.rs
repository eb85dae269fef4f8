//! The invariants every schedule ends with, read from the one database both ledgers share, and
//! `idempay reconcile` run as an operator runs it.
//!
//! Each payment intent has an amount of its own, so the processor's charges are matched to their
//! intent by amount, whatever downstream key (or keys) made them.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::coverage::Seen;
use crate::plan::{DECLINED_CARD, Want};
use crate::run::{Answer, PROCESSOR_KEY, Schedule};
use crate::world::idempay;

/// One broken promise.
#[derive(Clone, Debug)]
pub struct Violation {
    /// What kind: `double charge`, `dispute lost`… (the summary counts them by kind).
    pub kind: &'static str,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.to_uppercase(), self.detail)
    }
}

#[derive(sqlx::FromRow)]
struct ChargeRow {
    id: String,
    amount: i64,
    status: String,
    amount_refunded: i64,
    amount_disputed: i64,
    idempotency_key: String,
    created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct PaymentRow {
    id: String,
    amount: i64,
    charge: Option<String>,
    /// What was captured: the whole amount on the payments before manual capture (NULL there).
    captured: i64,
    amount_refunded: i64,
    amount_disputed: i64,
}

/// Waits (up to 15 s) until the processor's outbox has delivered every event, so that the
/// disputes it announced have reached idempay, or been refused for good.
pub async fn until_events_delivered(s: &Schedule) {
    let started = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM webhook_deliveries
             WHERE url LIKE '%/v1/webhooks/processor' AND delivered_at IS NULL",
        )
        .fetch_one(&s.db)
        .await
        .unwrap_or(-1);
        if pending == 0 {
            return;
        }
        // Every fault has ended: an outbox that does not drain is a fault of its own, and the
        // checks after it would judge disputes and refunds on events that never arrived.
        if started.elapsed() > Duration::from_secs(60) {
            return s.trouble(
                "events undelivered",
                format!(
                    "{pending} processor event(s) still undelivered 60 s after the faults ended"
                ),
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Every invariant, as a list of what broke (empty: the schedule passed).
pub async fn invariants(
    s: &Schedule,
    answers: &[Option<Answer>],
    epoch: Option<DateTime<Utc>>,
) -> Vec<Violation> {
    let mut broken = Vec::new();
    let mut violation = |kind: &'static str, detail: String| {
        broken.push(Violation { kind, detail });
    };
    let at = |when: DateTime<Utc>| match epoch {
        Some(epoch) => format!("{:+.3}s", (when - epoch).num_milliseconds() as f64 / 1000.0),
        None => when.to_rfc3339(),
    };
    let charges: Vec<ChargeRow> = sqlx::query_as(
        "SELECT id, amount, status, amount_refunded, amount_disputed, idempotency_key, created_at
         FROM processor_charges ORDER BY created_at",
    )
    .fetch_all(&s.db)
    .await
    .expect("the processor's charges");
    let payments: Vec<PaymentRow> = sqlx::query_as(
        "SELECT id, amount, charge, COALESCE(amount_captured, amount) AS captured,
                    amount_refunded, amount_disputed
             FROM payments",
    )
    .fetch_all(&s.db)
    .await
    .expect("the payments");
    // (payment, count, sum) of idempay's refunds that stand; (charge, count, sum) of the
    // processor's.
    let sums = |query: &'static str| {
        let db = s.db.clone();
        async move {
            let rows: Vec<(String, i64, i64)> =
                sqlx::query_as(query).fetch_all(&db).await.expect(query);
            rows.into_iter()
                .map(|(id, count, sum)| (id, (count, sum)))
                .collect::<BTreeMap<_, _>>()
        }
    };
    let our_refunds = sums(
        "SELECT payment_id, count(*), sum(amount)::bigint FROM refunds
         WHERE status = 'succeeded' GROUP BY payment_id",
    )
    .await;
    let their_refunds = sums(
        "SELECT charge_id, count(*), sum(amount)::bigint FROM processor_refunds
         WHERE status = 'succeeded' GROUP BY charge_id",
    )
    .await;
    let our_disputes =
        sums("SELECT payment_id, count(*), sum(amount)::bigint FROM disputes GROUP BY payment_id")
            .await;
    let their_disputes = sums(
        "SELECT charge_id, count(*), sum(amount)::bigint FROM processor_disputes GROUP BY charge_id",
    )
    .await;
    let describe = |charge: &ChargeRow| {
        format!(
            "{} ({}, downstream key {}, committed {})",
            charge.id,
            charge.status,
            charge.idempotency_key,
            at(charge.created_at)
        )
    };

    let mut amounts = Vec::new();
    for (k, intent) in s.plan.intents.iter().enumerate() {
        let Want::Pay { amount, method } = intent.want else {
            continue;
        };
        amounts.push(amount);
        let name = format!("intent {k} (pay {amount}, key {})", s.key(k));
        let cs: Vec<&ChargeRow> = charges.iter().filter(|c| c.amount == amount).collect();
        let ps: Vec<&PaymentRow> = payments.iter().filter(|p| p.amount == amount).collect();
        let listed = cs
            .iter()
            .map(|c| describe(c))
            .collect::<Vec<_>>()
            .join(", ");
        if cs.len() > 1 {
            violation(
                "double charge",
                format!(
                    "{name}: {} charges at the processor: {listed}; {} payment(s) record {}",
                    cs.len(),
                    ps.len(),
                    ps.iter()
                        .map(|p| format!("{} → {}", p.id, p.charge.as_deref().unwrap_or("-")))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
        if ps.len() > 1 {
            violation("double payment", format!("{name}: {} payments", ps.len()));
        }
        // Every payment intent is one the processor takes or declines by its card: any other
        // final answer (a 409 held key, a 422, an undocumented one) is a schedule that did not
        // pay, whose ledgers would agree on nothing done.
        let expected = if method == DECLINED_CARD { 402 } else { 201 };
        if let Some(answer) = answers[k]
            .as_ref()
            .filter(|a| a.status != expected && !made_nothing(a))
        {
            violation(
                "unexpected answer",
                format!("{name}: answered {answer}, where its card is answered {expected}"),
            );
        }
        match &answers[k] {
            None => violation(
                "no final answer",
                format!("{name}: no final answer within a minute after the faults ended"),
            ),
            Some(answer) if matches!(answer.status, 201 | 402) => {
                let recorded = ps.len() == 1
                    && cs.len() == 1
                    && ps[0].charge.as_deref() == Some(cs[0].id.as_str())
                    && answer.id.as_deref() == Some(ps[0].id.as_str());
                if !recorded && cs.len() <= 1 {
                    violation(
                        "ledger mismatch",
                        format!(
                            "{name}: answered {answer}, yet charges [{listed}] and payments [{}]",
                            ps.iter()
                                .map(|p| p.id.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    );
                }
            }
            Some(answer) => {
                if !cs.is_empty() || !ps.is_empty() {
                    violation(
                        "refused but charged",
                        format!(
                            "{name}: answered {answer}, yet {} charge(s) [{listed}] and {} payment(s)",
                            cs.len(),
                            ps.len()
                        ),
                    );
                }
            }
        }
        // Refunds and disputes, on the payment and its charge when both are there once.
        let (Some(p), Some(c)) = (
            ps.first(),
            cs.iter()
                .find(|c| Some(&c.id) == ps.first().and_then(|p| p.charge.as_ref())),
        ) else {
            continue;
        };
        let ours = our_refunds.get(&p.id).copied().unwrap_or_default();
        let theirs = their_refunds.get(&c.id).copied().unwrap_or_default();
        if ours != theirs || p.amount_refunded != ours.1 || c.amount_refunded != theirs.1 {
            violation(
                if theirs.0 > ours.0 {
                    "double refund"
                } else {
                    "refund mismatch"
                },
                format!(
                    "{name}: payment {} has {} refund(s) of {} in all (amount_refunded {}); \
                     charge {} has {} of {} (amount_refunded {})",
                    p.id,
                    ours.0,
                    ours.1,
                    p.amount_refunded,
                    c.id,
                    theirs.0,
                    theirs.1,
                    c.amount_refunded
                ),
            );
        }
        let ours = our_disputes.get(&p.id).copied().unwrap_or_default();
        let theirs = their_disputes.get(&c.id).copied().unwrap_or_default();
        // What the disputes hold here is derived: the processor's disputed amount, at most what
        // was captured and not refunded (src/payments/disputed.rs).
        let held = c.amount_disputed.min(p.captured - p.amount_refunded);
        if ours != theirs || p.amount_disputed != held {
            violation(
                if theirs.0 > ours.0 {
                    "dispute lost"
                } else {
                    "dispute mismatch"
                },
                format!(
                    "{name}: payment {} has {} dispute(s) of {} (amount_disputed {}); charge {} \
                     has {} of {} (amount_disputed {})",
                    p.id,
                    ours.0,
                    ours.1,
                    p.amount_disputed,
                    c.id,
                    theirs.0,
                    theirs.1,
                    c.amount_disputed
                ),
            );
        }
        if p.amount_refunded + p.amount_disputed > p.amount {
            violation(
                "over the amount",
                format!(
                    "{name}: refunded {} and disputed {} of {}",
                    p.amount_refunded, p.amount_disputed, p.amount
                ),
            );
        }
    }
    for (k, intent) in s.plan.intents.iter().enumerate() {
        match intent.want {
            // The same key with another amount: refused 422 once its payment is paid, and
            // nothing of its amount made anywhere (a charge of it is a stray charge below too).
            Want::Reuse { of, amount } => {
                if answers[of].as_ref().is_none_or(|paid| paid.status != 201) {
                    continue;
                }
                let name = format!("intent {k} (pay {amount} under the key of intent {of})");
                let made = charges.iter().filter(|c| c.amount == amount).count()
                    + payments.iter().filter(|p| p.amount == amount).count();
                match &answers[k] {
                    Some(answer) if answer.status == 422 && made == 0 => {
                        s.coverage.saw(Seen::Reused);
                    }
                    answer => violation(
                        "reused key executed",
                        format!(
                            "{name}: answered {}, {made} charge(s) and payment(s) of its amount, \
                             where a key reused with another payload is refused 422 and makes nothing",
                            answer
                                .as_ref()
                                .map_or("nothing".to_owned(), ToString::to_string)
                        ),
                    ),
                }
            }
            // Two clients, one intent: one answer (the same status and payment), one payment
            // (the payment intent's own checks above count them).
            Want::Twin { of } => {
                let (ours, theirs) = (&answers[k], &answers[of]);
                let same = match (ours, theirs) {
                    (Some(ours), Some(theirs)) => {
                        ours.status == theirs.status && ours.id == theirs.id
                    }
                    _ => false,
                };
                if same {
                    s.coverage.saw(Seen::Twins);
                } else {
                    violation(
                        "two answers to one intent",
                        format!(
                            "intent {k} (intent {of} sent by a second client): answered {}, \
                             where intent {of} was answered {}",
                            ours.as_ref()
                                .map_or("nothing".to_owned(), ToString::to_string),
                            theirs
                                .as_ref()
                                .map_or("nothing".to_owned(), ToString::to_string)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    let (authorized, lines) = crate::captures::captures_as_asked(s, answers).await;
    amounts.extend(authorized);
    for line in lines {
        violation(line.0, line.1);
    }
    for charge in charges.iter().filter(|c| !amounts.contains(&c.amount)) {
        violation(
            "stray charge",
            format!("no intent has its amount: {}", describe(charge)),
        );
    }
    for line in refunds_and_disputes_as_asked(s, answers, &charges, &payments).await {
        violation(line.0, line.1);
    }

    let stuck: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT idem_key, scope, recovery_point FROM idempotency_keys
         WHERE status = 'in_progress' AND scope NOT LIKE 'processor:%' ORDER BY idem_key",
    )
    .fetch_all(&s.db)
    .await
    .expect("the keys");
    for (key, scope, point) in stuck {
        violation(
            "key left in progress",
            format!(
                "{key} ({scope}) at {} after every intent was answered",
                point.as_deref().unwrap_or("no recovery point")
            ),
        );
    }

    let url = s.db.connect_options().get_database().map(|database| {
        format!(
            "postgres://postgres:postgres@127.0.0.1:{}/{database}",
            s.db.connect_options().get_port()
        )
    });
    let reconciled = idempay(
        &["reconcile"],
        &[
            ("DATABASE_URL", url.as_deref().unwrap_or_default()),
            ("IDEMPAY_PROCESSOR_URL", &s.processor_address),
            ("IDEMPAY_PROCESSOR_API_KEY", PROCESSOR_KEY),
        ],
    )
    .await;
    let stdout = String::from_utf8_lossy(&reconciled.stdout);
    s.timeline.log(format!(
        "reconcile: {}",
        stdout.lines().last().unwrap_or("")
    ));
    if !reconciled.status.success() {
        violation(
            "reconcile",
            format!(
                "`idempay reconcile` exited {}: {}{}",
                reconciled.status,
                stdout.trim_end().replace('\n', "; "),
                String::from_utf8_lossy(&reconciled.stderr).trim_end()
            ),
        );
    }
    broken
}

/// Each refund and dispute against its intent: a refund of a paid payment answered 201, its answer
/// naming the one refund idempay recorded, of the intent's payment and amount; at the processor,
/// as many refunds of a charge as its payment's intents were answered 201 (so a refund made twice
/// and recorded twice, on both ledgers alike, is found); a dispute of a paid payment opened.
async fn refunds_and_disputes_as_asked(
    s: &Schedule,
    answers: &[Option<Answer>],
    charges: &[ChargeRow],
    payments: &[PaymentRow],
) -> Vec<(&'static str, String)> {
    let mut broken = Vec::new();
    let refunds: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT id, payment_id, amount FROM refunds")
            .fetch_all(&s.db)
            .await
            .expect("the refunds");
    let theirs: Vec<(String, i64)> =
        sqlx::query_as("SELECT charge_id, amount FROM processor_refunds")
            .fetch_all(&s.db)
            .await
            .expect("the processor's refunds");
    let paid = |of: usize| {
        answers[of]
            .as_ref()
            .filter(|answer| answer.status == 201)
            .and_then(|answer| answer.id.clone())
    };
    let mut asked = BTreeMap::<usize, usize>::new();
    for (k, intent) in s.plan.intents.iter().enumerate() {
        let name = format!("intent {k} ({:?}, key {})", intent.want, s.key(k));
        match intent.want {
            Want::Refund { of, amount } => {
                let Some(payment) = paid(of) else { continue };
                let Some(answer) = &answers[k] else {
                    broken.push(("no final answer", format!("{name}: none")));
                    continue;
                };
                if made_nothing(answer) {
                    // Settled by an operator: no refund under its key (the ledgers' counts
                    // below compare what was made).
                    continue;
                }
                if answer.status != 201 {
                    broken.push((
                        "unexpected answer",
                        format!("{name}: answered {answer}, the refund of a paid payment"),
                    ));
                    continue;
                }
                *asked.entry(of).or_default() += 1;
                let named = refunds
                    .iter()
                    .find(|(id, _, _)| Some(id) == answer.id.as_ref());
                if named.is_none_or(|(_, of_payment, of_amount)| {
                    *of_payment != payment || *of_amount != amount
                }) {
                    broken.push((
                        "refund not as asked",
                        format!(
                            "{name}: answered {answer}, and that refund is {named:?} in idempay's \
                             ledger, where the intent asks {amount} of {payment}"
                        ),
                    ));
                }
            }
            Want::Dispute { of, .. } => {
                if paid(of).is_some() && answers[k].is_none() {
                    broken.push((
                        "dispute not opened",
                        format!("{name}: its payment was paid, yet it was never opened"),
                    ));
                }
            }
            Want::Pay { .. }
            | Want::Authorize { .. }
            | Want::Capture { .. }
            | Want::Cancel { .. }
            | Want::Reuse { .. }
            | Want::Twin { .. } => {}
        }
    }
    for (of, count) in asked {
        let Some(payment) = paid(of) else { continue };
        let Some(charge) = payments
            .iter()
            .find(|p| p.id == payment)
            .and_then(|p| p.charge.as_ref())
            .filter(|charge| charges.iter().any(|c| &c.id == *charge))
        else {
            continue;
        };
        let made = theirs.iter().filter(|(of, _)| of == charge).count();
        if made != count {
            broken.push((
                "double refund",
                format!(
                    "payment intent {of} ({payment}): {count} refund intent(s) answered 201, \
                     {made} refund(s) of {charge} at the processor"
                ),
            ));
        }
    }
    broken
}

/// An operator settled the intent's held key and the processor had made nothing under it: a
/// final answer for any intent (409 `processor-made-nothing`), with nothing made.
pub(crate) fn made_nothing(answer: &Answer) -> bool {
    answer
        .problem
        .as_deref()
        .is_some_and(|problem| problem.ends_with("processor-made-nothing"))
}

/// Counts the work the schedule got done, and the takeovers and recoveries its keys met: a
/// takeover is a client's retry taking a lapsed key (every claim of the recovery job counts in a
/// key's `takeovers` too, and in its `recoveries`: taken out), a recovery a key the recovery job
/// resumed to an answer, as its instance's log says (`logs`).
pub async fn count_work(s: &Schedule, answers: &[Option<Answer>], logs: &std::path::Path) {
    for (k, intent) in s.plan.intents.iter().enumerate() {
        let status = answers[k].as_ref().map(|answer| answer.status);
        let seen = match (&intent.want, status) {
            (Want::Pay { .. }, Some(201)) => Seen::Paid,
            (Want::Pay { .. }, Some(402)) => Seen::Declined,
            (Want::Refund { .. }, Some(201)) => Seen::Refunded,
            (Want::Dispute { .. }, Some(201)) => Seen::Disputed,
            (Want::Capture { .. }, Some(200)) => Seen::Captured,
            (Want::Cancel { .. }, Some(200)) => Seen::Canceled,
            _ => continue,
        };
        s.coverage.saw(seen);
    }
    let keys: Option<(i64, i64)> = sqlx::query_as(
        // Read through `to_jsonb`: a binary of an older release (`IDEMPAY_BIN`) may have no such
        // column, and counts none, rather than fail the schedule on its schema.
        "SELECT COALESCE(sum((to_jsonb(k) ->> 'takeovers')::bigint), 0)::bigint,
                COALESCE(sum((to_jsonb(k) ->> 'recoveries')::bigint), 0)::bigint
         FROM idempotency_keys k WHERE scope NOT LIKE 'processor:%'",
    )
    .fetch_one(&s.db)
    .await
    .map_err(|error| s.trouble("coverage not read", format!("the keys' takeovers: {error}")))
    .ok();
    let (takeovers, claims) = keys.unwrap_or_default();
    s.coverage.add(
        Seen::Takeover,
        u32::try_from(takeovers - claims).unwrap_or(0),
    );
    s.coverage.add(Seen::Recovery, resumed_to_an_answer(logs));
}

/// How many keys the recovery jobs resumed to an answer other than a 5xx, by the instances' logs
/// ("recovery resumed a key … status=…").
fn resumed_to_an_answer(logs: &std::path::Path) -> u32 {
    let Ok(files) = std::fs::read_dir(logs) else {
        return 0;
    };
    let mut resumed = 0;
    for file in files.flatten() {
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        resumed += text
            .lines()
            .filter(|line| line.contains("recovery resumed a key"))
            .filter(|line| {
                line.split_whitespace()
                    .find_map(|field| field.strip_prefix("status="))
                    .is_some_and(|status| !status.starts_with('5'))
            })
            .count();
    }
    u32::try_from(resumed).unwrap_or(u32::MAX)
}

/// No backend of the schedule's database sits idle inside a transaction opened more than 2 s
/// before, once every intent has its answer: each would hold its locks, and what was written on
/// it, acknowledged or not, waits on a `COMMIT` nobody will send.
pub async fn no_transaction_left_open(s: &Schedule, database: &str) -> Vec<Violation> {
    let left: Vec<(i32, String, String)> = sqlx::query_as(
        "SELECT pid, coalesce(application_name, ''), left(coalesce(query, ''), 160)
         FROM pg_stat_activity
         WHERE datname = $1 AND state LIKE 'idle in transaction%'
           AND xact_start < now() - interval '2 seconds'",
    )
    .bind(database)
    .fetch_all(&s.db)
    .await
    .unwrap_or_default();
    left.into_iter()
        .map(|(pid, application, query)| Violation {
            kind: "transaction left open",
            detail: format!("backend {pid} ({application}) idle in a transaction, last: {query}"),
        })
        .collect()
}

/// What PostgreSQL says only to a connection inside a transaction its owner does not know of: a
/// `BEGIN` on it ("there is already a transaction in progress", 25001), or any statement once that
/// transaction failed ("current transaction is aborted", 25P02). Neither appears in any process's
/// log of a schedule.
pub fn no_stray_transaction_said(logs: &std::path::Path) -> Vec<Violation> {
    const SAID: [&str; 3] = [
        "already a transaction in progress",
        "current transaction is aborted",
        "25P02",
    ];
    let mut violations = Vec::new();
    let Ok(files) = std::fs::read_dir(logs) else {
        return violations;
    };
    for file in files.flatten() {
        let text = std::fs::read_to_string(file.path()).unwrap_or_default();
        for said in SAID {
            let count = text.matches(said).count();
            if count > 0 {
                violations.push(Violation {
                    kind: "stray transaction",
                    detail: format!(
                        "{} logged \"{said}\" {count} time(s)",
                        file.file_name().to_string_lossy()
                    ),
                });
            }
        }
    }
    violations
}
