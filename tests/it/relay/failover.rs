//! Failover, as managed Postgres does it: a primary and its streaming
//! standby, both local, named together in one URL with
//! `target_session_attrs=read-write`. Events are emitted continuously; the
//! primary stops and the standby is promoted; emitting resumes on the new
//! primary. A subscriber's stream stays open throughout and receives every
//! committed event exactly once, in order, in both wake-up modes: in the
//! logical mode the replication stream follows the primary like every
//! pooled connection, and re-reads from its watermark after the switch.
//! The old primary's connections either close, or go silent (a frozen
//! network path), which the relay must find out for itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;
use tokio_postgres::NoTls;

use crate::support::cluster::Cluster;
use crate::support::freezer::Freezer;
use crate::support::server::{TestServer, token};
use crate::support::{TestDb, eventually, eventually_within, test_in_both_wakeup_modes};
use eventrelay::publisher::NewEvent;
use eventrelay::store::WakeupMode;

/// Events emitted before the switch, and after it.
const BEFORE: usize = 20;
const AFTER: usize = 20;

/// What the emitter committed: each event's id, and whether its commit
/// came after the promotion.
#[derive(Default)]
struct Emitted {
    after_promotion: Vec<String>,
    count: usize,
}

/// Emits a durable event every 50 ms through the multi-host URL until
/// `stop`, reconnecting (to whichever server takes writes) on any error.
fn start_emitter(
    db: &TestDb,
    promoted: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Emitted>>, tokio::task::JoinHandle<()>) {
    let emitted = Arc::new(Mutex::new(Emitted::default()));
    let (url, publisher, record) = (db.url.clone(), db.publisher(), Arc::clone(&emitted));
    let task = tokio::spawn(async move {
        let mut client = None;
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if client.is_none() {
                client = match tokio_postgres::connect(&url, NoTls).await {
                    Ok((c, connection)) => {
                        tokio::spawn(connection);
                        Some(c)
                    }
                    Err(_) => continue,
                };
            }
            let event = NewEvent::durable("tick", "org-1", json!({ "i": i }));
            let after = promoted.load(Ordering::Relaxed);
            match publisher.emit(client.as_ref().unwrap(), event).await {
                Ok(envelope) => {
                    i += 1;
                    let mut record = record.lock().unwrap();
                    record.count += 1;
                    if after {
                        record.after_promotion.push(envelope.id.to_string());
                    }
                }
                Err(_) => client = None,
            }
        }
    });
    (emitted, task)
}

/// Every event id the stream delivers, with when it arrived; `ended` turns
/// true if the stream closes.
struct Received {
    ids: Mutex<Vec<(String, Instant)>>,
    ended: AtomicBool,
}

fn start_reader(mut stream: crate::support::server::SseStream) -> Arc<Received> {
    let received = Arc::new(Received {
        ids: Mutex::default(),
        ended: AtomicBool::new(false),
    });
    let record = Arc::clone(&received);
    tokio::spawn(async move {
        while let Some(frame) = stream.next_frame().await {
            if frame.event.as_deref() == Some("tick") || frame.data.contains("\"tick\"") {
                let id = frame.json()["id"].as_str().unwrap().to_owned();
                record.ids.lock().unwrap().push((id, Instant::now()));
            }
        }
        record.ended.store(true, Ordering::Relaxed);
    });
    received
}

/// How the old primary goes away as the relay sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OldPath {
    /// Its connections are closed (the server stops).
    Closed,
    /// Its connections go silent, as behind a NAT that dropped the flows:
    /// the relay finds out from its health checks and TCP timeouts.
    Frozen,
}

/// The relay's health and TCP settings for a frozen path: found dead in
/// seconds rather than the production defaults' tens of seconds.
const FROZEN_HEALTH_SECS: u64 = 2;

test_in_both_wakeup_modes!(a_failover_loses_nothing_and_keeps_every_stream_open);

async fn a_failover_loses_nothing_and_keeps_every_stream_open(mode: WakeupMode) {
    drill(mode, OldPath::Closed).await;
}

test_in_both_wakeup_modes!(a_failover_behind_a_frozen_path_loses_nothing);

async fn a_failover_behind_a_frozen_path_loses_nothing(mode: WakeupMode) {
    drill(mode, OldPath::Frozen).await;
}

test_in_both_wakeup_modes!(
    a_failover_that_loses_commits_ends_every_stream_and_resyncs,
    flavor = "multi_thread",
    worker_threads = 2
);

/// An asynchronous failover that loses the primary's last commits: the
/// standby stops receiving, the primary commits events a subscriber
/// receives, then the primary crashes and the stale standby is promoted.
/// Those events are gone from the new history, where their seqs and
/// transaction ids may name other events. The relay finds out when its
/// listener reconnects, ends every stream, and the resume answers a resync.
async fn a_failover_that_loses_commits_ends_every_stream_and_resyncs(mode: WakeupMode) {
    let primary = Cluster::start_logical_and(20, 20, "-c wal_sender_timeout=2s")
        .expect("Postgres server binaries");
    let standby = Cluster::start_standby_of(&primary);
    let url = multi_host_url(
        &format!("127.0.0.1:{}", primary.port),
        &format!("127.0.0.1:{}", standby.port),
    );
    let db = match mode {
        WakeupMode::Notify => TestDb::new_on(&url).await,
        WakeupMode::Logical => TestDb::logical_on(&url).await,
    };
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let bearer = token("alice", "org-1", json!({}));
    let (mut stream, _) = server.subscribe(&bearer, None, "").await;
    let tick = |i: i64| NewEvent::durable("tick", "org-1", json!({ "i": i }));

    // Kept: committed and on the standby before it stops.
    let kept = db.emit(tick(0)).await;
    assert_eq!(stream.next_event().await.json()["id"], kept.id.to_string());
    let (replica, connection) = tokio_postgres::connect(&standby.url(), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let query = format!("SELECT count(*) FROM {}.outbox", db.schema);
    eventually("the standby replays the first event", async || {
        let row = replica.query_one(&query, &[]).await.ok()?;
        (row.get::<_, i64>(0) == 1).then_some(())
    })
    .await;
    drop(replica);

    // Lost: committed on the primary alone, and delivered.
    standby.stop();
    let mut cursor = None;
    for i in 1..=3 {
        let lost = db.emit(tick(i)).await;
        let frame = stream.next_event().await;
        assert_eq!(frame.json()["id"], lost.id.to_string());
        cursor = frame.id;
    }
    let cursor = cursor.unwrap();
    tokio::task::block_in_place(|| {
        primary.crash();
        standby.start_again();
        standby.promote();
    });

    // The stream the lost events went out on ends...
    assert!(
        stream.ends_within(Duration::from_secs(60)).await,
        "{mode:?}: the stream that carried lost events stays open"
    );
    assert_eq!(server.metric("eventrelay_history_rewinds_total").await, 1.0);
    // ...and a resume from the last of them is told to re-read its state,
    // then receives the new history's events.
    let (mut resumed, resync) = server.subscribe(&bearer, Some(&cursor), "").await;
    assert!(resync, "{mode:?}: a resume from a lost event must resync");
    let after = db.emit(tick(10)).await;
    let frame = loop {
        let frame = resumed.next_event().await;
        if frame.json()["id"] == after.id.to_string() {
            break frame;
        }
    };
    assert_eq!(frame.json()["data"]["i"], 10);
}

fn multi_host_url(first: &str, second: &str) -> String {
    format!("postgres://postgres@{first},{second}/postgres?target_session_attrs=read-write")
}

async fn drill(mode: WakeupMode, old_path: OldPath) {
    // A WAL sender whose relay's path froze holds up the primary's
    // shutdown until `wal_sender_timeout`: a short one keeps the drill short.
    let primary = Cluster::start_logical_and(20, 20, "-c wal_sender_timeout=2s")
        .expect("Postgres server binaries");
    let standby = Cluster::start_standby_of(&primary);
    let standby_addr = format!("127.0.0.1:{}", standby.port);
    let url = multi_host_url(&format!("127.0.0.1:{}", primary.port), &standby_addr);
    let db = match mode {
        WakeupMode::Notify => TestDb::new_on(&url).await,
        WakeupMode::Logical => TestDb::logical_on(&url).await,
    };
    // The relay reaches the primary through a path that can go silent;
    // the emitter and the checks below connect directly.
    let path = Freezer::start(format!("127.0.0.1:{}", primary.port).parse().unwrap()).await;
    let relay_url = multi_host_url(&path.addr.to_string(), &standby_addr);
    let server = TestServer::start(&db, |c| {
        c.database.url = Some(relay_url.into());
        if old_path == OldPath::Frozen {
            c.database.listen_health_secs = FROZEN_HEALTH_SECS;
            c.database.tcp_keepalive_secs = 1;
            c.database.tcp_user_timeout_secs = FROZEN_HEALTH_SECS;
        }
    });
    server.ready().await;
    let (stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let received = start_reader(stream);
    let (promoted, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (emitted, emitter) = start_emitter(&db, Arc::clone(&promoted), Arc::clone(&stop));

    eventually("events flow before the switch", async || {
        (received.ids.lock().unwrap().len() >= BEFORE).then_some(())
    })
    .await;
    // A fast shutdown sends the standby every committed change first, as
    // a planned switchover does; then the standby takes over.
    if old_path == OldPath::Frozen {
        path.freeze();
    }
    let (standby_port, promote) = (
        standby.port,
        tokio::task::spawn_blocking(move || {
            primary.stop();
            let promoted_at = Instant::now();
            standby.promote();
            (promoted_at, primary, standby)
        }),
    );
    let (promoted_at, _primary, _standby) = promote.await.unwrap();
    promoted.store(true, Ordering::Relaxed);

    // The new primary's events arrive on the same stream.
    eventually_within(
        "emits succeed on the new primary",
        Duration::from_secs(60),
        async || (emitted.lock().unwrap().after_promotion.len() >= AFTER).then_some(()),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    emitter.await.unwrap();

    // Every row the new primary holds, in commit order, is what the stream
    // delivered: once each, in order, nothing more.
    let truth: Vec<String> = {
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
            .query(
                &format!(
                    "SELECT id::text FROM {}.outbox WHERE type = 'tick' ORDER BY seq",
                    db.schema
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    assert!(
        truth.len() >= emitted.lock().unwrap().count,
        "a committed event is missing from the new primary"
    );
    let delivered = eventually("every committed event is delivered", async || {
        let ids = received.ids.lock().unwrap().clone();
        (ids.len() >= truth.len()).then_some(ids)
    })
    .await;
    let delivered_ids: Vec<&String> = delivered.iter().map(|(id, _)| id).collect();
    assert_eq!(delivered_ids, truth.iter().collect::<Vec<_>>(), "{mode:?}");
    assert!(
        !received.ended.load(Ordering::Relaxed),
        "the stream was dropped"
    );

    // The relay's temporary slot went with the old primary; the one on the
    // new primary goes with the relay.
    drop(server);
    eventually("no replication slot is left behind", async || {
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.ok()?;
        tokio::spawn(connection);
        let slots: i64 = client
            .query_one("SELECT count(*) FROM pg_replication_slots", &[])
            .await
            .ok()?
            .get(0);
        (slots == 0).then_some(())
    })
    .await;

    let first_after = &emitted.lock().unwrap().after_promotion[0];
    let arrived = delivered
        .iter()
        .find(|(id, _)| id == first_after)
        .map(|(_, at)| *at)
        .unwrap();
    eprintln!(
        "failover ({mode:?}, old path {old_path:?}, new primary on port {standby_port}): {} \
         events, the first from the new primary delivered {:?} after the promotion began",
        truth.len(),
        arrived - promoted_at
    );
}
