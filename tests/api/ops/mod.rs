//! What an operator sees, checked: the alerting and recording rules of `ops/prometheus/` with
//! promtool, each alert's runbook, and a real Prometheus scraping a running idempay and its
//! processor until the alerts of a held key and a stalled endpoint fire ([`live_prometheus`]),
//! every metric a rule or a dashboard panel names exported, every panel's query answered.

mod alert_rules;
mod live_prometheus;

use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `ops/prometheus/`, where the rules and their promtool cases are.
fn prometheus_dir() -> PathBuf {
    root().join("ops/prometheus")
}

/// An alerting rule of the rules file, as written: its name and the values it was given.
#[derive(Debug, Default)]
pub struct Alert {
    pub name: String,
    pub severity: Option<String>,
    pub summary: Option<String>,
    pub description: Option<String>,
    pub runbook_url: Option<String>,
}

/// The alerting rules of `ops/prometheus/idempay.rules.yml`. The file is read as the text it is
/// (the suite has no YAML parser): a rule starts at `- alert:` or `- record:`, and its labels and
/// annotations are the `key: value` lines up to the next rule or group; promtool checks the YAML
/// itself.
pub fn alerts() -> Vec<Alert> {
    let text = std::fs::read_to_string(prometheus_dir().join("idempay.rules.yml"))
        .expect("ops/prometheus/idempay.rules.yml");
    let mut alerts = Vec::new();
    let mut current: Option<Alert> = None;
    for line in text.lines() {
        let line = line.trim();
        let item = line.strip_prefix("- ").unwrap_or(line);
        let Some((key, value)) = item.split_once(':') else {
            continue;
        };
        let value = value.trim().trim_matches('"').to_owned();
        let starts_an_item = line.starts_with("- ");
        if starts_an_item && matches!(key, "alert" | "record" | "name") {
            alerts.extend(current.take());
            if key == "alert" {
                current = Some(Alert {
                    name: value,
                    ..Alert::default()
                });
            }
            continue;
        }
        let Some(alert) = current.as_mut() else {
            continue;
        };
        let field = match key {
            "severity" => &mut alert.severity,
            "summary" => &mut alert.summary,
            "description" => &mut alert.description,
            "runbook_url" => &mut alert.runbook_url,
            _ => continue,
        };
        *field = Some(value);
    }
    alerts.extend(current);
    alerts
}

/// The anchors of `ops/runbooks.md`'s headings, as a Markdown renderer makes them: lower case,
/// spaces as hyphens, punctuation but `-` and `_` dropped.
pub fn runbook_anchors() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("ops/runbooks.md")).expect("ops/runbooks.md");
    text.lines()
        .filter_map(|line| line.strip_prefix("## "))
        .map(|heading| {
            heading
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}
