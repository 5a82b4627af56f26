//! TLS to Postgres with libpq's `sslmode` meanings, against a throwaway
//! cluster that accepts only TLS, with certificates from a CA the test
//! makes.

use std::path::PathBuf;

use crate::support::TestDb;
use crate::support::certs::Ca;
use crate::support::cluster::Cluster;
use crate::support::server::{TestServer, token};
use eventrelay::publisher::{ConnectError, NewEvent, PgConnectOptions, Publisher};
use serde_json::json;

struct Setup {
    cluster: Cluster,
    ca: Ca,
    other_ca: Ca,
    dir: PathBuf,
}

impl Drop for Setup {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// A TLS-only cluster whose certificate names 127.0.0.1 and `db.test`.
fn setup() -> Setup {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tls-{}", uuid::Uuid::new_v4().simple()));
    let ca = Ca::new(&dir, "test-ca").expect("the openssl command is installed");
    let other_ca = Ca::new(&dir, "other-ca").unwrap();
    let (cert, key) = ca.issue("server", "IP:127.0.0.1,DNS:db.test");
    let cluster = Cluster::start_tls_only(&cert, &key)
        .expect("Postgres server binaries (initdb, pg_ctl) are installed");
    Setup {
        cluster,
        ca,
        other_ca,
        dir,
    }
}

fn url(setup: &Setup, host: &str, params: &str) -> String {
    format!(
        "postgres://postgres@{host}:{}/postgres?{params}",
        setup.cluster.port
    )
}

async fn encrypted(options: &PgConnectOptions) -> Result<bool, ConnectError> {
    let client = options.connect().await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    Ok(row.get(0))
}

#[tokio::test]
async fn each_sslmode_connects_or_refuses_as_libpq_does() {
    let setup = setup();
    let ca = setup.ca.cert.display().to_string();
    let other = setup.other_ca.cert.display().to_string();
    let connects = [
        url(&setup, "127.0.0.1", "sslmode=require"),
        url(&setup, "127.0.0.1", "sslmode=prefer"),
        url(
            &setup,
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        // verify-ca checks the chain, not the name.
        url(
            &setup,
            "localhost",
            &format!("sslmode=verify-ca&sslrootcert={ca}"),
        ),
    ];
    for url in connects {
        let options = PgConnectOptions::parse(&url).unwrap();
        assert!(
            encrypted(&options)
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}")),
            "{url}"
        );
    }
    let refused = [
        url(
            &setup,
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={other}"),
        ),
        url(
            &setup,
            "127.0.0.1",
            &format!("sslmode=verify-ca&sslrootcert={other}"),
        ),
        // The certificate does not name `localhost`.
        url(
            &setup,
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        // `require` with a root certificate verifies the chain, as in libpq.
        url(
            &setup,
            "127.0.0.1",
            &format!("sslmode=require&sslrootcert={other}"),
        ),
    ];
    for url in refused {
        let error = encrypted(&PgConnectOptions::parse(&url).unwrap())
            .await
            .expect_err(&url);
        assert!(
            matches!(error, ConnectError::CertificateRejected(_)),
            "{url}: {error:?}"
        );
        assert!(
            error.to_string().contains("certificate did not verify"),
            "{error}"
        );
    }
    // The cluster accepts no plain-text connection.
    let error =
        encrypted(&PgConnectOptions::parse(&url(&setup, "127.0.0.1", "sslmode=disable")).unwrap())
            .await
            .unwrap_err();
    assert!(error.to_string().contains("no encryption"), "{error}");
}

#[tokio::test]
async fn require_against_a_server_without_tls_fails_clearly() {
    let cluster = Cluster::start().expect("Postgres server binaries are installed");
    let options = PgConnectOptions::parse(&format!("{}?sslmode=require", cluster.url())).unwrap();
    let Err(error) = options.connect().await else {
        panic!("sslmode=require connected to a server without TLS");
    };
    assert!(
        matches!(error, ConnectError::ServerWithoutTls(_)),
        "{error:?}"
    );
    assert!(error.to_string().contains("does not offer TLS"), "{error}");
}

#[tokio::test]
async fn an_event_travels_emit_relay_sse_over_tls_on_every_connection() {
    let setup = setup();
    let base = url(
        &setup,
        "127.0.0.1",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            setup.ca.cert.display()
        ),
    );
    let db = TestDb::new_on(&base).await;
    let server = TestServer::start(&db, |c| c.database.migrate = true);
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let client = db.connect().await;
    let event = Publisher::new(db.schema.as_str())
        .unwrap()
        .emit(
            &client,
            NewEvent::durable("order.created", "org-1", json!({})),
        )
        .await
        .unwrap();
    assert_eq!(stream.next_event().await.json()["id"], event.id.to_string());
    let plain: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.backend_type = 'client backend' AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0, "every connection is encrypted");
}

#[test]
fn bad_tls_settings_are_refused_at_start_naming_the_setting() {
    let garbage = std::env::temp_dir().join(format!("not-a-cert-{}.pem", std::process::id()));
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let cases = [
        (
            "postgres://db/app?sslmode=sometimes",
            "database.url",
            "unknown sslmode",
        ),
        (
            "postgres://db/app?sslmode=verify-full&sslrootcert=/no/such/ca.pem",
            "database.url",
            "cannot read sslrootcert /no/such/ca.pem",
        ),
        (
            &format!(
                "postgres://db/app?sslmode=verify-ca&sslrootcert={}",
                garbage.display()
            ),
            "database.url",
            "no usable PEM",
        ),
    ];
    for (url, setting, why) in cases {
        let mut config = eventrelay::config::Config::default();
        config.database.url = Some(url.to_owned().into());
        let error = config.validate().unwrap_err().to_string();
        assert!(
            error.contains(setting) && error.contains(why),
            "{url}: {error}"
        );
    }
    let mut config = eventrelay::config::Config::default();
    config.database.listen_health_secs = 0;
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("database.listen_health_secs"), "{error}");
    std::fs::remove_file(garbage).ok();
}
