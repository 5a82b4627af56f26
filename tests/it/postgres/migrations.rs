//! The migration runner against a real Postgres.

use crate::support::TestDb;
use crate::support::process::eventrelay_command;
use eventrelay::store::{MIGRATIONS, MigrateError, check_schema, migrate};

#[tokio::test]
async fn running_twice_applies_nothing_the_second_time() {
    let db = TestDb::unmigrated();
    let mut client = db.connect().await;
    let first = migrate(&mut client, &db.schema, &db.channel).await.unwrap();
    assert_eq!(first.applied.len(), MIGRATIONS.len());
    assert_eq!(first.already_applied, 0);
    let second = migrate(&mut client, &db.schema, &db.channel).await.unwrap();
    assert!(second.applied.is_empty());
    assert_eq!(second.already_applied, MIGRATIONS.len());
}

#[tokio::test]
async fn two_processes_at_once_apply_each_migration_once() {
    let db = TestDb::unmigrated();
    let mut a = db.connect().await;
    let mut b = db.connect().await;
    let (ra, rb) = tokio::join!(
        migrate(&mut a, &db.schema, &db.channel),
        migrate(&mut b, &db.schema, &db.channel)
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.applied.len() + rb.applied.len(), MIGRATIONS.len());
    let recorded: i64 = a
        .query_one(
            &format!("SELECT count(*) FROM {}.schema_migrations", db.schema),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, MIGRATIONS.len() as i64);
}

#[tokio::test]
async fn a_database_from_a_newer_version_is_refused() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    client
        .execute(
            &format!(
                "INSERT INTO {}.schema_migrations (version, name, checksum) VALUES (9999, 'future', 'x')",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let error = migrate(&mut client, &db.schema, &db.channel)
        .await
        .unwrap_err();
    assert!(
        matches!(error, MigrateError::UnknownVersion { version: 9999, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("newer version"));
}

#[tokio::test]
async fn an_edited_migration_is_refused() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    client
        .execute(
            &format!(
                "UPDATE {}.schema_migrations SET checksum = 'edited' WHERE version = 1",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let error = migrate(&mut client, &db.schema, &db.channel)
        .await
        .unwrap_err();
    assert!(
        matches!(error, MigrateError::ChecksumMismatch { version: 1, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn the_channel_setting_follows_the_configuration() {
    let db = TestDb::new().await;
    let mut client = db.connect().await;
    let other = eventrelay::publisher::Identifier::new("another_channel").unwrap();
    migrate(&mut client, &db.schema, &other).await.unwrap();
    let channel: String = client
        .query_one(&format!("SELECT {}.notify_channel()", db.schema), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(channel, "another_channel");
}

/// The payload limits the outbox trigger works with are the ones the Rust
/// side plans carried rows and ephemeral events with.
#[tokio::test]
async fn the_schema_reads_the_same_payload_limits_as_the_wire_crate() {
    let db = TestDb::new().await;
    let row = db
        .connect()
        .await
        .query_one(
            &format!(
                "SELECT max_notify_payload, pointer_overhead FROM {}.settings",
                db.schema
            ),
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, i32>(0) as usize,
        eventrelay_wire::MAX_NOTIFY_PAYLOAD_BYTES
    );
    assert_eq!(
        row.get::<_, i32>(1) as usize,
        eventrelay_wire::carrying::POINTER_OVERHEAD
    );
}

/// A schema a development build made before the schema's first version is
/// refused by name, whether the relay migrates or not, and `migrate
/// --reset` makes it new.
#[tokio::test]
async fn a_schema_from_an_earlier_build_is_refused_until_reset() {
    let db = TestDb::unmigrated();
    let mut client = db.connect().await;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {schema};
             CREATE TABLE {schema}.schema_migrations (version integer PRIMARY KEY,
                 name text NOT NULL, checksum text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO {schema}.schema_migrations (version, name, checksum)
                 VALUES (1, 'outbox', 'old'), (2, 'webhooks', 'old');",
            schema = db.schema
        ))
        .await
        .unwrap();
    for error in [
        migrate(&mut client, &db.schema, &db.channel)
            .await
            .unwrap_err(),
        check_schema(&client, &db.schema).await.unwrap_err(),
    ] {
        assert!(
            matches!(error, MigrateError::EarlierBuild { version: 1, .. }),
            "{error}"
        );
        assert!(error.to_string().contains("migrate --reset"), "{error}");
    }

    let output = eventrelay_command()
        .args(["migrate", "--reset"])
        .args(["--database-url", &db.url])
        .args([
            "--schema",
            db.schema.as_str(),
            "--channel",
            db.channel.as_str(),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report = migrate(&mut client, &db.schema, &db.channel).await.unwrap();
    assert_eq!(report.already_applied, MIGRATIONS.len());
    assert!(report.applied.is_empty());
}
