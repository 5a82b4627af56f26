//! What can be checked of the container files and the command line without
//! a container engine: the Dockerfile's shape, that what it copies exists,
//! that the health check command it runs works against a real relay, and
//! that SIGTERM drains the relay within what the deployment files allow.
//! `scripts/check-image` replays the image's build stage and
//! `scripts/check-deploy` validates the Kubernetes and systemd files.

use std::path::Path;
use std::process::Command;

use crate::support::TestDb;
use crate::support::server::TestServer;

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn the_dockerfile_is_multi_stage_non_root_and_health_checked() {
    let dockerfile = repo_file("docker/Dockerfile");
    assert_eq!(
        dockerfile.matches("\nFROM ").count() + usize::from(dockerfile.starts_with("FROM ")),
        2
    );
    let user = dockerfile
        .lines()
        .find_map(|line| line.strip_prefix("USER "))
        .expect("a USER line");
    assert_ne!(user.trim(), "root");
    assert!(dockerfile.contains("HEALTHCHECK"));
    assert!(dockerfile.contains("\"eventrelay\", \"health\""));
    for line in dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let parts: Vec<&str> = line.split_whitespace().collect();
        for source in &parts[1..parts.len() - 1] {
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(source).exists(),
                "Dockerfile copies {source}, which does not exist"
            );
        }
    }
    let runtime_base = dockerfile
        .lines()
        .rfind(|line| line.starts_with("FROM "))
        .unwrap();
    assert!(
        runtime_base.contains("distroless") || runtime_base.contains("slim"),
        "the runtime stage starts from a small base: {runtime_base}"
    );
    let ignored: Vec<String> = repo_file(".dockerignore")
        .lines()
        .map(|line| line.trim().trim_end_matches('/').to_owned())
        .collect();
    for folder in ["target", ".git", ".eventrelay", "**/node_modules", "fuzz"] {
        assert!(
            ignored.iter().any(|line| line == folder),
            ".dockerignore must keep {folder} out of the build context"
        );
    }
    let compose = repo_file("docker/compose.yaml");
    assert!(compose.contains("dockerfile: docker/Dockerfile"));
    assert!(compose.contains("condition: service_healthy"));
}

#[tokio::test]
async fn the_health_command_reports_a_ready_relay() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let binary = env!("CARGO_BIN_EXE_eventrelay");
    let ok = Command::new(binary)
        .args(["health", "--url", &server.url("/readyz")])
        .status()
        .unwrap();
    assert!(ok.success());
    let missing = Command::new(binary)
        .args(["health", "--url", &server.url("/no-such-endpoint")])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("404"));
}

#[test]
fn check_config_names_the_bad_setting() {
    let output = Command::new(env!("CARGO_BIN_EXE_eventrelay"))
        .arg("check-config")
        .env("EVENTRELAY_SSE__HEARTBEAT_SECS", "0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("sse.heartbeat_secs"));
}

#[test]
fn serve_stops_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    let names = TestDb::unmigrated();
    let mut child = Command::new(env!("CARGO_BIN_EXE_eventrelay"))
        .arg("serve")
        .env("DATABASE_URL", &names.url)
        .env("EVENTRELAY_DATABASE__SCHEMA", names.schema.as_str())
        .env("EVENTRELAY_DATABASE__CHANNEL", names.channel.as_str())
        .env("EVENTRELAY_HTTP__BIND", "127.0.0.1:0")
        .env("EVENTRELAY_AUTH__MODE", "jwt")
        .env(
            "EVENTRELAY_AUTH__SECRET",
            crate::support::server::TEST_SECRET,
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first_line = String::new();
    stdout.read_line(&mut first_line).unwrap();
    // Keep reading so the service never writes into a closed pipe.
    let drain = std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    assert!(
        first_line.starts_with("eventrelay listening on http://127.0.0.1:"),
        "{first_line}"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status}");
            let _ = drain.join();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn the_relay_logs_at_the_configured_level_and_format() {
    use crate::support::process::{RelayProcess, relay_config};
    let db = TestDb::new().await;
    // relay_config sets `log.level = "warn"`: the start-up lines at INFO
    // must not appear.
    let quiet = RelayProcess::spawn(&relay_config(&db, 0, "[webhooks]\nenabled = false\n"));
    quiet.ready().await;
    // A JSON relay at info on the same database, to compare with.
    let json = RelayProcess::spawn(
        &relay_config(&db, 0, "[webhooks]\nenabled = false\n")
            .replace("level = \"warn\"", "level = \"info\"\nformat = \"json\""),
    );
    json.ready().await;
    crate::support::eventually("an INFO line is logged", async || {
        json.log()
            .contains("listening for notifications")
            .then_some(())
    })
    .await;
    for line in json.log().lines() {
        let parsed: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
    assert!(
        !quiet.log().contains("INFO"),
        "INFO lines under level = warn:\n{}",
        quiet.log()
    );
}

/// A child process that is killed if the test ends before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The first number after `key` in a deployment file (`key: 30`,
/// `key=30s`).
fn setting_after(text: &str, key: &str) -> u64 {
    let start = text
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in the file"))
        + key.len();
    text[start..]
        .trim_start_matches([':', '=', ' '])
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or_else(|| panic!("{key} is not followed by a number"))
}

/// SIGTERM with streams open: every stream ends, the process exits 0, and
/// it does so well inside what the deployment files allow: the Kubernetes
/// Deployment's grace period after its preStop pause, and the systemd
/// unit's TimeoutStopSec. Each stream ends cleanly (its closing chunk, not
/// a cut connection) at once, so a client reconnects to another replica
/// straight away with its Last-Event-ID and replays: nothing durable is
/// lost.
#[tokio::test]
async fn sigterm_ends_open_streams_within_the_deployments_grace_period() {
    use crate::support::process::relay_config;
    use futures_util::StreamExt;
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    let deployment = repo_file("deploy/kubernetes/deployment.yaml");
    let grace = setting_after(&deployment, "terminationGracePeriodSeconds");
    let pre_stop = setting_after(
        &deployment[deployment.find("preStop:").unwrap()..],
        "seconds",
    );
    let unit = repo_file("deploy/systemd/eventrelay.service");
    let timeout_stop = setting_after(&unit, "TimeoutStopSec");

    let db = TestDb::new().await;
    let config = std::env::temp_dir().join(format!(
        "eventrelay-sigterm-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &config,
        relay_config(&db, 0, "[webhooks]\nenabled = false\n"),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_eventrelay"));
    command.env_remove("DATABASE_URL");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            command.env_remove(name);
        }
    }
    let mut relay = KillOnDrop(
        command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut stdout = BufReader::new(relay.0.stdout.take().unwrap());
    let mut first_line = String::new();
    stdout.read_line(&mut first_line).unwrap();
    std::fs::remove_file(&config).unwrap();
    // Keep reading so the relay never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    let base = first_line
        .split_whitespace()
        .find(|word| word.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line: {first_line}"))
        .to_owned();
    crate::support::wait_ready(&base).await;
    let mut bodies = Vec::new();
    for subscriber in ["alice", "bob", "carol"] {
        let response = reqwest::Client::new()
            .get(format!("{base}/v1/events"))
            .bearer_auth(crate::support::server::token(
                subscriber,
                "org-1",
                serde_json::json!({}),
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.bytes_stream();
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains("event: ready") {
            let chunk = tokio::time::timeout(crate::support::DEADLINE, body.next())
                .await
                .expect("the ready frame arrives")
                .expect("the stream is open")
                .unwrap();
            seen.extend_from_slice(&chunk);
        }
        bodies.push(body);
    }

    let started = Instant::now();
    let status = Command::new("kill")
        .args(["-TERM", &relay.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let limit = Duration::from_secs(grace.saturating_sub(pre_stop));
    for mut body in bodies {
        // Heartbeats may still arrive; the stream must then end.
        loop {
            match tokio::time::timeout(limit, body.next()).await {
                Ok(Some(Ok(_))) => continue,
                Ok(None) => break,
                Ok(Some(Err(error))) => {
                    panic!("a stream was cut instead of ended cleanly: {error}")
                }
                Err(_) => panic!("a stream stayed open {limit:?} after SIGTERM"),
            }
        }
    }
    let streams_ended = started.elapsed();
    let code = loop {
        if let Some(status) = relay.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < limit,
            "the relay did not exit within {limit:?} of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let exited = started.elapsed();
    assert!(code.success(), "exit status after SIGTERM: {code}");
    eprintln!("streams ended {streams_ended:?} and the relay exited {exited:?} after SIGTERM");
    // Margin for a loaded node: the drain must take at most half of what
    // the deployment files allow.
    assert!(
        exited * 2 < limit,
        "draining took {exited:?}: raise terminationGracePeriodSeconds ({grace} s, preStop {pre_stop} s)"
    );
    assert!(
        exited * 2 < Duration::from_secs(timeout_stop),
        "draining took {exited:?}: raise TimeoutStopSec ({timeout_stop} s)"
    );
}

/// A relay started with a low soft limit on open files raises it to the
/// hard limit, so the runtime's default does not cap its streams.
#[tokio::test]
async fn serve_raises_its_open_file_limit_to_the_hard_limit() {
    use crate::support::process::relay_config;
    use std::io::{BufRead, BufReader};

    let db = TestDb::new().await;
    let config = std::env::temp_dir().join(format!(
        "eventrelay-nofile-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &config,
        relay_config(&db, 0, "[webhooks]\nenabled = false\n"),
    )
    .unwrap();
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(r#"ulimit -Sn 256 && exec "$0" serve --config "$1""#)
        .arg(env!("CARGO_BIN_EXE_eventrelay"))
        .arg(&config)
        .env_remove("DATABASE_URL");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            command.env_remove(name);
        }
    }
    let mut relay = KillOnDrop(
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut first_line = String::new();
    BufReader::new(relay.0.stdout.take().unwrap())
        .read_line(&mut first_line)
        .unwrap();
    std::fs::remove_file(&config).unwrap();
    assert!(first_line.contains("listening"), "{first_line}");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", relay.0.id())).unwrap();
    let line = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(
        numbers[0], numbers[1],
        "soft limit raised to the hard one: {line}"
    );
    assert_ne!(numbers[0], "256", "{line}");
}
