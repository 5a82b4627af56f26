//! The outbox read side against a real Postgres.

use crate::support::TestDb;
use chrono::{Duration, Utc};
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
async fn prunes_rows_written_before_a_time_whatever_their_occurred_at() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    let old = Utc::now() - Duration::hours(30);
    let mut written_long_ago = Vec::new();
    for _ in 0..3 {
        let row = client
            .query_one(
                &format!(
                    "INSERT INTO {}.outbox (id, type, scope_key, written_at)
                     VALUES (gen_random_uuid(), 'old', 'org-a', $1) RETURNING seq",
                    db.schema
                ),
                &[&old],
            )
            .await
            .unwrap();
        written_long_ago.push(row.get::<_, i64>(0));
    }
    // A caller may set occurred_at to any time; retention ignores it.
    client
        .execute(
            &format!(
                "SELECT {}.emit('backdated', 'org-a', occurred_at => $1)",
                db.schema
            ),
            &[&old],
        )
        .await
        .unwrap();
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    publisher
        .emit(&client, NewEvent::durable("fresh", "org-a", json!({})))
        .await
        .unwrap();

    let outbox = Outbox::new(&db.schema);
    let cutoff = Utc::now() - Duration::hours(24);
    assert_eq!(outbox.prune_before(&client, cutoff).await.unwrap(), 3);
    let kept: Vec<String> = outbox
        .read_since(&client, "org-a", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(kept, ["backdated", "fresh"]);
    assert_eq!(outbox.prune_before(&client, cutoff).await.unwrap(), 0);

    // The highest pruned seq is recorded, so a replay from below it is told
    // to re-read even though later rows remain.
    let view = outbox.join_view(&client, "org-a").await.unwrap();
    assert_eq!(view.pruned_through, *written_long_ago.iter().max().unwrap());
}

#[tokio::test]
async fn reserved_event_types_are_refused_by_sql_and_withheld_when_read() {
    let db = TestDb::new().await;
    let client = db.connect().await;
    // The CHECK names the same types as the wire crate, all of them.
    let definition: String = client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint
             WHERE conname = 'outbox_type_not_reserved' AND connamespace = $1::text::regnamespace",
            &[&db.schema.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    let mut in_sql: Vec<&str> = definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .filter(|quoted| !quoted.ends_with('.'))
        .collect();
    in_sql.sort_unstable();
    // The reserved names, and the relay's own events it lets system rows
    // carry under the prefix.
    let mut in_rust = eventrelay::wire::RESERVED_EVENT_TYPES.to_vec();
    in_rust.extend(eventrelay::wire::SYSTEM_EVENT_TYPES);
    in_rust.sort_unstable();
    assert_eq!(in_sql, in_rust, "{definition}");
    let prefix = eventrelay::wire::RESERVED_EVENT_TYPE_PREFIX;
    assert!(definition.contains(&format!("'{prefix}'")), "{definition}");
    let prefixed = format!("{prefix}ping");
    let mut reserved_types = eventrelay::wire::RESERVED_EVENT_TYPES.to_vec();
    reserved_types.push(&prefixed);
    // No emitter may write the relay's own events either.
    reserved_types.extend(eventrelay::wire::SYSTEM_EVENT_TYPES);
    for reserved in reserved_types {
        assert!(eventrelay::wire::is_reserved_event_type(reserved));
        let error = client
            .execute(
                &format!("SELECT {}.emit($1, 'org-a')", db.schema),
                &[&reserved],
            )
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("outbox_type_not_reserved")
                || format!("{error:?}").contains("outbox_type_not_reserved"),
            "{reserved}: {error:?}"
        );
    }
    // A system row (the relay's own) may carry one of the relay's events,
    // and is shown like any event; one of another name is refused.
    let system_row = |event_type: &str| {
        format!(
            "INSERT INTO {s}.outbox (id, type, scope_key, system)
             VALUES (gen_random_uuid(), '{event_type}', 'org-a', true)",
            s = db.schema
        )
    };
    client
        .batch_execute(&system_row("eventrelay.subscription.paused"))
        .await
        .unwrap();
    assert!(
        client
            .batch_execute(&system_row("eventrelay.ping"))
            .await
            .is_err()
    );
    assert!(client.batch_execute(&system_row("ready")).await.is_err());
    // A row from before the rule (the constraint is NOT VALID, so such rows
    // may exist) is never shown.
    client
        .batch_execute(&format!(
            "ALTER TABLE {s}.outbox DROP CONSTRAINT outbox_type_not_reserved;
             SELECT {s}.emit('ready', 'org-a');
             SELECT {s}.emit('eventrelay.ping', 'org-a');
             SELECT {s}.emit('order.created', 'org-a');",
            s = db.schema
        ))
        .await
        .unwrap();
    let read: Vec<String> = Outbox::new(&db.schema)
        .read_since(&client, "org-a", 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type)
        .collect();
    assert_eq!(read, ["eventrelay.subscription.paused", "order.created"]);
}
