//! `idempay dev`'s banner, as a new user meets it: `idempay dev` started as `make run` starts it,
//! and every command it prints pasted into a shell in another directory, each checked against
//! what its comment says it shows.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idempay_test_macros::api_test;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long `idempay dev` may take to print its banner: it starts a PostgreSQL container first.
const BANNER_WITHIN: Duration = Duration::from_secs(60);
/// What the banner promises of the receiver: an event, its failed deliveries and its retry.
const RETRIES_SEEN_WITHIN: Duration = Duration::from_secs(30);

#[api_test]
async fn every_command_the_dev_banner_prints_does_what_it_says_from_any_directory() {
    let dev = Dev::start().await;
    let shown = commands(&dev.banner);
    let elsewhere = Elsewhere::new();
    let find = |what: What| {
        shown
            .iter()
            .find(|command| command.what == what)
            .unwrap_or_else(|| panic!("no {what:?} command in the banner:\n{}", dev.banner))
            .text
            .clone()
    };
    assert_eq!(shown.len(), 10, "{shown:#?}");
    assert!(
        dev.banner.contains("(run the command above once more)"),
        "{}",
        dev.banner
    );

    // The receiver first, so that the payments' events are delivered to it.
    let registered = elsewhere.run(&find(What::RegisterEndpoint)).await;
    let endpoint: serde_json::Value = serde_json::from_str(&registered).unwrap();
    let secret = endpoint["secret"].as_str().unwrap().to_owned();
    let mut receiver = elsewhere.spawn(&find(What::Receive).replace("whsec_…", &secret));
    let listening = receiver.line(Duration::from_secs(15)).await;
    let receiver_address = listening
        .strip_prefix("listening on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("{listening}"))
        .to_owned();

    let pay = find(What::Pay);
    let paid = elsewhere.run(&pay).await;
    let paid_at = Instant::now();
    assert!(paid.starts_with("HTTP/1.1 201"), "{paid}");
    let payment: serde_json::Value = serde_json::from_str(paid.lines().last().unwrap()).unwrap();
    let payment_id = payment["id"].as_str().unwrap().to_owned();
    let again = elsewhere.run(&pay).await;
    assert!(
        again.to_lowercase().contains("idempotent-replayed: true"),
        "{again}"
    );
    assert_eq!(again.lines().last(), paid.lines().last(), "the same body");

    let mismatch = elsewhere.run(&find(What::Mismatch)).await;
    assert!(mismatch.starts_with("HTTP/1.1 422"), "{mismatch}");

    // The payment's event, the only one so far: failed on purpose twice, then received, all
    // within 30 s because `idempay dev` retries after seconds (production's second retry would
    // come 5 min after the first).
    let mut printed = Vec::new();
    while printed.len() < 3 {
        let left = RETRIES_SEEN_WITHIN.saturating_sub(paid_at.elapsed());
        assert!(
            !left.is_zero(),
            "not within {RETRIES_SEEN_WITHIN:?}: {printed:#?}"
        );
        printed.push(receiver.line(left).await);
    }
    let event = printed[0]
        .strip_prefix("failed on purpose: ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{printed:#?}"))
        .to_owned();
    assert!(
        printed[1].starts_with(&format!("failed on purpose: {event} ")),
        "{printed:#?}"
    );
    assert_eq!(
        printed[2],
        format!("received: {event} payment.succeeded"),
        "{printed:#?}"
    );
    eprintln!(
        "failed twice, then received {:?} after the payment",
        paid_at.elapsed()
    );

    let slow = elsewhere.run(&find(What::SlowAndItsRetry)).await;
    assert!(
        slow.contains("HTTP/1.1 409") && slow.to_lowercase().contains("retry-after:"),
        "{slow}"
    );
    assert!(slow.contains("HTTP/1.1 201"), "{slow}");

    let ledger = elsewhere.run(&find(What::ProcessorLedger)).await;
    let ledger: serde_json::Value = serde_json::from_str(&ledger).unwrap();
    assert_eq!(
        ledger["data"].as_array().map(Vec::len),
        Some(2),
        "one charge per payment: {ledger}"
    );

    // The dispute is opened at the processor, which sends its event: the payment shows it once
    // the event is delivered. Before, the banner sent an event of a dispute the processor never
    // made, and reconcile then failed (`dispute dp_demo1: the processor has no such dispute`).
    let charge = payment["charge"].as_str().unwrap();
    let opened = elsewhere
        .run(&find(What::Dispute).replace("ch_…", charge))
        .await;
    let opened: serde_json::Value = serde_json::from_str(&opened).unwrap();
    assert_eq!(
        (opened["object"].as_str(), opened["amount"].as_i64()),
        (Some("dispute"), Some(500)),
        "{opened}"
    );
    let key = api_key(&pay);
    let read_payment = || async {
        reqwest::Client::new()
            .get(format!("{}/v1/payments/{payment_id}", dev.base_url(&pay)))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    let opened_at = Instant::now();
    while read_payment().await["amount_disputed"] != 500 {
        assert!(
            opened_at.elapsed() < RETRIES_SEEN_WITHIN,
            "the processor's dispute not applied within {RETRIES_SEEN_WITHIN:?}: {}",
            read_payment().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let disputes: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/disputes?payment={payment_id}",
            dev.base_url(&pay)
        ))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(disputes["data"][0]["id"], opened["id"], "{disputes}");

    let reconciled = elsewhere.output(&find(What::Reconcile)).await;
    assert!(reconciled.success, "{reconciled:?}");
    assert_eq!(
        reconciled.stdout,
        "reconciled 2 charges, 2 payments, 0 refunds and 1 disputes: 0 difference(s)\n",
        "{reconciled:?}"
    );

    // Authorize now, capture later, as the banner shows it; then the ledgers agree on it too.
    let authorized = elsewhere.run(&find(What::Authorize)).await;
    assert!(authorized.starts_with("HTTP/1.1 201"), "{authorized}");
    let held: serde_json::Value = serde_json::from_str(authorized.lines().last().unwrap()).unwrap();
    assert_eq!(held["status"], "requires_capture", "{held}");
    let capture = find(What::Capture).replace("pay_…", held["id"].as_str().unwrap());
    let captured = elsewhere.run(&capture).await;
    assert!(captured.starts_with("HTTP/1.1 200"), "{captured}");
    let captured: serde_json::Value =
        serde_json::from_str(captured.lines().last().unwrap()).unwrap();
    assert_eq!(
        (&captured["status"], &captured["amount_captured"]),
        (&serde_json::json!("succeeded"), &serde_json::json!(3000)),
        "{captured}"
    );
    let reconciled = elsewhere.output(&find(What::Reconcile)).await;
    assert_eq!(
        reconciled.stdout,
        "reconciled 3 charges, 3 payments, 0 refunds and 1 disputes: 0 difference(s)\n",
        "{reconciled:?}"
    );

    receiver.stop();
    // Nothing of the test outlives it: the receiver's port is free again.
    let stopped_at = Instant::now();
    while tokio::net::TcpStream::connect(&receiver_address)
        .await
        .is_ok()
    {
        assert!(
            stopped_at.elapsed() < Duration::from_secs(10),
            "the receiver still listens on {receiver_address}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let warnings = dev.stop().await;
    assert!(
        warnings.is_empty(),
        "the walk-through logged: {warnings:#?}"
    );
}

/// What a command of the banner is for, by the comment above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    Pay,
    Mismatch,
    SlowAndItsRetry,
    Authorize,
    Capture,
    ProcessorLedger,
    Dispute,
    Reconcile,
    RegisterEndpoint,
    Receive,
}

impl What {
    /// Every command's comment says what it shows; one this test does not know fails it, so a
    /// command added to the banner is added here too.
    fn of(comment: &str) -> Self {
        let table = [
            ("# A payment:", Self::Pay),
            ("# The same key with another body: 422", Self::Mismatch),
            ("# A slow charge", Self::SlowAndItsRetry),
            ("# Authorize now, capture later", Self::Authorize),
            ("a capture takes 3000 of it", Self::Capture),
            ("The processor's ledger", Self::ProcessorLedger),
            ("# A dispute of 500 on a payment", Self::Dispute),
            ("# The two ledgers compared", Self::Reconcile),
            ("register an endpoint", Self::RegisterEndpoint),
            ("run a receiver", Self::Receive),
        ];
        table
            .iter()
            .find(|(words, _)| comment.contains(words))
            .map(|(_, what)| *what)
            .unwrap_or_else(|| panic!("a command this test does not check, under: {comment}"))
    }
}

/// A command of the banner: the lines right under a comment, up to the next blank line.
#[derive(Debug)]
struct Shown {
    what: What,
    text: String,
}

fn commands(banner: &str) -> Vec<Shown> {
    let mut shown = Vec::new();
    let (mut comment, mut command) = (String::new(), Vec::<&str>::new());
    let mut finish = |comment: &mut String, command: &mut Vec<&str>| {
        if !command.is_empty() {
            let text = command.join("\n");
            // The only blanks left for the reader are those the comments name.
            let unfilled = text
                .replace("ch_…", "")
                .replace("whsec_…", "")
                .replace("pay_…", "");
            assert!(!unfilled.contains('…'), "a blank to fill in: {text}");
            shown.push(Shown {
                what: What::of(comment),
                text,
            });
        }
        command.clear();
        comment.clear();
    };
    for line in banner.lines() {
        if line.starts_with('#') {
            if !command.is_empty() {
                finish(&mut comment, &mut command);
            }
            comment.push_str(line);
            comment.push('\n');
        } else if line.trim().is_empty() {
            finish(&mut comment, &mut command);
        } else if !comment.is_empty() {
            command.push(line);
        }
    }
    finish(&mut comment, &mut command);
    shown
}

/// The API key the payment command sends.
fn api_key(command: &str) -> String {
    let (_, after) = command.split_once("Bearer ").unwrap();
    after.split('\'').next().unwrap().to_owned()
}

/// `idempay dev`, as `make run` starts it, but on a free port; stopped with Ctrl-C (SIGINT), so
/// that it removes its PostgreSQL container, also when the test fails.
struct Dev {
    child: Child,
    banner: String,
    /// Its WARN and ERROR log lines.
    warnings: Arc<Mutex<Vec<String>>>,
}

impl Dev {
    async fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idempay"))
            .arg("dev")
            .env("IDEMPAY_LISTEN", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("idempay dev starts");
        let warnings = Arc::new(Mutex::new(Vec::new()));
        let mut logs = BufReader::new(child.stderr.take().unwrap()).lines();
        let kept = warnings.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = logs.next_line().await {
                if line.contains("WARN") || line.contains("ERROR") {
                    kept.lock().unwrap().push(line);
                }
            }
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut banner = String::new();
        let reading = async {
            // The receiver's command is the banner's last line.
            while let Some(line) = lines.next_line().await.unwrap() {
                banner.push_str(&line);
                banner.push('\n');
                if line.contains(" webhook listen ") {
                    return;
                }
            }
            panic!("idempay dev ended before its banner did:\n{banner}");
        };
        let mut dev = Self {
            child,
            banner: String::new(),
            warnings,
        };
        if tokio::time::timeout(BANNER_WITHIN, reading).await.is_err() {
            panic!("no banner within {BANNER_WITHIN:?}:\n{banner}");
        }
        dev.banner = banner;
        // Its output after the banner is not read: the pipe is left open.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        dev
    }

    /// The API's base URL, from a command that calls it.
    fn base_url(&self, command: &str) -> String {
        let start = command.find("http://").unwrap();
        let rest = &command[start..];
        let end = rest.find("/v1/").unwrap();
        rest[..end].to_owned()
    }

    fn interrupt(&self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    }

    /// Ctrl-C, then waits for it to end; its WARN and ERROR lines.
    async fn stop(mut self) -> Vec<String> {
        self.interrupt();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("idempay dev stops within 30 s of Ctrl-C")
            .unwrap();
        assert!(status.success(), "idempay dev ended with {status}");
        std::mem::take(&mut *self.warnings.lock().unwrap())
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.interrupt();
        }
    }
}

/// A new empty directory, not the repository's: where the banner's commands are pasted.
struct Elsewhere(PathBuf);

#[derive(Debug)]
struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Elsewhere {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("idempay-banner-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }

    fn shell(&self, command: &str) -> Command {
        let mut shell = Command::new("sh");
        shell
            .args(["-c", command])
            .current_dir(&self.0)
            .env("RUST_LOG", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        shell
    }

    async fn output(&self, command: &str) -> Ran {
        let output = tokio::time::timeout(Duration::from_secs(30), self.shell(command).output())
            .await
            .unwrap_or_else(|_| panic!("still running after 30 s: {command}"))
            .unwrap();
        Ran {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).replace('\r', ""),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs `command` to its end and returns its stdout; it must succeed.
    async fn run(&self, command: &str) -> String {
        let ran = self.output(command).await;
        assert!(ran.success, "{command}:\n{}\n{}", ran.stdout, ran.stderr);
        ran.stdout
    }

    /// Starts a command that runs until stopped, in a process group of its own.
    fn spawn(&self, command: &str) -> Running {
        let mut child = self
            .shell(command)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Running { child, lines }
    }
}

impl Drop for Elsewhere {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A long-running command of the banner, read a line at a time.
struct Running {
    child: Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Running {
    async fn line(&mut self, within: Duration) -> String {
        tokio::time::timeout(within, self.lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("the command still runs")
    }

    /// Stops the shell and what it started: its whole process group (`--` so that `kill` reads
    /// the group's negative id as an id, not an option).
    fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-s", "TERM", "--", &format!("-{pid}")])
                .status();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}
