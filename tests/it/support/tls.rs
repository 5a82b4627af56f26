//! HTTPS for tests: a certificate authority made in the test (rcgen) that
//! signs a leaf for 127.0.0.1, a relay serving it, and clients that trust
//! that CA only: reqwest's (HTTP/2 when offered) and a raw TLS stream.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use eventrelay::config::{Config, TlsConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::server::TestServer;
use super::{DEADLINE, TestDb, eventually};

/// A certificate authority that signs leaves for 127.0.0.1.
pub struct TestCa {
    certificate: rcgen::Certificate,
    key: KeyPair,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        TestCa { certificate, key }
    }

    /// A leaf for 127.0.0.1 and localhost: (certificate PEM, key PEM).
    pub fn leaf(&self) -> (String, String) {
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let key = KeyPair::generate().unwrap();
        let leaf = params
            .signed_by(&key, &self.certificate, &self.key)
            .unwrap();
        (leaf.pem(), key.serialize_pem())
    }

    /// A client that trusts this CA only; HTTP/2 when the server offers it.
    pub fn client(&self) -> reqwest::Client {
        self.client_builder().build().unwrap()
    }

    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(self.certificate.pem().as_bytes()).unwrap(),
            )
    }

    /// A TLS connection to `server` over a raw socket, trusting this CA
    /// only and offering the one application protocol `alpn` (`h2`,
    /// `http/1.1`), for requests no HTTP client would send.
    pub async fn connect_raw(&self, server: &TestServer, alpn: &[u8]) -> TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.certificate.pem().as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let address = server.base.trim_start_matches("http://");
        let tcp = TcpStream::connect(address).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let tls = tokio::time::timeout(
            DEADLINE,
            TlsConnector::from(Arc::new(config)).connect(name, tcp),
        )
        .await
        .expect("the TLS handshake ends before the deadline")
        .unwrap();
        assert_eq!(
            tls.get_ref().1.alpn_protocol(),
            Some(alpn),
            "the relay agreed to {}",
            String::from_utf8_lossy(alpn)
        );
        tls
    }
}

/// A folder for one test's files, removed at the end.
pub struct Folder(pub PathBuf);

impl Folder {
    pub fn new() -> Folder {
        let path =
            std::env::temp_dir().join(format!("eventrelay-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).unwrap();
        Folder(path)
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tls(cert: &Path, key: &Path) -> TlsConfig {
    TlsConfig {
        cert_file: Some(cert.to_owned()),
        key_file: Some(key.to_owned()),
    }
}

/// The relay's https:// base (TestServer announces it as http://).
pub fn https(server: &TestServer) -> String {
    server.base.replacen("http://", "https://", 1)
}

/// A relay serving TLS with a leaf of a fresh test CA; the CA (for clients)
/// and the folder holding the certificate live as long as the server.
pub fn tls_server(
    db: &TestDb,
    configure: impl FnOnce(&mut Config),
) -> (TestServer, TestCa, Folder) {
    let ca = TestCa::new("eventrelay test CA");
    let folder = Folder::new();
    let (cert, key) = ca.leaf();
    let (cert, key) = (
        folder.write("cert.pem", &cert),
        folder.write("key.pem", &key),
    );
    let server = TestServer::start(db, |config| {
        config.http.tls = tls(&cert, &key);
        configure(config);
    });
    (server, ca, folder)
}

/// Waits until the relay at `base` answers 200 on `/readyz` to `client`.
pub async fn wait_ready(client: &reqwest::Client, base: &str) {
    eventually("the relay becomes ready over TLS", async || {
        let response = client.get(format!("{base}/readyz")).send().await.ok()?;
        (response.status() == 200).then_some(())
    })
    .await;
}
