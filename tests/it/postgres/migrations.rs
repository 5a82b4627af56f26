//! The migration runner against a real Postgres.

use crate::support::TestDb;
use eventrelay::store::{MIGRATIONS, MigrateError, migrate};

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
