//! Late commits: a transaction that takes a seq and commits after many
//! higher seqs (in any scope) were delivered. A stream that resumes from
//! the `id:` it last saw, and a relay whose listener reconnects, must both
//! find it, however far below the newest seq it lies.

use eventrelay::store::WakeupMode;
use eventrelay::wire::{EventEnvelope, NewEvent};
use serde_json::json;
use tokio_postgres::Client;

use crate::support::cluster::Cluster;
use crate::support::freezer::{Freezer, postgres_addr};
use crate::support::server::{SseStream, TestServer, token};
use crate::support::{TestDb, eventually};

/// A relay, and alice subscribed to `org-x` on it, with no cursor.
async fn alice_subscribed() -> (TestDb, TestServer, String, SseStream) {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let alice = token("alice", "org-x", json!({}));
    let (stream, _) = server.subscribe(&alice, None, "").await;
    (db, server, alice, stream)
}

/// Emits the late event into `org-x` in `open`, which stays open.
async fn emit_late(db: &TestDb, open: &impl eventrelay::publisher::PgExecutor) -> EventEnvelope {
    db.emit_in(open, NewEvent::durable("late", "org-x", json!({})))
        .await
}

/// Commits `count` events in `scope` in one statement.
async fn fill(db: &TestDb, client: &Client, scope: &str, count: i64) {
    client
        .execute(
            &format!(
                "INSERT INTO {}.outbox (id, type, scope_key, data)
                 SELECT gen_random_uuid(), 'filler', $1, jsonb_build_object('n', n)
                 FROM generate_series(1, $2::int8) n",
                db.schema
            ),
            &[&scope, &count],
        )
        .await
        .unwrap();
}

/// The scenario every resume must survive: a subscriber of `org-x` sees
/// seq 152 while the transaction holding seq 1 is still open, goes away,
/// and resumes from the `id:` of 152 after that transaction committed.
/// With `keep_hub`, another stream keeps the scope's hub (and its tail)
/// alive meanwhile, so the resume is served from memory; without it, from
/// the outbox.
async fn resume_after_a_long_transaction(mode: WakeupMode, keep_hub: bool) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let alice = token("alice", "org-x", json!({}));
    let (mut stream, _) = server.subscribe(&alice, None, "").await;
    let keeper = match keep_hub {
        true => Some(
            server
                .subscribe(&token("bob", "org-x", json!({})), None, "")
                .await,
        ),
        false => None,
    };

    let mut long = db.connect().await;
    let open = long.transaction().await.unwrap();
    let late = emit_late(&db, &open).await;
    let others = db.connect().await;
    fill(&db, &others, "org-y", 150).await;
    let last = db.emit(NewEvent::durable("seen", "org-x", json!({}))).await;
    let seen = stream.next_event().await;
    assert_eq!(seen.json()["id"], last.id.to_string());
    assert!(
        last.seq.unwrap() - late.seq.unwrap() > 150,
        "more seqs passed than the plain look-back covers"
    );
    drop(stream);

    open.commit().await.unwrap();
    if let Some((mut keeper, _)) = keeper {
        // The hub has handed it on before the resume.
        let ids: Vec<String> = keeper
            .events(2)
            .await
            .iter()
            .map(|frame| frame.json()["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids, vec![last.id.to_string(), late.id.to_string()]);
    }
    let id = seen.id.clone().expect("a durable frame has an id");
    let (mut resumed, resync) = server.subscribe(&alice, Some(&id), "").await;
    assert!(!resync, "nothing was pruned: the resume is exact");
    let replayed: Vec<String> = resumed
        .replayed
        .iter()
        .map(|frame| frame.json()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        replayed,
        vec![late.id.to_string()],
        "the late commit, and nothing the stream had seen"
    );
    let next = db
        .emit(NewEvent::durable("after", "org-x", json!({})))
        .await;
    assert_eq!(resumed.next_event().await.json()["id"], next.id.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_from_the_outbox_gets_a_late_commit_however_many_seqs_passed() {
    resume_after_a_long_transaction(WakeupMode::Notify, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_from_the_tail_gets_a_late_commit_however_many_seqs_passed() {
    resume_after_a_long_transaction(WakeupMode::Notify, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_a_resume_from_the_outbox_gets_a_late_commit() {
    resume_after_a_long_transaction(WakeupMode::Logical, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_a_resume_from_the_tail_gets_a_late_commit() {
    resume_after_a_long_transaction(WakeupMode::Logical, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_whose_late_commit_is_still_open_gets_it_live() {
    let (db, server, alice, mut stream) = alice_subscribed().await;
    let mut long = db.connect().await;
    let open = long.transaction().await.unwrap();
    let late = emit_late(&db, &open).await;
    fill(&db, &db.connect().await, "org-y", 150).await;
    db.emit(NewEvent::durable("seen", "org-x", json!({}))).await;
    let id = stream.next_event().await.id.unwrap();
    drop(stream);

    let (mut resumed, resync) = server.subscribe(&alice, Some(&id), "").await;
    assert!(!resync);
    assert!(resumed.replayed.is_empty(), "{:?}", resumed.replayed);
    open.commit().await.unwrap();
    assert_eq!(resumed.next_event().await.json()["id"], late.id.to_string());
}

/// What a relay hears while its listener is cut is gone; when it listens
/// again it re-reads every active scope. A late commit made meanwhile lies
/// 1,200 seqs below the newest delivered, further than any fixed look-back
/// would reach, and must still be found.
async fn a_reconnect_finds_a_late_commit_far_below_the_watermark(mode: WakeupMode) {
    const HEALTH_SECS: u64 = 2;
    const MARKS: &str = "eventrelay_horizon_marks_sent_total";
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let server_addr = match &_cluster {
        Some(cluster) => format!("127.0.0.1:{}", cluster.port).parse().unwrap(),
        None => postgres_addr(),
    };
    let proxy = Freezer::start(server_addr).await;
    let listen_url = db
        .url
        .replace(&server_addr.to_string(), &proxy.addr.to_string());
    let server = TestServer::start(&db, move |c| {
        c.database.listen_url = Some(listen_url.into());
        c.database.listen_health_secs = HEALTH_SECS;
    });
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-x", json!({})), None, "")
        .await;

    let mut long = db.connect().await;
    let open = long.transaction().await.unwrap();
    let late = emit_late(&db, &open).await;
    fill(&db, &db.connect().await, "org-y", 1_200).await;
    let seen = db.emit(NewEvent::durable("seen", "org-x", json!({}))).await;
    assert_eq!(stream.next_event().await.json()["id"], seen.id.to_string());

    proxy.freeze();
    eventually("the relay finds its listener cut", async || {
        let response = reqwest::get(server.url("/readyz")).await.ok()?;
        (response.status() == 503).then_some(())
    })
    .await;
    open.commit().await.unwrap();
    // The relay's marks go on meanwhile (through its pool, which is not
    // cut): the second one after the commit vouches for it. The listener
    // hears none of them.
    let marks = server.metric(MARKS).await;
    server.wait_for_metric(MARKS, |n| n >= marks + 2.0).await;
    proxy.restore();
    assert_eq!(stream.next_event().await.json()["id"], late.id.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_reconnect_finds_a_late_commit_far_below_the_watermark() {
    a_reconnect_finds_a_late_commit_far_below_the_watermark(WakeupMode::Notify).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_a_stream_reconnect_finds_a_late_commit_far_below_the_watermark() {
    a_reconnect_finds_a_late_commit_far_below_the_watermark(WakeupMode::Logical).await;
}

/// A cursor whose horizon is above every transaction id the server has
/// assigned, or whose seq holds another event than the one it names, comes
/// from another history (a restore, or a failover to a standby that missed
/// the old primary's last commits): what it vouches for means nothing here,
/// so the stream is told to resync, and it is counted.
#[tokio::test]
async fn a_cursor_from_another_history_is_told_to_resync() {
    const UNKNOWN: &str = r#"eventrelay_resyncs_total{reason="unknown_cursor"}"#;
    let (db, server, alice, mut stream) = alice_subscribed().await;
    db.emit(NewEvent::durable("seen", "org-x", json!({}))).await;
    let id = stream.next_event().await.id.unwrap();
    drop(stream);
    assert_eq!(server.metric(UNKNOWN).await, 0.0);

    let (_, resync) = server.subscribe(&alice, Some(&id), "").await;
    assert!(!resync, "a cursor of this history resumes");
    let seq = id.split('.').next().unwrap();
    let beyond = format!("{seq}.{}", u64::MAX / 2);
    let (_, resync) = server.subscribe(&alice, Some(&beyond), "").await;
    assert!(resync, "a horizon no transaction here has reached");
    assert_eq!(server.metric(UNKNOWN).await, 1.0);

    // The seq and horizon of this history, but another event at that seq:
    // the commits the cursor came after were lost (a failover that
    // rewrote the end of the history), and seqs were taken again.
    let cursor: eventrelay::wire::ResumeCursor = id.parse().unwrap();
    let check = cursor.check.expect("a live frame names its event");
    let other = eventrelay::wire::ResumeCursor {
        check: Some(check ^ 1),
        ..cursor
    };
    let (_, resync) = server.subscribe(&alice, Some(&other.to_string()), "").await;
    assert!(resync, "the event at the cursor's seq is another one");
    assert_eq!(server.metric(UNKNOWN).await, 2.0);
}

/// A late commit owed to a resuming cursor, pruned before the resume: the
/// replay cannot give it, and the seqs alone do not show it (everything
/// pruned lies below the cursor's seq), so the stream must be told to
/// resync, never left with a silent hole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_commit_pruned_before_the_resume_makes_it_resync() {
    const PRUNED: &str = r#"eventrelay_resyncs_total{reason="pruned"}"#;
    let (db, server, alice, mut stream) = alice_subscribed().await;
    let mut long = db.connect().await;
    let open = long.transaction().await.unwrap();
    let late = emit_late(&db, &open).await;
    db.emit(NewEvent::durable("seen", "org-x", json!({}))).await;
    let id = stream.next_event().await.id.unwrap();
    drop(stream);
    open.commit().await.unwrap();

    let client = db.connect().await;
    client
        .execute(
            &format!(
                "UPDATE {}.outbox SET written_at = now() - interval '30 days' WHERE id = $1",
                db.schema
            ),
            &[&late.id],
        )
        .await
        .unwrap();
    let outbox = eventrelay::store::Outbox::new(&db.schema);
    let pruned = outbox
        .prune_before(&client, chrono::Utc::now() - chrono::Duration::days(1))
        .await
        .unwrap();
    assert_eq!(pruned, 1, "only the late commit is old enough");

    let (resumed, resync) = server.subscribe(&alice, Some(&id), "").await;
    assert!(resync, "the late commit is gone: the client must re-read");
    assert!(resumed.replayed.is_empty());
    assert_eq!(server.metric(PRUNED).await, 1.0);
}

/// A relay on a throwaway logical cluster where a commit can be held on
/// the replication stream but out of every snapshot: its
/// `synchronous_standby_names` names a standby that never connects, and
/// only a session that asks for `synchronous_commit = on` waits for it.
async fn relay_with_a_standby_that_never_comes() -> (Cluster, TestDb, TestServer) {
    let cluster = Cluster::start_logical_and(
        20,
        20,
        "-c synchronous_standby_names=eventrelay_never_there -c synchronous_commit=local",
    )
    .expect("Postgres server binaries");
    let db = TestDb::logical_on(&cluster.url()).await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    (cluster, db, server)
}

/// An event whose commit is flushed, and so on the replication stream, but
/// waits for the standby: no other session sees it until it is released.
struct HeldCommit {
    pid: i32,
    control: Client,
    committing: tokio::task::JoinHandle<EventEnvelope>,
}

impl HeldCommit {
    async fn emit(db: &TestDb, event: NewEvent) -> HeldCommit {
        let held = db.connect().await;
        held.batch_execute("SET synchronous_commit = on")
            .await
            .unwrap();
        let pid: i32 = held
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        let publisher = db.publisher();
        let committing = tokio::spawn(async move { publisher.emit(&held, event).await.unwrap() });
        let control = db.connect().await;
        eventually("the commit waits for the standby", async || {
            let waiting: bool = control
                .query_one(
                    "SELECT wait_event IS NOT DISTINCT FROM 'SyncRep' \
                     FROM pg_stat_activity WHERE pid = $1",
                    &[&pid],
                )
                .await
                .unwrap()
                .get(0);
            waiting.then_some(())
        })
        .await;
        HeldCommit {
            pid,
            control,
            committing,
        }
    }

    /// Stops the wait: the commit, already durable here, becomes visible.
    async fn release(self) -> EventEnvelope {
        self.control
            .execute("SELECT pg_cancel_backend($1)", &[&self.pid])
            .await
            .unwrap();
        self.committing.await.unwrap()
    }
}

/// A commit heard while a scope's first read (a long one: a transaction
/// held open keeps it at 20,000 rows) still runs, and not visible to that
/// read, reaches the stream when the read ends: it is not left to a read
/// that cannot see it yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_heard_during_a_read_before_it_is_visible_is_delivered() {
    let (_cluster, db, server) = relay_with_a_standby_that_never_comes().await;
    let mut long = db.connect().await;
    let open = long.transaction().await.unwrap();
    open.execute("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();
    let filler = db.connect().await;
    fill(&db, &filler, "org-x", 20_000).await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-x", json!({})), None, "")
        .await;

    let held = HeldCommit::emit(&db, NewEvent::durable("held", "org-x", json!({}))).await;
    let heard = stream.next_event().await;
    assert_eq!(heard.event.as_deref(), Some("held"));
    let held_event = held.release().await;
    assert_eq!(heard.json()["id"], held_event.id.to_string());
    open.rollback().await.unwrap();
    let next = db
        .emit(NewEvent::durable("after", "org-x", json!({})))
        .await;
    assert_eq!(
        stream.next_event().await.json()["id"],
        next.id.to_string(),
        "the held event is not sent again"
    );
}

/// A commit heard while nobody on the relay followed its scope (so it was
/// dropped), still out of every snapshot when the scope's first subscriber
/// joins and its first read runs, reaches that subscriber once it becomes
/// visible: by the join's snapshot it committed after the join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_heard_before_its_scope_was_followed_and_visible_after_is_delivered() {
    let (_cluster, db, server) = relay_with_a_standby_that_never_comes().await;
    let (mut watcher, _) = server
        .subscribe(&token("watcher", "org-w", json!({})), None, "")
        .await;
    let held = HeldCommit::emit(&db, NewEvent::durable("held", "org-z", json!({}))).await;
    // Heard in commit order: once this one is, the held one was too.
    let marker = db
        .emit(NewEvent::durable("marker", "org-w", json!({})))
        .await;
    assert_eq!(
        watcher.next_event().await.json()["id"],
        marker.id.to_string()
    );

    let (mut stream, _) = server
        .subscribe(&token("alice", "org-z", json!({})), None, "")
        .await;
    let held_event = held.release().await;
    let next = db
        .emit(NewEvent::durable("after", "org-z", json!({})))
        .await;
    let mut received: Vec<String> = stream
        .events(2)
        .await
        .iter()
        .map(|frame| frame.json()["id"].as_str().unwrap().to_owned())
        .collect();
    received.sort();
    let mut expected = vec![held_event.id.to_string(), next.id.to_string()];
    expected.sort();
    assert_eq!(received, expected, "each once");
}
