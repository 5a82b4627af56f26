//! Pages from other origins, over TCP against a real relay: CORS
//! preflights and headers on `/v1/events` (exact origins, subdomain
//! patterns, `*` without credentials), refused preflights with their stable
//! codes and no CORS header, and the bearer token in a query parameter
//! (`auth.query_param`), which the relay never writes to its log.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use crate::support::server::{PUBLISH_TOKEN, SseStream, TEST_SECRET, TestServer, token};
use crate::support::{DEADLINE, TestDb};
use eventrelay::auth::AuthConfig;
use eventrelay::config::Config;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const APP: &str = "http://app.test:3000";
const CREDENTIALED: [&str; 2] = [
    "access-control-allow-origin",
    "access-control-allow-credentials",
];

fn origins(config: &mut Config) {
    config.http.allowed_origins = vec![APP.into(), "https://*.example.com".into()];
}

async fn preflight(
    server: &TestServer,
    origin: &str,
    method: &str,
    headers: Option<&str>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .request(Method::OPTIONS, server.url("/v1/events"))
        .header("origin", origin)
        .header("access-control-request-method", method);
    if let Some(headers) = headers {
        request = request.header("access-control-request-headers", headers);
    }
    request.send().await.expect("relay answers")
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).map(|value| value.to_str().unwrap())
}

fn vary(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all("vary")
        .iter()
        .flat_map(|value| value.to_str().unwrap().split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect()
}

/// No `access-control-*` header at all.
fn assert_no_cors(headers: &HeaderMap, what: &str) {
    let cors: Vec<_> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("access-control-"))
        .collect();
    assert!(cors.is_empty(), "{what}: unexpected CORS headers {cors:?}");
}

/// A refused preflight: 403, the stable code, JSON, and nothing else.
async fn assert_refused(response: reqwest::Response, code: &str) {
    assert_eq!(response.status(), StatusCode::FORBIDDEN, "{code}");
    assert_no_cors(response.headers(), code);
    let body: Value = response.json().await.expect("a JSON error body");
    assert_eq!(body["error"]["code"], code, "{body}");
}

#[tokio::test]
async fn an_allowed_origin_passes_the_preflight_and_reads_the_stream() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, origins);
    server.ready().await;

    for origin in [APP, "https://orders.example.com", "https://a.b.example.com"] {
        let response = preflight(
            &server,
            origin,
            "GET",
            Some("authorization,last-event-id,cache-control"),
        )
        .await;
        assert_eq!(response.status(), StatusCode::NO_CONTENT, "{origin}");
        let headers = response.headers();
        assert_eq!(header(headers, "access-control-allow-origin"), Some(origin));
        assert_eq!(
            header(headers, "access-control-allow-credentials"),
            Some("true")
        );
        assert_eq!(header(headers, "access-control-allow-methods"), Some("GET"));
        let allowed = header(headers, "access-control-allow-headers").unwrap();
        for name in ["authorization", "last-event-id", "cache-control"] {
            assert!(allowed.contains(name), "{allowed}");
        }
        assert!(vary(headers).contains(&"origin".to_owned()));
        assert!(header(headers, "access-control-max-age").is_some());
    }

    // The stream itself, read as the page's fetch would.
    let alice = token("alice", "org-1", json!({}));
    let response = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .header("origin", APP)
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers();
    assert_eq!(header(headers, "access-control-allow-origin"), Some(APP));
    assert_eq!(
        header(headers, "access-control-allow-credentials"),
        Some("true")
    );
    assert!(
        header(headers, "access-control-expose-headers")
            .unwrap()
            .contains("retry-after")
    );
    assert!(vary(headers).contains(&"origin".to_owned()));
    assert_eq!(header(headers, "content-type"), Some("text/event-stream"));
    let mut body = response;
    let mut seen = String::new();
    while !seen.contains("event: ready") {
        let chunk = tokio::time::timeout(DEADLINE, body.chunk())
            .await
            .expect("ready before the deadline")
            .unwrap()
            .expect("stream open");
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }

    // A refusal carries the headers too, so the page can read its status
    // and refresh the token instead of seeing a network error.
    let refused = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .header("origin", APP)
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    assert_eq!(
        header(refused.headers(), "access-control-allow-origin"),
        Some(APP)
    );
}

#[tokio::test]
async fn other_origins_and_requests_get_no_cors_headers() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, origins);
    server.ready().await;

    for origin in [
        "http://app.test:3001",
        "https://app.test:3000",
        "https://example.com",
        "https://orders.example.com.evil.test",
        "null",
    ] {
        assert_refused(
            preflight(&server, origin, "GET", Some("authorization")).await,
            "origin_not_allowed",
        )
        .await;
        let response = reqwest::Client::new()
            .get(server.url("/v1/events"))
            .header("origin", origin)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 401);
        assert_no_cors(response.headers(), origin);
        // Caches must still keep answers for different origins apart.
        assert!(vary(response.headers()).contains(&"origin".to_owned()));
    }

    // A request without an Origin (curl, a server) is unchanged.
    let response = reqwest::get(server.url("/v1/events")).await.unwrap();
    assert_eq!(response.status(), 401);
    assert_no_cors(response.headers(), "no origin");

    // A method or a header that is not open to other origins.
    for method in ["DELETE", "PUT", "POST", "get "] {
        assert_refused(
            preflight(&server, APP, method, None).await,
            "cors_method_not_allowed",
        )
        .await;
    }
    for headers in [
        "x-request-id",
        "authorization, x-request-id",
        "content-type",
    ] {
        assert_refused(
            preflight(&server, APP, "GET", Some(headers)).await,
            "cors_header_not_allowed",
        )
        .await;
    }
    // The publish API answers no other origin unless asked to.
    let response = reqwest::Client::new()
        .post(server.url("/v1/events"))
        .header("origin", APP)
        .bearer_auth(PUBLISH_TOKEN)
        .json(&json!({"type": "t.x", "scopeKey": "org-1", "lane": "ephemeral", "data": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_no_cors(response.headers(), "publish without http.cors_publish");

    // Other endpoints and a plain OPTIONS are not CORS endpoints.
    let options = reqwest::Client::new()
        .request(Method::OPTIONS, server.url("/v1/events"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_eq!(options.status(), 404);
    assert_no_cors(options.headers(), "plain OPTIONS");
    let health = reqwest::Client::new()
        .get(server.url("/healthz"))
        .header("origin", APP)
        .send()
        .await
        .unwrap();
    assert_no_cors(health.headers(), "healthz");
}

#[tokio::test]
async fn without_allowed_origins_every_preflight_is_refused() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    assert_refused(
        preflight(&server, APP, "GET", Some("authorization")).await,
        "origin_not_allowed",
    )
    .await;
    let response = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .header("origin", APP)
        .bearer_auth(token("alice", "org-1", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_no_cors(response.headers(), "same-origin relay");
}

#[tokio::test]
async fn publishing_from_another_origin_when_configured() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |config| {
        origins(config);
        config.http.cors_publish = true;
    });
    server.ready().await;
    let response = preflight(&server, APP, "POST", Some("authorization, content-type")).await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        header(response.headers(), "access-control-allow-methods"),
        Some("POST")
    );
    assert_refused(
        preflight(&server, APP, "POST", Some("last-event-id")).await,
        "cors_header_not_allowed",
    )
    .await;
    let response = reqwest::Client::new()
        .post(server.url("/v1/events"))
        .header("origin", APP)
        .bearer_auth(PUBLISH_TOKEN)
        .json(&json!({"type": "t.x", "scopeKey": "org-1", "lane": "ephemeral", "data": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        Some(APP)
    );
}

#[tokio::test]
async fn any_origin_is_served_without_credentials() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |config| {
        config.http.allowed_origins = vec!["*".into()];
        config.http.allow_credentials = false;
    });
    server.ready().await;
    let response = preflight(&server, "https://anyone.test", "GET", Some("authorization")).await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        Some("*")
    );
    assert_eq!(
        header(response.headers(), "access-control-allow-credentials"),
        None
    );
    let response = reqwest::Client::new()
        .get(server.url("/v1/events"))
        .header("origin", "https://anyone.test")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    for name in CREDENTIALED {
        let expected = (name == "access-control-allow-origin").then_some("*");
        assert_eq!(header(response.headers(), name), expected, "{name}");
    }
}

#[test]
fn bad_origin_settings_are_refused_at_load_naming_the_setting() {
    for (origins, credentials, says) in [
        (vec!["*"], true, "cannot go with credentials"),
        (vec!["*", "https://app.example.com"], false, "list it alone"),
        (vec!["https://app.example.com/"], true, "no path"),
        (vec!["app.example.com"], true, "scheme://host"),
        (vec!["https://*.com"], true, "two labels"),
        (vec!["https://app.*.example.com"], true, "leftmost"),
    ] {
        let mut config = Config::default();
        config.http.allowed_origins = origins.iter().map(|o| (*o).to_owned()).collect();
        config.http.allow_credentials = credentials;
        let error = config.validate().unwrap_err().to_string();
        assert!(error.starts_with("http.allowed_origins:"), "{error}");
        assert!(error.contains(says), "{origins:?}: {error}");
    }
}

#[tokio::test]
async fn a_query_token_opens_the_stream_only_when_configured() {
    let db = TestDb::new().await;
    let alice = token("alice", "org-1", json!({}));
    let plain = TestServer::start(&db, |_| {});
    plain.ready().await;
    let (status, body) = plain
        .connect(None, None, &format!("?access_token={alice}"))
        .await
        .err()
        .expect("no query tokens by default");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    drop(plain);

    let server = TestServer::start(&db, |config| {
        if let Some(AuthConfig::Jwt(jwt)) = &mut config.auth {
            jwt.query_param = Some("access_token".into());
        }
    });
    server.ready().await;
    let (mut stream, resync) =
        subscribe_with_query(&server, &format!("?access_token={alice}&until=done.now")).await;
    assert!(resync);
    server
        .publish(json!({"type": "done.now", "scopeKey": "org-1", "lane": "durable", "data": {}}))
        .await;
    assert_eq!(stream.next_event().await.event.as_deref(), Some("done.now"));

    // The header wins over the parameter.
    let (status, _) = server
        .connect(Some("wrong"), None, &format!("?access_token={alice}"))
        .await
        .err()
        .expect("a bad header is not rescued by the query");
    assert_eq!(status, 401);
    let (status, _) = server
        .connect(None, None, "?access_token=forged")
        .await
        .err()
        .expect("a bad query token is refused");
    assert_eq!(status, 401);
}

/// `subscribe` without a header: the query string carries the token.
async fn subscribe_with_query(server: &TestServer, query: &str) -> (SseStream, bool) {
    let mut stream = server
        .connect(None, None, query)
        .await
        .unwrap_or_else(|e| panic!("refused: {e:?}"));
    loop {
        let frame = stream.next_frame().await.expect("open until ready");
        if frame.event.as_deref() == Some("ready") {
            return (stream, frame.json()["resync"].as_bool().unwrap());
        }
    }
}

/// The relay as a process, logging everything at `trace`: its whole log,
/// read to the end once it has stopped, announces `*` and holds no query
/// token, accepted or refused.
#[tokio::test]
async fn query_tokens_never_reach_the_log_and_star_is_announced() {
    let db = TestDb::new().await;
    let config = std::env::temp_dir().join(format!(
        "eventrelay-cors-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(
        &config,
        format!(
            r#"
[database]
url = "{url}"
schema = "{schema}"
channel = "{channel}"
pool_size = 2

[http]
bind = "127.0.0.1:0"
workers = 1
allowed_origins = ["*"]
allow_credentials = false

[hub]
arbiters = 1

[auth]
mode = "jwt"
algorithm = "HS256"
secret = "{TEST_SECRET}"
query_param = "access_token"

[log]
level = "trace"
"#,
            url = db.url,
            schema = db.schema,
            channel = db.channel,
        ),
    )
    .unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_eventrelay"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("EVENTRELAY_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .env_remove("DATABASE_URL")
        .env_remove("RUST_LOG")
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the eventrelay binary starts");
    // The whole log, collected until the process has gone.
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut log);
        log
    });
    let (first_line, announced) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = first_line.send(lines.next());
        for _ in lines {}
    });
    let line = announced
        .recv_timeout(DEADLINE)
        .expect("the relay announces its address")
        .expect("a line")
        .unwrap();
    let base = line
        .split_whitespace()
        .find(|word| word.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_owned();
    crate::support::wait_ready(&base).await;

    let alice = token("alice", "org-1", json!({}));
    let forged = "forged.query.token-that-must-not-be-logged";
    let client = reqwest::Client::new();
    for (query_token, status) in [(forged, 401), (alice.as_str(), 200)] {
        let mut response = client
            .get(format!(
                "{base}/v1/events?access_token={query_token}&until=x.y"
            ))
            .header("origin", "https://anyone.test")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        if status == 200 {
            // Served: the stream starts.
            let chunk = tokio::time::timeout(DEADLINE, response.chunk()).await;
            assert!(matches!(chunk, Ok(Ok(Some(_)))), "{chunk:?}");
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&config);
    let log = log.join().unwrap();
    assert!(
        log.contains("http.allowed_origins = [\"*\"]"),
        "the start-up log announces `*`:\n{log}"
    );
    assert!(log.contains("TRACE"), "the relay logged at trace");
    let signature = alice.rsplit('.').next().unwrap();
    assert!(!log.contains(signature), "a query token reached the log");
    assert!(
        !log.contains(forged),
        "a refused query token reached the log"
    );
    assert!(
        !log.contains("access_token="),
        "the token parameter reached the log"
    );
}
