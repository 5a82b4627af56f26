//! HTTPS and HTTP/2 served by the relay itself, over TCP with certificates
//! made here (a CA and a leaf for 127.0.0.1): ALPN offers h2 and
//! http/1.1; streams, heartbeats, replay and the connection cap behave over
//! HTTP/2 as over HTTP/1.1, many streams sharing one connection; a renewed
//! certificate is served without a restart; and a missing, unreadable,
//! malformed or mismatched pair stops the start with an error naming the
//! setting.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::server::{SseStream, TEST_SECRET, TestServer, token};
use crate::support::tls::{Folder, TestCa, https, tls, tls_server, wait_ready};
use crate::support::{DEADLINE, TestDb, eventually};
use eventrelay::auth::{AuthConfig, JwtConfig, build_resolver};
use eventrelay::config::{Config, TlsConfig};
use reqwest::{StatusCode, Version};
use serde_json::{Value, json};
use tokio::time::Instant;

/// Opens a stream over HTTP/2; `Err` carries the refusal's status and body.
async fn open_stream(
    client: &reqwest::Client,
    base: &str,
    token: &str,
    last_event_id: Option<i64>,
) -> Result<SseStream, (StatusCode, Value)> {
    let mut request = client.get(format!("{base}/v1/events")).bearer_auth(token);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await.expect("relay answers");
    if response.status() != StatusCode::OK {
        let status = response.status();
        return Err((status, response.json().await.unwrap_or(Value::Null)));
    }
    assert_eq!(response.version(), Version::HTTP_2, "the stream is HTTP/2");
    Ok(SseStream::new(response))
}

async fn publish(client: &reqwest::Client, base: &str, event_type: &str) -> i64 {
    let response = client
        .post(format!("{base}/v1/events"))
        .bearer_auth(crate::support::server::PUBLISH_TOKEN)
        .json(&json!({"type": event_type, "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["events"][0]["seq"].as_i64().unwrap()
}

#[tokio::test]
async fn streams_over_http2_behave_as_over_http1() {
    let db = TestDb::new().await;
    let (server, ca, _folder) = tls_server(&db, |config| {
        config.sse.heartbeat_secs = 1;
        config.sse.replay_lookback = 0;
        config.sse.max_connections_per_subscriber = 3;
    });
    let base = https(&server);
    let client = ca.client();
    wait_ready(&client, &base).await;

    // ALPN: HTTP/2 for a client that offers it, HTTP/1.1 for one that does
    // not, and no plain HTTP on the TLS port.
    let response = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(response.version(), Version::HTTP_2);
    let http1 = ca.client_builder().http1_only().build().unwrap();
    let response = http1.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(
        (response.status(), response.version()),
        (StatusCode::OK, Version::HTTP_11)
    );
    assert!(reqwest::get(server.url("/healthz")).await.is_err());

    // Live events and heartbeats.
    let alice = token("alice", "org-1", json!({}));
    let mut live = open_stream(&client, &base, &alice, None).await.unwrap();
    let resync = live.ready().await;
    assert!(live.replayed.is_empty() && resync);
    let first = publish(&client, &base, "order.created").await;
    let frame = live.next_event().await;
    assert_eq!(frame.event.as_deref(), Some("order.created"));
    assert_eq!(frame.seq(), Some(first));
    loop {
        if live.next_frame().await.unwrap().comment.as_deref() == Some("hb") {
            break;
        }
    }

    // Replay from Last-Event-ID, on a second stream of the same connection.
    let second = publish(&client, &base, "order.paid").await;
    assert_eq!(live.next_event().await.seq(), Some(second));
    let mut resumed = open_stream(&client, &base, &alice, Some(first))
        .await
        .unwrap();
    assert!(!resumed.ready().await);
    let seqs: Vec<_> = resumed.replayed.iter().map(|f| f.seq().unwrap()).collect();
    assert_eq!(seqs, vec![second]);

    // The connection cap counts HTTP/2 streams like connections, and a
    // stream the client resets gives its place back.
    let third = open_stream(&client, &base, &alice, None).await.unwrap();
    let (status, body) = open_stream(&client, &base, &alice, None)
        .await
        .err()
        .expect("the fourth stream is over the cap");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["code"], "too_many_connections");
    drop(third);
    let mut fourth = eventually(
        "the reset stream gives its place back",
        async || match open_stream(&client, &base, &alice, None).await {
            Ok(stream) => Some(stream),
            Err((StatusCode::TOO_MANY_REQUESTS, _)) => None,
            Err(other) => panic!("refused for another reason: {other:?}"),
        },
    )
    .await;
    fourth.ready().await;
    let last = publish(&client, &base, "order.shipped").await;
    for stream in [&mut live, &mut resumed, &mut fourth] {
        assert_eq!(stream.next_event().await.seq(), Some(last));
    }
}

/// An event stream over HTTP/1.1, answered 200.
async fn open_http1(client: &reqwest::Client, base: &str, token: &str) -> reqwest::Response {
    let response = client
        .get(format!("{base}/v1/events"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (response.status(), response.version()),
        (StatusCode::OK, Version::HTTP_11)
    );
    response
}

#[tokio::test]
async fn https_connections_are_sent_on_without_waiting_for_acknowledgements() {
    let db = TestDb::new().await;
    let (server, ca, _folder) = tls_server(&db, |_| {});
    let base = https(&server);
    let alice = token("alice", "org-1", json!({}));
    // One stream over HTTP/2, and one over HTTP/1.1.
    let client = ca.client();
    wait_ready(&client, &base).await;
    let mut http2 = open_stream(&client, &base, &alice, None).await.unwrap();
    http2.ready().await;
    let http1 = ca.client_builder().http1_only().build().unwrap();
    let _stream = open_http1(&http1, &base, &alice).await;
    let accepted = crate::support::sockets::accepted_nodelay(crate::support::sockets::address_of(
        &server.base,
    ));
    assert!(
        accepted.len() >= 2 && accepted.iter().all(|nodelay| *nodelay),
        "the relay's side of both streams has TCP_NODELAY: {accepted:?}"
    );
}

#[tokio::test]
async fn a_client_closing_an_https_stream_is_released_at_once() {
    let db = TestDb::new().await;
    // The default 20 s heartbeat: only the peek can notice the close.
    let (server, ca, _folder) = tls_server(&db, |config| {
        assert_eq!(config.sse.heartbeat_secs, 20);
    });
    let base = https(&server);
    let http1 = ca.client_builder().http1_only().build().unwrap();
    wait_ready(&http1, &base).await;

    let mut response = open_http1(&http1, &base, &token("alice", "org-1", json!({}))).await;
    let mut seen = String::new();
    while !seen.contains("event: ready") {
        let chunk = tokio::time::timeout(DEADLINE, response.chunk())
            .await
            .expect("the stream starts")
            .unwrap()
            .expect("the stream stays open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let observer = ca.client();
    assert_eq!(
        crate::support::metric_with(&observer, &base, "eventrelay_sse_connections").await,
        1.0
    );

    // Dropping an unfinished response closes its connection.
    drop(response);
    drop(http1);
    // Within the deadline, half the 20 s heartbeat: the peek noticed the
    // close, not a failed heartbeat write.
    eventually("the closed HTTPS stream is released", async || {
        let open =
            crate::support::metric_with(&observer, &base, "eventrelay_sse_connections").await;
        (open == 0.0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let db = TestDb::new().await;
    let (old_ca, new_ca) = (TestCa::new("old CA"), TestCa::new("new CA"));
    let folder = Folder::new();
    let (cert, key) = old_ca.leaf();
    let (cert_path, key_path) = (
        folder.write("cert.pem", &cert),
        folder.write("key.pem", &key),
    );
    let server = TestServer::start(&db, |config| config.http.tls = tls(&cert_path, &key_path));
    let base = https(&server);
    wait_ready(&old_ca.client(), &base).await;
    // Fresh clients, so every request makes a new handshake.
    let handshakes = |ca: &TestCa| {
        let client = ca.client();
        let url = format!("{base}/healthz");
        async move { client.get(url).send().await.is_ok() }
    };
    assert!(handshakes(&old_ca).await);
    assert!(!handshakes(&new_ca).await);

    // A renewal caught half-way (a new certificate, the old key) is not
    // used: the old pair keeps serving.
    let (cert, key) = new_ca.leaf();
    std::fs::write(&cert_path, &cert).unwrap();
    let deadline = Instant::now() + eventrelay::http::tls::CHECK_INTERVAL * 2;
    while Instant::now() < deadline {
        assert!(
            handshakes(&old_ca).await,
            "the old pair stays while the new one is half written"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::write(&key_path, &key).unwrap();
    eventually("the renewed certificate is served", async || {
        handshakes(&new_ca).await.then_some(())
    })
    .await;
    assert!(!handshakes(&old_ca).await);
}

/// Runs the service with `tls` and returns its start-up error.
fn start_error(tls: TlsConfig) -> String {
    let mut config = Config::default();
    config.http.tls = tls;
    config.auth = Some(AuthConfig::Jwt(JwtConfig {
        secret: Some(TEST_SECRET.into()),
        ..JwtConfig::default()
    }));
    let resolver = build_resolver(config.auth.as_ref().unwrap()).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let result = actix_web::rt::System::new().block_on(eventrelay::server::run(
        config,
        resolver,
        listener,
        std::future::pending(),
    ));
    result.expect_err("the start fails").to_string()
}

#[test]
fn a_bad_pair_stops_the_start_naming_the_setting() {
    let ca = TestCa::new("CA");
    let folder = Folder::new();
    let (cert, key) = ca.leaf();
    let (other_cert, other_key) = ca.leaf();
    let cert = folder.write("cert.pem", &cert);
    let key = folder.write("key.pem", &key);
    let other_key = folder.write("other-key.pem", &other_key);
    let other_cert = folder.write("other-cert.pem", &other_cert);
    let missing = folder.0.join("missing.pem");
    let not_pem = folder.write("not.pem", "this is not PEM\n");
    let cut = folder.write("cut.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n");
    for (tls_config, starts, says) in [
        (
            tls(&missing, &key),
            "http.tls.cert_file: cannot read",
            "missing.pem",
        ),
        (
            tls(&cert, &missing),
            "http.tls.key_file: cannot read",
            "missing.pem",
        ),
        // A folder where a file should be: unreadable, even as root.
        (tls(&folder.0, &key), "http.tls.cert_file: cannot read", ""),
        (
            tls(&not_pem, &key),
            "http.tls.cert_file:",
            "holds no PEM certificate",
        ),
        (tls(&cut, &key), "http.tls.cert_file:", "not valid PEM"),
        (
            tls(&cert, &not_pem),
            "http.tls.key_file:",
            "holds no PEM private key",
        ),
        (
            tls(&cert, &cert),
            "http.tls.key_file:",
            "holds no PEM private key",
        ),
        (
            tls(&cert, &other_key),
            "http.tls.key_file:",
            "does not belong to the certificate",
        ),
        (
            tls(&other_cert, &key),
            "http.tls.key_file:",
            "does not belong to the certificate",
        ),
    ] {
        let error = start_error(tls_config.clone());
        assert!(error.starts_with(starts), "{tls_config:?}: {error}");
        assert!(error.contains(says), "{tls_config:?}: {error}");
    }

    // Half a pair is refused by the configuration check itself.
    for (tls_config, setting) in [
        (
            TlsConfig {
                cert_file: Some(cert.clone()),
                key_file: None,
            },
            "http.tls.key_file:",
        ),
        (
            TlsConfig {
                cert_file: None,
                key_file: Some(key.clone()),
            },
            "http.tls.cert_file:",
        ),
        (
            TlsConfig {
                cert_file: Some(PathBuf::new()),
                key_file: Some(key.clone()),
            },
            "http.tls.cert_file:",
        ),
    ] {
        let mut config = Config::default();
        config.http.tls = tls_config;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with(setting), "{error}");
    }
}

/// The command says what is wrong and exits with a failure, before it
/// touches the database.
#[test]
fn serve_exits_with_the_error_on_a_mismatched_pair() {
    let ca = TestCa::new("CA");
    let folder = Folder::new();
    let (cert, _) = ca.leaf();
    let (_, other_key) = ca.leaf();
    let cert = folder.write("cert.pem", &cert);
    let key = folder.write("key.pem", &other_key);
    let config = folder.write(
        "eventrelay.toml",
        &format!(
            r#"
[database]
url = "postgres://nobody@127.0.0.1:1/nothing"
[http]
bind = "127.0.0.1:0"
[http.tls]
cert_file = "{}"
key_file = "{}"
[auth]
mode = "jwt"
secret = "{TEST_SECRET}"
"#,
            cert.display(),
            key.display()
        ),
    );
    let mut command = Command::new(env!("CARGO_BIN_EXE_eventrelay"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .env_remove("DATABASE_URL")
        .args(["serve", "--config"])
        .arg(&config)
        .current_dir(&folder.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve did not stop on a mismatched pair");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("error: http.tls.key_file:")
            && stderr.contains("does not belong to the certificate"),
        "{stderr}"
    );
}
