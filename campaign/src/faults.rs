//! The fault schedule, drawn from the campaign's seed, and the faults
//! themselves. Every kind comes at least once per run (in an order the
//! seed shuffles), then kinds at random; the same seed draws the same
//! schedule.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use uuid::Uuid;

use super::Clock;
use super::cluster::Cluster;
use super::records::{Outcome, Written};
use super::subscribers::Away;
use crate::freezer::Freezer;
use eventrelay_bench::BenchResult;
use eventrelay_bench::relay_process::{RelayProcess, RelaySettings};

/// Every kind of fault the campaign makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// A relay killed with SIGKILL, and started again on its port.
    RelayKilled,
    /// A relay stopped with SIGTERM (streams end cleanly), and started again.
    RelayStopped,
    /// The backend of every relay's LISTEN connection (notify mode) or
    /// replication stream (logical mode; its temporary slot goes with it)
    /// terminated.
    ListenerTerminated,
    /// The primary restarted (fast shutdown).
    PostgresRestarted,
    /// The primary stopped, the standby promoted, a new standby made.
    FailedOver,
    /// The standby stopped, the primary alone for a second, then crashed,
    /// and the stale standby promoted: the commits of that second are
    /// gone from the new history, which gives their seqs and transaction
    /// ids to other events.
    FailedOverLosingCommits,
    /// A third of the subscribers drop their streams for 0.5 to 3 s.
    SubscribersAway,
    /// Every subscriber drops its stream and comes back at once.
    ReconnectStorm,
    /// The outbox pruned of everything written more than 2 s ago, under
    /// clients that may be replaying.
    OutboxPruned,
    /// Every relay's path to Postgres goes silent (no FIN, no RST) for 4
    /// to 10 s (less in short runs), as when a NAT gateway drops its flows; then new flows pass
    /// again and the dead ones are closed.
    PathFrozen,
}

impl Fault {
    pub const ALL: [Fault; 10] = [
        Fault::RelayKilled,
        Fault::RelayStopped,
        Fault::ListenerTerminated,
        Fault::PostgresRestarted,
        Fault::FailedOver,
        Fault::FailedOverLosingCommits,
        Fault::SubscribersAway,
        Fault::ReconnectStorm,
        Fault::OutboxPruned,
        Fault::PathFrozen,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::RelayKilled => "relay_killed",
            Fault::RelayStopped => "relay_stopped",
            Fault::ListenerTerminated => "listener_terminated",
            Fault::PostgresRestarted => "postgres_restarted",
            Fault::FailedOver => "failed_over",
            Fault::FailedOverLosingCommits => "failed_over_losing_commits",
            Fault::SubscribersAway => "subscribers_away",
            Fault::ReconnectStorm => "reconnect_storm",
            Fault::OutboxPruned => "outbox_pruned",
            Fault::PathFrozen => "path_frozen",
        }
    }
}

/// When each fault comes, in seconds from the start, and which relay or
/// subscribers it takes (by a number the fault reads as it needs).
pub fn schedule(seed: u64, duration: Duration, every: Duration) -> Vec<(f64, Fault, u64)> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed_fa17);
    let mut first = Fault::ALL.to_vec();
    rng.shuffle(&mut first);
    let mut at = every.as_secs_f64();
    let mut planned = Vec::new();
    let end = duration.as_secs_f64() - every.as_secs_f64().min(2.0);
    while at < end {
        let fault = match first.pop() {
            Some(fault) => fault,
            None => Fault::ALL[rng.usize(0..Fault::ALL.len())],
        };
        planned.push((at, fault, rng.u64(..)));
        at += every.as_secs_f64() * (0.5 + rng.f64());
    }
    planned
}

/// What the faults act on.
pub struct Target {
    pub cluster: Cluster,
    pub relays: Vec<Option<RelayProcess>>,
    pub settings: RelaySettings,
    pub binary: PathBuf,
    pub work_dir: PathBuf,
    pub schema: String,
    pub wakeup_logical: bool,
    pub away: Vec<watch::Sender<Away>>,
    pub orders: u64,
    /// The relays' paths to the two servers.
    pub paths: Vec<Freezer>,
    /// The time between faults, on average.
    pub fault_every: Duration,
    /// What the writers committed, to find what a lossy failover took.
    pub written: Arc<Mutex<Vec<Written>>>,
    pub clock: Clock,
    /// Events whose commit a lossy failover took from the history.
    pub vanished: HashSet<Uuid>,
    /// Events the outbox was pruned of (read just before each prune).
    pub pruned: HashSet<Uuid>,
}

impl Target {
    pub async fn inflict(&mut self, fault: Fault, pick: u64) -> BenchResult<()> {
        match fault {
            Fault::RelayKilled | Fault::RelayStopped => {
                let slot = (pick as usize) % self.relays.len();
                let Some(mut relay) = self.relays[slot].take() else {
                    return Ok(());
                };
                let port = relay.port;
                if fault == Fault::RelayStopped {
                    relay.terminate(Duration::from_secs(20)).await?;
                }
                drop(relay);
                self.relays[slot] = Some(self.start_relay(port).await?);
            }
            Fault::ListenerTerminated => {
                let which = if self.wakeup_logical {
                    "backend_type = 'walsender' AND query ILIKE '%LOGICAL%'"
                } else {
                    "backend_type = 'client backend' AND (query ILIKE 'LISTEN%' OR query = 'SELECT 1')"
                };
                let client = eventrelay::connect(&self.cluster.primary_url()).await?;
                client
                    .execute(
                        &format!(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                             WHERE pid <> pg_backend_pid() AND {which}"
                        ),
                        &[],
                    )
                    .await?;
            }
            Fault::PostgresRestarted => self.cluster.restart_primary()?,
            Fault::FailedOver => self.cluster.fail_over()?,
            Fault::FailedOverLosingCommits => {
                let began = self.clock.now();
                let lost = self
                    .cluster
                    .fail_over_losing_commits(Duration::from_secs(1));
                self.find_vanished(began).await?;
                lost?;
            }
            Fault::SubscribersAway | Fault::ReconnectStorm => {
                self.orders += 1;
                let mut rng = fastrand::Rng::with_seed(pick);
                for sender in &self.away {
                    let order = match fault {
                        Fault::ReconnectStorm => Away {
                            order: self.orders,
                            millis: 0,
                        },
                        _ if rng.u8(0..3) == 0 => Away {
                            order: self.orders,
                            millis: rng.u64(500..3000),
                        },
                        _ => continue,
                    };
                    let _ = sender.send(order);
                }
            }
            Fault::OutboxPruned => {
                let client = eventrelay::connect(&self.cluster.primary_url()).await?;
                let outbox = eventrelay::store::Outbox::new(
                    &eventrelay::publisher::Identifier::new(&self.schema)?,
                );
                let cutoff = chrono::Utc::now() - chrono::Duration::seconds(2);
                // What the prune takes, so a lossy failover later can tell
                // an event it took from one pruned.
                let taken = client
                    .query(
                        &format!(
                            "SELECT id FROM {}.outbox WHERE occurred_at < $1",
                            self.schema
                        ),
                        &[&cutoff],
                    )
                    .await?;
                self.pruned
                    .extend(taken.iter().map(|row| row.get::<_, Uuid>(0)));
                outbox.prune_before(&client, cutoff).await?;
            }
            Fault::PathFrozen => {
                for path in &self.paths {
                    path.freeze();
                }
                // Longer than the relays' 3 s to call a path dead, and
                // shorter in the short campaigns, whose faults come faster.
                let longest = (self.fault_every.as_millis() as u64 * 4).clamp(4_500, 10_000);
                let silent = fastrand::Rng::with_seed(pick).u64(4_000..longest);
                tokio::time::sleep(Duration::from_millis(silent)).await;
                for path in &self.paths {
                    path.restore();
                    path.sever();
                }
            }
        }
        Ok(())
    }

    /// After a lossy failover: which events that committed, or whose
    /// COMMIT got no answer, the new primary lacks. Candidates are those
    /// that ended from a second before the standby stopped (what it had
    /// not yet received), less those a prune took. An event whose outcome
    /// is unknown may have committed on the old primary and been delivered
    /// before it went: absent now, its seq may come back under another id.
    async fn find_vanished(&mut self, began: f64) -> BenchResult<()> {
        let since = began - 1.0;
        let candidates: Vec<Uuid> = self
            .written
            .lock()
            .map_err(|_| "a writer panicked")?
            .iter()
            .filter(|w| w.outcome != Outcome::RolledBack && w.durable && w.ended_at >= since)
            .filter(|w| !self.pruned.contains(&w.id))
            .map(|w| w.id)
            .collect();
        let client = eventrelay::connect(&self.cluster.primary_url()).await?;
        let held: HashSet<Uuid> = client
            .query(
                &format!("SELECT id FROM {}.outbox WHERE id = ANY($1)", self.schema),
                &[&candidates],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        self.vanished
            .extend(candidates.into_iter().filter(|id| !held.contains(id)));
        Ok(())
    }

    pub async fn start_relay(&self, port: u16) -> BenchResult<RelayProcess> {
        RelayProcess::start_on(&self.binary, &self.work_dir, &self.settings, port).await
    }
}
