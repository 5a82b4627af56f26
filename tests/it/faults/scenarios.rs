//! Fault suite: durable events keep arriving through the faults a
//! deployment meets. Each scenario writes durable events from several
//! concurrent writers while a fault is injected again and again, then
//! counts, for every subscriber or webhook receiver, the distinct event ids
//! it got against the ids whose COMMIT returned. None may be missing;
//! duplicates are allowed (delivery is at least once) and counted.
//!
//! Each scenario prints one `FAULT` line with its figures. The load is
//! small by default; `EVENTRELAY_FAULT_EVENTS` raises it (`scripts/faults`
//! runs the suite at a larger size and collects the lines).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::cluster::Cluster;
use crate::support::flaky_receiver::{FlakyReceiver, Mischief};
use crate::support::process::{RelayProcess, free_port, relay_config};
use crate::support::server::{TestServer, token};
use crate::support::{TestDb, test_in_both_wakeup_modes};
use eventrelay::publisher::{NewEvent, Publisher};
use eventrelay::store::WakeupMode;
use eventrelay_client::{ClientBuilder, ClientHandle, State};
use serde_json::json;
use uuid::Uuid;

/// Longest a scenario waits for its last delivery once the writers
/// finish: a minute, plus 20 ms per event at larger sizes.
fn settle_deadline() -> Duration {
    Duration::from_secs(60) + Duration::from_millis(20 * events_per_scenario() as u64)
}

/// How many durable events each scenario writes.
fn events_per_scenario() -> usize {
    std::env::var("EVENTRELAY_FAULT_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

const WRITERS: usize = 4;
const SUBSCRIBERS: usize = 3;

/// What the writers did: the ids whose COMMIT returned, and how many emit
/// attempts failed (a failed attempt may or may not have committed).
#[derive(Default)]
struct Written {
    confirmed: HashSet<Uuid>,
    failed_attempts: usize,
}

/// Writes `total` durable events in scope `org-1` from `WRITERS`
/// concurrent connections, each pausing `pace` between events so the load
/// overlaps the faults. A failed attempt reconnects and tries again with a
/// new event, until the deadline.
async fn write_events(url: String, schema: String, total: usize, pace: Duration) -> Written {
    let next = Arc::new(AtomicUsize::new(0));
    let written = Arc::new(Mutex::new(Written::default()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (url, schema) = (url.clone(), schema.clone());
            let (next, written) = (Arc::clone(&next), Arc::clone(&written));
            tokio::spawn(async move {
                let publisher = Publisher::new(&schema).unwrap();
                let deadline = Instant::now() + settle_deadline();
                let mut client = None;
                while next.fetch_add(1, Ordering::SeqCst) < total {
                    loop {
                        assert!(Instant::now() < deadline, "writer {writer} cannot emit");
                        if client.is_none() {
                            client = eventrelay::connect(&url).await.ok();
                        }
                        let Some(connection) = client.as_ref() else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        let event =
                            NewEvent::durable("order.created", "org-1", json!({"writer": writer}));
                        match publisher.emit(connection, event).await {
                            Ok(envelope) => {
                                written.lock().unwrap().confirmed.insert(envelope.id);
                                break;
                            }
                            Err(_) => {
                                written.lock().unwrap().failed_attempts += 1;
                                client = None;
                            }
                        }
                    }
                    tokio::time::sleep(pace).await;
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    Arc::try_unwrap(written)
        .ok()
        .expect("writers are done")
        .into_inner()
        .unwrap()
}

/// Starts writing the scenario's events into `db`, `pace` apart per writer.
fn start_writing(db: &TestDb, pace: Duration) -> tokio::task::JoinHandle<Written> {
    tokio::spawn(write_events(
        db.url.clone(),
        db.schema.to_string(),
        events_per_scenario(),
        pace,
    ))
}

/// Ids an observer (a subscriber or a receiver) got, with how many times.
type Received = HashMap<Uuid, usize>;

/// An SSE subscriber built on the Rust client, with de-duplication off so
/// duplicates reach the count.
struct Subscriber {
    handle: ClientHandle,
    received: Arc<Mutex<Received>>,
}

impl Subscriber {
    async fn start(base: Arc<Mutex<String>>, token: String) -> Subscriber {
        let (handle, mut events) = ClientBuilder::new(move |http| {
            let base = base.lock().unwrap().clone();
            http.get(format!("{base}/v1/events")).bearer_auth(&token)
        })
        .backoff(Duration::from_millis(20), Duration::from_millis(250))
        .dedupe_capacity(0)
        .channel_capacity(4096)
        .start();
        let received = Arc::new(Mutex::new(Received::new()));
        let counted = Arc::clone(&received);
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                *counted
                    .lock()
                    .unwrap()
                    .entry(event.envelope.id)
                    .or_default() += 1;
            }
        });
        let mut status = handle.subscribe();
        tokio::time::timeout(
            crate::support::DEADLINE,
            status.wait_for(|s| s.state == State::Connected),
        )
        .await
        .expect("the subscriber connects before the deadline")
        .unwrap();
        Subscriber { handle, received }
    }

    fn received(&self) -> Received {
        self.received.lock().unwrap().clone()
    }
}

fn received_by(subscribers: &[Subscriber]) -> Vec<Received> {
    subscribers.iter().map(Subscriber::received).collect()
}

async fn subscribers(base: &Arc<Mutex<String>>) -> Vec<Subscriber> {
    let mut all = Vec::new();
    for n in 0..SUBSCRIBERS {
        let token = token(&format!("user-{n}"), "org-1", json!({}));
        all.push(Subscriber::start(Arc::clone(base), token).await);
    }
    all
}

/// Waits until every observer has every confirmed id, or the deadline.
async fn settle(confirmed: &HashSet<Uuid>, observers: impl Fn() -> Vec<Received>) -> Vec<Received> {
    let deadline = Instant::now() + settle_deadline();
    loop {
        let now = observers();
        let complete = now
            .iter()
            .all(|got| confirmed.iter().all(|id| got.contains_key(id)));
        if complete || Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Prints the scenario's figures and fails when any confirmed event is
/// missing from any observer.
fn report(
    scenario: &str,
    written: &Written,
    observed: &[Received],
    faults: usize,
    started: Instant,
) {
    let mut lost = 0;
    let mut duplicates = 0;
    let mut unconfirmed: HashSet<Uuid> = HashSet::new();
    for got in observed {
        lost += written
            .confirmed
            .iter()
            .filter(|id| !got.contains_key(id))
            .count();
        duplicates += got.values().map(|n| n - 1).sum::<usize>();
        unconfirmed.extend(got.keys().filter(|id| !written.confirmed.contains(id)));
    }
    println!(
        "FAULT {scenario}: emitted={} observers={} lost={lost} duplicates={duplicates} \
         failed_attempts={} unconfirmed_received={} faults={faults} seconds={:.1}",
        written.confirmed.len(),
        observed.len(),
        written.failed_attempts,
        unconfirmed.len(),
        started.elapsed().as_secs_f64(),
    );
    assert!(faults > 0, "{scenario}: no fault was injected");
    assert_eq!(lost, 0, "{scenario}: confirmed events were lost");
}

/// Terminates the backend tagged `listener_tag` every 40 ms until the
/// writers are done; answers how many times one was terminated.
async fn terminate_listener_until_done(
    db: &TestDb,
    listener_tag: &str,
    writing: &tokio::task::JoinHandle<Written>,
) -> usize {
    let control = db.connect().await;
    let mut terminations = 0;
    while !writing.is_finished() {
        let row = control
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                 FROM pg_stat_activity WHERE application_name = $1",
                &[&listener_tag],
            )
            .await
            .unwrap();
        terminations += row.get::<_, i64>(0) as usize;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    terminations
}

test_in_both_wakeup_modes!(
    the_listener_terminated_again_and_again_under_load,
    flavor = "multi_thread",
    worker_threads = 4
);

/// In the logical wake-up mode the "listener" is the WAL sender of the
/// relay's replication stream, and each termination drops its temporary
/// slot.
async fn the_listener_terminated_again_and_again_under_load(mode: WakeupMode) {
    let (db, _cluster) = TestDb::for_mode(mode).await;
    let scenario = match mode {
        WakeupMode::Notify => "listener-terminated",
        WakeupMode::Logical => "wal-sender-terminated",
    };
    listener_terminated_under_load(db, scenario).await;
}

async fn listener_terminated_under_load(db: TestDb, scenario: &str) {
    let started = Instant::now();
    let listener_tag = format!("{}_listener", db.schema);
    let listen_url = db.url.replace(db.schema.as_str(), &listener_tag);
    let server = TestServer::start(&db, |c| c.database.listen_url = Some(listen_url.into()));
    server.ready().await;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let subscribers = subscribers(&base).await;

    let writing = start_writing(&db, Duration::from_millis(2));
    let terminations = terminate_listener_until_done(&db, &listener_tag, &writing).await;
    let written = writing.await.unwrap();
    let observed = settle(&written.confirmed, || {
        subscribers.iter().map(Subscriber::received).collect()
    })
    .await;
    report(scenario, &written, &observed, terminations, started);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn history_never_reaches_subscribers_across_listener_reconnects() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let listener_tag = format!("{}_listener", db.schema);
    let listen_url = db.url.replace(db.schema.as_str(), &listener_tag);
    let server = TestServer::start(&db, |c| c.database.listen_url = Some(listen_url.into()));
    server.ready().await;
    // The scope has history before anyone subscribes.
    let history = write_events(
        db.url.clone(),
        db.schema.to_string(),
        events_per_scenario() / 2,
        Duration::ZERO,
    )
    .await
    .confirmed;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let subscribers = subscribers(&base).await;

    let writing = start_writing(&db, Duration::from_millis(2));
    let terminations = terminate_listener_until_done(&db, &listener_tag, &writing).await;
    let written = writing.await.unwrap();
    let observed = settle(&written.confirmed, || received_by(&subscribers)).await;
    let history_received: usize = observed
        .iter()
        .map(|got| history.iter().filter(|id| got.contains_key(id)).count())
        .sum();
    println!(
        "FAULT history-then-listener-terminated: history={} history_received={history_received}",
        history.len()
    );
    report(
        "history-then-listener-terminated",
        &written,
        &observed,
        terminations,
        started,
    );
    assert_eq!(
        history_received, 0,
        "subscribers without a Last-Event-ID got events from before they joined"
    );
}

test_in_both_wakeup_modes!(
    postgres_restarted_under_load,
    flavor = "multi_thread",
    worker_threads = 4
);

async fn postgres_restarted_under_load(mode: WakeupMode) {
    let cluster = match mode {
        WakeupMode::Notify => Cluster::start(),
        WakeupMode::Logical => Cluster::start_logical(),
    };
    let Some(cluster) = cluster else {
        panic!("no Postgres server binaries (initdb, pg_ctl): install them or set PG_BINDIR");
    };
    let (db, scenario) = match mode {
        WakeupMode::Notify => (TestDb::new_on(&cluster.url()).await, "postgres-restarted"),
        WakeupMode::Logical => (
            TestDb::logical_on(&cluster.url()).await,
            "postgres-restarted-logical",
        ),
    };
    postgres_restarted_under_load_on(cluster, db, scenario).await;
}

async fn postgres_restarted_under_load_on(cluster: Cluster, db: TestDb, scenario: &str) {
    let started = Instant::now();
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let subscribers = subscribers(&base).await;

    let writing = start_writing(&db, Duration::from_millis(5));
    let mut restarts = 0;
    while !writing.is_finished() && restarts < 3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cluster = &cluster;
        tokio::task::block_in_place(|| cluster.restart());
        restarts += 1;
    }
    let written = writing.await.unwrap();
    let observed = settle(&written.confirmed, || received_by(&subscribers)).await;
    report(scenario, &written, &observed, restarts, started);
    drop(subscribers);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_killed_and_restarted_while_clients_resume() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let config = relay_config(&db, free_port(), "[webhooks]\nenabled = false\n");
    let mut relay = RelayProcess::spawn(&config);
    relay.ready().await;
    let base = Arc::new(Mutex::new(relay.base.clone()));
    let subscribers = subscribers(&base).await;

    let writing = start_writing(&db, Duration::from_millis(3));
    let mut kills = 0;
    while !writing.is_finished() && kills < 4 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        relay.kill();
        kills += 1;
        // Events committed while no relay runs wait in the outbox; the
        // clients replay them from their Last-Event-ID.
        relay = RelayProcess::spawn(&config);
        relay.ready().await;
    }
    let written = writing.await.unwrap();
    let observed = settle(&written.confirmed, || received_by(&subscribers)).await;
    report("relay-killed", &written, &observed, kills, started);
    for subscriber in subscribers {
        let _ = subscriber.handle.stop().await;
    }
}

/// Webhook settings for the chaos scenarios: a short timeout and a long,
/// fast retry schedule, so every delivery gets there within the test.
fn webhook_tables(receiver: &str, timeout_ms: u64, lease_ms: u64) -> String {
    format!(
        r#"
[webhooks]
enabled = true
workers = 16
allow_private_networks = true
request_timeout_ms = {timeout_ms}
lease_ms = {lease_ms}
retry_schedule_ms = [20, 50, 100, 100, 200, 200, 200, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300, 300]
max_retry_after_ms = 1000

[[webhooks.subscriptions]]
id = "chaos"
url = "{receiver}"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
types = ["order.*"]
"#
    )
}

/// Ids a receiver accepted, as parsed uuids.
fn accepted(receiver: &FlakyReceiver) -> Received {
    receiver
        .accepted()
        .into_iter()
        .filter_map(|(id, n)| Some((id.parse().ok()?, n)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_receiver_that_flaps_stalls_and_times_out() {
    let started = Instant::now();
    let db = TestDb::new().await;
    let receiver = Arc::new(Mutex::new(FlakyReceiver::start(
        Mischief {
            fail_500: 15,
            unavailable_503: 10,
            stall: 10,
            stall_for: Duration::from_millis(700),
        },
        7,
    )));
    let url = receiver.lock().unwrap().url.clone();
    let relay = RelayProcess::spawn(&relay_config(&db, 0, &webhook_tables(&url, 300, 1_000)));
    relay.ready().await;

    let writing = start_writing(&db, Duration::from_millis(3));
    let mut outages = 0;
    while !writing.is_finished() && outages < 5 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let receiver = Arc::clone(&receiver);
        tokio::task::spawn_blocking(move || {
            let mut receiver = receiver.lock().unwrap();
            receiver.go_down();
            std::thread::sleep(Duration::from_millis(200));
            receiver.come_up();
        })
        .await
        .unwrap();
        outages += 1;
    }
    let written = writing.await.unwrap();
    let observed = settle(&written.confirmed, || {
        vec![accepted(&receiver.lock().unwrap())]
    })
    .await;
    let requests = receiver.lock().unwrap().requests();
    println!("FAULT webhook-chaos: receiver saw {requests} requests");
    report(
        "webhook-receiver-chaos",
        &written,
        &observed,
        outages,
        started,
    );
    assert!(
        relay
            .metric("eventrelay_webhook_deliveries_total{outcome=\"retry\"}")
            .await
            > 0.0,
        "the receiver's failures were retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_killed_mid_request() {
    let started = Instant::now();
    let db = TestDb::new().await;
    // One request in ten stalls past the timeout, so a kill almost always
    // lands while a request is in flight; only such kills count.
    let receiver = FlakyReceiver::start(
        Mischief {
            fail_500: 0,
            unavailable_503: 0,
            stall: 10,
            stall_for: Duration::from_millis(1_500),
        },
        11,
    );
    let config = relay_config(&db, 0, &webhook_tables(&receiver.url, 1_000, 1_500));
    let mut relay = RelayProcess::spawn(&config);
    relay.ready().await;

    let writing = start_writing(&db, Duration::from_millis(3));
    let mut kills_mid_request = 0;
    let deadline = Instant::now() + settle_deadline();
    while kills_mid_request < 3 {
        assert!(Instant::now() < deadline, "no request was ever in flight");
        tokio::time::sleep(Duration::from_millis(200)).await;
        if receiver.in_flight() == 0 {
            continue;
        }
        relay.kill();
        kills_mid_request += 1;
        relay = RelayProcess::spawn(&config);
        relay.ready().await;
    }
    let written = writing.await.unwrap();
    let observed = settle(&written.confirmed, || vec![accepted(&receiver)]).await;
    report(
        "dispatcher-killed",
        &written,
        &observed,
        kills_mid_request,
        started,
    );
}
