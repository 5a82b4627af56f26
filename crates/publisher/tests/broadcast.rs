//! Broadcast channels against a real Postgres (`DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/postgres`).
//!
//! Every test uses its own channel name, so they run in parallel. Nothing
//! sleeps and hopes: each wait is for a condition, under a deadline.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    reason = "test code: a panic is the test failing, and figures are printed for the reader"
)]

use std::future::Future;
use std::time::Duration;

use eventrelay_publisher::backoff::Backoff;
use eventrelay_publisher::broadcast::{
    BroadcastChannel, BroadcastError, MessageError, SubscribeError, Subscription,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

/// The longest any condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(15);

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A name no other test (or run) uses, valid as a channel and as an
/// `application_name`.
fn unique_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("bc_{}", &id[..20])
}

/// `url` with `application_name` set, so the test can find the subscriber's
/// backend in `pg_stat_activity`.
fn tagged_url(url: &str, application_name: &str) -> String {
    if url.contains("://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}application_name={application_name}")
    } else {
        format!("{url} application_name={application_name}")
    }
}

async fn connect() -> (Client, JoinHandle<()>) {
    let (client, connection) = tokio_postgres::connect(&database_url(), NoTls)
        .await
        .expect("connect to DATABASE_URL");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, driver)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Hint {
    key: String,
}

fn hint(key: &str) -> Hint {
    Hint {
        key: key.to_owned(),
    }
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"key": {"type": "string", "minLength": 1}},
        "required": ["key"]
    })
}

fn channel() -> BroadcastChannel<Hint> {
    BroadcastChannel::new(&unique_name())
        .unwrap()
        .with_schema(&schema())
        .unwrap()
}

/// Reconnects fast, so the reconnect test does not wait on the defaults.
fn quick_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(20), Duration::from_millis(200))
}

struct Subscribed {
    subscription: Subscription,
    messages: UnboundedReceiver<Hint>,
    reconnects: UnboundedReceiver<()>,
}

/// Subscribes with a handler that forwards every message to `messages` and
/// every reconnect to `reconnects`.
async fn subscribe(channel: &BroadcastChannel<Hint>, url: &str) -> Subscribed {
    let (message_tx, messages) = unbounded_channel();
    let (reconnect_tx, reconnects) = unbounded_channel();
    let subscription = channel
        .on_message(move |hint: Hint| message_tx.send(hint).map_err(|_| "test is over"))
        .on_reconnect(move || {
            let _ = reconnect_tx.send(());
        })
        .backoff(quick_backoff())
        .connect(url)
        .await
        .expect("subscribe");
    Subscribed {
        subscription,
        messages,
        reconnects,
    }
}

async fn next<T>(receiver: &mut UnboundedReceiver<T>) -> T {
    tokio::time::timeout(DEADLINE, receiver.recv())
        .await
        .expect("nothing arrived before the deadline")
        .expect("the sender is gone")
}

/// Polls `condition` until it holds; fails the test at the deadline.
async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(DEADLINE, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}

async fn backends(admin: &Client, application_name: &str) -> Vec<i32> {
    admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

async fn raw_notify(client: &Client, channel: &str, payload: &str) {
    client
        .execute("SELECT pg_notify($1, $2)", &[&channel, &payload])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_message_published_in_a_transaction_arrives_at_commit_and_not_before() {
    let channel = channel();
    let mut sub = subscribe(&channel, &database_url()).await;
    let (mut writer, _w) = connect().await;
    let (other, _o) = connect().await;

    let tx = writer.transaction().await.unwrap();
    channel.publish_in_tx(&tx, &hint("in-tx")).await.unwrap();
    // Postgres delivers in commit order: once the sentinel, committed after
    // the in-tx publish, has arrived, the in-tx message would have too.
    channel.publish(&other, &hint("sentinel")).await.unwrap();
    assert_eq!(
        next(&mut sub.messages).await,
        hint("sentinel"),
        "the message arrived before COMMIT"
    );

    tx.commit().await.unwrap();
    assert_eq!(next(&mut sub.messages).await, hint("in-tx"));
    assert_eq!(sub.subscription.stats().received, 2);
}

#[tokio::test]
async fn a_message_published_in_a_rolled_back_transaction_is_never_delivered() {
    let channel = channel();
    let mut sub = subscribe(&channel, &database_url()).await;
    let (mut writer, _w) = connect().await;
    let (other, _o) = connect().await;

    let tx = writer.transaction().await.unwrap();
    channel
        .publish_in_tx(&tx, &hint("rolled-back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    channel.publish(&other, &hint("sentinel")).await.unwrap();
    assert_eq!(next(&mut sub.messages).await, hint("sentinel"));
    channel.publish(&other, &hint("after")).await.unwrap();
    assert_eq!(next(&mut sub.messages).await, hint("after"));
    assert_eq!(sub.subscription.stats().received, 2);
}

#[tokio::test]
async fn after_its_backend_is_terminated_the_subscription_reconnects_and_says_so() {
    let channel = channel();
    let application_name = unique_name();
    let mut sub = subscribe(&channel, &tagged_url(&database_url(), &application_name)).await;
    let (admin, _a) = connect().await;

    let before = backends(&admin, &application_name).await;
    assert_eq!(before.len(), 1, "one dedicated connection");
    let terminated = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&before[0]])
        .await
        .unwrap();
    assert!(terminated.get::<_, bool>(0));

    next(&mut sub.reconnects).await;
    assert_eq!(sub.subscription.stats().reconnects, 1);
    let after = backends(&admin, &application_name).await;
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "a new backend");

    // on_reconnect runs once LISTEN is back, so this cannot fall in the gap.
    channel
        .publish(&admin, &hint("after-reconnect"))
        .await
        .unwrap();
    assert_eq!(next(&mut sub.messages).await, hint("after-reconnect"));
    assert!(sub.reconnects.try_recv().is_err(), "one reconnect only");
}

#[tokio::test]
async fn invalid_payloads_are_dropped_and_counted_and_the_next_valid_one_arrives() {
    let channel = channel();
    let mut sub = subscribe(&channel, &database_url()).await;
    let (admin, _a) = connect().await;
    let name = channel.name().as_str();

    raw_notify(&admin, name, "not json").await;
    raw_notify(&admin, name, r#"{"key": 5}"#).await; // fails the schema
    raw_notify(&admin, name, r#"{"key": ""}"#).await; // fails the schema
    raw_notify(&admin, name, "[1, 2]").await;
    channel.publish(&admin, &hint("valid")).await.unwrap();

    assert_eq!(next(&mut sub.messages).await, hint("valid"));
    let stats = sub.subscription.stats();
    assert_eq!(stats.received, 5);
    assert_eq!(stats.dropped, 4);
    assert_eq!(stats.handler_failures, 0);
}

#[tokio::test]
async fn publish_refuses_oversized_and_schema_failing_messages_without_touching_the_database() {
    let capped = channel().with_max_payload_bytes(64).unwrap();
    let mut sub = subscribe(&capped, &database_url()).await;
    let (mut writer, _w) = connect().await;
    let (other, _o) = connect().await;
    let long = hint(&"x".repeat(100));

    let tx = writer.transaction().await.unwrap();
    match capped.publish_in_tx(&tx, &hint("")).await {
        Err(BroadcastError::Message(MessageError::Schema(errors))) => {
            assert!(errors[0].contains("/key"), "{errors:?}");
        }
        other => panic!("expected a schema error, got {other:?}"),
    }
    assert!(matches!(
        capped.publish_in_tx(&tx, &long).await,
        Err(BroadcastError::Message(MessageError::TooLarge {
            size: 110,
            max: 64
        }))
    ));
    assert!(matches!(
        capped.publish(&other, &hint("")).await,
        Err(MessageError::Schema(_))
    ));
    assert!(matches!(
        capped.publish(&other, &long).await,
        Err(MessageError::TooLarge { size: 110, max: 64 })
    ));

    // Without a lowered cap, Postgres's own limit applies.
    let uncapped = channel();
    let huge = hint(&"x".repeat(8000));
    assert!(matches!(
        uncapped.publish(&other, &huge).await,
        Err(MessageError::TooLarge { max: 7999, .. })
    ));

    // Any statement that reached the server and failed would have aborted
    // the transaction; it is still usable, and nothing was sent.
    tx.query_one("SELECT 1", &[]).await.unwrap();
    capped.publish_in_tx(&tx, &hint("fine")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(next(&mut sub.messages).await, hint("fine"));
    assert_eq!(sub.subscription.stats().received, 1);
}

#[tokio::test]
async fn a_failing_or_panicking_handler_does_not_end_the_subscription() {
    let channel = channel();
    let (tx, mut messages) = unbounded_channel();
    let subscription = channel
        .on_message(move |hint: Hint| -> Result<(), String> {
            match hint.key.as_str() {
                "boom" => panic!("the handler blew up"),
                "fail" => Err("the handler said no".to_owned()),
                _ => {
                    tx.send(hint).unwrap();
                    Ok(())
                }
            }
        })
        .connect(&database_url())
        .await
        .unwrap();
    let (client, _c) = connect().await;

    for key in ["boom", "fail", "ok", "boom"] {
        channel.publish(&client, &hint(key)).await.unwrap();
    }
    assert_eq!(next(&mut messages).await, hint("ok"));
    channel.publish(&client, &hint("still-ok")).await.unwrap();
    assert_eq!(next(&mut messages).await, hint("still-ok"));

    let stats = subscription.stats();
    assert_eq!(stats.received, 5);
    assert_eq!(stats.handler_failures, 3);
    assert_eq!(stats.dropped, 0);
    assert!(!subscription.is_finished());
}

#[tokio::test]
async fn async_handlers_are_awaited_one_at_a_time_and_may_panic() {
    let channel = channel();
    let (tx, mut messages) = unbounded_channel();
    let subscription = channel
        .on_message_async(move |hint: Hint| {
            let tx = tx.clone();
            async move {
                match hint.key.as_str() {
                    "boom" => panic!("the async handler blew up"),
                    "slow" => tokio::time::sleep(Duration::from_millis(50)).await,
                    _ => {}
                }
                tx.send(hint)
            }
        })
        .connect(&database_url())
        .await
        .unwrap();
    let (client, _c) = connect().await;

    for key in ["slow", "boom", "fast"] {
        channel.publish(&client, &hint(key)).await.unwrap();
    }
    assert_eq!(next(&mut messages).await, hint("slow"));
    assert_eq!(next(&mut messages).await, hint("fast"));
    assert_eq!(subscription.stats().handler_failures, 1);
}

#[tokio::test]
async fn publish_swallows_database_errors_and_publish_in_tx_returns_them() {
    let channel = channel();

    // A client whose connection is gone.
    let (dead, driver) = connect().await;
    driver.abort();
    let _ = driver.await;
    assert!(dead.is_closed());
    assert!(channel.publish(&dead, &hint("lost")).await.is_ok());

    // A transaction whose connection is gone.
    let (mut client, driver) = connect().await;
    let tx = client.transaction().await.unwrap();
    driver.abort();
    let _ = driver.await;
    assert!(matches!(
        channel.publish_in_tx(&tx, &hint("x")).await,
        Err(BroadcastError::Database(_))
    ));
    drop(tx);

    // A transaction an earlier statement has aborted.
    let (mut client, _d) = connect().await;
    let tx = client.transaction().await.unwrap();
    assert!(tx.batch_execute("SELECT 1 / 0").await.is_err());
    match channel.publish_in_tx(&tx, &hint("x")).await {
        Err(BroadcastError::Database(error)) => {
            assert_eq!(error.code(), Some(&SqlState::IN_FAILED_SQL_TRANSACTION));
        }
        other => panic!("expected a database error, got {other:?}"),
    }
}

#[cfg(feature = "deadpool")]
#[tokio::test]
async fn deadpool_clients_and_transactions_take_their_paths() {
    let channel = channel();
    let mut sub = subscribe(&channel, &database_url()).await;
    let config: tokio_postgres::Config = database_url().parse().unwrap();
    let pool = deadpool_postgres::Pool::builder(deadpool_postgres::Manager::new(config, NoTls))
        .max_size(1)
        .build()
        .unwrap();

    let mut client = pool.get().await.unwrap();
    channel.publish(&client, &hint("pooled")).await.unwrap();
    let tx = client.transaction().await.unwrap();
    channel
        .publish_in_tx(&tx, &hint("pooled-tx"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(next(&mut sub.messages).await, hint("pooled"));
    assert_eq!(next(&mut sub.messages).await, hint("pooled-tx"));
}

#[tokio::test]
async fn a_first_connect_failure_is_returned() {
    let channel = channel();

    let refused = channel
        .on_message(|_: Hint| ())
        .connect("postgres://postgres@127.0.0.1:1/postgres")
        .await;
    assert!(
        matches!(refused, Err(SubscribeError::Connect(_))),
        "{refused:?}"
    );

    let invalid = channel
        .on_message(|_: Hint| ())
        .connect(&format!(
            "{}{}sslmode=bogus",
            database_url(),
            if database_url().contains('?') {
                '&'
            } else {
                '?'
            }
        ))
        .await;
    assert!(
        matches!(invalid, Err(SubscribeError::InvalidUrl(_))),
        "{invalid:?}"
    );

    let mut config: tokio_postgres::Config = database_url().parse().unwrap();
    config.dbname(unique_name());
    match channel
        .on_message(|_: Hint| ())
        .connect_with(config, NoTls)
        .await
    {
        Err(SubscribeError::Connect(error)) => {
            assert_eq!(error.code(), Some(&SqlState::INVALID_CATALOG_NAME));
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stream_of_payloads_feeds_the_same_pipeline() {
    let channel = channel();
    let (feed, payloads) = unbounded_channel::<String>();
    let stream = futures_util::stream::unfold(payloads, |mut payloads| async move {
        payloads.recv().await.map(|payload| (payload, payloads))
    });
    let (tx, mut messages) = unbounded_channel();
    let subscription = channel.subscribe_to_stream(stream, move |hint: Hint| tx.send(hint));

    feed.send("garbage".to_owned()).unwrap();
    feed.send(r#"{"key": ""}"#.to_owned()).unwrap();
    feed.send(channel.encode(&hint("embedded")).unwrap())
        .unwrap();
    assert_eq!(next(&mut messages).await, hint("embedded"));
    let stats = subscription.stats();
    assert_eq!((stats.received, stats.dropped), (3, 2));

    // The stream ending ends the subscription, and with it the handler.
    drop(feed);
    let ended = tokio::time::timeout(DEADLINE, messages.recv()).await;
    assert!(matches!(ended, Ok(None)), "the handler was not dropped");
    wait_until("the task has finished", || {
        let finished = subscription.is_finished();
        async move { finished }
    })
    .await;
}

#[tokio::test]
async fn stop_and_drop_close_the_dedicated_connection() {
    let channel = channel();
    let (admin, _a) = connect().await;

    for stop_by_dropping in [false, true] {
        let application_name = unique_name();
        let sub = subscribe(&channel, &tagged_url(&database_url(), &application_name)).await;
        assert_eq!(backends(&admin, &application_name).await.len(), 1);
        if stop_by_dropping {
            drop(sub);
        } else {
            sub.subscription.stop().await;
        }
        wait_until("the subscriber's backend is gone", || {
            let admin = &admin;
            let application_name = application_name.clone();
            async move { backends(admin, &application_name).await.is_empty() }
        })
        .await;
    }
}

#[tokio::test]
async fn an_idle_connection_is_health_checked_and_keeps_delivering() {
    let channel = channel();
    let application_name = unique_name();
    let (tx, mut messages) = unbounded_channel();
    let subscription = channel
        .on_message(move |hint: Hint| tx.send(hint))
        .health_check(Some(Duration::from_millis(50)))
        .connect(&tagged_url(&database_url(), &application_name))
        .await
        .unwrap();
    let (admin, _a) = connect().await;

    // pg_stat_activity shows each backend's latest statement.
    wait_until("the subscriber has been health-checked", || {
        let admin = &admin;
        let application_name = application_name.clone();
        async move {
            admin
                .query(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND query = 'SELECT 1'",
                    &[&application_name],
                )
                .await
                .unwrap()
                .len()
                == 1
        }
    })
    .await;

    channel
        .publish(&admin, &hint("still-listening"))
        .await
        .unwrap();
    assert_eq!(next(&mut messages).await, hint("still-listening"));
    assert_eq!(subscription.stats().reconnects, 0);
}
