//! HTTPS served directly, for deployments without a proxy in front: the PEM
//! certificate and key of `[http.tls]`, loaded with rustls (ring), offered
//! with HTTP/2 next to HTTP/1.1 (ALPN, added by actix-web).
//!
//! The pair is read and checked at start, so a missing, unreadable or
//! mismatched pair stops the relay with an error naming the setting. After
//! that, [`ReloadingCertificate`] re-reads the files when they change (an
//! ACME renewal), so a new certificate is served without a restart. A
//! renewal caught half-written is not used: the previous pair keeps serving
//! until the files change again and load cleanly.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::config::TlsConfig;

/// How often, at most, a handshake looks at the files' modification times.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(2);

const CERT_SETTING: &str = "http.tls.cert_file";
const KEY_SETTING: &str = "http.tls.key_file";

/// Why the TLS pair cannot be used; each names the setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{setting}: cannot read {}: {source}", .path.display())]
    Read {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{CERT_SETTING}: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", .0.display())]
    NoCertificate(PathBuf),
    #[error("{KEY_SETTING}: {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", .0.display())]
    NoKey(PathBuf),
    #[error("{setting}: {} is not valid PEM: {reason}", .path.display())]
    Pem {
        setting: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{KEY_SETTING}: {} is not a usable private key: {reason}", .path.display())]
    Key { path: PathBuf, reason: String },
    #[error(
        "{KEY_SETTING}: {} does not belong to the certificate in {CERT_SETTING} ({})",
        .key.display(), .cert.display()
    )]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("http.tls.cert_file and http.tls.key_file are both required")]
    Incomplete,
    #[error("http.tls: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The rustls server configuration for `tls`, or why the pair is unusable.
/// `tls` must be enabled (both files set).
pub fn server_config(tls: &TlsConfig) -> Result<rustls::ServerConfig, TlsError> {
    let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) else {
        return Err(TlsError::Incomplete);
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = ReloadingCertificate::load(cert, key, Arc::clone(&provider))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    Ok(config)
}

/// What identifies one version of the files: modification time and size of
/// each. A renewal replaces at least one of them.
type Stamp = [Option<(SystemTime, u64)>; 2];

/// Serves the certificate of two files and re-reads them when they change,
/// checking at most every [`CHECK_INTERVAL`], during a handshake.
pub struct ReloadingCertificate {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    state: Mutex<State>,
}

struct State {
    current: Arc<CertifiedKey>,
    /// The files as they were when `current` was read.
    loaded: Stamp,
    /// Files that failed to load, so they are not retried (and logged)
    /// until they change again.
    failed: Option<Stamp>,
    checked_at: Instant,
}

impl fmt::Debug for ReloadingCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReloadingCertificate")
            .field("cert_file", &self.cert_path)
            .field("key_file", &self.key_path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCertificate {
    /// Reads and checks the pair once; an error here stops the start.
    pub fn load(
        cert_path: &Path,
        key_path: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, TlsError> {
        let loaded = stamp(cert_path, key_path);
        let current = Arc::new(read_pair(cert_path, key_path, &provider)?);
        Ok(ReloadingCertificate {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            provider,
            state: Mutex::new(State {
                current,
                loaded,
                failed: None,
                checked_at: Instant::now(),
            }),
        })
    }

    /// The pair to serve now, re-read first when the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.checked_at.elapsed() >= CHECK_INTERVAL {
            state.checked_at = Instant::now();
            let now = stamp(&self.cert_path, &self.key_path);
            if now != state.loaded && state.failed != Some(now) {
                match read_pair(&self.cert_path, &self.key_path, &self.provider) {
                    Ok(pair) => {
                        tracing::info!(
                            cert_file = %self.cert_path.display(),
                            "TLS certificate re-read after the files changed"
                        );
                        state.current = Arc::new(pair);
                        state.loaded = now;
                        state.failed = None;
                    }
                    Err(error) => {
                        tracing::warn!(
                            %error,
                            "the TLS files changed but cannot be used; still serving the previous certificate"
                        );
                        state.failed = Some(now);
                    }
                }
            }
        }
        Arc::clone(&state.current)
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let of = |path: &Path| {
        let metadata = std::fs::metadata(path).ok()?;
        Some((metadata.modified().ok()?, metadata.len()))
    };
    [of(cert), of(key)]
}

fn read(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// Reads the chain and the key and checks that the key is the
/// certificate's.
fn read_pair(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let cert_pem = read(CERT_SETTING, cert_path)?;
    let key_pem = read(KEY_SETTING, key_path)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            setting: CERT_SETTING,
            path: cert_path.to_owned(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert_path.to_owned()));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey(key_path.to_owned()),
        other => TlsError::Pem {
            setting: KEY_SETTING,
            path: key_path.to_owned(),
            reason: other.to_string(),
        },
    })?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key {
            path: key_path.to_owned(),
            reason: e.to_string(),
        })?;
    let pair = CertifiedKey::new(chain, signing_key);
    match pair.keys_match() {
        Ok(()) => Ok(pair),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::Mismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            })
        }
        // ring knows the public key of every key type it loads; a
        // certificate it cannot parse is refused.
        Err(error) => Err(TlsError::Pem {
            setting: CERT_SETTING,
            path: cert_path.to_owned(),
            reason: format!("cannot check it against the key: {error}"),
        }),
    }
}
