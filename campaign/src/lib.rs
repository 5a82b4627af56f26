//! The fault campaign: a real setup on this machine (a primary with a
//! streaming standby, several relays on a multi-host URL, writers,
//! resuming SSE subscribers) run under a schedule of faults drawn from a
//! seed, then judged by a checker that knows nothing of the relay's code
//! ([`checker`]). The same seed draws the same schedule, so an anomaly's
//! report says how to run it again.

pub mod checker;
pub mod cluster;
pub mod faults;
pub mod freezer;
pub mod hooks;
pub mod postgres_tools;
pub mod records;
pub mod subscribers;
pub mod webhook_receiver;
pub mod writers;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use checker::Verdict;
use eventrelay_bench::BenchResult;
use eventrelay_bench::relay_process::{RelayProcess, RelaySettings};
use faults::{Fault, Target};
use freezer::Freezer;
use records::{StoredRow, SubscriberLog};

/// Seconds since the campaign began, shared by every part's records.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    pub fn now(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// How a campaign runs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub duration: Duration,
    /// `notify` or `logical`.
    pub wakeup: &'static str,
    pub relays: usize,
    pub scopes: usize,
    pub subscribers: usize,
    pub writers: usize,
    /// Time between faults, on average.
    pub fault_every: Duration,
    /// The relay binary.
    pub binary: PathBuf,
    pub work_dir: PathBuf,
}

/// What a campaign did and found.
pub struct Report {
    pub plan: Plan,
    /// Each fault inflicted: when, what, and whether it worked.
    pub faults: Vec<(f64, Fault, Result<(), String>)>,
    pub verdict: Verdict,
    /// How long the subscribers took to catch up once writing stopped.
    pub drained_in: Duration,
}

/// Subscribers watch `scope-0` .. this; writers favour them.
const WATCHED: usize = 8;
/// Longest the subscribers and the webhook receiver may go without
/// catching up on anything at the end: a backlog that still shrinks (a
/// dispatcher behind a slow receiver) is waited for, up to [`DRAIN_MAX`].
const DRAIN: Duration = Duration::from_secs(45);
const DRAIN_MAX: Duration = Duration::from_secs(600);

pub async fn run(plan: Plan) -> BenchResult<Report> {
    std::fs::create_dir_all(&plan.work_dir)?;
    let cluster = cluster::Cluster::start(&plan.work_dir.join("postgres"))?;
    let schema = format!("campaign_{}", plan.seed % 1_000_000);
    let logical = plan.wakeup == "logical";
    // The first relay migrates the schema for its mode, as it would in
    // production: the campaign runs any relay binary, of any version.
    let url = cluster.url();
    // The relays reach both servers through paths that can go silent;
    // writers and the checker connect directly.
    let mut paths = Vec::new();
    for port in cluster.ports() {
        let server = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        paths.push(Freezer::start_on(([127, 0, 0, 1], 0).into(), server).await?);
    }
    let relay_url = format!(
        "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
        paths[0].addr, paths[1].addr
    );
    let hooks = hooks::start().await?;
    let mut settings = RelaySettings::new(&relay_url, &schema);
    settings.wakeup = plan.wakeup;
    settings.dead_path_secs = Some(3);
    settings.webhook_url = Some(hooks.receiver.url.clone());
    // A delivery whose relay died mid-request is sent again once its lease
    // runs out: short enough to happen while the run drains.
    settings.webhook_lease_ms = Some(9_000);
    // Small queues, so the slow subscriber is dropped and must resume.
    settings.queue_capacity = 64;
    let mut relays = Vec::new();
    for _ in 0..plan.relays {
        relays.push(Some(
            RelayProcess::start(&plan.binary, &plan.work_dir, &settings).await?,
        ));
    }
    let bases: Arc<Vec<String>> = Arc::new(
        relays
            .iter()
            .flatten()
            .map(|relay| relay.base.clone())
            .collect(),
    );
    let clock = Clock(Instant::now());
    let (stop_writers, writers_stop) = watch::channel(false);
    let (stop_subscribers, subscribers_stop) = watch::channel(false);

    let subscriber_ids: Vec<String> = (0..plan.subscribers).map(|i| format!("sub-{i}")).collect();
    let mut logs = Vec::new();
    let mut away = Vec::new();
    let mut tasks = Vec::new();
    for (i, id) in subscriber_ids.iter().enumerate() {
        let scope = format!("scope-{}", i % WATCHED);
        let granted = i % 2 == 0;
        let log = Arc::new(Mutex::new(SubscriberLog {
            id: id.clone(),
            scope: scope.clone(),
            granted,
            connections: Vec::new(),
        }));
        let grants = if granted {
            serde_json::json!({"orders": ["read"]})
        } else {
            serde_json::Value::Null
        };
        let (order, orders) = watch::channel(subscribers::Away::default());
        away.push(order);
        let subscriber = subscribers::Subscriber {
            token: eventrelay_bench::subscriber_token(id, &scope, grants),
            relays: Arc::clone(&bases),
            slow: i == 1,
            // Every fourth subscriber uses the Rust client.
            via_client: i % 4 == 3,
            seed: plan.seed ^ ((i as u64 + 1) * 0x9e37),
            clock,
            log: Arc::clone(&log),
        };
        logs.push(log);
        tasks.push(tokio::spawn(
            subscriber.run(orders, subscribers_stop.clone()),
        ));
    }
    // Every subscriber is in before anything is written.
    let joined = Instant::now();
    while logs.iter().any(|log| {
        log.lock()
            .map(|log| log.connections.iter().all(|c| c.ready.is_none()))
            .unwrap_or(false)
    }) && joined.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let written = Arc::new(Mutex::new(Vec::new()));
    let mut writer_tasks = Vec::new();
    for index in 0..plan.writers {
        let writer = writers::Writer {
            index,
            url: url.clone(),
            schema: schema.clone(),
            scopes: plan.scopes,
            watched: WATCHED,
            subscribers: subscriber_ids.clone(),
            slow: index == 0,
            seed: plan.seed ^ ((index as u64 + 101) * 0x7f4a),
            clock,
            log: Arc::clone(&written),
        };
        writer_tasks.push(tokio::spawn(writer.run(writers_stop.clone())));
    }

    let mut target = Target {
        cluster,
        relays,
        settings,
        binary: plan.binary.clone(),
        work_dir: plan.work_dir.clone(),
        schema: schema.clone(),
        wakeup_logical: logical,
        away,
        orders: 0,
        paths,
        fault_every: plan.fault_every,
        written: Arc::clone(&written),
        clock,
        vanished: HashSet::new(),
        pruned: HashSet::new(),
    };
    let started = Instant::now();
    let mut inflicted = Vec::new();
    for (at, fault, pick) in faults::schedule(plan.seed, plan.duration, plan.fault_every) {
        let due = Duration::from_secs_f64(at);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let result = target.inflict(fault, pick).await.map_err(|e| e.to_string());
        inflicted.push((clock.now(), fault, result));
    }
    if let Some(rest) = plan.duration.checked_sub(started.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let _ = stop_writers.send(true);
    for task in writer_tasks {
        let _ = task.await;
    }

    // The subscribers catch up: until nothing committed is missing, or
    // the drain's limit.
    let draining = Instant::now();
    let outbox_url = target.cluster.primary_url();
    let (mut fewest, mut progressed) = (usize::MAX, Instant::now());
    let verdict = loop {
        let outbox = read_outbox(&outbox_url, &schema).await?;
        let verdict = judge(&written, &logs, &outbox, &hooks.log, &target.vanished);
        let missing = verdict
            .anomalies
            .iter()
            .filter(|a| a.kind == "lost" || a.kind == "hook_lost")
            .count();
        if missing < fewest {
            (fewest, progressed) = (missing, Instant::now());
        }
        if missing == 0 || progressed.elapsed() > DRAIN || draining.elapsed() > DRAIN_MAX {
            break verdict;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let drained_in = draining.elapsed();
    if !verdict.anomalies.is_empty() {
        // Everything the checker read, for a closer look.
        let outbox = read_outbox(&outbox_url, &schema).await?;
        let dump = serde_json::json!({
            "written": *written.lock().map_err(|_| "a writer panicked")?,
            "subscribers": logs.iter().filter_map(|log| log.lock().ok().map(|l| l.clone())).collect::<Vec<_>>(),
            "outbox": outbox,
            "hooks": *hooks.log.lock().map_err(|_| "the receiver panicked")?,
            "vanished": &target.vanished,
        });
        let path = plan.work_dir.join("records.json");
        std::fs::write(&path, serde_json::to_vec(&dump)?)?;
        eprintln!("the records are in {}", path.display());
    }
    let _ = stop_subscribers.send(true);
    for task in tasks {
        let _ = task.await;
    }
    drop(target);
    Ok(Report {
        plan,
        faults: inflicted,
        verdict,
        drained_in,
    })
}

fn judge(
    written: &Mutex<Vec<records::Written>>,
    logs: &[Arc<Mutex<SubscriberLog>>],
    outbox: &[StoredRow],
    hooks: &Mutex<Vec<hooks::HookReceived>>,
    vanished: &HashSet<uuid::Uuid>,
) -> Verdict {
    let hooks = hooks.lock().map(|h| h.clone()).unwrap_or_default();
    let written = written.lock().map(|w| w.clone()).unwrap_or_default();
    let logs: Vec<SubscriberLog> = logs
        .iter()
        .filter_map(|log| log.lock().ok().map(|log| log.clone()))
        .collect();
    checker::check(&written, outbox, &logs, &hooks, vanished)
}

async fn read_outbox(url: &str, schema: &str) -> BenchResult<Vec<StoredRow>> {
    let client = eventrelay::connect(url).await?;
    let rows = client
        .query(
            &format!("SELECT id, seq, scope_key, type, data FROM {schema}.outbox"),
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| StoredRow {
            id: row.get(0),
            seq: row.get(1),
            scope: row.get(2),
            event_type: row.get(3),
            data: row.get(4),
        })
        .collect())
}

impl Report {
    /// The report, one fact per line; anomalies last, each with what
    /// reproduces it.
    pub fn lines(&self) -> Vec<String> {
        let plan = &self.plan;
        let v = &self.verdict;
        let mut by_kind: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for (_, fault, result) in &self.faults {
            let entry = by_kind.entry(fault.name()).or_default();
            entry.0 += 1;
            if result.is_err() {
                entry.1 += 1;
            }
        }
        let faults: Vec<String> = by_kind
            .iter()
            .map(|(name, (n, failed))| match failed {
                0 => format!("{name}={n}"),
                _ => format!("{name}={n} ({failed} failed)"),
            })
            .collect();
        let mut lines = vec![
            format!(
                "CAMPAIGN seed={} mode={} duration={}s relays={} writers={} subscribers={} scopes={}",
                plan.seed,
                plan.wakeup,
                plan.duration.as_secs(),
                plan.relays,
                plan.writers,
                plan.subscribers,
                plan.scopes
            ),
            format!("faults {} in all: {}", self.faults.len(), faults.join(" ")),
            format!(
                "events committed: durable={} ephemeral={}; rolled back={}; outcome unknown={}",
                v.committed_durable, v.committed_ephemeral, v.rolled_back, v.unknown_outcome
            ),
            format!(
                "deliveries checked={} entitled events delivered={} resyncs={} webhook requests={} drained in {:.1} s",
                v.deliveries,
                v.entitled_delivered,
                v.resyncs,
                v.hook_requests,
                self.drained_in.as_secs_f64()
            ),
            format!(
                "events lost by lossy failovers (not the relay's to deliver)={} phantoms resynced={} \
                 (at most {:.1} s after their receipt)",
                v.vanished, v.phantoms_resynced, v.phantom_resync_max_secs
            ),
            format!("anomalies={}", v.anomalies.len()),
        ];
        for (at, fault, result) in &self.faults {
            if let Err(error) = result {
                lines.push(format!(
                    "fault {} at {at:.1} s failed: {error}",
                    fault.name()
                ));
            }
        }
        for anomaly in &v.anomalies {
            lines.push(format!(
                "ANOMALY {} subscriber={} connection={:?} event={} {} (reproduce: --seed {} --mode {} --duration {})",
                anomaly.kind,
                anomaly.subscriber,
                anomaly.connection,
                anomaly.event,
                anomaly.detail,
                plan.seed,
                plan.wakeup,
                plan.duration.as_secs()
            ));
        }
        if !v.anomalies.is_empty() {
            let schedule: Vec<String> = self
                .faults
                .iter()
                .map(|(at, fault, _)| format!("{at:.1}s {}", fault.name()))
                .collect();
            lines.push(format!("schedule: {}", schedule.join(", ")));
        }
        lines
    }
}
