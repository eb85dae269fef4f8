//! `idempay webhook listen`, the receiver a developer runs: it verifies, deduplicates and prints.

use std::process::Stdio;
use std::time::Duration;

use idempay_test_macros::api_test;
use service::outbox::WebhookSecrets;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdout, Command};

/// The next line the receiver prints, within a bound.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a line in time")
        .expect("stdout readable")
        .expect("the receiver still runs")
}

#[api_test]
async fn the_local_receiver_prints_an_event_once_notes_its_duplicate_and_refuses_a_bad_signature() {
    let secret = WebhookSecrets::generate();
    let mut child = Command::new(env!("CARGO_BIN_EXE_idempay"))
        .args(["webhook", "listen", "--port", "0", "--fail-first", "1"])
        .args(["--secret", &secret.expose()])
        .env("RUST_LOG", "off")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("idempay webhook listen starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = next_line(&mut lines).await;
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();

    let body = br#"{"id":"evt_1","object":"event","type":"payment.succeeded","created_at":"2026-12-01T00:00:00Z","data":{"object":{}}}"#;
    let deliver = |signer: &WebhookSecrets| {
        let now = chrono::Utc::now().timestamp();
        let signature = signer.sign("evt_1", now, body).unwrap();
        reqwest::Client::new()
            .post(&url)
            .header("webhook-id", "evt_1")
            .header("webhook-timestamp", now)
            .header("webhook-signature", signature)
            .body(body.to_vec())
            .send()
    };
    let statuses = [
        deliver(&secret).await.unwrap().status().as_u16(),
        deliver(&secret).await.unwrap().status().as_u16(),
        deliver(&secret).await.unwrap().status().as_u16(),
        deliver(&WebhookSecrets::generate())
            .await
            .unwrap()
            .status()
            .as_u16(),
    ];

    assert_eq!(statuses, [500, 200, 200, 401]);
    let mut printed = Vec::new();
    for _ in 0..4 {
        printed.push(next_line(&mut lines).await);
    }
    assert!(
        printed[0].starts_with("failed on purpose: evt_1"),
        "{printed:?}"
    );
    assert_eq!(printed[1], "received: evt_1 payment.succeeded");
    assert!(printed[2].starts_with("duplicate: evt_1"), "{printed:?}");
    assert!(printed[3].starts_with("refused: "), "{printed:?}");
    child.kill().await.ok();
}
