//! Every relay's members merged into one view per scope, and what changed
//! between two readings: a subscriber is a member while any live relay
//! holds a stream of it; its stream count is the sum over those relays.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

use serde::Serialize;
use serde_json::{Value, json};

use crate::actors::EncodedEvent;

/// One member of a scope, as streams see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Member {
    pub id: String,
    /// Its open streams, on every relay together.
    pub streams: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info: Option<Value>,
}

/// One relay's row for a subscriber, as read from the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub relay_id: String,
    pub scope_key: String,
    pub subscriber_id: String,
    pub streams: i32,
    pub info: Option<Value>,
}

/// A scope's members after a change, and what changed.
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeChange {
    pub scope_key: String,
    /// Members that joined, or whose stream count or info changed.
    pub joined: Vec<Member>,
    pub left: Vec<String>,
    pub count: usize,
    /// Past `presence.max_members`: the frame carries the count only.
    pub counts_only: bool,
    /// The scope came back under `presence.max_members`: the frame lists
    /// every member, as a snapshot, since streams had counts only.
    pub snapshot: bool,
}

impl ScopeChange {
    /// The `event: presence` frame of this change.
    pub fn frame(&self) -> EncodedEvent {
        let data = match (self.counts_only, self.snapshot) {
            (true, _) => json!({
                "scopeKey": self.scope_key, "snapshot": false, "count": self.count,
                "members": null, "left": null,
            }),
            (false, snapshot) => json!({
                "scopeKey": self.scope_key, "snapshot": snapshot, "count": self.count,
                "members": self.joined, "left": self.left,
            }),
        };
        EncodedEvent::presence(&self.scope_key, &data.to_string())
    }
}

/// Per scope, per subscriber, per live relay: streams and info.
type Holders = BTreeMap<String, (i32, Option<Value>)>;

#[derive(Default)]
struct State {
    scopes: HashMap<String, BTreeMap<String, Holders>>,
    live: HashSet<String>,
}

/// The merged view, shared by the presence task (which updates it) and the
/// hubs (which take snapshots from it) and the presence request.
pub struct PresenceView {
    state: Mutex<State>,
    max_members: usize,
}

impl PresenceView {
    pub fn new(max_members: usize) -> Self {
        PresenceView {
            state: Mutex::new(State::default()),
            max_members,
        }
    }

    /// Applies rows read from the table and the relays alive now; answers
    /// each scope whose members changed, and how.
    pub fn apply(&self, rows: Vec<Row>, live: HashSet<String>) -> Vec<ScopeChange> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut touched: HashSet<String> = rows.iter().map(|r| r.scope_key.clone()).collect();
        if live != state.live {
            // A relay that died or came back changes every scope it holds.
            let changed: HashSet<&String> = live.symmetric_difference(&state.live).collect();
            for (scope, subscribers) in &state.scopes {
                if subscribers
                    .values()
                    .any(|holders| holders.keys().any(|relay| changed.contains(relay)))
                {
                    touched.insert(scope.clone());
                }
            }
        }
        let before: HashMap<String, BTreeMap<String, Member>> = touched
            .iter()
            .map(|scope| (scope.clone(), members_of(&state, scope)))
            .collect();
        for row in rows {
            let subscribers = state.scopes.entry(row.scope_key).or_default();
            let holders = subscribers.entry(row.subscriber_id.clone()).or_default();
            if row.streams > 0 {
                holders.insert(row.relay_id, (row.streams, row.info));
            } else {
                holders.remove(&row.relay_id);
                if holders.is_empty() {
                    subscribers.remove(&row.subscriber_id);
                }
            }
        }
        state.live = live;
        state
            .scopes
            .retain(|_, subscribers| !subscribers.is_empty());
        let mut changes = Vec::new();
        for (scope, before) in before {
            let after = members_of(&state, &scope);
            let back_under = before.len() > self.max_members && after.len() <= self.max_members;
            let joined: Vec<Member> = after
                .values()
                .filter(|member| back_under || before.get(&member.id) != Some(member))
                .cloned()
                .collect();
            let left: Vec<String> = match back_under {
                true => Vec::new(),
                false => before
                    .keys()
                    .filter(|id| !after.contains_key(*id))
                    .cloned()
                    .collect(),
            };
            if joined.is_empty() && left.is_empty() && !back_under {
                continue;
            }
            changes.push(ScopeChange {
                scope_key: scope,
                joined,
                left,
                count: after.len(),
                counts_only: after.len() > self.max_members,
                snapshot: back_under,
            });
        }
        changes
    }

    /// A scope's members now, by id.
    pub fn members(&self, scope_key: &str) -> Vec<Member> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        members_of(&state, scope_key).into_values().collect()
    }

    /// The snapshot frame a stream of `scope_key` starts with.
    pub fn snapshot_frame(&self, scope_key: &str) -> EncodedEvent {
        let members = self.members(scope_key);
        let count = members.len();
        let listed = (count <= self.max_members).then_some(members);
        let left = listed.as_ref().map(|_| Vec::<String>::new());
        let data = json!({
            "scopeKey": scope_key, "snapshot": true, "count": count,
            "members": listed, "left": left,
        });
        EncodedEvent::presence(scope_key, &data.to_string())
    }

    /// Past this many members, streams get counts only.
    pub fn max_members(&self) -> usize {
        self.max_members
    }
}

/// A scope's members as the live relays hold them.
fn members_of(state: &State, scope_key: &str) -> BTreeMap<String, Member> {
    let Some(subscribers) = state.scopes.get(scope_key) else {
        return BTreeMap::new();
    };
    subscribers
        .iter()
        .filter_map(|(id, holders)| {
            let live: Vec<&(i32, Option<Value>)> = holders
                .iter()
                .filter(|(relay, _)| state.live.contains(*relay))
                .map(|(_, held)| held)
                .collect();
            let streams: i64 = live.iter().map(|(streams, _)| i64::from(*streams)).sum();
            (streams > 0).then(|| {
                let info = live.iter().find_map(|(_, info)| info.clone());
                (
                    id.clone(),
                    Member {
                        id: id.clone(),
                        streams,
                        info,
                    },
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(relay: &str, subscriber: &str, streams: i32) -> Row {
        Row {
            relay_id: relay.into(),
            scope_key: "org-1".into(),
            subscriber_id: subscriber.into(),
            streams,
            info: None,
        }
    }

    fn live(relays: &[&str]) -> HashSet<String> {
        relays.iter().map(|r| (*r).to_owned()).collect()
    }

    #[test]
    fn a_subscriber_on_two_relays_is_one_member_until_its_last_stream_goes() {
        let view = PresenceView::new(10);
        let changes = view.apply(
            vec![row("a", "ada", 1), row("b", "ada", 1)],
            live(&["a", "b"]),
        );
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].joined[0].streams, 2);
        assert_eq!(changes[0].count, 1);
        let changes = view.apply(vec![row("a", "ada", 0)], live(&["a", "b"]));
        assert_eq!(
            changes[0].joined[0].streams, 1,
            "a changed count, not a leave"
        );
        assert!(changes[0].left.is_empty());
        let changes = view.apply(vec![row("b", "ada", 0)], live(&["a", "b"]));
        assert_eq!(changes[0].left, ["ada"]);
        assert_eq!(changes[0].count, 0);
        assert!(view.members("org-1").is_empty());
    }

    #[test]
    fn a_dead_relays_members_leave_and_nothing_unchanged_is_sent() {
        let view = PresenceView::new(10);
        view.apply(
            vec![row("a", "ada", 1), row("b", "bob", 2)],
            live(&["a", "b"]),
        );
        assert!(
            view.apply(vec![], live(&["a", "b"])).is_empty(),
            "no change, no frame"
        );
        let changes = view.apply(vec![], live(&["a"]));
        assert_eq!(changes[0].left, ["bob"]);
        assert_eq!(view.members("org-1").len(), 1);
    }

    #[test]
    fn past_the_cap_streams_get_counts_only() {
        let view = PresenceView::new(1);
        let changes = view.apply(vec![row("a", "ada", 1), row("a", "bob", 1)], live(&["a"]));
        assert!(changes[0].counts_only);
        let frame = String::from_utf8(view.snapshot_frame("org-1").frame.to_vec()).unwrap();
        assert!(frame.starts_with("event: presence\n"), "{frame}");
        assert!(
            frame.contains(r#""count":2"#) && frame.contains(r#""members":null"#),
            "{frame}"
        );
        assert!(frame.contains(r#""left":null"#), "{frame}");
        // Back under the cap, streams get every member again, as a snapshot.
        let changes = view.apply(vec![row("a", "bob", 0)], live(&["a"]));
        assert!(changes[0].snapshot && !changes[0].counts_only);
        assert_eq!(changes[0].joined.len(), 1);
    }
}
