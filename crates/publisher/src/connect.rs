//! Connecting to Postgres the way libpq does: one URL carries the server,
//! the credentials and the TLS settings, with libpq's meanings.
//!
//! tokio-postgres understands `sslmode=disable|prefer|require` and nothing
//! about certificates, so the TLS parameters are taken out of the URL here
//! and turned into a rustls configuration:
//!
//! | `sslmode` | encrypts | checks the chain | checks the host name |
//! |---|---|---|---|
//! | `disable` | no | – | – |
//! | `prefer` (default) | if the server offers it | no | no |
//! | `require` | yes | only with `sslrootcert` | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! `sslrootcert` is a PEM file or `system` (the platform's trust store);
//! `sslcert` and `sslkey` are a client certificate and its key. Every
//! connection eventrelay opens (the service's pool and LISTEN connection,
//! the command line, the publisher's broadcast subscriptions) goes through
//! [`PgConnectOptions`], so TLS and TCP keepalives are the same everywhere.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The TLS connector every eventrelay connection uses.
pub type PgTls = MakeRustlsConnect;

/// Why a connection could not be configured or opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("not a Postgres URL ({0}); expected postgres://user:password@host:port/database")]
    Url(#[source] tokio_postgres::Error),
    #[error("unknown sslmode {0:?}; use disable, prefer, require, verify-ca or verify-full")]
    UnknownSslMode(String),
    #[error("sslmode={0} needs sslrootcert (a PEM file of the CA, or `system`)")]
    RootCertRequired(&'static str),
    #[error("cannot read {setting} {path}: {source}")]
    Read {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{setting} {path} holds no usable PEM {what}")]
    Pem {
        setting: &'static str,
        path: PathBuf,
        what: &'static str,
    },
    #[error("sslcert and sslkey must be given together")]
    ClientCertHalf,
    #[error("the client certificate and key do not form a usable pair: {0}")]
    ClientCert(#[source] rustls::Error),
    #[error("cannot load the platform's trusted certificates: {0}")]
    SystemRoots(String),
    #[error("invalid TLS configuration: {0}")]
    Tls(#[source] rustls::Error),
    #[error("sslmode=require (or stricter) but the server does not offer TLS")]
    ServerWithoutTls(#[source] tokio_postgres::Error),
    #[error("the server's certificate did not verify: {}", describe(.0))]
    CertificateRejected(#[source] tokio_postgres::Error),
    #[error("cannot connect to Postgres: {}", describe(.0))]
    Connect(#[source] tokio_postgres::Error),
    #[error("no answer from Postgres within {0:?} while connecting")]
    Timeout(Duration),
}

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn parse(text: &str) -> Result<SslMode, ConnectError> {
        Ok(match text {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            // libpq's `allow` tries plain text first; nobody should want it.
            other => return Err(ConnectError::UnknownSslMode(other.to_owned())),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where trusted CA certificates come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    /// The platform's trust store (`sslrootcert=system`).
    System,
}

/// TCP settings that find a dead peer where no FIN or RST ever arrives
/// (a NAT or load balancer that dropped the flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSettings {
    /// Idle time before the first keepalive probe.
    pub keepalive_idle: Duration,
    /// How long sent data may stay unacknowledged before the kernel gives
    /// up on the connection (`TCP_USER_TIMEOUT`).
    pub user_timeout: Duration,
    /// How long opening a connection may take.
    pub connect_timeout: Duration,
}

impl Default for TcpSettings {
    fn default() -> Self {
        TcpSettings {
            keepalive_idle: Duration::from_secs(15),
            user_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// A parsed connection URL: tokio-postgres's settings plus the TLS ones
/// it does not know.
#[derive(Clone)]
pub struct PgConnectOptions {
    config: Config,
    ssl_mode: SslMode,
    root_cert: Option<RootCert>,
    client_cert: Option<(PathBuf, PathBuf)>,
}

impl fmt::Debug for PgConnectOptions {
    /// Never shows the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgConnectOptions")
            .field("host", &self.config.get_hosts())
            .field("port", &self.config.get_ports())
            .field("user", &self.config.get_user())
            .field("dbname", &self.config.get_dbname())
            .field("ssl_mode", &self.ssl_mode)
            .field("root_cert", &self.root_cert)
            .field("client_cert", &self.client_cert)
            .finish_non_exhaustive()
    }
}

/// The URL parameters taken out before tokio-postgres parses the rest.
const TLS_PARAMETERS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

impl PgConnectOptions {
    /// Parses a `postgres://` URL (or a `key=value` string) with libpq's
    /// TLS parameters. Files named are checked when the TLS configuration
    /// is built ([`PgConnectOptions::tls`]).
    pub fn parse(url: &str) -> Result<PgConnectOptions, ConnectError> {
        let (rest, tls) = split_tls_parameters(url);
        let mut config: Config = rest.parse().map_err(ConnectError::Url)?;
        let mut ssl_mode = SslMode::Prefer;
        let mut root_cert = None;
        let (mut cert, mut key) = (None, None);
        for (name, value) in tls {
            match name.as_str() {
                "sslmode" => ssl_mode = SslMode::parse(&value)?,
                "sslrootcert" if value == "system" => root_cert = Some(RootCert::System),
                "sslrootcert" => root_cert = Some(RootCert::File(PathBuf::from(value))),
                "sslcert" => cert = Some(PathBuf::from(value)),
                "sslkey" => key = Some(PathBuf::from(value)),
                _ => {}
            }
        }
        let client_cert = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(ConnectError::ClientCertHalf),
        };
        if matches!(ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
            return Err(ConnectError::RootCertRequired(ssl_mode.as_str()));
        }
        config.ssl_mode(match ssl_mode {
            SslMode::Disable => PgSslMode::Disable,
            SslMode::Prefer => PgSslMode::Prefer,
            _ => PgSslMode::Require,
        });
        Ok(PgConnectOptions {
            config,
            ssl_mode,
            root_cert,
            client_cert,
        })
    }

    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// `sslrootcert`, for a connection made by another client (the
    /// replication stream's).
    pub fn root_cert(&self) -> Option<&RootCert> {
        self.root_cert.as_ref()
    }

    /// `sslcert` and `sslkey`, when given.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.client_cert
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// tokio-postgres's part of the settings, to adjust (an application
    /// name, a timeout) before connecting.
    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// One set of settings per host the URL names (`host=a,b`,
    /// `postgres://a:5432,b:5433/db`), in order, each naming that host
    /// alone: for a client that cannot try several hosts itself (the
    /// replication stream's) to try them one by one, as libpq does.
    pub fn each_host(&self) -> Vec<PgConnectOptions> {
        let hosts = self.config.get_hosts();
        let ports = self.config.get_ports();
        if hosts.len() <= 1 {
            return vec![self.clone()];
        }
        (0..hosts.len())
            .map(|i| {
                let mut one = self.clone();
                one.config = single_host(&self.config, &hosts[i], port_of(ports, i));
                one
            })
            .collect()
    }

    /// Turns on TCP keepalives and sets the user timeout.
    pub fn with_tcp(mut self, tcp: TcpSettings) -> PgConnectOptions {
        self.config
            .keepalives(true)
            .keepalives_idle(tcp.keepalive_idle)
            .keepalives_interval(Duration::from_secs(5).min(tcp.keepalive_idle))
            .keepalives_retries(3)
            .tcp_user_timeout(tcp.user_timeout)
            .connect_timeout(tcp.connect_timeout);
        self
    }

    /// The rustls connector for these settings, reading every file named.
    pub fn tls(&self) -> Result<PgTls, ConnectError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = match &self.root_cert {
            None => None,
            Some(RootCert::File(path)) => Some(load_roots(path)?),
            Some(RootCert::System) => Some(system_roots()?),
        };
        let verifier: Arc<dyn ServerCertVerifier> = match (self.ssl_mode, roots) {
            // libpq: `require` with a root certificate behaves as `verify-ca`.
            (SslMode::VerifyCa | SslMode::Require, Some(roots)) => {
                Arc::new(IgnoreHostName(webpki_verifier(roots, &provider)?))
            }
            (SslMode::VerifyFull, Some(roots)) => webpki_verifier(roots, &provider)?,
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err(ConnectError::RootCertRequired(self.ssl_mode.as_str()));
            }
            (_, _) => Arc::new(EncryptOnly(Arc::clone(&provider))),
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ConnectError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.client_cert {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = load_certs("sslcert", cert)?;
                let key = load_key(key)?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(ConnectError::ClientCert)?
            }
        };
        Ok(MakeRustlsConnect::new(config))
    }

    /// Opens one connection and drives it on a spawned task. The connect
    /// timeout covers the whole start-up (TCP, TLS, authentication), not
    /// only the TCP handshake, since a path that swallows packets can stall
    /// any of them.
    pub async fn connect(&self) -> Result<Client, ConnectError> {
        let limit = self
            .config
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(30));
        let (client, connection) = tokio::time::timeout(limit, self.config.connect(self.tls()?))
            .await
            .map_err(|_| ConnectError::Timeout(limit))?
            .map_err(|e| self.explain(e))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::warn!(%error, "postgres connection closed with an error");
            }
        });
        Ok(client)
    }

    /// Names the two TLS failures a user can act on.
    pub fn explain(&self, error: tokio_postgres::Error) -> ConnectError {
        explain(error)
    }
}

/// libpq's rule: one port for every host, or one port per host.
fn port_of(ports: &[u16], i: usize) -> u16 {
    match ports {
        [] => 5432,
        [port] => *port,
        ports => ports.get(i).copied().unwrap_or(5432),
    }
}

/// `config` with `host` and `port` as its only server. tokio-postgres
/// cannot remove a host from a configuration, so the rest is copied over.
fn single_host(config: &Config, host: &tokio_postgres::config::Host, port: u16) -> Config {
    let mut one = Config::new();
    match host {
        tokio_postgres::config::Host::Tcp(name) => one.host(name),
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(dir) => one.host_path(dir),
    };
    one.port(port)
        .ssl_mode(config.get_ssl_mode())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle());
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one
}

/// The whole of a tokio-postgres error: its own text only says "db error"
/// or "error performing TLS handshake", the reason is further down.
pub fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return match db.detail() {
            Some(detail) => format!("{}: {} ({detail})", db.severity(), db.message()),
            None => format!("{}: {}", db.severity(), db.message()),
        };
    }
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Turns a connection error into [`ConnectError`], naming a server without
/// TLS and a certificate that did not verify.
pub fn explain(error: tokio_postgres::Error) -> ConnectError {
    let text = format!("{error:?}");
    if text.contains("server does not support TLS") || text.contains("TLS was required") {
        ConnectError::ServerWithoutTls(error)
    } else if text.contains("InvalidCertificate")
        || text.contains("UnknownIssuer")
        || text.contains("NotValidForName")
        || text.contains("invalid peer certificate")
    {
        ConnectError::CertificateRejected(error)
    } else {
        ConnectError::Connect(error)
    }
}

/// Splits `url` into the URL without the TLS parameters and those
/// parameters, for both the URL and the `key=value` forms.
fn split_tls_parameters(url: &str) -> (String, Vec<(String, String)>) {
    let mut tls = Vec::new();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_owned(), tls);
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if TLS_PARAMETERS.contains(&name) {
                tls.push((name.to_owned(), percent_decode(value)));
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (rest, tls)
    } else {
        let mut kept = Vec::new();
        for pair in url.split_whitespace() {
            match pair.split_once('=') {
                Some((name, value)) if TLS_PARAMETERS.contains(&name) => {
                    tls.push((name.to_owned(), value.trim_matches('\'').to_owned()))
                }
                _ => kept.push(pair),
            }
        }
        (kept.join(" "), tls)
    }
}

/// Decodes `%XX` escapes (paths in URLs may carry them).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(byte) = u8::from_str_radix(hex, 16) {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

fn load_certs(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ConnectError> {
    let pem = read(setting, path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|_| ConnectError::Pem {
            setting,
            path: path.to_owned(),
            what: "certificate",
        })?;
    if certs.is_empty() {
        return Err(ConnectError::Pem {
            setting,
            path: path.to_owned(),
            what: "certificate",
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, ConnectError> {
    let pem = read("sslkey", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|_| ConnectError::Pem {
        setting: "sslkey",
        path: path.to_owned(),
        what: "private key",
    })
}

fn load_roots(path: &Path) -> Result<RootCertStore, ConnectError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs("sslrootcert", path)? {
        roots.add(cert).map_err(|_| ConnectError::Pem {
            setting: "sslrootcert",
            path: path.to_owned(),
            what: "CA certificate",
        })?;
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, ConnectError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(ConnectError::SystemRoots(why));
    }
    Ok(roots)
}

fn webpki_verifier(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, ConnectError> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| ConnectError::Tls(rustls::Error::General(e.to_string())))
}

/// `verify-ca`: the chain must lead to a trusted root; the name in it is
/// not compared with the host connected to.
#[derive(Debug)]
struct IgnoreHostName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for IgnoreHostName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require` without a root certificate: encrypt, and accept
/// whatever certificate the server shows, as libpq does. The handshake's
/// signatures are still checked, so the session key is the server's.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_postgres::config::{Host, TargetSessionAttrs};

    #[test]
    fn each_host_keeps_every_other_setting() {
        let options = PgConnectOptions::parse(
            "postgres://app:pw@a:5432,b:5433/db?target_session_attrs=read-write\
             &application_name=x&connect_timeout=3&sslmode=require",
        )
        .unwrap();
        let hosts = options.each_host();
        assert_eq!(hosts.len(), 2);
        for (one, (host, port)) in hosts.iter().zip([("a", 5432), ("b", 5433)]) {
            let config = one.config();
            assert_eq!(config.get_hosts(), [Host::Tcp(host.into())]);
            assert_eq!(config.get_ports(), [port]);
            assert_eq!(config.get_user(), Some("app"));
            assert_eq!(config.get_password(), Some(&b"pw"[..]));
            assert_eq!(config.get_dbname(), Some("db"));
            assert_eq!(config.get_application_name(), Some("x"));
            assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(3)));
            assert_eq!(
                config.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite
            );
            assert_eq!(one.ssl_mode(), SslMode::Require);
        }
        let shared_port = PgConnectOptions::parse("host=a,b port=7 user=app").unwrap();
        let ports: Vec<u16> = shared_port
            .each_host()
            .iter()
            .map(|one| one.config().get_ports()[0])
            .collect();
        assert_eq!(ports, [7, 7]);
        let single = PgConnectOptions::parse("postgres://app@a/db").unwrap();
        assert_eq!(single.each_host().len(), 1);
    }

    #[test]
    fn tls_parameters_are_taken_out_of_both_url_forms() {
        let options = PgConnectOptions::parse(
            "postgres://app:pw@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=/ca%20dir/ca.pem",
        )
        .unwrap();
        assert_eq!(options.ssl_mode(), SslMode::VerifyFull);
        assert_eq!(
            options.root_cert,
            Some(RootCert::File(PathBuf::from("/ca dir/ca.pem")))
        );
        assert_eq!(options.config().get_application_name(), Some("x"));
        let options =
            PgConnectOptions::parse("host=db user=app sslmode=require sslrootcert=system").unwrap();
        assert_eq!(options.ssl_mode(), SslMode::Require);
        assert_eq!(options.root_cert, Some(RootCert::System));
        assert_eq!(
            PgConnectOptions::parse("postgres://db/app")
                .unwrap()
                .ssl_mode(),
            SslMode::Prefer,
            "libpq's default"
        );
        assert!(
            !format!(
                "{:?}",
                PgConnectOptions::parse("postgres://u:secret@db/app").unwrap()
            )
            .contains("secret")
        );
    }

    #[test]
    fn bad_tls_parameters_are_named() {
        let error = PgConnectOptions::parse("postgres://db/app?sslmode=maybe").unwrap_err();
        assert!(
            error.to_string().contains("unknown sslmode \"maybe\""),
            "{error}"
        );
        let error = PgConnectOptions::parse("postgres://db/app?sslmode=verify-full").unwrap_err();
        assert!(error.to_string().contains("sslrootcert"), "{error}");
        let error = PgConnectOptions::parse("postgres://db/app?sslcert=/a.pem").unwrap_err();
        assert!(error.to_string().contains("together"), "{error}");
        let error =
            PgConnectOptions::parse("postgres://db/app?sslmode=require&sslrootcert=/nope.pem")
                .unwrap()
                .tls()
                .err()
                .unwrap();
        assert!(
            error
                .to_string()
                .contains("cannot read sslrootcert /nope.pem"),
            "{error}"
        );
        let garbage = std::env::temp_dir().join(format!("garbage-{}.pem", std::process::id()));
        std::fs::write(&garbage, "not a certificate").unwrap();
        let error = PgConnectOptions::parse(&format!(
            "postgres://db/app?sslmode=verify-ca&sslrootcert={}",
            garbage.display()
        ))
        .unwrap()
        .tls()
        .err()
        .unwrap();
        assert!(error.to_string().contains("no usable PEM"), "{error}");
        std::fs::remove_file(garbage).ok();
    }
}
