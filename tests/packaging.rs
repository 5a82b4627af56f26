//! What can be checked of the container files and the command line without
//! a container engine: the Dockerfile's shape, that what it copies exists,
//! and that the health check command it runs works against a real relay.

mod common;

use std::path::Path;
use std::process::Command;

use common::TestDb;
use common::server::TestServer;

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
        .env("EVENTRELAY_AUTH__SECRET", common::server::TEST_SECRET)
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
    use common::process::{RelayProcess, relay_config};
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
    let deadline = tokio::time::Instant::now() + common::DEADLINE;
    while !json.log().contains("listening for notifications") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no INFO line logged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
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
