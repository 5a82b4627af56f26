//! Isolation as a property: for random scopes, subscribers with random
//! grants, and events with random audiences (none, a users list, a
//! permission, or both, including shapes that must fail closed), every
//! subscriber receives exactly the events an independent statement of the
//! audience rule allows, in order: nothing forbidden and nothing missing.
//! Checked on the three delivery paths: live, replay from the hub's
//! in-memory tail, and replay paged from the outbox (on a second relay whose
//! tail is one event long and holds nothing for the scope).

use std::cell::Cell;
use std::collections::BTreeMap;

use crate::support::TestDb;
use crate::support::server::{Frame, TestServer, token};
use eventrelay::publisher::{Audience, NewEvent, Publisher};
use proptest::prelude::*;
use proptest::sample::{select, subsequence};
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use serde_json::{Value, json};

const USERS: [&str; 4] = ["ann", "ben", "cat", "dan"];
/// Names an audience may list: every user, and one that differs from `ann`
/// only by case, which must not admit her.
const LISTABLE: [&str; 5] = ["ann", "ben", "cat", "dan", "Ann"];
const RESOURCES: [&str; 2] = ["orders", "reports"];

/// Grants as a token carries them: resource → actions. `None` leaves the
/// claim out, which means no grants at all.
type Grants = Option<BTreeMap<String, Vec<String>>>;

#[derive(Clone, Debug)]
struct SubscriberPlan {
    scope: usize,
    user: &'static str,
    grants: Grants,
}

#[derive(Clone, Debug)]
struct EventPlan {
    scope: usize,
    users: Option<Vec<&'static str>>,
    permission: Option<Value>,
}

#[derive(Clone, Debug)]
struct Plan {
    scopes: usize,
    subscribers: Vec<SubscriberPlan>,
    events: Vec<EventPlan>,
}

/// Permissions an event may require: ones a grant can hold, and shapes the
/// rule refuses whatever the grants.
fn permissions() -> Vec<Value> {
    vec![
        json!({"orders": ["read"]}),
        json!({"orders": ["write"]}),
        json!({"reports": ["read"]}),
        json!({"orders": ["read", "write"]}),
        json!({"orders": ["read"], "reports": ["write"]}),
        json!("orders:read"),
        json!("reports:write"),
        // Fail closed:
        json!({}),
        json!({"orders": []}),
        json!({"orders": "read"}),
        json!({"orders": [""]}),
        json!({"": ["read"]}),
        json!("orders"),
        json!("orders:read:extra"),
        json!(":read"),
        json!(42),
        json!(["orders", "read"]),
    ]
}

fn grants() -> impl Strategy<Value = Grants> {
    proptest::option::weighted(
        0.85,
        proptest::collection::btree_map(
            select(RESOURCES.to_vec()).prop_map(str::to_owned),
            subsequence(vec!["read", "write", "*"], 0..=2)
                .prop_map(|actions| actions.into_iter().map(str::to_owned).collect()),
            0..=2,
        ),
    )
}

fn event(scopes: usize) -> impl Strategy<Value = EventPlan> {
    let users = subsequence(LISTABLE.to_vec(), 0..=3);
    let permission = select(permissions());
    (
        0..scopes,
        prop_oneof![
            2 => Just((None, None)),
            2 => users.clone().prop_map(|u| (Some(u), None)),
            3 => permission.clone().prop_map(|p| (None, Some(p))),
            2 => (users, permission).prop_map(|(u, p)| (Some(u), Some(p))),
        ],
    )
        .prop_map(|(scope, (users, permission))| EventPlan {
            scope,
            users,
            permission,
        })
}

fn plan() -> impl Strategy<Value = Plan> {
    (2usize..=3, 3usize..=4)
        .prop_flat_map(|(scopes, users)| {
            (
                Just(scopes),
                Just(users),
                proptest::collection::vec(grants(), scopes * users),
                proptest::collection::vec(event(scopes), 16..=24),
            )
        })
        .prop_map(|(scopes, users, grants, events)| {
            let subscribers = grants
                .into_iter()
                .enumerate()
                .map(|(n, grants)| SubscriberPlan {
                    scope: n / users,
                    user: USERS[n % users],
                    grants,
                })
                .collect();
            Plan {
                scopes,
                subscribers,
                events,
            }
        })
}

// ------------------------------------------------------------ the oracle

/// Whether `grants` hold one `resource`/`action` pair.
fn granted(grants: &Grants, resource: &str, action: &str) -> bool {
    grants
        .as_ref()
        .and_then(|g| g.get(resource))
        .is_some_and(|actions| actions.iter().any(|a| a == action || a == "*"))
}

/// The permission rule, restated: a `"resource:action"` string, or a
/// non-empty object of non-empty resources to non-empty lists of non-empty
/// action strings, every one granted. Anything else is never held.
fn holds(grants: &Grants, permission: &Value) -> bool {
    let mut required = Vec::new();
    match permission {
        Value::String(text) => {
            let parts: Vec<&str> = text.split(':').collect();
            if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
                return false;
            }
            required.push((parts[0].to_owned(), parts[1].to_owned()));
        }
        Value::Object(map) if !map.is_empty() => {
            for (resource, actions) in map {
                let Some(actions) = actions.as_array() else {
                    return false;
                };
                if resource.is_empty() || actions.is_empty() {
                    return false;
                }
                for action in actions {
                    match action.as_str() {
                        Some(action) if !action.is_empty() => {
                            required.push((resource.clone(), action.to_owned()));
                        }
                        _ => return false,
                    }
                }
            }
        }
        _ => return false,
    }
    required
        .iter()
        .all(|(resource, action)| granted(grants, resource, action))
}

/// May `subscriber` see `event`? Same scope; on the users list if there is
/// one; holding the permission if there is one.
fn allowed(subscriber: &SubscriberPlan, event: &EventPlan) -> bool {
    subscriber.scope == event.scope
        && event
            .users
            .as_ref()
            .is_none_or(|users| users.contains(&subscriber.user))
        && event
            .permission
            .as_ref()
            .is_none_or(|permission| holds(&subscriber.grants, permission))
}

// ------------------------------------------------------------ running

struct Relays {
    db: TestDb,
    /// Serves the live streams and replays from its hub's tail.
    live: TestServer,
    /// Holds no tail for any scope, so its replays page from the outbox.
    cold: TestServer,
}

#[derive(Default)]
struct Totals {
    cases: usize,
    events: usize,
    subscribers: usize,
    deliveries: usize,
    withheld: usize,
}

fn ids(frames: &[Frame]) -> Vec<String> {
    frames
        .iter()
        .map(|f| f.json()["id"].as_str().unwrap().to_owned())
        .collect()
}

fn subscriber_token(scope_key: &str, subscriber: &SubscriberPlan) -> String {
    let grants = match &subscriber.grants {
        Some(grants) => json!(grants),
        None => Value::Null,
    };
    token(subscriber.user, scope_key, grants)
}

/// Runs one plan on fresh scopes; `Err` names the first subscriber whose
/// events differ from the oracle's.
async fn check(
    relays: &Relays,
    case: usize,
    plan: &Plan,
    totals: &mut Totals,
) -> Result<(), String> {
    let scope_keys: Vec<String> = (0..plan.scopes)
        .map(|n| format!("iso-{case}-{}-scope-{n}", uuid::Uuid::new_v4().simple()))
        .collect();
    let memory_before = relays
        .live
        .metric("eventrelay_replays_total{source=\"memory\"}")
        .await;
    let outbox_before = relays
        .cold
        .metric("eventrelay_replays_total{source=\"outbox\"}")
        .await;

    let mut live = Vec::new();
    for subscriber in &plan.subscribers {
        let token = subscriber_token(&scope_keys[subscriber.scope], subscriber);
        live.push(relays.live.subscribe(&token, None, "").await.0);
    }

    let client = relays.db.connect().await;
    let publisher = Publisher::new(relays.db.schema.as_str()).unwrap();
    let mut emitted = Vec::new();
    for (n, event) in plan.events.iter().enumerate() {
        let mut new = NewEvent::durable("iso.event", &scope_keys[event.scope], json!({"n": n}));
        if event.users.is_some() || event.permission.is_some() {
            new = new.with_audience(Audience {
                users: event
                    .users
                    .as_ref()
                    .map(|users| users.iter().map(|u| (*u).to_owned()).collect()),
                permission: event.permission.clone(),
            });
        }
        emitted.push(publisher.emit(&client, new).await.unwrap());
    }
    // One unrestricted sentinel per scope marks the end of every stream.
    let mut sentinels = Vec::new();
    for scope_key in &scope_keys {
        let sentinel = NewEvent::durable("iso.sentinel", scope_key, json!({}));
        sentinels.push(publisher.emit(&client, sentinel).await.unwrap());
    }

    for (subscriber, stream) in plan.subscribers.iter().zip(&mut live) {
        let who = format!(
            "{} in scope {} with grants {:?}",
            subscriber.user, subscriber.scope, subscriber.grants
        );
        let mut expected: Vec<String> = plan
            .events
            .iter()
            .zip(&emitted)
            .filter(|(event, _)| allowed(subscriber, event))
            .map(|(_, envelope)| envelope.id.to_string())
            .collect();
        let sentinel = &sentinels[subscriber.scope];
        expected.push(sentinel.id.to_string());
        totals.withheld += plan.events.len() + plan.scopes - expected.len();

        let mut received = Vec::new();
        loop {
            let frame = stream.next_event().await;
            received.push(frame);
            if frame_is(received.last().unwrap(), &sentinel.id.to_string()) {
                break;
            }
        }
        compare("live", &who, &ids(&received), &expected, plan)?;

        // Replay everything after the seq just before the scope's first event.
        let first_seq = emitted
            .iter()
            .chain(std::iter::once(sentinel))
            .filter(|e| e.scope_key == sentinel.scope_key)
            .filter_map(|e| e.seq)
            .min()
            .unwrap();
        let after = (first_seq - 1).to_string();
        let token = subscriber_token(&scope_keys[subscriber.scope], subscriber);
        for (path, relay) in [
            ("memory replay", &relays.live),
            ("outbox replay", &relays.cold),
        ] {
            let (replay, resync) = relay.subscribe(&token, Some(&after), "").await;
            if resync {
                return Err(format!("{path} for {who} asked for a resync"));
            }
            compare(path, &who, &ids(&replay.replayed), &expected, plan)?;
        }
        totals.deliveries += 3 * expected.len();
    }

    let served_from_memory = relays
        .live
        .metric("eventrelay_replays_total{source=\"memory\"}")
        .await
        - memory_before;
    let served_from_outbox = relays
        .cold
        .metric("eventrelay_replays_total{source=\"outbox\"}")
        .await
        - outbox_before;
    let subscribers = plan.subscribers.len() as f64;
    if (served_from_memory, served_from_outbox) != (subscribers, subscribers) {
        return Err(format!(
            "expected {subscribers} replays from memory and {subscribers} from the outbox, \
             got {served_from_memory} and {served_from_outbox}"
        ));
    }
    totals.cases += 1;
    totals.events += emitted.len() + sentinels.len();
    totals.subscribers += plan.subscribers.len();
    Ok(())
}

fn frame_is(frame: &Frame, id: &str) -> bool {
    frame.json()["id"].as_str() == Some(id)
}

fn compare(
    path: &str,
    who: &str,
    received: &[String],
    expected: &[String],
    plan: &Plan,
) -> Result<(), String> {
    if received == expected {
        return Ok(());
    }
    let extra: Vec<&String> = received
        .iter()
        .filter(|id| !expected.contains(id))
        .collect();
    let missing: Vec<&String> = expected
        .iter()
        .filter(|id| !received.contains(id))
        .collect();
    Err(format!(
        "{path}: {who} received {} events, the rule allows {}; forbidden but received: {extra:?}; \
         allowed but missing: {missing:?}; events: {:?}",
        received.len(),
        expected.len(),
        plan.events
    ))
}

#[test]
fn no_subscriber_receives_what_the_audience_rule_forbids_or_misses_what_it_allows() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let relays = runtime.block_on(async {
        let db = TestDb::new().await;
        // Every case reuses a few subscriber names across scopes, and the
        // connection cap counts a subscriber's streams in all of them.
        let live = TestServer::start(&db, |c| {
            c.sse.replay_lookback = 0;
            c.sse.max_connections_per_subscriber = 10_000;
        });
        let cold = TestServer::start(&db, |c| {
            c.sse.replay_lookback = 0;
            c.sse.max_connections_per_subscriber = 10_000;
            c.hub.tail_events = 1;
        });
        live.ready().await;
        cold.ready().await;
        Relays { db, live, cold }
    });

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 16,
        max_shrink_iters: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let case = Cell::new(0);
    let totals = std::cell::RefCell::new(Totals::default());
    let result = runner.run(&plan(), |plan| {
        case.set(case.get() + 1);
        runtime
            .block_on(check(&relays, case.get(), &plan, &mut totals.borrow_mut()))
            .map_err(TestCaseError::fail)
    });
    let totals = totals.into_inner();
    eprintln!(
        "isolation: {} cases, {} events, {} subscribers, {} deliveries checked across 3 paths \
         (live, memory replay, outbox replay), {} (subscriber, event) pairs withheld on each path",
        totals.cases, totals.events, totals.subscribers, totals.deliveries, totals.withheld
    );
    if let Err(failure) = result {
        panic!("{failure}");
    }
    drop(relays);
}
