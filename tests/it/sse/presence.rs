//! Presence across relays: each stream of a scope with presence starts with
//! a snapshot of who is connected (right after `ready`) and then hears
//! joins and leaves made on any relay; a subscriber with two streams is one
//! member; a relay killed outright loses its members when its heartbeat
//! expires; `presence: false` hides a subscriber; past the cap, streams
//! get counts only. Every test runs in both wake-up modes with two relays,
//! though presence itself does not use the wake-up path (it is a table
//! every relay reads).

use std::collections::BTreeMap;
use std::time::Duration;

use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};

use crate::support::process::{RelayProcess, free_port, relay_config};
use crate::support::server::{ADMIN_TOKEN, SseStream, TEST_SECRET, TestServer};
use crate::support::{TestDb, test_in_both_wakeup_modes};
use eventrelay::config::Config;
use eventrelay::store::WakeupMode;

const EXPIRE_SECS: u64 = 3;

fn with_presence(max_members: usize) -> impl Fn(&mut Config) + Clone {
    move |config: &mut Config| {
        config.presence.scopes = vec!["org-*".into()];
        config.presence.batch_ms = 50;
        config.presence.expire_secs = EXPIRE_SECS;
        config.presence.max_members = max_members;
        config.admin.token = Some(ADMIN_TOKEN.into());
    }
}

/// A token for `subscriber` in `scope` with extra claims.
fn token_with(subscriber: &str, scope: &str, extra: Value) -> String {
    let mut claims = json!({
        "sub": subscriber,
        "scope": scope,
        "exp": chrono::Utc::now().timestamp() + 600,
    });
    claims
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(TEST_SECRET.as_bytes()).unwrap(),
    )
    .unwrap()
}

/// A stream and the members its presence frames say are connected.
struct Watcher {
    stream: SseStream,
    members: BTreeMap<String, Value>,
    count: u64,
    counts_only: bool,
}

impl Watcher {
    /// Connects and reads through `ready` and the snapshot after it.
    async fn open(server: &TestServer, token: &str) -> Watcher {
        let (mut stream, _) = server.subscribe(token, None, "").await;
        let first = stream.next_event().await;
        assert_eq!(
            first.event.as_deref(),
            Some("presence"),
            "the snapshot follows ready"
        );
        assert!(first.id.is_none(), "presence frames carry no id");
        let mut watcher = Watcher {
            stream,
            members: BTreeMap::new(),
            count: 0,
            counts_only: false,
        };
        let snapshot = first.json();
        assert_eq!(snapshot["snapshot"], true);
        watcher.apply(&snapshot);
        watcher
    }

    fn apply(&mut self, frame: &Value) {
        if frame["snapshot"] == true {
            self.members.clear();
        }
        self.count = frame["count"].as_u64().unwrap();
        self.counts_only = frame["members"].is_null();
        for member in frame["members"].as_array().into_iter().flatten() {
            self.members
                .insert(member["id"].as_str().unwrap().to_owned(), member.clone());
        }
        for left in frame["left"].as_array().into_iter().flatten() {
            self.members.remove(left.as_str().unwrap());
        }
    }

    /// Reads presence frames until `holds` is true of the members.
    async fn until(&mut self, what: &str, holds: impl Fn(&Watcher) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(EXPIRE_SECS * 4);
        while !holds(self) {
            let frame = tokio::time::timeout_at(deadline, self.stream.next_event())
                .await
                .unwrap_or_else(|_| panic!("{what}: members are {:?}", self.members));
            if frame.event.as_deref() == Some("presence") {
                self.apply(&frame.json());
            }
        }
    }

    fn streams_of(&self, id: &str) -> Option<i64> {
        self.members.get(id).and_then(|m| m["streams"].as_i64())
    }
}

test_in_both_wakeup_modes!(
    joins_and_leaves_are_seen_on_the_other_relay_and_two_tabs_are_one_member
);

async fn joins_and_leaves_are_seen_on_the_other_relay_and_two_tabs_are_one_member(
    mode: WakeupMode,
) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let one = TestServer::start(&db, with_presence(100));
    let two = TestServer::start(&db, with_presence(100));
    one.ready().await;
    two.ready().await;
    let ada = token_with("ada", "org-1", json!({"presence_info": {"name": "Ada"}}));
    let mut bob = Watcher::open(&two, &token_with("bob", "org-1", json!({}))).await;

    let first_tab = Watcher::open(&one, &ada).await;
    bob.until("ada joins on the other relay", |w| {
        w.streams_of("ada") == Some(1)
    })
    .await;
    assert_eq!(bob.members["ada"]["info"], json!({"name": "Ada"}));
    let second_tab = Watcher::open(&two, &ada).await;
    bob.until("ada has two streams", |w| w.streams_of("ada") == Some(2))
        .await;
    assert_eq!(bob.count, 2, "ada and bob");

    drop(first_tab);
    bob.until("ada is down to one stream", |w| {
        w.streams_of("ada") == Some(1)
    })
    .await;
    drop(second_tab);
    bob.until("ada leaves with her last stream", |w| {
        !w.members.contains_key("ada")
    })
    .await;
    assert_eq!(bob.count, 1);
}

test_in_both_wakeup_modes!(a_killed_relays_members_leave_when_its_heartbeat_expires);

async fn a_killed_relays_members_leave_when_its_heartbeat_expires(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let port = free_port();
    let extra =
        format!("[presence]\nscopes = [\"org-*\"]\nbatch_ms = 50\nexpire_secs = {EXPIRE_SECS}\n");
    let process = RelayProcess::spawn(&relay_config(&db, port, &extra));
    process.ready().await;
    let server = TestServer::start(&db, with_presence(100));
    server.ready().await;
    let mut bob = Watcher::open(&server, &token_with("bob", "org-1", json!({}))).await;

    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/events"))
        .bearer_auth(token_with("ada", "org-1", json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let _ada = SseStream::new(response);
    bob.until("ada joins on the process", |w| {
        w.members.contains_key("ada")
    })
    .await;

    process.kill();
    let killed = tokio::time::Instant::now();
    bob.until(
        "ada leaves once the killed relay's heartbeat expires",
        |w| !w.members.contains_key("ada"),
    )
    .await;
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(EXPIRE_SECS + 2),
        "ada left {took:?} after the kill"
    );
}

test_in_both_wakeup_modes!(a_hidden_subscriber_sees_the_others_and_is_never_listed);

async fn a_hidden_subscriber_sees_the_others_and_is_never_listed(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, with_presence(100));
    let other = TestServer::start(&db, with_presence(100));
    server.ready().await;
    other.ready().await;
    let hidden = token_with("cam", "org-1", json!({"presence": false}));
    let mut cam = Watcher::open(&server, &hidden).await;
    let _ada = Watcher::open(&other, &token_with("ada", "org-1", json!({}))).await;
    cam.until("cam sees ada", |w| w.members.contains_key("ada"))
        .await;
    assert!(!cam.members.contains_key("cam"));

    // The request: a subscriber of the scope, or the admin token.
    let (status, answer) = server
        .admin(
            &hidden,
            reqwest::Method::GET,
            "/v1/scopes/org-1/presence",
            None,
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["count"], 1);
    assert_eq!(answer["members"][0]["id"], "ada");
    let (status, _) = server
        .admin(
            ADMIN_TOKEN,
            reqwest::Method::GET,
            "/v1/scopes/org-1/presence",
            None,
        )
        .await;
    assert_eq!(status, 200);
    let eve = token_with("eve", "org-2", json!({}));
    let (status, refused) = server
        .admin(
            &eve,
            reqwest::Method::GET,
            "/v1/scopes/org-1/presence",
            None,
        )
        .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (403, Some("scope_not_granted"))
    );
    let (status, _) = server
        .admin(
            ADMIN_TOKEN,
            reqwest::Method::GET,
            "/v1/scopes/team-1/presence",
            None,
        )
        .await;
    assert_eq!(status, 404, "a scope without presence");
    let big = token_with(
        "zed",
        "org-1",
        json!({"presence_info": {"bio": "x".repeat(2000)}}),
    );
    let refused = server.connect(Some(&big), None, "").await;
    assert!(refused.is_err(), "an oversized presence_info is refused");
}

test_in_both_wakeup_modes!(past_the_cap_streams_get_counts_and_the_request_pages);

async fn past_the_cap_streams_get_counts_and_the_request_pages(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, with_presence(2));
    let other = TestServer::start(&db, with_presence(2));
    server.ready().await;
    other.ready().await;
    let mut ada = Watcher::open(&server, &token_with("ada", "org-1", json!({}))).await;
    let _bob = Watcher::open(&other, &token_with("bob", "org-1", json!({}))).await;
    ada.until("two members, listed", |w| w.members.len() == 2)
        .await;
    let cam = Watcher::open(&server, &token_with("cam", "org-1", json!({}))).await;
    ada.until("three members, counted only", |w| {
        w.count == 3 && w.counts_only
    })
    .await;
    let (_, page) = server
        .admin(
            ADMIN_TOKEN,
            reqwest::Method::GET,
            "/v1/scopes/org-1/presence?limit=2",
            None,
        )
        .await;
    assert_eq!(page["count"], 3);
    assert_eq!(page["members"].as_array().unwrap().len(), 2);
    assert_eq!(page["next"], "bob");
    let (_, rest) = server
        .admin(
            ADMIN_TOKEN,
            reqwest::Method::GET,
            "/v1/scopes/org-1/presence?limit=2&after=bob",
            None,
        )
        .await;
    assert_eq!(rest["members"][0]["id"], "cam");
    assert_eq!(rest["next"], Value::Null);
    drop(cam);
    ada.until("back under the cap, every member listed again", |w| {
        !w.counts_only && w.members.len() == 2
    })
    .await;
}

/// A member whose row took a lower version but committed after a higher
/// one was read is still read: each read takes again the rows of every
/// transaction that was running at the read before it.
#[tokio::test]
async fn a_member_written_by_a_late_commit_is_not_skipped() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, with_presence(100));
    server.ready().await;
    let mut bob = Watcher::open(&server, &token_with("bob", "org-1", json!({}))).await;
    let schema = db.schema.as_str();
    let setup = db.connect().await;
    setup
        .batch_execute(&format!(
            "INSERT INTO {schema}.presence_relays VALUES
                 ('writer-a', now() + interval '1 hour'), ('writer-b', now() + interval '1 hour')"
        ))
        .await
        .unwrap();
    let member = |relay: &str, subscriber: &str| {
        format!(
            "INSERT INTO {schema}.presence_members (relay_id, scope_key, subscriber_id, streams)
             VALUES ('{relay}', 'org-1', '{subscriber}', 1)"
        )
    };
    // The late one takes its version first and commits last.
    let mut late = db.connect().await;
    let late = late.transaction().await.unwrap();
    late.batch_execute(&member("writer-a", "lena"))
        .await
        .unwrap();
    setup
        .batch_execute(&member("writer-b", "erik"))
        .await
        .unwrap();
    bob.until("erik, written after lena, is read", |w| {
        w.members.contains_key("erik")
    })
    .await;
    assert!(
        !bob.members.contains_key("lena"),
        "lena is not committed yet"
    );
    late.commit().await.unwrap();
    bob.until("lena is read although her version is lower", |w| {
        w.members.contains_key("lena")
    })
    .await;
}
