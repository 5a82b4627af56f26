//! The checker: knows nothing of the relay. It reads what committed (the
//! outbox as it stands at the end, and the writers' own record of their
//! transactions) and what the subscribers recorded, and names every
//! anomaly:
//!
//! - `lost`: a durable event the subscriber was entitled to, whose
//!   transaction committed after the subscriber's last `resync: true`
//!   before it, and that no connection of the subscriber ever received;
//! - `two_contents`: an event received with another seq, type, scope or
//!   data than it was stored with; `two_ids`: one seq under two event ids;
//! - `repeated`: one event twice in one connection;
//! - `rolled_back`: an event whose transaction rolled back, received;
//! - `unknown`: an event no writer wrote, received;
//! - `audience`: an event of another scope, or whose `audience.users`
//!   leaves the subscriber out, or whose permission it does not hold,
//!   received;
//! - `phantom`: an event a lossy failover took from the history, received,
//!   and no resync after it: the client keeps an event that never was.
//!
//! Events a lossy failover took (found by the campaign on the new primary
//! right after it, among those that committed or whose outcome is unknown)
//! are the database's loss, not the relay's: they need not arrive, and
//! their seqs may come back under other ids.
//! - for webhooks, once the run has drained: `hook_lost`, a committed
//!   durable event of the subscribed type that the receiver never answered
//!   with 2xx; `hook_unverified`, a request whose signature does not
//!   verify; `hook_rolled_back`, a request for an event whose transaction
//!   did not commit, or that no writer wrote.
//!
//! Entitlement is decided here from the writers' record alone: the scope,
//! `audience.users`, and the one permission the campaign uses.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::hooks::HookReceived;
use super::records::{Outcome, StoredRow, SubscriberLog, Written};
use super::writers::HOOK_TYPE;

/// One anomaly, named for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Anomaly {
    pub kind: &'static str,
    pub subscriber: String,
    /// The connection it was seen on (its index among the subscriber's).
    pub connection: Option<usize>,
    pub event: Uuid,
    pub detail: String,
}

/// What the check went through, and what it found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub committed_durable: usize,
    pub committed_ephemeral: usize,
    pub rolled_back: usize,
    pub unknown_outcome: usize,
    /// Frames of events received, in all.
    pub deliveries: usize,
    /// (subscriber, event) pairs that had to arrive, and did.
    pub entitled_delivered: usize,
    /// Resyncs the streams were told of after their first.
    pub resyncs: usize,
    /// Webhook requests received.
    pub hook_requests: usize,
    /// Committed events lossy failovers took from the history.
    pub vanished: usize,
    /// Receipts of such events that a later resync covered.
    pub phantoms_resynced: usize,
    /// The longest wait from such a receipt to the resync that covered it.
    pub phantom_resync_max_secs: f64,
    pub anomalies: Vec<Anomaly>,
}

fn entitled(written: &Written, subscriber: &SubscriberLog) -> bool {
    written.scope == subscriber.scope
        && written
            .users
            .as_ref()
            .is_none_or(|users| users.contains(&subscriber.id))
        && (!written.permission || subscriber.granted)
}

pub fn check(
    written: &[Written],
    outbox: &[StoredRow],
    subscribers: &[SubscriberLog],
    hooks: &[HookReceived],
    vanished: &HashSet<Uuid>,
) -> Verdict {
    let mut verdict = Verdict {
        vanished: vanished.len(),
        ..Verdict::default()
    };
    let by_id: HashMap<Uuid, &Written> = written.iter().map(|w| (w.id, w)).collect();
    let stored: HashMap<Uuid, &StoredRow> = outbox.iter().map(|row| (row.id, row)).collect();
    for w in written {
        match (w.outcome, w.durable) {
            (Outcome::Committed, true) => verdict.committed_durable += 1,
            (Outcome::Committed, false) => verdict.committed_ephemeral += 1,
            (Outcome::RolledBack, _) => verdict.rolled_back += 1,
            (Outcome::Unknown, _) => verdict.unknown_outcome += 1,
        }
    }
    let mut seq_ids: HashMap<i64, Uuid> = HashMap::new();
    for subscriber in subscribers {
        let mut anomaly = |kind, connection, event, detail: String| {
            verdict.anomalies.push(Anomaly {
                kind,
                subscriber: subscriber.id.clone(),
                connection,
                event,
                detail,
            })
        };
        let mut received_ever: HashSet<Uuid> = HashSet::new();
        // When each stream said resync: events that ended before then are
        // covered by the state the client re-read.
        let mut resyncs: Vec<f64> = Vec::new();
        for (index, connection) in subscriber.connections.iter().enumerate() {
            if let Some((at, true)) = connection.ready {
                resyncs.push(at);
            }
            resyncs.extend(&connection.resyncs);
            let mut in_connection: HashSet<Uuid> = HashSet::new();
            for frame in &connection.received {
                verdict.deliveries += 1;
                received_ever.insert(frame.id);
                if !in_connection.insert(frame.id) {
                    anomaly("repeated", Some(index), frame.id, String::new());
                }
                let Some(w) = by_id.get(&frame.id) else {
                    anomaly("unknown", Some(index), frame.id, frame.event_type.clone());
                    continue;
                };
                if w.outcome == Outcome::RolledBack {
                    anomaly("rolled_back", Some(index), frame.id, String::new());
                }
                if !entitled(w, subscriber) {
                    anomaly(
                        "audience",
                        Some(index),
                        frame.id,
                        format!(
                            "scope {} users {:?} permission {}",
                            w.scope, w.users, w.permission
                        ),
                    );
                }
                let expected = stored.get(&frame.id).map(|row| {
                    (
                        Some(row.seq),
                        row.scope.as_str(),
                        row.event_type.as_str(),
                        &row.data,
                    )
                });
                let got = (
                    frame.seq,
                    frame.scope.as_str(),
                    frame.event_type.as_str(),
                    &frame.data,
                );
                let differs = match expected {
                    Some(expected) => expected != got,
                    // Not stored (ephemeral, or pruned): what the writer wrote.
                    None => {
                        (w.scope.as_str(), w.event_type.as_str(), &w.data) != (got.1, got.2, got.3)
                    }
                };
                if differs {
                    anomaly(
                        "two_contents",
                        Some(index),
                        frame.id,
                        format!("received {got:?}, stored {expected:?}"),
                    );
                }
                if let Some(seq) = frame.seq
                    && !vanished.contains(&frame.id)
                    && let Some(other) = seq_ids.insert(seq, frame.id)
                    && other != frame.id
                    && !vanished.contains(&other)
                {
                    anomaly(
                        "two_ids",
                        Some(index),
                        frame.id,
                        format!("seq {seq} was also {other}"),
                    );
                }
            }
        }
        verdict.resyncs += resyncs.len().saturating_sub(1);
        for (index, connection) in subscriber.connections.iter().enumerate() {
            for frame in connection
                .received
                .iter()
                .filter(|f| vanished.contains(&f.id))
            {
                let covered = resyncs
                    .iter()
                    .copied()
                    .filter(|&at| at > frame.at)
                    .reduce(f64::min);
                if let Some(at) = covered {
                    verdict.phantoms_resynced += 1;
                    verdict.phantom_resync_max_secs =
                        verdict.phantom_resync_max_secs.max(at - frame.at);
                } else {
                    anomaly(
                        "phantom",
                        Some(index),
                        frame.id,
                        format!("received at {:.3} s, no resync after it", frame.at),
                    );
                }
            }
        }
        for w in written {
            if w.outcome != Outcome::Committed
                || !w.durable
                || !entitled(w, subscriber)
                || vanished.contains(&w.id)
            {
                continue;
            }
            if received_ever.contains(&w.id) {
                verdict.entitled_delivered += 1;
                continue;
            }
            // Covered by a resync only if the stream said so after the
            // transaction ended.
            if resyncs.iter().any(|&at| at >= w.ended_at) {
                continue;
            }
            let detail = format!(
                "committed at {:.3} s, scope {}, stored as seq {:?}, last resync at {:?}",
                w.ended_at,
                w.scope,
                stored.get(&w.id).map(|row| row.seq),
                resyncs.last()
            );
            anomaly("lost", None, w.id, detail);
        }
    }
    check_hooks(written, &by_id, hooks, vanished, &mut verdict);
    verdict
}

fn check_hooks(
    written: &[Written],
    by_id: &HashMap<Uuid, &Written>,
    hooks: &[HookReceived],
    vanished: &HashSet<Uuid>,
    verdict: &mut Verdict,
) {
    verdict.hook_requests = hooks.len();
    let mut anomaly = |kind, event: Uuid, detail: String| {
        verdict.anomalies.push(Anomaly {
            kind,
            subscriber: "webhooks".into(),
            connection: None,
            event,
            detail,
        })
    };
    let mut answered: HashSet<Uuid> = HashSet::new();
    for hook in hooks {
        let id = hook.id.parse().unwrap_or(Uuid::nil());
        if !hook.verified {
            anomaly("hook_unverified", id, hook.id.clone());
        }
        match by_id.get(&id) {
            Some(w) if w.outcome != Outcome::RolledBack => {}
            _ => anomaly("hook_rolled_back", id, hook.id.clone()),
        }
        if (200..300).contains(&hook.status) {
            answered.insert(id);
        }
    }
    for w in written {
        let subscribed = w.durable && w.event_type == HOOK_TYPE;
        if subscribed
            && w.outcome == Outcome::Committed
            && !answered.contains(&w.id)
            && !vanished.contains(&w.id)
        {
            anomaly(
                "hook_lost",
                w.id,
                format!("committed at {:.3} s", w.ended_at),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Connection, Received};
    use serde_json::json;

    fn written(n: u128, scope: &str, outcome: Outcome, ended_at: f64) -> Written {
        Written {
            id: Uuid::from_u128(n),
            scope: scope.into(),
            event_type: "t".into(),
            durable: true,
            data: json!({"n": n}),
            users: None,
            permission: false,
            outcome,
            ended_at,
        }
    }

    fn row(w: &Written, seq: i64) -> StoredRow {
        StoredRow {
            id: w.id,
            seq,
            scope: w.scope.clone(),
            event_type: w.event_type.clone(),
            data: w.data.clone(),
        }
    }

    fn received(w: &Written, seq: i64) -> Received {
        Received {
            id: w.id,
            seq: Some(seq),
            scope: w.scope.clone(),
            event_type: w.event_type.clone(),
            data: w.data.clone(),
            frame_id: seq.to_string(),
            at: 2.5,
        }
    }

    fn subscriber(connections: Vec<Connection>) -> SubscriberLog {
        SubscriberLog {
            id: "sub-0".into(),
            scope: "s".into(),
            granted: false,
            connections,
        }
    }

    #[test]
    fn webhooks_must_arrive_signed_and_only_for_what_committed() {
        let mut hook = written(1, "s", Outcome::Committed, 1.0);
        hook.event_type = HOOK_TYPE.into();
        let mut retried = hook.clone();
        retried.id = Uuid::from_u128(2);
        let mut missing = hook.clone();
        missing.id = Uuid::from_u128(3);
        let mut undone = hook.clone();
        undone.id = Uuid::from_u128(4);
        undone.outcome = Outcome::RolledBack;
        let got = |w: &Written, verified, status| HookReceived {
            id: w.id.to_string(),
            verified,
            status,
        };
        let hooks = [
            got(&hook, true, 200),
            got(&retried, true, 500),
            got(&retried, true, 200),
            got(&undone, true, 200),
            got(&hook, false, 200),
        ];
        let none = HashSet::new();
        let verdict = check(&[hook, retried, missing, undone], &[], &[], &hooks, &none);
        assert_eq!(
            kinds(&verdict),
            vec!["hook_rolled_back", "hook_unverified", "hook_lost"]
        );
        assert_eq!(verdict.hook_requests, 5);
    }

    fn kinds(verdict: &Verdict) -> Vec<&'static str> {
        verdict.anomalies.iter().map(|a| a.kind).collect()
    }

    #[test]
    fn every_kind_of_anomaly_is_named_and_a_clean_run_has_none() {
        let before = written(1, "s", Outcome::Committed, 0.5);
        let seen = written(2, "s", Outcome::Committed, 2.0);
        let lost = written(3, "s", Outcome::Committed, 3.0);
        let undone = written(4, "s", Outcome::RolledBack, 3.0);
        let elsewhere = written(5, "t", Outcome::Committed, 3.0);
        let outbox = vec![
            row(&before, 1),
            row(&seen, 2),
            row(&lost, 3),
            row(&elsewhere, 5),
        ];
        let first = Connection {
            ready: Some((1.0, true)),
            received: vec![received(&seen, 2)],
            ..Connection::default()
        };
        let clean = check(
            &[before.clone(), seen.clone()],
            &outbox,
            &[subscriber(vec![first.clone()])],
            &[],
            &HashSet::new(),
        );
        assert!(clean.anomalies.is_empty(), "{:?}", clean.anomalies);
        assert_eq!(
            clean.entitled_delivered, 1,
            "the one before the resync is covered"
        );

        let mut bad = first;
        bad.received.push(received(&seen, 2));
        bad.received.push(received(&undone, 4));
        bad.received.push(received(&elsewhere, 5));
        let mut stranger = received(&seen, 7);
        stranger.id = Uuid::from_u128(99);
        bad.received.push(stranger);
        let other = written(6, "s", Outcome::Committed, 3.0);
        let mut outbox = outbox;
        outbox.push(row(&other, 6));
        bad.received.push(received(&other, 2));
        let verdict = check(
            &[before, seen, lost, undone, elsewhere, other],
            &outbox,
            &[subscriber(vec![bad])],
            &[],
            &HashSet::new(),
        );
        assert_eq!(
            kinds(&verdict),
            vec![
                "repeated",
                "rolled_back",
                "audience",
                "unknown",
                "two_contents",
                "two_ids",
                "lost"
            ]
        );
    }

    #[test]
    fn what_a_lossy_failover_took_need_not_arrive_but_must_be_resynced_away() {
        let kept = written(1, "s", Outcome::Committed, 1.0);
        let taken = written(2, "s", Outcome::Committed, 2.0);
        let reused = written(3, "s", Outcome::Committed, 4.0);
        // The new history gives the taken event's seq to another.
        let outbox = vec![row(&kept, 1), row(&reused, 2)];
        let vanished: HashSet<Uuid> = [taken.id].into();
        let first = Connection {
            ready: Some((0.5, true)),
            received: vec![received(&kept, 1), received(&taken, 2)],
            ..Connection::default()
        };
        let resumed = Connection {
            ready: Some((3.0, true)),
            received: vec![received(&reused, 2)],
            ..Connection::default()
        };
        let all = [kept, taken, reused];
        let resynced = check(
            &all,
            &outbox,
            &[subscriber(vec![first.clone(), resumed.clone()])],
            &[],
            &vanished,
        );
        assert!(resynced.anomalies.is_empty(), "{:?}", resynced.anomalies);
        assert_eq!((resynced.vanished, resynced.phantoms_resynced), (1, 1));

        let mut not_told = resumed;
        not_told.ready = Some((3.0, false));
        let verdict = check(
            &all,
            &outbox,
            &[subscriber(vec![first, not_told])],
            &[],
            &vanished,
        );
        assert_eq!(kinds(&verdict), vec!["phantom"]);
    }
}
