//! Secrets stay secret: the database password, the publish and admin
//! tokens, the JWT secret and webhook secrets never appear in what the
//! commands print, in the start-up banner, or in the log, even at debug
//! level, while the relay serves requests that use them.

use std::process::Command;

use crate::support::TestDb;
use crate::support::process::{RelayProcess, free_port};
use serde_json::json;

const PASSWORD: &str = "pw-7f3a9c1e-never-printed";
const PUBLISH: &str = "publish-4b2e8d7a-never-printed";
const ADMIN: &str = "admin-9d1c6f0b-never-printed";
const JWT: &str = "jwt-secret-5e8a2c4d-never-printed-at-all";
const WEBHOOK: &str = "whsec_c2VjcmV0LXdlYmhvb2stbmV2ZXItcHJpbnRlZA==";

fn secrets() -> [&'static str; 5] {
    [PASSWORD, PUBLISH, ADMIN, JWT, WEBHOOK]
}

fn assert_clean(what: &str, output: &str) {
    for secret in secrets() {
        assert!(
            !output.contains(secret),
            "{what} printed the secret {secret:?}:\n{output}"
        );
    }
}

/// A configuration with every kind of secret, on the test database (trust
/// authentication ignores the password).
fn config(db: &TestDb, port: u16) -> String {
    let url = db.url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{PASSWORD}@"),
        1,
    );
    assert_ne!(url, db.url, "the test URL has the expected form");
    format!(
        r#"
[database]
url = "{url}"
schema = "{schema}"
channel = "{channel}"

[http]
bind = "127.0.0.1:{port}"
workers = 1

[auth]
mode = "jwt"
algorithm = "HS256"
secret = "{JWT}"

[publish]
token = "{PUBLISH}"

[admin]
token = "{ADMIN}"

[log]
level = "debug"

[webhooks]
allow_private_networks = true

[[webhooks.subscriptions]]
id = "hook"
url = "http://127.0.0.1:9/hook"
secret = "{WEBHOOK}"
"#,
        schema = db.schema,
        channel = db.channel,
    )
}

#[tokio::test]
async fn no_command_and_no_log_line_shows_a_secret() {
    let db = TestDb::new().await;
    let config = config(&db, free_port());
    let file = std::env::temp_dir().join(format!("secrets-{}.toml", db.schema));
    std::fs::write(&file, &config).unwrap();

    let output = Command::new(env!("CARGO_BIN_EXE_eventrelay"))
        .args(["check-config", "--config"])
        .arg(&file)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{printed}");
    assert_clean("check-config", &printed);
    assert!(
        printed.contains("***"),
        "secrets are shown as ***:\n{printed}"
    );
    assert!(
        printed.contains("127.0.0.1"),
        "the rest of the URL stays readable"
    );

    let relay = RelayProcess::spawn(&config);
    relay.ready().await;
    // Use every secret: publish, admin, a subscriber's token, a webhook.
    let http = reqwest::Client::new();
    let published = http
        .post(format!("{}/v1/events", relay.base))
        .bearer_auth(PUBLISH)
        .json(&json!({"type": "order.created", "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 200);
    let refused = http
        .post(format!("{}/v1/events", relay.base))
        .bearer_auth(format!("{PUBLISH}-wrong"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let admin = http
        .get(format!("{}/v1/admin/subscriptions", relay.base))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(admin.status(), 200);
    let body = admin.text().await.unwrap();
    assert_clean("the admin API", &body);
    let token = crate::support::server::token_with_secret(JWT, "alice", "org-1");
    let stream = http
        .get(format!("{}/v1/events", relay.base))
        .bearer_auth(&token)
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    drop(stream);
    let log = format!("{}{}", relay.banner(), relay.log());
    assert!(log.contains("listening"), "the banner was captured:\n{log}");
    assert_clean("the relay's banner and log", &log);
    drop(relay);
    std::fs::remove_file(file).ok();
}

#[test]
fn development_secrets_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("dev-secrets-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_eventrelay"))
        .args(["token", "--subscriber", "alice", "--scope", "org-1"])
        .current_dir(&dir)
        .env_remove("EVENTRELAY_CONFIG")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mode = std::fs::metadata(dir.join(".eventrelay/jwt-secret"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    std::fs::remove_dir_all(dir).ok();
}
