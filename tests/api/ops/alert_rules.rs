//! The rules of `ops/prometheus/idempay.rules.yml` are valid (`promtool check rules`), each alert
//! fires in a case of `idempay.rules.test.yml` and stays quiet in another (`promtool test rules`),
//! and each says how urgent it is, what it means and where its runbook is.

use std::process::Command;

use idempay_test_macros::api_test;

use super::{alerts, prometheus_dir, runbook_anchors};

/// Runs promtool in `ops/prometheus/` (the test file names the rules by a path relative to it).
fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .expect("promtool runs (Debian's prometheus package: bash scripts/install-prometheus.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "promtool {} failed:\n{text}",
        args.join(" ")
    );
    text
}

#[api_test]
async fn the_rules_pass_promtool_check_and_every_alert_fires_and_stays_quiet_in_its_cases() {
    promtool(&["check", "rules", "idempay.rules.yml"]);
    promtool(&["test", "rules", "idempay.rules.test.yml"]);

    // promtool passes a test file that never mentions an alert: each must have a case where it
    // fires (expected alerts) and one where it stays quiet (`exp_alerts: []`).
    let cases = std::fs::read_to_string(prometheus_dir().join("idempay.rules.test.yml"))
        .expect("the rules' cases");
    let lines: Vec<&str> = cases.lines().map(str::trim).collect();
    let mut missing = Vec::new();
    for alert in alerts() {
        let named = format!("alertname: {}", alert.name);
        let mut fires = false;
        let mut quiet = false;
        for (index, line) in lines.iter().enumerate() {
            if *line != named {
                continue;
            }
            match lines.get(index + 1) {
                Some(&"exp_alerts: []") => quiet = true,
                Some(&"exp_alerts:") => fires = true,
                _ => {}
            }
        }
        if !fires {
            missing.push(format!("{}: no case where it fires", alert.name));
        }
        if !quiet {
            missing.push(format!("{}: no case where it stays quiet", alert.name));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The alerts an operator relies on: held keys, unknown outcomes, old suspended keys, delivery lag,
/// disabled endpoints, dead or failing jobs, targets down, the objectives' burn rates, and
/// backends left inside a transaction.
const REQUIRED: [&str; 16] = [
    "IdempayKeyHeld",
    "IdempaySuspendedKeyOld",
    "IdempayProcessorOutcomesUnknown",
    "IdempayWebhookDeliveryLagging",
    "IdempayProcessorEventsLagging",
    "IdempayWebhookEndpointsDisabled",
    "IdempayJobDead",
    "IdempayJobNotSucceeding",
    "IdempayDown",
    "IdempayProcessorDown",
    "IdempayAvailabilityBudgetBurnFast",
    "IdempayAvailabilityBudgetBurnSlow",
    "IdempayLatencyBudgetBurnFast",
    "IdempayLatencyBudgetBurnSlow",
    "IdempayIdleInTransaction",
    "IdempayConnectionsDiscarded",
];

#[api_test]
async fn every_alert_has_a_severity_a_summary_and_a_runbook_section_that_exists() {
    let alerts = alerts();
    let names: Vec<&str> = alerts.iter().map(|alert| alert.name.as_str()).collect();
    for required in REQUIRED {
        assert!(names.contains(&required), "no alert {required}: {names:?}");
    }
    let anchors = runbook_anchors();
    let mut wrong = Vec::new();
    for alert in &alerts {
        let name = &alert.name;
        match alert.severity.as_deref() {
            Some("page" | "ticket") => {}
            other => wrong.push(format!("{name}: severity {other:?}, not page or ticket")),
        }
        if alert.summary.as_deref().is_none_or(str::is_empty) {
            wrong.push(format!("{name}: no summary"));
        }
        if alert.description.as_deref().is_none_or(str::is_empty) {
            wrong.push(format!("{name}: no description"));
        }
        match alert
            .runbook_url
            .as_deref()
            .and_then(|url| url.strip_prefix("ops/runbooks.md#"))
        {
            Some(anchor) if anchors.iter().any(|known| known == anchor) => {}
            Some(anchor) => wrong.push(format!(
                "{name}: ops/runbooks.md has no section #{anchor} (it has {anchors:?})"
            )),
            None => wrong.push(format!(
                "{name}: runbook_url {:?} is not ops/runbooks.md#<section>",
                alert.runbook_url
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
