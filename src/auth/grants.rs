//! Grants and the declarative permission rule used in service mode.
//!
//! The wire crate treats `audience.permission` as opaque and hands it to the
//! subscriber's evaluator. In service mode that evaluator is [`Grants::allows`]
//! over the grants the relay learnt from the subscriber's token (JWT mode) or
//! from the application's answer (forward mode). An embedding application
//! (library mode) supplies its own evaluator instead and never touches this.
//!
//! # Grants
//!
//! A JSON object mapping a resource name to an array of action strings:
//!
//! ```json
//! {"orders": ["read", "write"], "reports": ["*"]}
//! ```
//!
//! The action `"*"` grants every action on that resource. Anything else — a
//! missing or `null` claim, a value that is not an object, or any entry whose
//! value is not an array of strings — means **no grants at all** (the whole
//! claim is discarded, not just the bad entry).
//!
//! # The rule
//!
//! `audience.permission` is **held** when it is either
//!
//! 1. a non-empty JSON object whose every key is a non-empty string and whose
//!    every value is a non-empty array of non-empty strings, and for every key
//!    `k` and every action `a` listed under it, `grants[k]` contains `a` or
//!    `"*"`; or
//! 2. a string `"resource:action"` with exactly one `:` and non-empty text on
//!    both sides, treated as `{"resource": ["action"]}`.
//!
//! Every other shape is **not held** (fail closed): a number, a boolean,
//! `null`, an array, an empty object, an object with an empty key, an empty
//! action list, a non-string or empty action, a nested object, a string
//! without exactly one `:`, or with an empty side. Nothing is trimmed or
//! case-folded: `"Orders"` and `"orders"` are different resources.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use eventrelay_wire::{PermissionEvaluator, Subscriber};
use serde_json::Value;

/// The action that grants every action on a resource.
pub const ANY_ACTION: &str = "*";

/// What a subscriber may do: resource name → granted actions.
///
/// Built once per resolution and made the subscriber's evaluator, so the
/// per-event check is a map lookup and a short scan. Subscribers with the
/// same grants share one evaluator (see [`Grants::into_subscriber`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Grants(BTreeMap<String, Vec<String>>);

/// Why a grants value was discarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantsError {
    #[error("grants must be a JSON object mapping resources to arrays of actions, got {0}")]
    NotAnObject(&'static str),
    #[error("grants for resource {resource:?} must be an array of strings")]
    NotAnArrayOfStrings { resource: String },
}

impl Grants {
    /// No grants: every permission-carrying event is withheld.
    pub fn none() -> Self {
        Grants::default()
    }

    /// Parses a grants value strictly. A missing or `null` value is no grants
    /// (not an error); any other shape than the documented one is an error.
    pub fn parse(value: Option<&Value>) -> Result<Self, GrantsError> {
        let object = match value {
            None | Some(Value::Null) => return Ok(Grants::none()),
            Some(Value::Object(object)) => object,
            Some(other) => return Err(GrantsError::NotAnObject(json_kind(other))),
        };
        let mut grants = BTreeMap::new();
        for (resource, actions) in object {
            let actions = actions
                .as_array()
                .and_then(|actions| {
                    actions
                        .iter()
                        .map(|action| action.as_str().map(str::to_owned))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| GrantsError::NotAnArrayOfStrings {
                    resource: resource.clone(),
                })?;
            grants.insert(resource.clone(), actions);
        }
        Ok(Grants(grants))
    }

    /// Parses a grants value as a resolver does: a malformed value becomes no
    /// grants, with one warning naming the subscriber, because refusing the
    /// whole connection would also hide the events that need no permission.
    pub fn parse_or_none(value: Option<&Value>, subscriber_id: &str) -> Self {
        match Grants::parse(value) {
            Ok(grants) => {
                if value.is_none_or(Value::is_null) {
                    tracing::debug!(subscriber_id, "no grants for subscriber");
                }
                grants
            }
            Err(error) => {
                tracing::warn!(
                    subscriber_id,
                    %error,
                    "ignoring malformed grants; the subscriber gets no grants"
                );
                Grants::none()
            }
        }
    }

    /// True when `permission` is held under the rule in the module docs.
    pub fn allows(&self, permission: &Value) -> bool {
        match permission {
            Value::String(text) => {
                let mut parts = text.split(':');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(resource), Some(action), None)
                        if !resource.is_empty() && !action.is_empty() =>
                    {
                        self.grants(resource, action)
                    }
                    _ => false,
                }
            }
            Value::Object(required) if !required.is_empty() => {
                required.iter().all(|(resource, actions)| {
                    let Some(actions) = actions.as_array() else {
                        return false;
                    };
                    !resource.is_empty()
                        && !actions.is_empty()
                        && actions.iter().all(|action| {
                            action
                                .as_str()
                                .is_some_and(|a| !a.is_empty() && self.grants(resource, a))
                        })
                })
            }
            _ => false,
        }
    }

    /// True when no resource is granted anything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A wire subscriber whose evaluator is this set of grants, shared with
    /// every other open stream whose subscriber has the same grants: a
    /// relay's streams hold a few distinct sets (one per role, say), and a
    /// set parsed into maps and strings takes several times the claim's
    /// size, which per stream would cost more than the stream itself.
    pub fn into_subscriber(
        self,
        scope_key: impl Into<String>,
        subscriber_id: impl Into<String>,
    ) -> Subscriber {
        let evaluator: Arc<dyn PermissionEvaluator> = shared(self);
        Subscriber {
            scope_key: scope_key.into(),
            subscriber_id: subscriber_id.into(),
            evaluator: Some(evaluator),
        }
    }

    fn grants(&self, resource: &str, action: &str) -> bool {
        self.0.get(resource).is_some_and(|granted| {
            granted
                .iter()
                .any(|g| g == action || g.as_str() == ANY_ACTION)
        })
    }
}

impl PermissionEvaluator for Grants {
    fn can(&self, permission: &Value) -> bool {
        self.allows(permission)
    }
}

/// The grants sets in use, by their hash: each set is held once, by the
/// subscribers that have it, and forgotten when the last of them goes.
#[derive(Default)]
struct Interned {
    sets: HashMap<u64, Vec<Weak<Grants>>>,
    /// Sets held after the last sweep of forgotten ones.
    after_sweep: usize,
}

/// The one `Arc` of `grants` every subscriber with these grants shares.
fn shared(grants: Grants) -> Arc<Grants> {
    static INTERNED: OnceLock<(RandomState, Mutex<Interned>)> = OnceLock::new();
    let (hasher, interned) = INTERNED.get_or_init(Default::default);
    let hash = hasher.hash_one(&grants);
    let mut interned = interned
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let same_hash = interned.sets.entry(hash).or_default();
    if let Some(held) = same_hash
        .iter()
        .filter_map(Weak::upgrade)
        .find(|held| **held == grants)
    {
        return held;
    }
    same_hash.retain(|set| set.strong_count() > 0);
    let held = Arc::new(grants);
    same_hash.push(Arc::downgrade(&held));
    // Sets whose subscribers all left are swept once the map has doubled
    // since the last sweep, which keeps the sweeps' cost per set constant.
    if interned.sets.len() > 2 * interned.after_sweep + 64 {
        interned
            .sets
            .retain(|_, sets| sets.iter().any(|set| set.strong_count() > 0));
        interned.after_sweep = interned.sets.len();
    }
    held
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grants() -> Grants {
        Grants::parse(Some(&json!({
            "orders": ["read", "write"],
            "reports": ["*"],
            "audit": [],
        })))
        .unwrap()
    }

    #[test]
    fn permission_shapes_table() {
        let grants = grants();
        let table: Vec<(Value, bool)> = vec![
            // Held: object form.
            (json!({"orders": ["read"]}), true),
            (json!({"orders": ["read", "write"]}), true),
            (json!({"orders": ["read"], "reports": ["export"]}), true),
            (json!({"reports": ["anything", "*"]}), true),
            // Held: string form.
            (json!("orders:read"), true),
            (json!("orders:write"), true),
            (json!("reports:export"), true),
            // Not held: a grant is missing.
            (json!({"orders": ["delete"]}), false),
            (json!({"orders": ["read", "delete"]}), false),
            (json!({"orders": ["read"], "billing": ["read"]}), false),
            (json!({"audit": ["read"]}), false),
            (json!({"orders": ["*"]}), false),
            (json!("orders:delete"), false),
            (json!("billing:read"), false),
            (json!("Orders:read"), false),
            (json!("orders: read"), false),
            // Not held: fail-closed shapes.
            (json!(1), false),
            (json!(1.5), false),
            (json!(true), false),
            (json!(false), false),
            (Value::Null, false),
            (json!([]), false),
            (json!(["orders:read"]), false),
            (json!([{"orders": ["read"]}]), false),
            (json!({}), false),
            (json!({"orders": []}), false),
            (json!({"orders": "read"}), false),
            (json!({"orders": null}), false),
            (json!({"orders": [1]}), false),
            (json!({"orders": ["read", 1]}), false),
            (json!({"orders": [""]}), false),
            (json!({"orders": [["read"]]}), false),
            (json!({"orders": {"read": true}}), false),
            (json!({"orders": [{"read": true}]}), false),
            (json!({"": ["read"]}), false),
            (json!("orders"), false),
            (json!(""), false),
            (json!("orders:read:extra"), false),
            (json!("orders::read"), false),
            (json!(":read"), false),
            (json!("orders:"), false),
            (json!(":"), false),
        ];
        for (permission, held) in table {
            assert_eq!(grants.allows(&permission), held, "permission {permission}");
        }
    }

    #[test]
    fn wildcard_grant_covers_any_action_but_only_on_its_resource() {
        let grants = Grants::parse(Some(&json!({"reports": ["*"]}))).unwrap();
        assert!(grants.allows(&json!("reports:delete")));
        assert!(grants.allows(&json!({"reports": ["read", "write"]})));
        assert!(!grants.allows(&json!("orders:read")));
    }

    #[test]
    fn empty_grants_hold_nothing() {
        for grants in [Grants::none(), Grants::parse(Some(&json!({}))).unwrap()] {
            assert!(grants.is_empty());
            assert!(!grants.allows(&json!("orders:read")));
            assert!(!grants.allows(&json!({"orders": ["read"]})));
        }
    }

    #[test]
    fn grants_parse_strictly() {
        assert_eq!(Grants::parse(None), Ok(Grants::none()));
        assert_eq!(Grants::parse(Some(&Value::Null)), Ok(Grants::none()));
        for bad in [
            json!("orders:read"),
            json!(["orders"]),
            json!(7),
            json!(true),
            json!({"orders": "read"}),
            json!({"orders": ["read", 1]}),
            json!({"orders": {"read": true}}),
            json!({"orders": null}),
        ] {
            assert!(Grants::parse(Some(&bad)).is_err(), "grants {bad}");
        }
    }

    #[test]
    fn malformed_grants_become_no_grants() {
        // One bad entry discards the whole claim, including the good entries.
        let value = json!({"orders": ["read"], "reports": "all"});
        let grants = Grants::parse_or_none(Some(&value), "alice");
        assert!(grants.is_empty());
        assert!(!grants.allows(&json!("orders:read")));
    }

    #[test]
    fn subscriber_evaluator_uses_the_grants() {
        use eventrelay_wire::{Audience, NewEvent, is_envelope_permitted};

        let subscriber = grants().into_subscriber("org-1", "alice");
        let event = |permission: Value| {
            let mut event = NewEvent::ephemeral("t", "org-1", json!({}));
            event.audience = Some(Audience::permission(permission));
            event.into_envelope(chrono::Utc::now())
        };
        assert!(is_envelope_permitted(
            &event(json!("orders:read")),
            &subscriber
        ));
        assert!(!is_envelope_permitted(
            &event(json!("orders:delete")),
            &subscriber
        ));
        assert!(!is_envelope_permitted(&event(json!(42)), &subscriber));
    }

    #[test]
    fn subscribers_with_the_same_grants_share_one_evaluator() {
        let evaluator = |subscriber: &Subscriber| subscriber.evaluator.clone().unwrap();
        let alice = grants().into_subscriber("org-1", "alice");
        let bob = grants().into_subscriber("org-2", "bob");
        assert!(Arc::ptr_eq(&evaluator(&alice), &evaluator(&bob)));
        let other = Grants::parse(Some(&json!({"orders": ["read"]})))
            .unwrap()
            .into_subscriber("org-1", "carol");
        assert!(!Arc::ptr_eq(&evaluator(&alice), &evaluator(&other)));
        assert!(evaluator(&other).can(&json!("orders:read")));
        assert!(!evaluator(&other).can(&json!("orders:write")));

        // Once every holder is gone the set is forgotten, not kept alive.
        let held = Arc::downgrade(&evaluator(&other));
        drop(other);
        assert_eq!(held.strong_count(), 0);
    }
}
