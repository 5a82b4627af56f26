//! The outbox read side against a real Postgres.

mod common;

use chrono::{Duration, Utc};
use common::TestDb;
use eventrelay::publisher::{NewEvent, Publisher};
use eventrelay::store::Outbox;
use serde_json::json;

#[tokio::test]
async fn reads_a_scope_after_a_seq_in_order_with_a_limit() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let mut mine = Vec::new();
    for n in 0..6 {
        let scope = if n % 2 == 0 { "org-a" } else { "org-b" };
        let envelope = publisher
            .emit(&client, NewEvent::durable("n", scope, json!({"n": n})))
            .await
            .unwrap();
        if scope == "org-a" {
            mine.push(envelope);
        }
    }
    let outbox = Outbox::new(&db.schema);
    assert_eq!(
        outbox.read_since(&client, "org-a", 0, 100).await.unwrap(),
        mine
    );
    let after_first = mine[0].seq.unwrap();
    assert_eq!(
        outbox
            .read_since(&client, "org-a", after_first, 1)
            .await
            .unwrap(),
        vec![mine[1].clone()]
    );
    assert!(
        outbox
            .read_since(&client, "org-c", 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        outbox.oldest_seq(&client, "org-a").await.unwrap(),
        mine[0].seq
    );
    assert_eq!(outbox.oldest_seq(&client, "org-c").await.unwrap(), None);
}

#[tokio::test]
async fn prunes_rows_older_than_a_time() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let old = Utc::now() - Duration::hours(30);
    for _ in 0..3 {
        client
            .execute(
                &format!(
                    "SELECT {}.emit('old', 'org-a', occurred_at => $1)",
                    db.schema
                ),
                &[&old],
            )
            .await
            .unwrap();
    }
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let fresh = publisher
        .emit(&client, NewEvent::durable("fresh", "org-a", json!({})))
        .await
        .unwrap();

    let outbox = Outbox::new(&db.schema);
    let cutoff = Utc::now() - Duration::hours(24);
    assert_eq!(outbox.prune_before(&client, cutoff).await.unwrap(), 3);
    assert_eq!(
        outbox.read_since(&client, "org-a", 0, 100).await.unwrap(),
        vec![fresh]
    );
    assert_eq!(outbox.prune_before(&client, cutoff).await.unwrap(), 0);
}
