//! Who is connected to the stream's scopes, as their `event: presence`
//! frames say (scopes the relay has presence for): the first of each scope,
//! right after `ready`, is a snapshot; each later one a change. Each frame
//! names its scope, so a stream of several keeps each scope's members
//! apart. See the wire-format chapter for the frames.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// One member of the scope.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Member {
    pub id: String,
    /// Its open streams, on every relay together.
    pub streams: i64,
    /// What its token's `presence_info` says, if anything.
    #[serde(default)]
    pub info: Option<Value>,
}

/// The scope's members, as the frames so far say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Presence {
    /// The scope these are the members of.
    pub scope_key: String,
    /// By id; empty when `counts_only`.
    pub members: BTreeMap<String, Member>,
    /// How many members there are.
    pub count: u64,
    /// The scope is past the relay's `presence.max_members`: only `count`
    /// is known.
    pub counts_only: bool,
}

/// What one frame changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PresenceChange {
    /// The frame was a snapshot, which replaced everything.
    pub snapshot: bool,
    /// Members that joined, or whose streams or info changed.
    pub joined: Vec<Member>,
    pub left: Vec<String>,
}

#[derive(Deserialize)]
struct Frame {
    #[serde(rename = "scopeKey", default)]
    scope_key: String,
    snapshot: bool,
    count: u64,
    members: Option<Vec<Member>>,
    left: Option<Vec<String>>,
}

/// The members of each scope of a stream that has presence, by scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Presences {
    scopes: BTreeMap<String, Presence>,
}

impl Presences {
    /// Applies a presence frame's data to its scope's members; `None` when
    /// it is malformed (nothing changes then).
    pub fn apply(&mut self, data: &str) -> Option<(&Presence, PresenceChange)> {
        let frame: Frame = serde_json::from_str(data).ok()?;
        let presence = self.scopes.entry(frame.scope_key.clone()).or_default();
        presence.scope_key.clone_from(&frame.scope_key);
        let change = presence.apply_frame(frame);
        Some((presence, change))
    }

    /// The first scope's members (by key), if any scope has presence.
    pub fn first(&self) -> Option<Presence> {
        self.scopes.values().next().cloned()
    }

    /// The members of `scope_key`, once its snapshot came.
    pub fn get(&self, scope_key: &str) -> Option<Presence> {
        self.scopes.get(scope_key).cloned()
    }
}

impl Presence {
    /// Applies a presence frame's data; `None` when it is malformed (the
    /// state is then left as it was).
    pub fn apply(&mut self, data: &str) -> Option<PresenceChange> {
        let frame: Frame = serde_json::from_str(data).ok()?;
        Some(self.apply_frame(frame))
    }

    fn apply_frame(&mut self, frame: Frame) -> PresenceChange {
        if frame.snapshot {
            self.members.clear();
        }
        self.count = frame.count;
        self.counts_only = frame.members.is_none();
        if self.counts_only {
            self.members.clear();
        }
        let joined = frame.members.unwrap_or_default();
        let left = frame.left.unwrap_or_default();
        for member in &joined {
            self.members.insert(member.id.clone(), member.clone());
        }
        for id in &left {
            self.members.remove(id);
        }
        PresenceChange {
            snapshot: frame.snapshot,
            joined,
            left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_replaces_and_changes_set_and_remove() {
        let mut presence = Presence::default();
        presence.apply(
            r#"{"snapshot":false,"count":1,"members":[{"id":"old","streams":1}],"left":[]}"#,
        );
        let change = presence
            .apply(r#"{"snapshot":true,"count":2,"members":[{"id":"ada","streams":2,"info":{"n":1}},{"id":"bob","streams":1}],"left":[]}"#)
            .unwrap();
        assert!(change.snapshot);
        assert_eq!(presence.members.keys().collect::<Vec<_>>(), ["ada", "bob"]);
        presence.apply(
            r#"{"snapshot":false,"count":1,"members":[{"id":"ada","streams":1}],"left":["bob"]}"#,
        );
        assert_eq!(presence.members["ada"].streams, 1);
        assert_eq!(
            presence.members["ada"].info, None,
            "a change sets the member whole"
        );
        assert_eq!(presence.count, 1);
        presence.apply(r#"{"snapshot":false,"count":1500,"members":null,"left":null}"#);
        assert!(presence.counts_only && presence.members.is_empty());
        assert_eq!(presence.count, 1500);
        assert_eq!(presence.apply("not json"), None);
        assert_eq!(presence.count, 1500, "a malformed frame changes nothing");
    }

    #[test]
    fn each_scope_keeps_its_own_members() {
        let mut scopes = Presences::default();
        scopes.apply(r#"{"scopeKey":"doc-1","snapshot":true,"count":1,"members":[{"id":"ada","streams":1}],"left":[]}"#);
        let (doc_2, change) = scopes
            .apply(r#"{"scopeKey":"doc-2","snapshot":true,"count":1,"members":[{"id":"bob","streams":1}],"left":[]}"#)
            .unwrap();
        assert!(change.snapshot);
        assert_eq!(doc_2.scope_key, "doc-2");
        assert_eq!(
            scopes
                .get("doc-1")
                .unwrap()
                .members
                .keys()
                .collect::<Vec<_>>(),
            ["ada"],
            "another scope's snapshot leaves it alone"
        );
        assert_eq!(scopes.first().unwrap().scope_key, "doc-1");
        assert!(scopes.get("doc-3").is_none());
        assert!(scopes.apply("{").is_none());
    }
}
