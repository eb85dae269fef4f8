//! One schedule, start to end: a fresh database, the processor and the instances started, the
//! intents and the faults let loose for the plan's duration, every fault ended, every intent driven
//! to a final answer, and the invariants checked.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use service::outbox::WebhookSecrets;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::Mutex as AsyncMutex;

use crate::check::{self, Violation};
use crate::coverage::{Counts, Coverage, Seen};
use crate::deploy::{self, Deploy};
use crate::intents;
use crate::merchants::{self, Merchants};
use crate::plan::{Draws, Fault, Plan, Rng, Target, Want};
use crate::timeline::Timeline;
use crate::world::{Database, Link, Process, Ready, Stop, create_account, free_ports, idempay_of};

/// The processor's API key, shared by it, the instances and `reconcile`.
pub const PROCESSOR_KEY: &str = "pk_explore";

/// The final answer of an intent.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    /// The problem's type, for a refusal.
    pub problem: Option<String>,
    /// The payment, refund or dispute it made or names.
    pub id: Option<String>,
    pub replayed: bool,
}

impl Answer {
    /// A dispute opened at the processor.
    pub fn made(dispute: String) -> Self {
        Self {
            status: 201,
            problem: None,
            id: Some(dispute),
            replayed: false,
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.status)?;
        if let Some(problem) = &self.problem {
            write!(f, " {problem}")?;
        }
        if let Some(id) = &self.id {
            write!(f, " {id}")?;
        }
        if self.replayed {
            f.write_str(" (replayed)")?;
        }
        Ok(())
    }
}

/// How long a crash of the database waits for a client's 2xx answer, to strike just after it.
const ACK_WAIT: Duration = Duration::from_secs(3);

/// How long a pause waits for its target to be started again when it was drawn while the target
/// was down: longer than the longest kill a plan draws, shorter than a schedule's fault phase.
const PAUSE_WAIT: Duration = Duration::from_secs(5);

/// What a schedule's tasks share.
pub struct Schedule {
    pub plan: Plan,
    pub timeline: Timeline,
    pub started: Instant,
    pub phase_end: Instant,
    pub api_key: String,
    pub secrets: WebhookSecrets,
    pub db: PgPool,
    pub processor_address: String,
    instance_ports: Vec<u16>,
    answers: Mutex<Vec<Option<Answer>>>,
    processor: AsyncMutex<Process>,
    instances: Vec<AsyncMutex<Process>>,
    /// The processor's faults in force: given to it again when it restarts.
    faults: Mutex<(u64, f64, f64)>,
    /// The processes stopped now (SIGSTOP), until their pause ends.
    paused: Mutex<Vec<Target>>,
    database: Arc<Database>,
    /// What the schedule did and met.
    pub coverage: Coverage,
    /// What went wrong on the way, beside the invariants: a fault not injected, an early event
    /// refused. Each is a violation: the schedule did not test what it planned.
    trouble: Mutex<Vec<Violation>>,
    /// The processes' link to the database, slowed by [`Fault::SlowDatabase`].
    link: Link,
    /// Until when the clients hang up mid-request ([`Fault::HangUps`]), and how long each waits.
    hang_ups: Mutex<(Option<Instant>, Rng)>,
    /// The rolling deploy made during the schedule, if any (deploy.rs).
    pub deploy: Option<Deploy>,
}

impl Schedule {
    pub fn instance_address(&self, index: usize) -> String {
        format!("http://127.0.0.1:{}", self.instance_ports[index])
    }

    /// The idempotency key of intent `k`.
    pub fn key(&self, k: usize) -> String {
        format!("explore-{}-{k}", self.plan.seed)
    }

    /// The key intent `k` is sent under: its own, or the one of the intent it reuses or sends
    /// a second time.
    pub fn key_sent(&self, k: usize) -> String {
        match self.plan.intents[k].want {
            Want::Reuse { of, .. } | Want::Twin { of } => self.key(of),
            _ => self.key(k),
        }
    }

    pub fn answer(&self, k: usize) -> Option<Answer> {
        self.answers.lock().unwrap()[k].clone()
    }

    pub fn set_answer(&self, k: usize, answer: Answer) {
        self.answers.lock().unwrap()[k] = Some(answer);
    }

    /// The settings an operator's `idempay keys settle` runs with: the instances' own (the
    /// database, the processor, its timeout, the recovery window), as ops/runbooks.md says.
    pub fn operator_env(&self) -> Vec<(&str, String)> {
        let options = self.db.connect_options();
        let mut env = vec![
            (
                "DATABASE_URL",
                format!(
                    "postgres://postgres:postgres@127.0.0.1:{}/{}",
                    options.get_port(),
                    options.get_database().unwrap_or("postgres")
                ),
            ),
            ("IDEMPAY_PROCESSOR_URL", self.processor_address.clone()),
            ("IDEMPAY_PROCESSOR_API_KEY", PROCESSOR_KEY.to_owned()),
            (
                "IDEMPAY_PROCESSOR_TIMEOUT",
                format!("{}ms", self.plan.processor_timeout.as_millis()),
            ),
            ("IDEMPAY_LEASE", self.plan.lease.to_owned()),
        ];
        if let Some(window) = self.plan.recovery_window() {
            env.push((
                "IDEMPAY_RECOVERY_WINDOW",
                format!("{}ms", window.as_millis()),
            ));
        }
        env
    }

    /// How many intents have a final 2xx answer.
    fn acknowledged(&self) -> usize {
        self.answers
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .filter(|answer| (200..300).contains(&answer.status))
            .count()
    }

    /// How many intents were sent (their moment came) and have no final answer yet.
    fn in_flight(&self) -> usize {
        let elapsed = self.started.elapsed();
        let answers = self.answers.lock().unwrap();
        self.plan
            .intents
            .iter()
            .zip(answers.iter())
            .filter(|(intent, answer)| intent.at <= elapsed && answer.is_none())
            .count()
    }

    /// Intent `k` has nothing to do: its payment was refused or declined.
    pub fn skip(&self, k: usize, why: &str) {
        self.timeline.log(format!("intent {k} skipped: {why}"));
        self.set_answer(
            k,
            Answer {
                status: 0,
                problem: Some(format!("skipped: {why}")),
                id: None,
                replayed: false,
            },
        );
    }

    /// How long a client waits for an answer before it hangs up, while the clients hang up
    /// ([`Fault::HangUps`]): from 10 ms (before the request's first statement is answered) to
    /// 400 ms (after most requests are); `None` otherwise.
    pub fn hang_up_after(&self) -> Option<Duration> {
        let mut hang_ups = self.hang_ups.lock().unwrap();
        let (until, rng) = &mut *hang_ups;
        until
            .is_some_and(|until| Instant::now() < until)
            .then(|| rng.millis(10, 400))
    }

    pub fn trouble(&self, kind: &'static str, detail: String) {
        self.timeline
            .log(format!("  {}: {detail}", kind.to_uppercase()));
        self.trouble
            .lock()
            .unwrap()
            .push(Violation { kind, detail });
    }

    pub(crate) fn process(&self, target: Target) -> &AsyncMutex<Process> {
        match target {
            Target::Processor => &self.processor,
            Target::Instance(index) => &self.instances[index],
        }
    }

    pub(crate) fn is_paused(&self, target: Target) -> bool {
        self.paused.lock().unwrap().contains(&target)
    }

    pub(crate) fn processor_fault_env(&self) -> Vec<(String, String)> {
        let (latency, lose, fail) = *self.faults.lock().unwrap();
        vec![
            ("IDEMPAY_PROCESSOR_LATENCY".into(), format!("{latency}ms")),
            ("IDEMPAY_PROCESSOR_LOSE_ANSWERS".into(), lose.to_string()),
            ("IDEMPAY_PROCESSOR_FAIL".into(), fail.to_string()),
        ]
    }

    /// Gives the running processor the faults in force, asking again for up to 5 s. Not set,
    /// the schedule would go on without the faults it planned: that fails it.
    async fn put_faults(&self) {
        let (latency_ms, lose_answers, fail) = *self.faults.lock().unwrap();
        let mut error = String::new();
        for _ in 0..5 {
            let put = reqwest::Client::new()
                .put(format!("{}/v1/test/faults", self.processor_address))
                .bearer_auth(PROCESSOR_KEY)
                .timeout(Duration::from_secs(1))
                .json(&serde_json::json!({
                    "latency_ms": latency_ms, "lose_answers": lose_answers, "fail": fail
                }))
                .send()
                .await;
            match put.and_then(|response| response.error_for_status()) {
                Ok(_) => return,
                Err(failed) => error = failed.to_string(),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.trouble(
            "fault not injected",
            format!(
                "the processor's faults (latency {latency_ms}ms, lose_answers {lose_answers}, \
                 fail {fail}) not set: {error}"
            ),
        );
    }

    async fn start_processor(&self) {
        let env = self.processor_fault_env();
        let mut processor = self.processor.lock().await;
        if processor.is_up() {
            return;
        }
        match processor.start(&env).await {
            Ok(()) => self.timeline.log("  processor up"),
            Err(error) => self.not_started(Target::Processor, processor.binary(), &error),
        }
    }

    async fn start_instance(&self, index: usize) {
        let mut instance = self.instances[index].lock().await;
        if instance.is_up() {
            return;
        }
        match instance.start(&[]).await {
            Ok(()) => self.timeline.log(format!("  instance {index} up")),
            Err(error) => self.not_started(Target::Instance(index), instance.binary(), &error),
        }
    }

    /// A process that did not start: logged; during a deploy, a violation, as each release must
    /// start on the schema the other left (a restart after a kill included).
    fn not_started(&self, target: Target, binary: &str, error: &str) {
        if self.deploy.is_some() {
            self.trouble(
                "process not started",
                format!("{target} on {binary}: {error}"),
            );
        } else {
            self.timeline.log(format!("  {target} NOT up: {error}"));
        }
    }

    /// Strikes one fault; a killed process is restarted by a task of its own after its downtime.
    async fn strike(
        self: &Arc<Self>,
        fault: &Fault,
        rng: &mut Rng,
    ) -> Option<tokio::task::JoinHandle<()>> {
        self.timeline.log(format!("FAULT {fault}"));
        match *fault {
            Fault::Processor {
                latency_ms,
                lose_answers,
                fail,
            } => {
                *self.faults.lock().unwrap() = (latency_ms, lose_answers, fail);
                if self.is_paused(Target::Processor) {
                    // Set when it continues: a stopped process answers nothing.
                    self.timeline
                        .log("  the processor is paused: set when it continues");
                } else if self.processor.lock().await.is_up() {
                    self.put_faults().await;
                }
                None
            }
            Fault::KillProcessor { down } => {
                let mut processor = self.processor.lock().await;
                if !processor.is_up() {
                    self.timeline.log("  the processor is down already");
                    return None;
                }
                processor.kill().await;
                self.coverage.saw(Seen::ProcessorKilled);
                let s = Arc::clone(self);
                Some(tokio::spawn(async move {
                    tokio::time::sleep(down).await;
                    s.start_processor().await;
                }))
            }
            Fault::KillInstance { index, down } => {
                let mut instance = self.instances[index].lock().await;
                if !instance.is_up() {
                    self.timeline.log("  the instance is down already");
                    return None;
                }
                instance.kill().await;
                self.coverage.saw(Seen::InstanceKilled);
                let s = Arc::clone(self);
                Some(tokio::spawn(async move {
                    tokio::time::sleep(down).await;
                    s.start_instance(index).await;
                }))
            }
            Fault::RestartDatabase => {
                match self.database.restart(Stop::Fast).await {
                    Ok(()) => {
                        self.coverage.saw(Seen::DatabaseRestarted);
                        self.timeline.log("  the database up");
                    }
                    Err(error) => {
                        self.trouble("fault not injected", format!("database restart: {error}"))
                    }
                }
                None
            }
            Fault::CrashDatabase => {
                // Aimed at the window where a lost commit would show: just after a client was
                // answered 2xx (its commit acknowledged, and not durable unless it reached the
                // disk first). The kill waits up to ACK_WAIT for the next such answer.
                let acknowledged = self.acknowledged();
                let waiting = Instant::now();
                while self.acknowledged() == acknowledged && waiting.elapsed() < ACK_WAIT {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let aimed = if self.acknowledged() > acknowledged {
                    format!(
                        "at once after a 2xx answer, which came {:?} into the wait",
                        waiting.elapsed()
                    )
                } else {
                    format!("no 2xx answer within {ACK_WAIT:?}")
                };
                // What the crash cut into: the intents sent and not answered yet. A crash with
                // none on their way proves nothing about acknowledged work, and is not counted.
                let in_flight = self.in_flight();
                match self.database.restart(Stop::Crash).await {
                    Ok(()) => {
                        self.timeline.log(format!(
                            "  the database up after its crash (killed {aimed}, {in_flight} \
                             intent(s) on their way)"
                        ));
                        if in_flight > 0 {
                            self.coverage.saw(Seen::DatabaseCrashed);
                        }
                    }
                    Err(error) => {
                        self.trouble("fault not injected", format!("database crash: {error}"))
                    }
                }
                None
            }
            Fault::Redeliver { count } => {
                intents::redeliver(self, count, rng).await;
                None
            }
            Fault::Pause { target, pause } => {
                let s = Arc::clone(self);
                Some(tokio::spawn(async move {
                    // A pause drawn while its target is down (killed just before) waits for it to
                    // be started again, for up to PAUSE_WAIT: a plan's pause that never happens is
                    // a schedule that did not run as drawn (and a replay of it fails so).
                    let waiting = Instant::now();
                    loop {
                        if s.process(target).lock().await.signal("STOP") {
                            break;
                        }
                        if waiting.elapsed() >= PAUSE_WAIT || Instant::now() >= s.phase_end {
                            s.timeline.log(format!(
                                "  {target} is down for {:.1?}: not paused",
                                waiting.elapsed()
                            ));
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    if waiting.elapsed() >= Duration::from_millis(50) {
                        s.timeline.log(format!(
                            "  {target} paused {:.1?} late: it was down",
                            waiting.elapsed()
                        ));
                    }
                    s.paused.lock().unwrap().push(target);
                    s.coverage.saw(Seen::Paused);
                    tokio::time::sleep(pause).await;
                    // Killed meanwhile, it was restarted running: nothing to continue.
                    s.process(target).lock().await.signal("CONT");
                    s.paused.lock().unwrap().retain(|paused| *paused != target);
                    s.timeline.log(format!("  {target} continued"));
                    if target == Target::Processor {
                        s.put_faults().await;
                    }
                }))
            }
            Fault::SlowDatabase { delay_ms } => {
                self.link.delay(Duration::from_millis(delay_ms));
                if delay_ms > 0 {
                    self.coverage.saw(Seen::SlowDatabase);
                }
                None
            }
            Fault::HangUps { span } => {
                let until = Instant::now() + span;
                self.hang_ups.lock().unwrap().0 = Some(until);
                // The webhook intake is hung up on too, where a request's own future opens the
                // transaction: events already delivered, sent again throughout the span by a
                // sender that gives up as the clients do.
                let s = Arc::clone(self);
                let mut rng = Rng::new(rng.next_u64());
                Some(tokio::spawn(async move {
                    while Instant::now() < until {
                        intents::redeliver(&s, 4, &mut rng).await;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }))
            }
        }
    }
}

/// The outcome of one schedule.
pub struct Outcome {
    pub plan: Plan,
    pub violations: Vec<Violation>,
    pub coverage: Counts,
    pub timeline: String,
    pub logs: PathBuf,
    pub took: Duration,
}

pub async fn run(
    database: Arc<Database>,
    seed: u64,
    draws: Draws,
    deploy: Option<&Deploy>,
) -> Outcome {
    let begun = Instant::now();
    let plan = Plan::draw(seed, draws);
    let name = format!("explore_{seed}");
    database.create_database(&name).await;
    let url = database.url(&name);
    // Before a deploy, the schema is the previous release's.
    let first = deploy.map_or_else(crate::world::binary, |deploy| deploy.previous.clone());
    let migrated = idempay_of(&first, database.migrate_args(), &[("DATABASE_URL", &url)]).await;
    assert!(migrated.status.success(), "migrate: {migrated:?}");
    let (api_key, _) = create_account(&url, "explorer").await;
    // Merchant endpoints in today's draws only: waiting for their last deliveries adds about
    // 10 s to a schedule, and the regression seeds replay what they failed on without them.
    let merchants = if plan.draws == Draws::Current {
        Some(Merchants::start(&url).await)
    } else {
        None
    };
    let logs = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("explore/seed-{seed}"));
    std::fs::remove_dir_all(&logs).ok();
    std::fs::create_dir_all(&logs).expect("the logs' directory");

    // Every process reaches the database over the link a slow-link fault slows; the explorer's
    // own statements (the set-up above, the checks) go straight to it.
    let link = Link::to(&url).await;
    let linked = link.url(&url);
    let secrets = WebhookSecrets::generate();
    let mut ports = free_ports(1 + plan.instances.len());
    let processor_port = ports.remove(0);
    let instance_ports = ports;
    let common = |name: &str, value: &str| (name.to_owned(), value.to_owned());
    // Authorizations that lapse within the schedule, released by an expiry job that looks every
    // second; otherwise the processor's defaults (a week, every minute).
    let lapsing = plan.authorization_ttl.map_or_else(Vec::new, |ttl| {
        vec![
            common(
                "IDEMPAY_PROCESSOR_AUTHORIZATION_TTL",
                &format!("{}ms", ttl.as_millis()),
            ),
            common("IDEMPAY_EXPIRY_INTERVAL", "1s"),
        ]
    });
    let mut processor = Process::new(
        "processor",
        &["processor"],
        [
            vec![
                common("DATABASE_URL", &linked),
                common(
                    "IDEMPAY_PROCESSOR_LISTEN",
                    &format!("127.0.0.1:{processor_port}"),
                ),
                common("IDEMPAY_PROCESSOR_API_KEY", PROCESSOR_KEY),
                common("IDEMPAY_LEASE", plan.lease),
                common("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
                common("IDEMPAY_WEBHOOK_SECRET", &secrets.expose()),
                common(
                    "IDEMPAY_PROCESSOR_WEBHOOK_URL",
                    &format!(
                        "http://127.0.0.1:{}/v1/webhooks/processor",
                        instance_ports[0]
                    ),
                ),
                // Every half second, for longer than any schedule: late, never given up. Then a
                // last delay of 27 h, as `processor` refuses to give an event up before it forgot its
                // keys (a day).
                common(
                    "IDEMPAY_WEBHOOK_RETRY_SCHEDULE",
                    &[vec!["500ms"; 400], vec!["27h"]].concat().join(","),
                ),
                common("IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT", "2s"),
            ],
            lapsing,
        ]
        .concat(),
        processor_port,
        &logs,
        Ready::Processor {
            api_key: PROCESSOR_KEY.to_owned(),
        },
    );
    processor.set_binary(&first);
    let processor_address = processor.address();
    let instances = plan
        .instances
        .iter()
        .zip(&instance_ports)
        .enumerate()
        .map(|(index, (settings, port))| {
            let mut instance = Process::new(
                &format!("instance-{index}"),
                &["serve"],
                vec![
                    common("DATABASE_URL", &linked),
                    common("IDEMPAY_LISTEN", &format!("127.0.0.1:{port}")),
                    common("IDEMPAY_PROCESSOR_URL", &processor_address),
                    common("IDEMPAY_PROCESSOR_API_KEY", PROCESSOR_KEY),
                    common(
                        "IDEMPAY_PROCESSOR_TIMEOUT",
                        &format!("{}ms", plan.processor_timeout.as_millis()),
                    ),
                    common("IDEMPAY_RECOVERY_INTERVAL", settings.recovery_interval),
                    common("IDEMPAY_LEASE", plan.lease),
                    common("IDEMPAY_DATABASE_ACQUIRE_TIMEOUT", "1s"),
                    common("IDEMPAY_WEBHOOK_SECRET", &secrets.expose()),
                    // The merchant endpoints are the explorer's receiver, on loopback.
                    common("IDEMPAY_WEBHOOK_ALLOW_PRIVATE", "true"),
                    // Deliveries looked for every 200 ms, not every second: the check waits for
                    // the last of them after every intent's answer.
                    common("IDEMPAY_WEBHOOK_POLL_INTERVAL", "200ms"),
                    common(
                        "IDEMPAY_WEBHOOK_RETRY_SCHEDULE",
                        &merchants::retry_schedule(),
                    ),
                ]
                .into_iter()
                .chain(plan.recovery_window().map(|window| {
                    common(
                        "IDEMPAY_RECOVERY_WINDOW",
                        &format!("{}ms", window.as_millis()),
                    )
                }))
                .collect(),
                *port,
                &logs,
                Ready::Readyz,
            );
            instance.set_binary(&first);
            AsyncMutex::new(instance)
        })
        .collect();
    let db = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&url)
        .await
        .expect("the explorer's pool");
    let intents = plan.intents.len();
    let now = Instant::now();
    let s = Arc::new(Schedule {
        timeline: Timeline::default(),
        started: now,
        phase_end: now,
        api_key,
        secrets,
        db,
        processor_address,
        instance_ports,
        answers: Mutex::new(vec![None; intents]),
        processor: AsyncMutex::new(processor),
        instances,
        faults: Mutex::new((0, 0.0, 0.0)),
        paused: Mutex::new(Vec::new()),
        database,
        coverage: Coverage::default(),
        trouble: Mutex::new(Vec::new()),
        link,
        hang_ups: Mutex::new((None, Rng::new(seed.rotate_left(11) ^ 0x4A96_0995))),
        plan,
        deploy: deploy.cloned(),
    });
    s.timeline.log(format!("seed {seed}: {}", s.plan));
    if let Some(deploy) = &s.deploy {
        s.timeline.log(format!("with {deploy}"));
    }
    s.start_processor().await;
    futures::future::join_all((0..s.instances.len()).map(|index| s.start_instance(index))).await;
    if let Some(merchants) = &merchants {
        merchants.register(&s).await;
    }
    // The schedule's clock starts once everything runs.
    let s = {
        let mut owned = Arc::into_inner(s).expect("no other owner yet");
        owned.started = Instant::now();
        owned.phase_end = owned.started + owned.plan.duration;
        Arc::new(owned)
    };
    let database_epoch: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar("SELECT now()")
        .fetch_one(&s.db)
        .await
        .ok();
    s.timeline.log("faults and intents begin");

    let clients: Vec<_> = (0..intents)
        .map(|k| tokio::spawn(intents::during_faults(Arc::clone(&s), k)))
        .collect();
    let faults = {
        let s = Arc::clone(&s);
        tokio::spawn(async move {
            let mut rng = Rng::new(s.plan.seed.rotate_left(17) ^ 0xFA17);
            let mut restarts = Vec::new();
            for (at, fault) in s.plan.faults.clone() {
                tokio::time::sleep_until((s.started + at).into()).await;
                restarts.extend(s.strike(&fault, &mut rng).await);
            }
            for restart in restarts {
                restart.await.ok();
            }
        })
    };
    let rolled = s.deploy.clone().map(|deploy| {
        let s = Arc::clone(&s);
        tokio::spawn(async move { deploy::roll(&s, &deploy).await })
    });
    faults.await.expect("the faults task");
    if let Some(rolled) = rolled {
        rolled.await.expect("the deploy's task");
    }
    tokio::time::sleep_until(s.phase_end.into()).await;

    // Every fault ends: the processor healthy, every process up.
    s.timeline
        .log("END OF FAULTS: the processor healthy, every process up");
    *s.faults.lock().unwrap() = (0, 0.0, 0.0);
    s.link.delay(Duration::ZERO);
    s.hang_ups.lock().unwrap().0 = None;
    s.start_processor().await;
    s.put_faults().await;
    futures::future::join_all((0..s.instances.len()).map(|index| s.start_instance(index))).await;
    for client in clients {
        client.await.expect("an intent's task");
    }

    // Every intent driven to a final answer: payments and authorizations, then the refunds of
    // those paid and the captures and cancels of those authorized, then the disputes.
    s.timeline
        .log("FINAL: every intent driven to a final answer");
    let open = |s: &Schedule, kind: fn(&Want) -> bool| -> Vec<usize> {
        (0..intents)
            .filter(|k| kind(&s.plan.intents[*k].want) && s.answer(*k).is_none())
            .collect()
    };
    let n = s.plan.instances.len();
    let last_chance = Duration::from_secs(60);
    let drive = |k: usize| {
        let s = Arc::clone(&s);
        async move {
            if let Some(of) = s.plan.intents[k].want.waits_for() {
                if s.answer(of).is_none_or(|paid| paid.status != 201) {
                    return s.skip(k, "its payment was not paid or authorized");
                }
            }
            if let Some(answer) = intents::send_settling(&s, k, k % n, last_chance).await {
                s.set_answer(k, answer);
            }
        }
    };
    let payments = open(&s, |want| {
        matches!(
            want,
            Want::Pay { .. } | Want::Authorize { .. } | Want::Twin { .. }
        )
    });
    futures::future::join_all(payments.into_iter().map(drive)).await;
    let refunds = open(&s, |want| {
        matches!(
            want,
            Want::Refund { .. } | Want::Capture { .. } | Want::Cancel { .. } | Want::Reuse { .. }
        )
    });
    futures::future::join_all(refunds.into_iter().map(drive)).await;
    let disputes = open(&s, |want| matches!(want, Want::Dispute { .. }));
    futures::future::join_all(disputes.into_iter().map(|k| {
        let s = Arc::clone(&s);
        async move {
            if let Want::Dispute { of, amount, .. } = s.plan.intents[k].want {
                let until = Instant::now() + Duration::from_secs(10);
                intents::dispute(&s, k, of, amount, false, until).await;
            }
        }
    }))
    .await;
    check::until_events_delivered(&s).await;
    let merchant_violations = match &merchants {
        Some(merchants) => merchants.check(&s).await,
        None => Vec::new(),
    };

    let answers = s.answers.lock().unwrap().clone();
    check::count_work(&s, &answers, &logs).await;
    let mut violations = std::mem::take(&mut *s.trouble.lock().unwrap());
    violations.extend(check::invariants(&s, &answers, database_epoch).await);
    violations.extend(check::no_transaction_left_open(&s, &name).await);
    violations.extend(check::no_stray_transaction_said(&logs));
    violations.extend(merchant_violations);
    s.timeline
        .log(format!("checked: {} violation(s)", violations.len()));
    s.processor.lock().await.kill().await;
    for instance in &s.instances {
        instance.lock().await.kill().await;
    }
    s.db.close().await;
    Outcome {
        plan: s.plan.clone(),
        violations,
        coverage: s.coverage.counts(),
        timeline: s.timeline.render(s.started),
        logs,
        took: begun.elapsed(),
    }
}
