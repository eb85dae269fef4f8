//! Settings of the service, from the command line or the environment. Durations are written in
//! human form (`2s`, `30s`, `24h`).

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::db::PoolLimits;
use service::outbox::RetrySchedule;
use service::settings::{declared_defaults, duration, positive};
use service::shared_settings::SharedArgs;

/// How long a key lives unless `IDEMPAY_KEY_TTL` says otherwise; `idempay fixture`'s too.
pub const DEFAULT_KEY_TTL: &str = "24h";

/// How the service behaves, independent of where its database and listener are.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// How long a key and its stored response live.
    #[arg(long, env = "IDEMPAY_KEY_TTL", default_value = DEFAULT_KEY_TTL, value_parser = positive("IDEMPAY_KEY_TTL"))]
    pub key_ttl: Duration,

    /// How long a processed webhook event id is remembered, so that its redelivery applies
    /// nothing. Longer than senders retry (Standard Webhooks about 28 hours, Stripe 3 days), and
    /// never shorter than the timestamp tolerance, within which a replayed delivery is accepted.
    #[arg(long, env = "IDEMPAY_EVENT_TTL", default_value = "7days", value_parser = parse_event_ttl)]
    pub event_ttl: Duration,

    /// How long an event is kept (in the feed, `GET /v1/events`, and at `GET /v1/events/{id}`)
    /// after it was written, as Stripe keeps its events 30 days; then the expiry job deletes it,
    /// unless a delivery of it to an endpoint is still pending.
    #[arg(long, env = "IDEMPAY_EVENT_RETENTION", default_value = "30days", value_parser = positive("IDEMPAY_EVENT_RETENTION"))]
    pub event_retention: Duration,

    /// The lease, the slow charge, the expiry interval and the webhook delivery settings, which
    /// the processor shares (embedded, it takes these).
    #[command(flatten)]
    pub shared: SharedArgs,

    #[command(flatten)]
    pub processor: ProcessorLink,

    /// How often the recovery job resumes keys whose request left a charge or refund at the
    /// processor unrecorded (its instance died, or its client never came back).
    #[arg(long, env = "IDEMPAY_RECOVERY_INTERVAL", default_value = "10s", value_parser = positive("IDEMPAY_RECOVERY_INTERVAL"))]
    pub recovery_interval: Duration,

    /// How long after its creation a key whose charge or refund at the processor is unresolved is
    /// still resumed (by a retry or the recovery job), with the same downstream key. Shorter than
    /// the processor remembers keys (24 h): a resume after that would charge again. Past it, the
    /// key is held for an operator (409 `idempotency-key-held`, `idempay reconcile`).
    #[arg(long, env = "IDEMPAY_RECOVERY_WINDOW", default_value = "12h", value_parser = parse_recovery_window)]
    pub recovery_window: Duration,

    /// How long a request may take before it is answered with 503. Whatever the request started
    /// goes on: a payment that completes later is replayed to a retry with the same key.
    #[arg(long, env = "IDEMPAY_REQUEST_TIMEOUT", default_value = "10s", value_parser = positive("IDEMPAY_REQUEST_TIMEOUT"))]
    pub request_timeout: Duration,

    /// How often each instance looks for deliveries due to merchant endpoints: a new event waits
    /// at most this long for its first attempt, and an idle instance sends the database one
    /// statement this often.
    #[arg(long, env = "IDEMPAY_WEBHOOK_POLL_INTERVAL", default_value = "1s", value_parser = positive("IDEMPAY_WEBHOOK_POLL_INTERVAL"))]
    pub webhook_poll_interval: Duration,

    /// Lets merchant endpoints point at loopback, private, link-local and other non-public
    /// addresses. For development and tests only (`idempay dev` sets it): in production it would
    /// let anyone with an API key make idempay call into its own network.
    #[arg(long, env = "IDEMPAY_WEBHOOK_ALLOW_PRIVATE", default_value_t = false)]
    pub webhook_allow_private: bool,

    /// How long a client may take to send a request's headers, counted from the connection's
    /// accept for its first request; an idle keep-alive connection is closed after it too. A
    /// client that sends its headers a byte at a time, or nothing, is cut off without an answer.
    #[arg(long, env = "IDEMPAY_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = positive("IDEMPAY_HEADER_READ_TIMEOUT"))]
    pub header_read_timeout: Duration,

    /// How long a request body may stall (no data arriving) before the request is answered with
    /// 408. Shorter than the request timeout, so that a stalled body is told apart from slow work.
    #[arg(long, env = "IDEMPAY_BODY_READ_TIMEOUT", default_value = "5s", value_parser = positive("IDEMPAY_BODY_READ_TIMEOUT"))]
    pub body_read_timeout: Duration,

    /// Requests per second each account may send to this instance, with a burst of as many; over
    /// it, a request is answered 429 with `Retry-After` before anything of it runs. 0 turns the
    /// limit off.
    #[arg(long, env = "IDEMPAY_RATE_LIMIT", default_value_t = 1000)]
    pub rate_limit: u32,

    /// For the demo only: serves the checkout page at `/demo/checkout`, which pays as a demo
    /// account of its own through a short-lived session cookie. Whoever reaches the listener can
    /// pay as that account, so never in production; off, the page's routes do not exist. `idempay
    /// dev` turns it on; a build without the `dev` feature refuses it.
    #[arg(long, env = "IDEMPAY_DEMO_UI", default_value_t = false)]
    pub demo_ui: bool,
}

impl Default for Settings {
    fn default() -> Self {
        declared_defaults()
    }
}

/// How idempay reaches the card processor.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct ProcessorLink {
    /// The card processor's base URL (`idempay processor` serves one). Unset, `serve` runs the
    /// same processor embedded, on a loopback port of its own, with its ledger in this database.
    #[arg(long = "processor-url", env = "IDEMPAY_PROCESSOR_URL")]
    pub url: Option<String>,

    /// The secret idempay authenticates to the processor with (`Authorization: Bearer …`).
    /// Required with `IDEMPAY_PROCESSOR_URL`; the embedded processor makes its own.
    #[arg(
        long = "processor-api-key",
        env = "IDEMPAY_PROCESSOR_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,

    /// How long one call to the processor may take. A call that takes longer has an unknown
    /// outcome: it is asked again with the same key, never treated as "nothing happened".
    #[arg(long = "processor-timeout", env = "IDEMPAY_PROCESSOR_TIMEOUT", default_value = "10s", value_parser = positive("IDEMPAY_PROCESSOR_TIMEOUT"))]
    pub timeout: Duration,

    /// How long the embedded processor's authorizations (charges made with `capture: false`)
    /// hold their money uncaptured; then its expiry job releases them and tells this idempay, whose
    /// payment becomes `canceled` (`expired`). The processor named by `IDEMPAY_PROCESSOR_URL` has
    /// its own setting of the same name.
    #[arg(long = "processor-authorization-ttl", env = "IDEMPAY_PROCESSOR_AUTHORIZATION_TTL", default_value = "7days", value_parser = positive("IDEMPAY_PROCESSOR_AUTHORIZATION_TTL"))]
    pub authorization_ttl: Duration,

    /// Wrong on purpose, for the demo only: a new key for every call to the processor instead of
    /// the downstream key, so that a lost answer's retry charges again. Shows what the downstream
    /// key prevents; never in production.
    #[arg(
        long = "unsafe-new-processor-key-per-call",
        env = "IDEMPAY_UNSAFE_NEW_PROCESSOR_KEY_PER_CALL",
        default_value_t = false
    )]
    pub new_key_per_call: bool,
}

impl Default for ProcessorLink {
    fn default() -> Self {
        declared_defaults()
    }
}

impl ProcessorLink {
    /// Applies the unsafe demo setting, when it is on, to a client of any processor.
    pub fn configure(
        &self,
        client: crate::downstream::ProcessorClient,
    ) -> crate::downstream::ProcessorClient {
        if self.new_key_per_call {
            tracing::warn!(
                "IDEMPAY_UNSAFE_NEW_PROCESSOR_KEY_PER_CALL is on: a retried charge can be charged twice"
            );
            client.with_a_new_key_per_call()
        } else {
            client
        }
    }

    /// A client for the configured processor; `None` when no URL is set.
    pub fn client(&self) -> anyhow::Result<Option<crate::downstream::ProcessorClient>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let api_key = self.api_key.clone().ok_or_else(|| {
            anyhow::anyhow!("IDEMPAY_PROCESSOR_URL is set but IDEMPAY_PROCESSOR_API_KEY is not")
        })?;
        crate::downstream::ProcessorClient::new(url, api_key, self.timeout)
            .map(|client| Some(self.configure(client)))
    }
}

/// Where the service listens.
#[derive(Args, Clone, Debug)]
pub struct ListenArgs {
    /// Listen address.
    #[arg(long, env = "IDEMPAY_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
}

/// Where the database is, and how many connections to it an instance may hold.
#[derive(Args, Clone, Debug)]
pub struct DatabaseArgs {
    /// PostgreSQL connection string.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,

    #[command(flatten)]
    pub pool: PoolLimits,
}

/// A delivery is accepted while its timestamp is within the tolerance: an event id forgotten
/// sooner could be replayed, with its valid signature, and applied again.
fn parse_event_ttl(raw: &str) -> Result<Duration, String> {
    let ttl = duration("IDEMPAY_EVENT_TTL", raw, Duration::from_nanos(1))?;
    let tolerance = service::outbox::TOLERANCE;
    if ttl < tolerance {
        return Err(format!(
            "IDEMPAY_EVENT_TTL must be at least the webhook timestamp tolerance, {}",
            humantime::format_duration(tolerance)
        ));
    }
    Ok(ttl)
}

/// Refuses at start a delivery retention shorter than a delivery can last. An endpoint whose
/// delivery is given up is disabled when it acknowledged no delivery since that one was created
/// (`service::outbox::delivery`), up to the retry schedule's whole span ago: an acknowledged delivery
/// deleted sooner would make a live endpoint look dead.
pub fn check_delivery_retention(
    retention: Duration,
    schedule: &RetrySchedule,
    attempt_timeout: Duration,
) -> Result<(), String> {
    let span = schedule.span(attempt_timeout);
    if retention < span {
        return Err(format!(
            "IDEMPAY_WEBHOOK_DELIVERY_RETENTION ({}) must be at least the span of the retry \
             schedule ({}, each delay at its longest, each attempt timed out twice over: {}): \
             whether an endpoint is disabled depends on what it acknowledged within it",
            humantime::format_duration(retention),
            schedule,
            humantime::format_duration(span),
        ));
    }
    Ok(())
}

/// The shortest recovery window `serve` accepts with the processor `timeout` and the `lease`:
/// the longest a request asks the processor about one call, plus the lease, plus the clock margin
/// its calls' deadline keeps from the window's end ([`check_recovery_window`] says why).
pub fn shortest_recovery_window(timeout: Duration, lease: Duration) -> Duration {
    crate::downstream::client::longest_asking(timeout)
        .saturating_add(lease)
        .saturating_add(idempotency::CLOCK_MARGIN)
}

/// Refuses at start (`serve`, `idempay dev`) a recovery window that does not fit between the
/// processor calls it bounds:
///
/// - At least the longest a request asks the processor about its call (every attempt cut off at
///   `IDEMPAY_PROCESSOR_TIMEOUT`, and the pauses between them) plus the lease. A key is held for
///   an operator once it is older than the window and no lease holds it; a request that asked
///   that long and then died leaves its lease to run out a lease later. With a shorter window, a
///   key would be held before any retry or the recovery job could take it over even once: every
///   lost answer would go to an operator (`IDEMPAY_RECOVERY_WINDOW=2s` once started, and did so).
///   Plus `idempotency::CLOCK_MARGIN`: every call carries the window's end less that margin as
///   its deadline, which the processor enforces.
/// - Plus that asking time, shorter than the processor remembers its keys: a resume claimed just
///   before the window ends still calls the processor with the downstream key until then, and a
///   call after the processor forgot the key would be a new charge.
pub fn check_recovery_window(settings: &Settings) -> Result<(), String> {
    let window = settings.recovery_window;
    let timeout = settings.processor.timeout;
    let asking = crate::downstream::client::longest_asking(timeout);
    let shortest = shortest_recovery_window(timeout, settings.shared.lease);
    let format = humantime::format_duration;
    if window < shortest {
        return Err(format!(
            "IDEMPAY_RECOVERY_WINDOW ({}) must be at least the longest a request asks the \
             processor about a call, 3 attempts of IDEMPAY_PROCESSOR_TIMEOUT ({}) and the pauses \
             between them ({}), plus IDEMPAY_LEASE ({}), plus the {} its calls' deadline keeps \
             for clocks that differ: {}. A key past the window is held for an operator, and a \
             shorter one would be held before any retry or the recovery job could \
             resume it. Lengthen the window, or shorten the timeout or the lease.",
            format(window),
            format(timeout),
            format(asking),
            format(settings.shared.lease),
            format(idempotency::CLOCK_MARGIN),
            format(shortest),
        ));
    }
    let remembered = processor::KEY_TTL;
    if window.saturating_add(asking) >= remembered {
        return Err(format!(
            "IDEMPAY_RECOVERY_WINDOW ({}) plus the longest a request asks the processor about a \
             call ({}, from IDEMPAY_PROCESSOR_TIMEOUT {}) must be shorter than the processor \
             remembers its idempotency keys ({}): a resume that starts at the end of the window \
             would call it after it forgot the key, and be charged again. Shorten the window or \
             the timeout.",
            format(window),
            format(asking),
            format(timeout),
            format(remembered),
        ));
    }
    Ok(())
}

/// Refuses, where the processor's events to this idempay are sent on this schedule (`idempay
/// dev`, whose processor takes idempay's settings), a schedule that gives one up while its
/// object may still be unrecorded. idempay refuses (409) an event about a charge or refund it has
/// not recorded yet, so that the sender comes again, and the charge of a key whose outcome is
/// unknown is recorded by a retry or the recovery job as late as the window's end, plus the time
/// that last resume asks the processor: the sender must redeliver at least that long, counted
/// from its first attempt, which comes after the key was made.
///
/// `serve` does not check it: there the schedule is only that of idempay's own deliveries to
/// merchant endpoints, which no recovery waits for (the embedded processor sends no events, and a
/// processor of its own, `idempay processor`, has its own schedule, checked against the time it
/// remembers keys, which the window is shorter than: `ProcessorSettings::check_redelivery`).
pub fn check_processor_redelivery(settings: &Settings) -> Result<(), String> {
    let window = settings.recovery_window;
    let asking = crate::downstream::client::longest_asking(settings.processor.timeout);
    let format = humantime::format_duration;
    processor::check_redelivery(
        &settings.shared.webhook_retry_schedule,
        window.saturating_add(asking),
        &format!(
            "IDEMPAY_RECOVERY_WINDOW ({}) plus the longest a resume asks the processor about a \
             call ({}, from IDEMPAY_PROCESSOR_TIMEOUT {}): {}",
            format(window),
            format(asking),
            format(settings.processor.timeout),
            format(window.saturating_add(asking)),
        ),
    )
}

/// The recovery window must end before the processor forgets the downstream key, or a resume
/// after that would be a new charge under the old key. (How it compares with the other settings
/// is checked at start: [`check_recovery_window`].)
fn parse_recovery_window(raw: &str) -> Result<Duration, String> {
    let window = duration("IDEMPAY_RECOVERY_WINDOW", raw, Duration::from_nanos(1))?;
    let remembered = processor::KEY_TTL;
    if window >= remembered {
        return Err(format!(
            "IDEMPAY_RECOVERY_WINDOW must be shorter than the time the processor remembers its \
             idempotency keys ({}): a key resumed after the processor forgot it would be charged \
             again",
            humantime::format_duration(remembered)
        ));
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::check_lease;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
        #[command(flatten)]
        pool: PoolLimits,
    }

    #[test]
    fn the_documented_defaults_are_the_default_settings() {
        let parsed = Cli::parse_from(["idempay"]);
        assert_eq!(parsed.settings, Settings::default());
        assert_eq!(parsed.pool, PoolLimits::default());
    }

    #[test]
    fn durations_are_read_in_human_form() {
        let parsed = Cli::parse_from(["idempay", "--lease", "1s", "--key-ttl", "90m"]).settings;
        assert_eq!(parsed.shared.lease, Duration::from_secs(1));
        assert_eq!(parsed.key_ttl, Duration::from_secs(90 * 60));
        assert!(Cli::try_parse_from(["idempay", "--lease", "10ms"]).is_err());
    }

    #[test]
    fn an_event_ttl_shorter_than_the_webhook_tolerance_is_refused() {
        let error = Cli::try_parse_from(["idempay", "--event-ttl", "4m"])
            .err()
            .expect("4 minutes is refused");
        assert!(error.to_string().contains("tolerance, 5m"), "{error}");
        let parsed = Cli::parse_from(["idempay", "--event-ttl", "5m"]).settings;
        assert_eq!(parsed.event_ttl, service::outbox::TOLERANCE);
    }

    #[test]
    fn a_lease_shorter_than_three_acquire_timeouts_is_refused() {
        let pool = PoolLimits::default();
        assert_eq!(check_lease(Settings::default().shared.lease, &pool), Ok(()));
        assert_eq!(check_lease(pool.acquire_timeout * 3, &pool), Ok(()));
        let refused = check_lease(Duration::from_secs(2), &pool).unwrap_err();
        assert!(refused.contains("IDEMPAY_LEASE (2s)"), "{refused}");
        assert!(refused.contains("= 15s"), "{refused}");
        let short = PoolLimits {
            acquire_timeout: Duration::from_millis(300),
            ..pool
        };
        assert_eq!(check_lease(Duration::from_secs(1), &short), Ok(()));
    }

    #[test]
    fn a_delivery_retention_shorter_than_the_retry_schedule_is_refused() {
        let settings = Settings::default().shared;
        assert_eq!(
            check_delivery_retention(
                settings.webhook_delivery_retention,
                &settings.webhook_retry_schedule,
                settings.webhook_delivery_timeout,
            ),
            Ok(())
        );
        let refused = check_delivery_retention(
            Duration::from_secs(24 * 60 * 60),
            &settings.webhook_retry_schedule,
            settings.webhook_delivery_timeout,
        )
        .unwrap_err();
        assert!(
            refused.contains("IDEMPAY_WEBHOOK_DELIVERY_RETENTION (1day)"),
            "{refused}"
        );
        let short = RetrySchedule::parse("100ms").unwrap();
        assert_eq!(
            check_delivery_retention(Duration::from_secs(1), &short, Duration::from_millis(200)),
            Ok(())
        );
        let parsed = Cli::parse_from([
            "idempay",
            "--event-retention",
            "90days",
            "--webhook-delivery-retention",
            "15days",
        ])
        .settings;
        assert_eq!(
            parsed.event_retention,
            Duration::from_secs(90 * 24 * 60 * 60)
        );
        assert_eq!(
            parsed.shared.webhook_delivery_retention,
            Duration::from_secs(15 * 24 * 60 * 60)
        );
    }

    #[test]
    fn a_recovery_window_as_long_as_the_processor_remembers_keys_is_refused() {
        for refused in ["24h", "2days"] {
            let error = parse_recovery_window(refused).unwrap_err();
            assert!(
                error.contains("remembers its idempotency keys (1day)"),
                "{refused}: {error}"
            );
        }
        let error = parse_recovery_window("0s").unwrap_err();
        assert!(
            error.contains("IDEMPAY_RECOVERY_WINDOW must be longer than zero"),
            "{error}"
        );
        assert_eq!(
            parse_recovery_window("23h 59m"),
            Ok(Duration::from_secs(24 * 60 * 60 - 60))
        );
        let parsed = Cli::try_parse_from(["idempay", "--recovery-window", "25h"]);
        assert!(parsed.is_err());
    }

    #[test]
    fn a_recovery_window_shorter_than_a_request_s_calls_and_a_lease_is_refused() {
        assert_eq!(check_recovery_window(&Settings::default()), Ok(()));
        let parsed = Cli::parse_from(["idempay", "--recovery-window", "2s"]).settings;
        let refused = check_recovery_window(&parsed).unwrap_err();
        assert!(
            refused.contains("IDEMPAY_RECOVERY_WINDOW (2s) must be at least")
                && refused.contains("IDEMPAY_PROCESSOR_TIMEOUT (10s)")
                && refused.contains("(30s 300ms)")
                && refused.contains("IDEMPAY_LEASE (30s), plus the 1s its calls' deadline")
                && refused.contains(": 1m 1s 300ms."),
            "{refused}"
        );
        let fits = Cli::parse_from([
            "idempay",
            "--recovery-window",
            "3s",
            "--processor-timeout",
            "200ms",
            "--lease",
            "1s",
        ])
        .settings;
        assert_eq!(
            check_recovery_window(&fits),
            Ok(()),
            "0.6 s + 0.3 s + 1 s + the 1 s margin"
        );
        let late = Cli::parse_from(["idempay", "--recovery-window", "23h 59m 45s"]).settings;
        let refused = check_recovery_window(&late).unwrap_err();
        assert!(
            refused.contains("IDEMPAY_RECOVERY_WINDOW (23h 59m 45s) plus")
                && refused.contains("remembers its idempotency keys (1day)"),
            "{refused}"
        );
    }

    #[test]
    fn a_schedule_that_gives_the_processor_s_events_up_within_the_recovery_window_is_refused() {
        let mut settings = Settings::default();
        assert_eq!(check_processor_redelivery(&settings), Ok(()));
        settings.shared.webhook_retry_schedule = RetrySchedule::parse("2s,5s,10s,30s,1m").unwrap();
        let refused = check_processor_redelivery(&settings).unwrap_err();
        assert!(
            refused.contains("IDEMPAY_WEBHOOK_RETRY_SCHEDULE (2s,5s,10s,30s,1m)")
                && refused.contains("IDEMPAY_RECOVERY_WINDOW (12h) plus")
                && refused.contains("IDEMPAY_PROCESSOR_TIMEOUT 10s): 12h 30s 300ms"),
            "{refused}"
        );
        settings.recovery_window = Duration::from_secs(60);
        assert_eq!(
            check_processor_redelivery(&settings),
            Ok(()),
            "96.3 s ≥ 90.3 s"
        );
    }

    #[test]
    fn every_interval_and_timeout_of_zero_is_refused_naming_its_variable() {
        let positive = [
            ("--key-ttl", "IDEMPAY_KEY_TTL"),
            ("--expiry-interval", "IDEMPAY_EXPIRY_INTERVAL"),
            ("--event-retention", "IDEMPAY_EVENT_RETENTION"),
            (
                "--webhook-delivery-retention",
                "IDEMPAY_WEBHOOK_DELIVERY_RETENTION",
            ),
            ("--recovery-interval", "IDEMPAY_RECOVERY_INTERVAL"),
            ("--request-timeout", "IDEMPAY_REQUEST_TIMEOUT"),
            ("--processor-timeout", "IDEMPAY_PROCESSOR_TIMEOUT"),
            (
                "--webhook-delivery-timeout",
                "IDEMPAY_WEBHOOK_DELIVERY_TIMEOUT",
            ),
            ("--webhook-poll-interval", "IDEMPAY_WEBHOOK_POLL_INTERVAL"),
            ("--header-read-timeout", "IDEMPAY_HEADER_READ_TIMEOUT"),
            ("--body-read-timeout", "IDEMPAY_BODY_READ_TIMEOUT"),
            (
                "--database-acquire-timeout",
                "IDEMPAY_DATABASE_ACQUIRE_TIMEOUT",
            ),
        ];
        for (flag, variable) in positive {
            let error = Cli::try_parse_from(["idempay", flag, "0s"])
                .err()
                .unwrap_or_else(|| panic!("{flag} 0s is refused"));
            assert!(
                error
                    .to_string()
                    .contains(&format!("{variable} must be longer than zero")),
                "{error}"
            );
            let error = Cli::try_parse_from(["idempay", flag, "2years"])
                .err()
                .unwrap_or_else(|| panic!("{flag} 2years is refused"));
            assert!(
                error
                    .to_string()
                    .contains(&format!("{variable} must be at most 1year")),
                "{error}"
            );
            let error = Cli::try_parse_from(["idempay", flag, "soon"])
                .err()
                .unwrap_or_else(|| panic!("{flag} soon is refused"));
            assert!(error.to_string().contains(variable), "{error}");
            assert!(
                Cli::try_parse_from(["idempay", flag, "1year"]).is_ok(),
                "{flag}"
            );
        }
        // A simulated delay of zero is none.
        let parsed = Cli::parse_from(["idempay", "--slow-charge", "0s"]).settings;
        assert_eq!(parsed.shared.slow_charge, Duration::ZERO);
        let error = Cli::try_parse_from(["idempay", "--database-max-connections", "0"])
            .err()
            .expect("no connections is refused");
        assert!(
            error
                .to_string()
                .contains("IDEMPAY_DATABASE_MAX_CONNECTIONS must be at least 1"),
            "{error}"
        );
    }

    /// The retrying client (the crate `client`) ends a call only at its deadline, and a key held
    /// by an instance that died answers 409 until the lease runs out; the retry that takes it over
    /// then calls the processor. A deadline shorter than twice both would give up on a key still
    /// held, and an application that starts over with a new key charges twice.
    #[test]
    fn the_client_s_default_deadline_outlasts_the_default_lease_and_a_processor_call() {
        let settings = Settings::default();
        let covered = settings.shared.lease + settings.processor.timeout;
        let deadline = client::RetryPolicy::default().deadline;
        assert!(
            deadline >= covered * 2,
            "the client's default deadline of {deadline:?} against a lease and a processor call \
             of {covered:?}: lengthen client::RetryPolicy::DEFAULT_DEADLINE"
        );
    }

    #[test]
    fn a_client_timeout_of_zero_is_refused() {
        assert!(Cli::try_parse_from(["idempay", "--header-read-timeout", "0s"]).is_err());
        let parsed = Cli::parse_from(["idempay", "--body-read-timeout", "1s"]).settings;
        assert_eq!(parsed.body_read_timeout, Duration::from_secs(1));
    }
}
