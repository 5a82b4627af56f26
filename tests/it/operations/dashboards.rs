//! The Grafana dashboard (deploy/grafana/eventrelay.json) and the Prometheus
//! alert rules (deploy/prometheus/alerts.yml) against the real service: every
//! metric they name is exposed on /metrics, and promtool accepts the rules.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::TestDb;
use crate::support::receiver::Receiver;
use crate::support::server::{TestServer, token};
use eventrelay::config::Config;
use eventrelay::publisher::{NewEvent, Publisher};
use eventrelay::webhooks::NewSubscription;
use serde_json::{Value, json};

const DASHBOARD: &str = "deploy/grafana/eventrelay.json";
const ALERTS: &str = "deploy/prometheus/alerts.yml";

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_file(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// The names a scrape can query, from the `# TYPE <name> <type>` lines of an
/// exposition: a counter's series is `<name>_total`, a histogram's family
/// name stands for its `_bucket`, `_sum` and `_count` series, and a gauge is
/// its own name.
fn exposed_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            let name = words.next()?;
            let kind = words.next()?;
            Some(match kind {
                "counter" if !name.ends_with("_total") => format!("{name}_total"),
                _ => name.to_owned(),
            })
        })
        .collect()
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// Every identifier starting with `eventrelay_` in a PromQL expression.
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut consumed = 0;
    for (at, _) in expr.match_indices("eventrelay_") {
        if at < consumed || expr[..at].chars().next_back().is_some_and(is_name_char) {
            continue;
        }
        let tail = &expr[at..];
        let end = tail.find(|c: char| !is_name_char(c)).unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        consumed = at + end;
    }
    names
}

/// Maps a histogram's `_bucket`, `_sum` or `_count` series back to its
/// family when the family is exposed (or when the name is not exposed as
/// it is, so a missing histogram is reported by its family name).
fn family(name: &str, exposed: &BTreeSet<String>) -> String {
    if exposed.contains(name) {
        return name.to_owned();
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            return base.to_owned();
        }
    }
    name.to_owned()
}

/// The PromQL in the dashboard: every `expr` (panel targets) and the
/// variables' `query`/`definition` strings, wherever they are nested.
fn dashboard_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query" | "definition", Value::String(text)) => {
                        out.push(text.clone())
                    }
                    _ => dashboard_exprs(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| dashboard_exprs(item, out)),
        _ => {}
    }
}

/// The `expr:` of every rule. The rules keep each expression on one line,
/// so plain line handling reads them without a YAML parser.
fn alert_exprs(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|line| line.trim_start().strip_prefix("expr:"))
        .map(|expr| expr.trim().to_owned())
        .collect()
}

fn webhook_to(url: &str) -> impl FnOnce(&mut Config) {
    let url = url.to_owned();
    move |config: &mut Config| {
        config.webhooks.allow_private_networks = true;
        config.webhooks.subscriptions = vec![NewSubscription {
            id: "receiver".into(),
            url,
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            types: vec!["order.*".into()],
            scope_key: None,
            max_per_second: None,
            ordering: Default::default(),
            ordering_max_block_secs: None,
        }];
    }
}

/// A subscriber that replays from the outbox and then gets an event live,
/// and a webhook delivery; answers the open stream.
async fn exercise(
    db: &TestDb,
    server: &TestServer,
    receiver: &Receiver,
) -> crate::support::server::SseStream {
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let client = db.connect().await;
    let first = publisher
        .emit(
            &client,
            NewEvent::durable("order.created", "org-1", json!({})),
        )
        .await
        .unwrap();
    let (mut stream, _) = server
        .subscribe(
            &token("alice", "org-1", json!({})),
            Some(&first.seq.unwrap().to_string()),
            "",
        )
        .await;
    let second = publisher
        .emit(&client, NewEvent::durable("order.paid", "org-1", json!({})))
        .await
        .unwrap();
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], second.id.to_string());
    receiver.wait_for(2).await;
    crate::support::eventually("the webhook deliveries are counted", async || {
        let delivered = server
            .metric("eventrelay_webhook_deliveries_total{outcome=\"delivered\"}")
            .await;
        (delivered >= 2.0).then_some(())
    })
    .await;
    stream
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_name_is_exposed() {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut exprs);
    let dashboard_exprs = exprs.len();
    exprs.extend(alert_exprs(&read(ALERTS)));
    assert!(dashboard_exprs > 20, "the dashboard has hardly any queries");
    assert!(
        exprs.len() - dashboard_exprs >= 9,
        "alerts.yml has fewer rules than expected"
    );

    let db = TestDb::new().await;
    let receiver = Receiver::start([]);
    let server = TestServer::start(&db, webhook_to(&receiver.url));
    server.ready().await;
    // Labelled families appear on /metrics once they have a series: make a
    // replay, a hub and a webhook delivery happen first.
    let _stream = exercise(&db, &server, &receiver).await;
    let exposition = reqwest::get(server.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exposed = exposed_names(&exposition);
    assert!(
        exposed.contains("eventrelay_sse_connections"),
        "no # TYPE lines parsed from /metrics:\n{exposition}"
    );

    let referenced: BTreeSet<String> = exprs
        .iter()
        .flat_map(|expr| names_in(expr))
        .map(|name| family(&name, &exposed))
        .collect();
    let missing: Vec<&String> = referenced
        .iter()
        .filter(|name| !exposed.contains(*name))
        .collect();
    println!(
        "{} queries name {} metrics; /metrics exposes {}",
        exprs.len(),
        referenced.len(),
        exposed.len()
    );
    assert!(
        missing.is_empty(),
        "the dashboard or the alert rules name metrics that /metrics does not expose:\n  {}",
        missing
            .iter()
            .map(|name| name.as_str())
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

#[test]
fn every_alert_has_a_severity_and_says_what_to_do() {
    let yaml = read(ALERTS);
    assert!(yaml.contains("- name: eventrelay\n"), "no eventrelay group");
    let rules: Vec<&str> = yaml.split("- alert: ").skip(1).collect();
    assert!(rules.len() >= 9, "only {} alert rules", rules.len());
    for rule in rules {
        let name = rule.lines().next().unwrap();
        for field in ["expr:", "severity:", "summary:", "description:"] {
            assert!(rule.contains(field), "{name} has no {field}");
        }
    }
}

fn promtool() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("promtool"))
        .chain([PathBuf::from("/usr/bin/promtool")])
        .find(|path| path.is_file())
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let promtool = promtool().unwrap_or_else(|| {
        panic!(
            "promtool is not installed: scripts/test installs it (Debian's prometheus package) \
             when run as root; or install it yourself"
        )
    });
    let output = std::process::Command::new(&promtool)
        .args(["check", "rules"])
        .arg(repo_file(ALERTS))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    assert!(
        output.status.success(),
        "promtool check rules {ALERTS} failed:\n{text}"
    );
}
