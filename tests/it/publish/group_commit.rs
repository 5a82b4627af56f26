//! Group commit on the publish API: concurrent requests share transactions
//! yet each keeps its own events, order, atomicity and answer.
//!
//! To make a group form deterministically, a test first sends a request
//! whose event a trigger slows down; the requests sent meanwhile queue up
//! and are written together as the next group.

use std::collections::HashSet;
use std::sync::Arc;

use crate::support::server::TestServer;
use crate::support::{TestDb, eventually};
use serde_json::{Value, json};

/// Makes inserting an event of type `test.slow` take half a second (and
/// say so in `pg_stat_activity`, see [`slow_insert_running`]), and one of
/// type `test.outage` fail the way a lost database does.
async fn install_triggers(db: &TestDb) {
    db.connect()
        .await
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.test_trouble() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.type = 'test.slow' THEN
                     PERFORM set_config('application_name', 'slow-{s}', true);
                     PERFORM pg_sleep(0.5);
                 END IF;
                 IF NEW.type = 'test.outage' THEN
                     RAISE EXCEPTION 'simulated outage' USING ERRCODE = '57P01';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER test_trouble BEFORE INSERT ON {s}.outbox
                 FOR EACH ROW EXECUTE FUNCTION {s}.test_trouble();",
            s = db.schema
        ))
        .await
        .unwrap();
}

fn event(event_type: &str, n: usize) -> Value {
    json!({"type": event_type, "scopeKey": "org-1", "lane": "durable", "data": {"n": n}})
}

/// Sends the slow request, then `bodies` concurrently while it is being
/// written; answers in the order of `bodies`.
async fn behind_a_slow_one(
    db: &TestDb,
    server: &Arc<TestServer>,
    bodies: Vec<Value>,
) -> Vec<(u16, Value)> {
    let slow = {
        let server = Arc::clone(server);
        tokio::spawn(async move { server.publish(event("test.slow", 0)).await })
    };
    // Until the slow insert is running, nothing else is queued behind it.
    slow_insert_running(db).await;
    let sends: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let server = Arc::clone(server);
            tokio::spawn(async move { server.publish(body).await })
        })
        .collect();
    assert_eq!(slow.await.unwrap().0, 200);
    let mut answers = Vec::new();
    for send in sends {
        answers.push(send.await.unwrap());
    }
    answers
}

/// Waits until the relay's slow insert is in its trigger's sleep.
async fn slow_insert_running(db: &TestDb) {
    let client = db.connect().await;
    let name = format!("slow-{}", db.schema);
    eventually("the slow insert runs", async || {
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                &[&name],
            )
            .await
            .ok()?;
        (row.get::<_, i64>(0) > 0).then_some(())
    })
    .await;
}

async fn stored_ids(db: &TestDb) -> HashSet<String> {
    db.connect()
        .await
        .query(&format!("SELECT id::text FROM {}.outbox", db.schema), &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn start(db: &TestDb) -> Arc<TestServer> {
    Arc::new(TestServer::start(db, |c| {
        c.publish.group_commit_ms = 50;
        // One committer: the requests queued behind the slow one form
        // exactly one group.
        c.publish.group_commit_writers = 1;
        c.webhooks.enabled = false;
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keeps_every_requests_events_ids_and_order() {
    let db = TestDb::new().await;
    install_triggers(&db).await;
    let server = start(&db);
    server.ready().await;
    let bodies: Vec<Value> = (0..12)
        .map(|r| {
            json!([
                event("a", r * 10),
                event("b", r * 10 + 1),
                event("c", r * 10 + 2)
            ])
        })
        .collect();
    let answers = behind_a_slow_one(&db, &server, bodies).await;
    let mut all_seqs = Vec::new();
    for (r, (status, body)) in answers.iter().enumerate() {
        assert_eq!(*status, 200, "{body}");
        let events = body["events"].as_array().unwrap();
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["a", "b", "c"], "request {r} keeps its order");
        let ns: Vec<u64> = events
            .iter()
            .map(|e| e["data"]["n"].as_u64().unwrap())
            .collect();
        assert_eq!(ns, [r as u64 * 10, r as u64 * 10 + 1, r as u64 * 10 + 2]);
        let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "request {r}'s events are contiguous: {seqs:?}"
        );
        all_seqs.extend(seqs);
    }
    let stored = stored_ids(&db).await;
    for (_, body) in &answers {
        for event in body["events"].as_array().unwrap() {
            assert!(stored.contains(event["id"].as_str().unwrap()));
        }
    }
    let distinct: HashSet<i64> = all_seqs.iter().copied().collect();
    assert_eq!(distinct.len(), all_seqs.len());
    // They were written together: one group held all twelve.
    let largest = group_sizes_above(&server, 8.0).await;
    assert!(
        largest >= 1.0,
        "no group of more than 8 requests was formed"
    );
}

/// How many groups held more than `size` requests.
async fn group_sizes_above(server: &TestServer, size: f64) -> f64 {
    let total = server
        .metric("eventrelay_publish_group_requests_count")
        .await;
    let at_most = server
        .metric(&format!(
            "eventrelay_publish_group_requests_bucket{{le=\"{size:.1}\"}}"
        ))
        .await;
    total - at_most
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_request_fails_alone() {
    let db = TestDb::new().await;
    install_triggers(&db).await;
    let server = start(&db);
    server.ready().await;
    let (status, used) = server.publish(event("first", 0)).await;
    assert_eq!(status, 200);
    let used_id = used["events"][0]["id"].clone();
    let mut bodies: Vec<Value> = (1..=6).map(|n| event("fine", n)).collect();
    let mut duplicate = event("again", 99);
    duplicate["id"] = used_id;
    bodies.insert(2, json!([event("fine", 50), duplicate]));
    bodies.insert(4, event("ready", 51));
    let answers = behind_a_slow_one(&db, &server, bodies).await;
    let stored = stored_ids(&db).await;
    for (i, (status, body)) in answers.iter().enumerate() {
        match i {
            2 => {
                assert_eq!(*status, 409, "{body}");
                assert_eq!(body["error"]["code"], "conflict");
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .starts_with("event 1:")
                );
            }
            4 => assert_eq!(
                (*status, &body["error"]["code"]),
                (400, &json!("invalid_event"))
            ),
            _ => {
                assert_eq!(*status, 200, "{body}");
                assert!(stored.contains(body["events"][0]["id"].as_str().unwrap()));
            }
        }
    }
    // Nothing of the refused request was written, not even its good event.
    let fine_50: i64 = db
        .connect()
        .await
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.outbox WHERE data->>'n' = '50'",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(fine_50, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_failure_answers_the_whole_group_with_503_and_writes_none() {
    let db = TestDb::new().await;
    install_triggers(&db).await;
    let server = start(&db);
    server.ready().await;
    let mut bodies: Vec<Value> = (1..=6).map(|n| event("fine", n)).collect();
    bodies.insert(3, event("test.outage", 7));
    let before = stored_ids(&db).await.len();
    let answers = behind_a_slow_one(&db, &server, bodies).await;
    for (status, body) in &answers {
        assert_eq!(*status, 503, "{body}");
        assert_eq!(body["error"]["code"], "unavailable");
    }
    // Only the slow request before the group was written.
    assert_eq!(stored_ids(&db).await.len(), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_writer_commits_while_the_first_group_is_still_being_written() {
    let db = TestDb::new().await;
    install_triggers(&db).await;
    let server = Arc::new(TestServer::start(&db, |c| {
        c.publish.group_commit_ms = 50;
        c.publish.group_commit_writers = 2;
        c.webhooks.enabled = false;
    }));
    server.ready().await;
    let slow = {
        let server = Arc::clone(&server);
        tokio::spawn(async move { server.publish(event("test.slow", 0)).await })
    };
    slow_insert_running(&db).await;
    // The slow insert holds one writer for half a second; these requests
    // are written by the other one meanwhile.
    let sends: Vec<_> = (1..=4)
        .map(|n| {
            let server = Arc::clone(&server);
            tokio::spawn(async move { server.publish(event("fine", n)).await })
        })
        .collect();
    let mut seqs = Vec::new();
    for send in sends {
        let (status, body) = send.await.unwrap();
        assert_eq!(status, 200, "{body}");
        seqs.push(body["events"][0]["seq"].as_i64().unwrap());
        assert!(
            !slow.is_finished(),
            "a request behind the slow one was answered only after it"
        );
    }
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, 200, "{body}");
    let slow_seq = body["events"][0]["seq"].as_i64().unwrap();
    // Every event has its own seq, and all of them were stored.
    seqs.push(slow_seq);
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 5);
    assert_eq!(stored_ids(&db).await.len(), 5);
}
