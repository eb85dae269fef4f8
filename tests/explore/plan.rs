//! A schedule, drawn from one seed before anything runs: the instances and their settings, the
//! intents (payments, refunds, disputes) with when they are sent, and the faults with when they
//! strike. The same seed always draws the same schedule; the processes' own timing, which no seed
//! controls, decides the interleavings within it.

use std::fmt;
use std::time::Duration;

use crate::coverage::Seen;

/// SplitMix64: a tiny PRNG of our own, so a seed draws the same schedule whatever version of
/// `rand` the lock file holds.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `low..=high`.
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next_u64() % (high - low + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.range(low, high))
    }

    pub fn pick(&mut self, n: usize) -> usize {
        self.range(0, n as u64 - 1) as usize
    }
}

/// The test card the processor declines: its payment is answered 402, every other one 201.
pub const DECLINED_CARD: &str = "pm_card_chargeDeclined";

/// One `idempay serve` instance's settings.
#[derive(Clone, Debug)]
pub struct InstancePlan {
    /// `IDEMPAY_RECOVERY_INTERVAL`: short ones tick during the faults, `1h` never does.
    pub recovery_interval: &'static str,
}

/// What a client wants done, once.
#[derive(Clone, Debug)]
pub enum Want {
    /// A payment of a unique amount (so that the processor's charges are matched to their intent
    /// by amount, whatever downstream key made them).
    Pay { amount: i64, method: &'static str },
    /// A refund of the payment of intent `of`, once it is paid.
    Refund { of: usize, amount: i64 },
    /// A dispute the cardholder's bank opens at the processor on the charge of intent `of`, as
    /// soon as the charge exists. An `early` one waits for a moment when idempay has not recorded
    /// the charge yet (its answer slower than idempay waits), as long as the payment has no final
    /// answer: its event arrives before the object it names.
    Dispute { of: usize, amount: i64, early: bool },
    /// A manual payment (`capture_method: manual`) of a unique amount, authorized only.
    Authorize { amount: i64 },
    /// A capture of `amount` of the authorization of intent `of`, once it is authorized.
    Capture { of: usize, amount: i64 },
    /// A cancel of the authorization of intent `of`, once it is authorized.
    Cancel { of: usize },
    /// A payment of `amount` under the key of payment intent `of`, once that one is paid: the
    /// same key with another payload, refused 422 and never executed.
    Reuse { of: usize, amount: i64 },
    /// Payment intent `of` sent at once by a second client (to another instance), with its key
    /// and body: both end with the same answer, and one payment.
    Twin { of: usize },
}

impl Want {
    /// The intent whose 201 this one waits for: a refund's payment, a capture's or a cancel's
    /// authorization.
    pub fn waits_for(&self) -> Option<usize> {
        match *self {
            Self::Refund { of, .. }
            | Self::Capture { of, .. }
            | Self::Cancel { of }
            | Self::Reuse { of, .. } => Some(of),
            Self::Pay { .. }
            | Self::Authorize { .. }
            | Self::Dispute { .. }
            | Self::Twin { .. } => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Intent {
    pub at: Duration,
    /// The instance the client tries first.
    pub instance: usize,
    pub want: Want,
}

/// A fault, or the end of one.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// The processor's faults from now on (`PUT /v1/test/faults`, and its environment when it
    /// restarts); all zero ends an episode.
    Processor {
        latency_ms: u64,
        lose_answers: f64,
        fail: f64,
    },
    /// kill -9 of the processor, restarted on the same port after `down`.
    KillProcessor { down: Duration },
    /// kill -9 of an instance, restarted on the same port after `down`.
    KillInstance { index: usize, down: Duration },
    /// PostgreSQL stopped (fast shutdown) and started again.
    RestartDatabase,
    /// PostgreSQL killed without warning (SIGKILL of the postmaster and its children at once, as
    /// a power cut or the kernel's OOM killer would), then started: it recovers from its WAL.
    /// Its commits are durable (`fsync` and `synchronous_commit` on, as production runs), so
    /// every answer a client received survives it.
    CrashDatabase,
    /// Processor events already delivered, sent again to a random instance in a shuffled order:
    /// duplicates, late and out of order.
    Redeliver { count: usize },
    /// SIGSTOP of a process, SIGCONT after `pause`: alive but silent, its leases lapsing.
    Pause { target: Target, pause: Duration },
    /// The database's answers `delay_ms` late on every process's link from now on (0 ends it):
    /// the wait between a statement and its answer, where a dropped request once left a
    /// connection inside a transaction, widens.
    SlowDatabase { delay_ms: u64 },
    /// For `span`, the clients hang up each attempt after a few hundred milliseconds at most, and
    /// retry it (the same key and body), and events already delivered are sent again by a sender
    /// that hangs up as they do: requests dropped at every moment of their lives.
    HangUps { span: Duration },
}

/// A process of the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Processor,
    Instance(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Processor => f.write_str("processor"),
            Self::Instance(index) => write!(f, "instance {index}"),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Processor {
                latency_ms,
                lose_answers,
                fail,
            } => write!(
                f,
                "processor faults: latency {latency_ms}ms, lose_answers {lose_answers}, fail {fail}"
            ),
            Self::KillProcessor { down } => write!(f, "kill -9 processor (down {down:?})"),
            Self::KillInstance { index, down } => {
                write!(f, "kill -9 instance {index} (down {down:?})")
            }
            Self::RestartDatabase => f.write_str("restart PostgreSQL"),
            Self::CrashDatabase => f.write_str("kill -9 PostgreSQL (a crash), then start it"),
            Self::Redeliver { count } => write!(f, "redeliver {count} processor events"),
            Self::Pause { target, pause } => write!(f, "SIGSTOP {target} (for {pause:?})"),
            Self::SlowDatabase { delay_ms: 0 } => f.write_str("the database's answers on time"),
            Self::SlowDatabase { delay_ms } => {
                write!(f, "the database's answers {delay_ms}ms late")
            }
            Self::HangUps { span } => write!(f, "clients hang up mid-request (for {span:?})"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    /// The explorer's draws the seed was drawn with.
    pub draws: Draws,
    pub instances: Vec<InstancePlan>,
    /// `IDEMPAY_PROCESSOR_TIMEOUT` of every instance.
    pub processor_timeout: Duration,
    /// `IDEMPAY_LEASE` of the instances and the processor.
    pub lease: &'static str,
    /// How long the faults last; then every fault ends and every intent is driven to its answer.
    pub duration: Duration,
    pub intents: Vec<Intent>,
    /// Sorted by time.
    pub faults: Vec<(Duration, Fault)>,
    /// `IDEMPAY_PROCESSOR_AUTHORIZATION_TTL` of the processor, when this schedule's
    /// authorizations lapse within it (the processor's expiry job then runs every second).
    pub authorization_ttl: Option<Duration>,
    /// When set, the instances' `IDEMPAY_RECOVERY_WINDOW` is the shortest they accept plus this
    /// ([`Plan::recovery_window`]): keys past it are held for an operator, who settles them.
    pub recovery_window_over: Option<Duration>,
}

/// Which of the explorer's draws make a seed's schedule. The explorer grew a kind of fault after
/// some seeds had failed; a seed replays the schedule it failed on only with the draws of then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draws {
    /// Every draw but the pauses (and what came after them): the seeds that failed before
    /// pauses existed (f40e9cd).
    BeforePauses,
    /// Every draw but the database's crash: the seeds that failed before crashes existed.
    BeforeCrashes,
    /// Every draw.
    Current,
}

impl Plan {
    pub fn draw(seed: u64, draws: Draws) -> Self {
        let mut rng = Rng::new(seed);
        let instances = (0..rng.range(1, 3))
            .map(|_| InstancePlan {
                recovery_interval: ["1s", "2s", "1h"][rng.pick(3)],
            })
            .collect::<Vec<_>>();
        let processor_timeout = rng.millis(600, 1500);
        let lease = ["3s", "5s"][rng.pick(2)];
        let duration = rng.millis(12_000, 18_000);
        let within = |rng: &mut Rng, from: Duration, to: Duration| {
            let to = to.min(duration);
            if to <= from {
                return from;
            }
            from + rng.millis(0, (to - from).as_millis() as u64)
        };

        let mut faults = Vec::new();
        let timeout_ms = processor_timeout.as_millis() as u64;
        // Episodes of a slow processor: slower than idempay waits, so the charges idempay gives
        // up on commit afterwards. The faults that matter most come with them.
        for _ in 0..rng.range(1, 2) {
            let start = within(&mut rng, Duration::ZERO, duration.mul_f64(0.6));
            let end = within(
                &mut rng,
                start + Duration::from_secs(3),
                start + Duration::from_secs(8),
            );
            let lose_answers = if rng.chance(0.3) {
                rng.range(2, 5) as f64 / 10.0
            } else {
                0.0
            };
            let fail = if rng.chance(0.2) {
                rng.range(1, 3) as f64 / 10.0
            } else {
                0.0
            };
            let latency_ms = if rng.chance(0.85) {
                rng.range(timeout_ms + 300, 3500)
            } else {
                0
            };
            faults.push((
                start,
                Fault::Processor {
                    latency_ms,
                    lose_answers,
                    fail,
                },
            ));
            faults.push((
                end,
                Fault::Processor {
                    latency_ms: 0,
                    lose_answers: 0.0,
                    fail: 0.0,
                },
            ));
            // The processor killed once the episode's charges commit (a latency after they were
            // asked for): before some commit and after others, whose answers idempay lacks.
            if rng.chance(0.8) {
                let latency = Duration::from_millis(latency_ms);
                let at = within(&mut rng, start + latency, end + latency);
                faults.push((
                    at,
                    Fault::KillProcessor {
                        down: rng.millis(1000, 4000),
                    },
                ));
            }
        }
        if rng.chance(0.3) {
            let at = within(&mut rng, Duration::ZERO, duration);
            faults.push((
                at,
                Fault::KillProcessor {
                    down: rng.millis(500, 3000),
                },
            ));
        }
        for _ in 0..rng.range(0, 2) {
            let at = within(&mut rng, Duration::ZERO, duration);
            let index = rng.pick(instances.len());
            faults.push((
                at,
                Fault::KillInstance {
                    index,
                    down: rng.millis(300, 3000),
                },
            ));
        }
        if rng.chance(0.25) {
            let at = within(&mut rng, Duration::from_secs(2), duration);
            faults.push((at, Fault::RestartDatabase));
        }
        for _ in 0..rng.range(0, 2) {
            let at = within(&mut rng, Duration::from_secs(3), duration);
            faults.push((
                at,
                Fault::Redeliver {
                    count: rng.range(2, 6) as usize,
                },
            ));
        }
        // The episodes (from, to) when the processor is slower than idempay waits.
        let episodes: Vec<(Duration, Duration)> = faults
            .iter()
            .filter_map(|(at, fault)| match fault {
                Fault::Processor { latency_ms, .. } if *latency_ms > timeout_ms => Some(*at),
                _ => None,
            })
            .map(|start| {
                let end = faults
                    .iter()
                    .filter(|(at, fault)| *at > start && matches!(fault, Fault::Processor { .. }))
                    .map(|(at, _)| *at)
                    .min()
                    .unwrap_or(duration);
                (start, end)
            })
            .collect();
        let slow = |at: Duration| {
            episodes
                .iter()
                .any(|(start, end)| (*start..*end).contains(&at))
        };
        let mut intents = Vec::new();
        let payments = rng.range(8, 14) as usize;
        for n in 0..payments {
            // Half of them meet a slow processor: the charges whose answer idempay gives up on.
            let at = match episodes.get(rng.pick(episodes.len().max(1))) {
                Some((start, end)) if rng.chance(0.5) => within(&mut rng, *start, *end),
                _ => within(&mut rng, Duration::ZERO, duration.mul_f64(0.8)),
            };
            let method = if rng.chance(0.1) {
                DECLINED_CARD
            } else {
                "pm_card_visa"
            };
            intents.push(Intent {
                at,
                instance: rng.pick(instances.len()),
                want: Want::Pay {
                    // Unique per intent: 1000, 1010, 1020… plus a few units.
                    amount: 1000 + 10 * n as i64 + rng.range(0, 9) as i64,
                    method,
                },
            });
        }
        for of in 0..payments {
            let (paid_at, amount) = match intents[of] {
                Intent {
                    at,
                    want: Want::Pay { amount, .. },
                    ..
                } => (at, amount),
                _ => unreachable!(),
            };
            // Refund and dispute a quarter at most each: both fit beside each other.
            if rng.chance(0.35) {
                intents.push(Intent {
                    at: within(&mut rng, paid_at, paid_at + Duration::from_secs(6)),
                    instance: rng.pick(instances.len()),
                    want: Want::Refund {
                        of,
                        amount: rng.range(1, amount as u64 / 4) as i64,
                    },
                });
            }
            if rng.chance(0.25) {
                intents.push(Intent {
                    at: within(&mut rng, paid_at, paid_at + Duration::from_secs(5)),
                    instance: 0,
                    want: Want::Dispute {
                        of,
                        amount: rng.range(1, amount as u64 / 4) as i64,
                        // Early when the payment meets a slow processor: its charge commits
                        // after idempay gave up, and stays unrecorded until the next retry.
                        early: slow(paid_at) && rng.chance(0.8),
                    },
                });
            }
        }

        // Pauses, from a stream of their own: a seed drawn before pauses existed keeps every draw
        // above, and drawn without pauses ([`Draws::BeforePauses`]) plays the schedule it failed on.
        // A pause of the processor outlasts idempay's timeout (an unknown outcome); one of an
        // instance may outlast its lease (a takeover, then a holder that wakes fenced off).
        let mut pauses = Rng::new(seed.rotate_left(29) ^ 0x0051_570B);
        let count = match draws {
            Draws::BeforePauses => 0,
            Draws::BeforeCrashes | Draws::Current => pauses.range(1, 2),
        };
        for _ in 0..count {
            let target = if pauses.chance(0.4) {
                Target::Processor
            } else {
                Target::Instance(pauses.pick(instances.len()))
            };
            let at = within(&mut pauses, Duration::ZERO, duration.mul_f64(0.8));
            faults.push((
                at,
                Fault::Pause {
                    target,
                    pause: pauses.millis(1000, 5000),
                },
            ));
        }

        // Manual payments, each then captured (in part) or canceled, from a stream of their own
        // too, so that a seed drawn before them plays its schedule unchanged.
        let mut manual = Rng::new(seed.rotate_left(43) ^ 0x00CA_97DE);
        let authorizations = match draws {
            Draws::BeforePauses => 0,
            Draws::BeforeCrashes | Draws::Current => manual.range(1, 3) as usize,
        };
        for n in 0..authorizations {
            let at = within(&mut manual, Duration::ZERO, duration.mul_f64(0.6));
            // Unique, and apart from the payments' 1000…1149.
            let amount = 5000 + 10 * n as i64 + manual.range(0, 9) as i64;
            let of = intents.len();
            intents.push(Intent {
                at,
                instance: manual.pick(instances.len()),
                want: Want::Authorize { amount },
            });
            let then = if manual.chance(0.7) {
                Want::Capture {
                    of,
                    amount: manual.range(1, amount as u64) as i64,
                }
            } else {
                Want::Cancel { of }
            };
            intents.push(Intent {
                at: within(&mut manual, at, at + Duration::from_secs(6)),
                instance: manual.pick(instances.len()),
                want: then,
            });
        }

        // A slow database link and clients that hang up, from a stream of their own too: each
        // once a schedule, the hang-ups mostly while the link is slow, when a request spends the
        // longest waiting on the database.
        let mut drops = Rng::new(seed.rotate_left(7) ^ 0x00D8_0995);
        if draws != Draws::BeforePauses {
            let slow_from = within(&mut drops, Duration::ZERO, duration.mul_f64(0.7));
            let slow_for = drops.millis(2000, 5000);
            faults.push((
                slow_from,
                Fault::SlowDatabase {
                    delay_ms: drops.range(20, 60),
                },
            ));
            faults.push((slow_from + slow_for, Fault::SlowDatabase { delay_ms: 0 }));
            let hang_from = if drops.chance(0.7) {
                slow_from + drops.millis(0, 1000)
            } else {
                within(&mut drops, Duration::ZERO, duration.mul_f64(0.7))
            };
            faults.push((
                hang_from,
                Fault::HangUps {
                    span: drops.millis(2000, 4000),
                },
            ));
        }

        // A crash of the database, from a stream of its own too: once a schedule, while the
        // payments, refunds and captures are on their way (the intents are sent in the first
        // 60% of the schedule), so that some are acknowledged just before it and some are
        // cut off by it.
        let mut crash = Rng::new(seed.rotate_left(53) ^ 0x00C2_A5E5);
        if draws == Draws::Current {
            let at = within(&mut crash, duration.mul_f64(0.15), duration.mul_f64(0.6));
            faults.push((at, Fault::CrashDatabase));
        }

        // What a client or an operator does beside the happy path, from a stream of its own too:
        // a capture racing a cancel on one authorization, a key reused with another payload, two
        // clients sending one intent, and authorizations that lapse at the processor.
        let mut beside = Rng::new(seed.rotate_left(37) ^ 0x00B5_1DE5);
        let mut authorization_ttl = None;
        let mut recovery_window_over = None;
        if draws == Draws::Current {
            // The first authorization's capture (or cancel) meets the other one, sent within
            // 300 ms of it by another client: one of them wins at both ledgers, the other is
            // answered 409.
            let first = intents
                .iter()
                .enumerate()
                .find_map(|(k, intent)| match intent.want {
                    Want::Capture { of, .. } | Want::Cancel { of } => Some((k, of)),
                    _ => None,
                });
            if let Some((k, of)) = first.filter(|_| beside.chance(0.7)) {
                let at = intents[k].at + beside.millis(0, 300);
                let want = match intents[k].want {
                    Want::Capture { .. } => Want::Cancel { of },
                    _ => {
                        let Want::Authorize { amount } = intents[of].want else {
                            unreachable!("a cancel names an authorization")
                        };
                        Want::Capture {
                            of,
                            amount: beside.range(1, amount as u64) as i64,
                        }
                    }
                };
                intents.push(Intent {
                    at,
                    instance: beside.pick(instances.len()),
                    want,
                });
            }
            let paid: Vec<usize> = intents
                .iter()
                .enumerate()
                .filter(|(_, intent)| {
                    matches!(intent.want, Want::Pay { method, .. } if method != DECLINED_CARD)
                })
                .map(|(k, _)| k)
                .collect();
            if !paid.is_empty() {
                // A key reused with another amount (a unique one, apart from every other
                // intent's), once its payment is paid.
                let of = paid[beside.pick(paid.len())];
                intents.push(Intent {
                    at: within(&mut beside, intents[of].at, duration),
                    instance: beside.pick(instances.len()),
                    want: Want::Reuse {
                        of,
                        amount: 2000 + beside.range(0, 99) as i64,
                    },
                });
                // Two clients on one intent: the second at the same moment, on another instance
                // where there is one.
                let of = paid[beside.pick(paid.len())];
                intents.push(Intent {
                    at: intents[of].at,
                    instance: (intents[of].instance + 1) % instances.len(),
                    want: Want::Twin { of },
                });
            }
            // Authorizations that lapse: 3–8 s at the processor, which its expiry job releases
            // and announces as `charge.expired`; a capture or cancel sent after it is refused.
            if beside.chance(0.4) {
                authorization_ttl = Some(beside.millis(3000, 8000));
            }
            // A recovery window as short as idempay allows (the longest a request asks the
            // processor, plus the lease), and up to 3 s more: a key whose call stays unknown that
            // long (a processor down, a holder paused or killed) is held for an operator, who
            // settles it from the processor's ledger; the client's retry then gets the result.
            if beside.chance(0.4) {
                recovery_window_over = Some(beside.millis(0, 3000));
            }
        }

        faults.sort_by_key(|(at, _)| *at);
        Self {
            seed,
            draws,
            instances,
            processor_timeout,
            lease,
            duration,
            intents,
            faults,
            authorization_ttl,
            recovery_window_over,
        }
    }
}

impl Plan {
    /// The instances' recovery window, when the plan shortens it: the shortest `serve` accepts
    /// (`config::shortest_recovery_window`), plus what the plan drew.
    pub fn recovery_window(&self) -> Option<Duration> {
        let lease = humantime::parse_duration(self.lease).expect("the plan's lease");
        self.recovery_window_over.map(|over| {
            idempay::config::shortest_recovery_window(self.processor_timeout, lease) + over
        })
    }

    /// The kinds this plan drew for certain: its faults, and its payments by their card (each
    /// answered 201 or 402 by its card alone). Refunds, disputes, captures and cancels wait on
    /// their payment and may be skipped; takeovers and recoveries are what faults may bring.
    pub fn drawn(&self) -> Vec<Seen> {
        let mut kinds = Vec::new();
        let faults = self.faults.iter().filter_map(|(_, fault)| match fault {
            Fault::Processor { .. } => None,
            Fault::KillProcessor { .. } => Some(Seen::ProcessorKilled),
            Fault::KillInstance { .. } => Some(Seen::InstanceKilled),
            Fault::RestartDatabase => Some(Seen::DatabaseRestarted),
            Fault::CrashDatabase => Some(Seen::DatabaseCrashed),
            Fault::Redeliver { .. } => Some(Seen::Redelivered),
            Fault::Pause { .. } => Some(Seen::Paused),
            Fault::SlowDatabase { delay_ms } => (*delay_ms > 0).then_some(Seen::SlowDatabase),
            Fault::HangUps { .. } => Some(Seen::HungUp),
        });
        let payments = self.intents.iter().filter_map(|intent| match intent.want {
            Want::Pay { method, .. } if method == DECLINED_CARD => Some(Seen::Declined),
            Want::Pay { .. } => Some(Seen::Paid),
            Want::Twin { .. } => Some(Seen::Twins),
            Want::Reuse { .. } => Some(Seen::Reused),
            _ => None,
        });
        // Today's draws register merchant endpoints, which receive the schedule's events.
        let merchants = (self.draws == Draws::Current).then_some(Seen::MerchantEvents);
        for kind in faults.chain(payments).chain(merchants) {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        kinds
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let recovery: Vec<&str> = self
            .instances
            .iter()
            .map(|instance| instance.recovery_interval)
            .collect();
        let count = |kind: fn(&Want) -> bool| {
            self.intents
                .iter()
                .filter(|intent| kind(&intent.want))
                .count()
        };
        write!(
            f,
            "{} instance(s) (recovery every {}), processor timeout {:?}, lease {}, {} payments, \
             {} refunds, {} disputes, {} authorizations ({} captures), {} faults over {:?}",
            self.instances.len(),
            recovery.join("/"),
            self.processor_timeout,
            self.lease,
            count(|want| matches!(want, Want::Pay { .. })),
            count(|want| matches!(want, Want::Refund { .. })),
            count(|want| matches!(want, Want::Dispute { .. })),
            count(|want| matches!(want, Want::Authorize { .. })),
            count(|want| matches!(want, Want::Capture { .. })),
            self.faults.len(),
            self.duration,
        )?;
        if let Some(ttl) = self.authorization_ttl {
            write!(f, ", authorizations lapse after {ttl:?}")?;
        }
        if let Some(window) = self.recovery_window() {
            write!(f, ", keys held for an operator after {window:?}")?;
        }
        match self.draws {
            Draws::BeforePauses => f.write_str(", drawn as before pauses")?,
            Draws::BeforeCrashes => f.write_str(", drawn as before crashes")?,
            Draws::Current => {}
        }
        Ok(())
    }
}
