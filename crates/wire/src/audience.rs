//! The audience predicate: the one rule deciding whether a subscriber may see
//! an envelope. Live delivery and every replay path call [`is_envelope_permitted`]
//! (or [`is_permitted`], the same rule on an event's routing fields); none
//! re-derives it.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::envelope::{Audience, EventEnvelope};

/// Decides whether a subscriber holds an opaque `audience.permission`.
///
/// The wire format never interprets permissions; whoever resolves a
/// subscriber (a token's grants, an app's own closure) supplies this.
pub trait PermissionEvaluator: Send + Sync {
    fn can(&self, permission: &Value) -> bool;
}

impl<F> PermissionEvaluator for F
where
    F: Fn(&Value) -> bool + Send + Sync,
{
    fn can(&self, permission: &Value) -> bool {
        self(permission)
    }
}

/// Who is subscribed: the scope they belong to, their id, and optionally how
/// to evaluate permissions for them.
#[derive(Clone)]
pub struct Subscriber {
    pub scope_key: String,
    pub subscriber_id: String,
    /// Without an evaluator, every permission-carrying event is withheld.
    pub evaluator: Option<Arc<dyn PermissionEvaluator>>,
}

impl Subscriber {
    /// A subscriber with no permission evaluator.
    pub fn new(scope_key: impl Into<String>, subscriber_id: impl Into<String>) -> Self {
        Subscriber {
            scope_key: scope_key.into(),
            subscriber_id: subscriber_id.into(),
            evaluator: None,
        }
    }

    /// Sets the evaluator for `audience.permission`.
    pub fn with_evaluator(mut self, evaluator: impl PermissionEvaluator + 'static) -> Self {
        self.evaluator = Some(Arc::new(evaluator));
        self
    }
}

impl fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("scope_key", &self.scope_key)
            .field("subscriber_id", &self.subscriber_id)
            .field("evaluator", &self.evaluator.is_some())
            .finish()
    }
}

/// True when `subscriber` may see `envelope`:
///
/// 1. the scope keys are equal; and
/// 2. if `audience.users` is present, the subscriber's id is in it (an empty
///    list admits nobody); and
/// 3. if `audience.permission` is present, the subscriber has an evaluator
///    and it returns true. No evaluator means the event is withheld.
pub fn is_envelope_permitted(envelope: &EventEnvelope, subscriber: &Subscriber) -> bool {
    is_permitted(&envelope.scope_key, envelope.audience.as_ref(), subscriber)
}

/// The same rule as [`is_envelope_permitted`], on the two fields it reads,
/// for holders of an event that keep only its routing fields.
pub fn is_permitted(scope_key: &str, audience: Option<&Audience>, subscriber: &Subscriber) -> bool {
    if scope_key != subscriber.scope_key {
        return false;
    }
    let Some(audience) = audience else {
        return true;
    };
    if let Some(users) = &audience.users {
        if !users.contains(&subscriber.subscriber_id) {
            return false;
        }
    }
    if let Some(permission) = &audience.permission {
        return match &subscriber.evaluator {
            Some(evaluator) => evaluator.can(permission),
            None => false,
        };
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Audience, NewEvent};
    use chrono::Utc;
    use serde_json::json;

    fn envelope(scope: &str, audience: Option<Audience>) -> EventEnvelope {
        let mut event = NewEvent::ephemeral("t", scope, json!({}));
        event.audience = audience;
        event.into_envelope(Utc::now())
    }

    #[test]
    fn scope_must_match() {
        let alice = Subscriber::new("org-1", "alice");
        assert!(is_envelope_permitted(&envelope("org-1", None), &alice));
        assert!(!is_envelope_permitted(&envelope("org-2", None), &alice));
    }

    #[test]
    fn users_restricts_to_listed_ids() {
        let alice = Subscriber::new("org-1", "alice");
        let bob = Subscriber::new("org-1", "bob");
        let for_alice = envelope("org-1", Some(Audience::users(["alice"])));
        assert!(is_envelope_permitted(&for_alice, &alice));
        assert!(!is_envelope_permitted(&for_alice, &bob));
        let for_nobody = envelope("org-1", Some(Audience::users(Vec::<String>::new())));
        assert!(!is_envelope_permitted(&for_nobody, &alice));
    }

    #[test]
    fn permission_is_handed_to_the_evaluator_and_fails_closed_without_one() {
        let permission = json!({"orders": ["read"]});
        let event = envelope("org-1", Some(Audience::permission(permission.clone())));
        let without = Subscriber::new("org-1", "alice");
        assert!(!is_envelope_permitted(&event, &without));

        let expected = permission.clone();
        let allows =
            Subscriber::new("org-1", "alice").with_evaluator(move |p: &Value| *p == expected);
        assert!(is_envelope_permitted(&event, &allows));
        let denies = Subscriber::new("org-1", "alice").with_evaluator(|_: &Value| false);
        assert!(!is_envelope_permitted(&event, &denies));
    }

    #[test]
    fn users_and_permission_must_both_hold() {
        let event = envelope(
            "org-1",
            Some(Audience {
                users: Some(vec!["alice".into()]),
                permission: Some(json!("admin")),
            }),
        );
        let alice_yes = Subscriber::new("org-1", "alice").with_evaluator(|_: &Value| true);
        let bob_yes = Subscriber::new("org-1", "bob").with_evaluator(|_: &Value| true);
        let alice_no = Subscriber::new("org-1", "alice").with_evaluator(|_: &Value| false);
        assert!(is_envelope_permitted(&event, &alice_yes));
        assert!(!is_envelope_permitted(&event, &bob_yes));
        assert!(!is_envelope_permitted(&event, &alice_no));
    }
}
