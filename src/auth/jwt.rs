//! JWT mode: the subscriber presents `Authorization: Bearer <jwt>` and the
//! relay verifies it locally against a pinned algorithm and a configured key
//! (an HMAC secret, a PEM public key, or a JWKS file), then reads the
//! subscriber id, scope key and grants from its claims. Also mints HMAC
//! tokens for development (`eventrelay token`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{AlgorithmFamily, DecodingKey, EncodingKey, Header, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{
    AuthConfigError, AuthError, Credentials, Grants, ResolvedSubscriber, SubscriberResolver,
    check_identity,
};

/// The signing algorithms a relay can be pinned to. `none` is not one of
/// them, so an unsigned token can never be accepted.
pub use jsonwebtoken::Algorithm;

/// The shortest HMAC secret accepted, in bytes: RFC 7518 §3.2 asks for a key
/// at least as long as the hash output, and 32 bytes is that for HS256.
pub const MIN_HMAC_SECRET_BYTES: usize = 32;

/// `[auth]` with `mode = "jwt"`.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// The one algorithm accepted; a token whose header names another is
    /// refused, which closes the algorithm-confusion attacks.
    pub algorithm: Algorithm,
    /// The shared secret, for HS256/HS384/HS512 (UTF-8 bytes, at least 32).
    pub secret: Option<crate::secret::Secret>,
    /// A PEM public key (RSA, EC or Ed25519, matching `algorithm`).
    pub public_key_file: Option<PathBuf>,
    /// A JWKS file; the token's `kid` picks the key.
    pub jwks_file: Option<PathBuf>,
    /// When set, the `iss` claim is required and must equal it.
    pub issuer: Option<String>,
    /// When set, the `aud` claim is required and must contain it.
    pub audience: Option<String>,
    /// The claim holding the subscriber id.
    pub subscriber_claim: String,
    /// The claim holding the scope key.
    pub scope_claim: String,
    /// The claim holding the grants.
    pub grants_claim: String,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
    /// `auth.query_param`: see [`AuthConfig::query_param`](super::AuthConfig::query_param).
    pub query_param: Option<String>,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            algorithm: Algorithm::HS256,
            secret: None,
            public_key_file: None,
            jwks_file: None,
            issuer: None,
            audience: None,
            subscriber_claim: "sub".into(),
            scope_claim: "scope".into(),
            grants_claim: "grants".into(),
            leeway_secs: 30,
            query_param: None,
        }
    }
}

/// Redacts the secret, so a config dump cannot leak it.
impl fmt::Debug for JwtConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtConfig")
            .field("algorithm", &self.algorithm)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("public_key_file", &self.public_key_file)
            .field("jwks_file", &self.jwks_file)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("subscriber_claim", &self.subscriber_claim)
            .field("scope_claim", &self.scope_claim)
            .field("grants_claim", &self.grants_claim)
            .field("leeway_secs", &self.leeway_secs)
            .field("query_param", &self.query_param)
            .finish()
    }
}

/// Verifies bearer JWTs; built once at startup, then shared by every
/// connection (keys are parsed once, never per request).
pub struct JwtResolver {
    algorithm: Algorithm,
    keys: Keys,
    validation: Validation,
    subscriber_claim: String,
    scope_claim: String,
    grants_claim: String,
}

enum Keys {
    One(DecodingKey),
    ByKid(HashMap<String, DecodingKey>),
}

impl JwtResolver {
    /// Validates `config` and loads its key material.
    pub fn new(config: &JwtConfig) -> Result<Self, AuthConfigError> {
        let algorithm = config.algorithm;
        let keys = load_keys(config)?;
        check_claim_names(config)?;

        let mut validation = Validation::new(algorithm);
        validation.leeway = config.leeway_secs;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(issuer) = &config.issuer {
            non_empty("auth.jwt.issuer", issuer)?;
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        match &config.audience {
            Some(audience) => {
                non_empty("auth.jwt.audience", audience)?;
                validation.set_audience(&[audience]);
                required.push("aud");
            }
            // Checked only when configured: without it, an `aud` claim is
            // not ours to judge.
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);

        Ok(JwtResolver {
            algorithm,
            keys,
            validation,
            subscriber_claim: config.subscriber_claim.clone(),
            scope_claim: config.scope_claim.clone(),
            grants_claim: config.grants_claim.clone(),
        })
    }

    /// Verifies one token and reads the subscriber from it.
    pub fn verify(&self, token: &str) -> Result<ResolvedSubscriber, AuthError> {
        let invalid = |reason: &str| AuthError::InvalidToken(reason.to_owned());
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| invalid("the token is malformed or its `alg` is not supported"))?;
        if header.alg != self.algorithm {
            return Err(AuthError::InvalidToken(format!(
                "the token is signed with {:?}; this relay accepts only {:?}",
                header.alg, self.algorithm
            )));
        }
        let key = match &self.keys {
            Keys::One(key) => key,
            Keys::ByKid(keys) => {
                let kid = header
                    .kid
                    .as_deref()
                    .ok_or_else(|| invalid("the token has no `kid` to pick a JWKS key"))?;
                keys.get(kid)
                    .ok_or_else(|| invalid("the token's `kid` is not in the JWKS"))?
            }
        };
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, key, &self.validation)
            .map_err(|error| token_error(error.into_kind()))?
            .claims;

        let subscriber_id = string_claim(&claims, &self.subscriber_claim)?;
        let (scope_key, more_scopes) = check_identity(subscriber_id, claims.get(&self.scope_claim))
            .map_err(|reason| {
                AuthError::InvalidToken(format!("the `{}` claim: {reason}", self.scope_claim))
            })?;
        let expires_at = claims
            .get("exp")
            .and_then(|exp| exp.as_i64().or_else(|| exp.as_f64().map(|f| f as i64)))
            .and_then(|secs| DateTime::<Utc>::from_timestamp(secs, 0))
            .ok_or_else(|| invalid("the `exp` claim is out of range"))?;
        let grants = Grants::parse_or_none(claims.get(&self.grants_claim), subscriber_id);
        let presence = crate::presence::PresenceClaims::from_claims(
            claims.get("presence"),
            claims.get("presence_info"),
        )
        .map_err(AuthError::InvalidToken)?;

        Ok(ResolvedSubscriber {
            presence,
            subscriber: grants.into_subscriber(scope_key, subscriber_id),
            more_scopes,
            expires_at: Some(expires_at),
        })
    }
}

impl SubscriberResolver for JwtResolver {
    fn resolve<'a>(
        &'a self,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<ResolvedSubscriber, AuthError>> {
        let result = credentials
            .bearer_token()
            .and_then(|token| self.verify(token));
        Box::pin(std::future::ready(result))
    }
}

/// Maps the library's verdict to ours; only expiry has its own variant,
/// because a client should refresh its token on it rather than give up.
fn token_error(kind: ErrorKind) -> AuthError {
    let reason = match kind {
        ErrorKind::ExpiredSignature => return AuthError::Expired,
        ErrorKind::ImmatureSignature => "the token is not valid yet (`nbf`)".to_owned(),
        ErrorKind::InvalidIssuer => "the token has the wrong issuer".to_owned(),
        ErrorKind::InvalidAudience => "the token has the wrong audience".to_owned(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".to_owned(),
        ErrorKind::InvalidAlgorithm => "the token's algorithm is not accepted".to_owned(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no `{claim}` claim"),
        ErrorKind::InvalidClaimFormat(claim) => format!("the token's `{claim}` claim is malformed"),
        _ => "the token is malformed".to_owned(),
    };
    AuthError::InvalidToken(reason)
}

fn string_claim<'c>(claims: &'c Map<String, Value>, name: &str) -> Result<&'c str, AuthError> {
    match claims.get(name) {
        Some(Value::String(value)) if !value.is_empty() => Ok(value),
        _ => Err(AuthError::InvalidToken(format!(
            "the `{name}` claim must be a non-empty string"
        ))),
    }
}

fn non_empty(setting: &'static str, value: &str) -> Result<(), AuthConfigError> {
    if value.is_empty() {
        return Err(AuthConfigError::invalid(setting, "must not be empty"));
    }
    Ok(())
}

fn check_claim_names(config: &JwtConfig) -> Result<(), AuthConfigError> {
    let names = [
        ("auth.jwt.subscriber_claim", &config.subscriber_claim),
        ("auth.jwt.scope_claim", &config.scope_claim),
        ("auth.jwt.grants_claim", &config.grants_claim),
    ];
    for (i, (setting, name)) in names.iter().enumerate() {
        non_empty(setting, name)?;
        if let Some((other, _)) = names[..i].iter().find(|(_, earlier)| earlier == name) {
            return Err(AuthConfigError::invalid(
                setting,
                format!("must differ from {other} (both are {name:?})"),
            ));
        }
    }
    Ok(())
}

fn load_keys(config: &JwtConfig) -> Result<Keys, AuthConfigError> {
    let algorithm = config.algorithm;
    let family = algorithm.family();
    if family == AlgorithmFamily::Hmac {
        for (setting, set) in [
            ("auth.jwt.public_key_file", config.public_key_file.is_some()),
            ("auth.jwt.jwks_file", config.jwks_file.is_some()),
        ] {
            if set {
                return Err(AuthConfigError::invalid(
                    setting,
                    format!("is for public-key algorithms, not {algorithm:?}; set auth.jwt.secret"),
                ));
            }
        }
        let secret = config
            .secret
            .as_deref()
            .ok_or_else(|| AuthConfigError::Missing {
                setting: "auth.jwt.secret",
                context: format!("for {algorithm:?}"),
            })?;
        check_secret(secret)
            .map_err(|problem| AuthConfigError::invalid("auth.jwt.secret", problem))?;
        let key = DecodingKey::from_secret(secret.as_bytes())
            .map_err(|e| AuthConfigError::invalid("auth.jwt.secret", e.to_string()))?;
        return Ok(Keys::One(key));
    }

    if config.secret.is_some() {
        return Err(AuthConfigError::invalid(
            "auth.jwt.secret",
            format!(
                "is for HS256/HS384/HS512, not {algorithm:?}; set auth.jwt.public_key_file or auth.jwt.jwks_file"
            ),
        ));
    }
    match (&config.public_key_file, &config.jwks_file) {
        (Some(path), None) => load_pem(path, algorithm).map(Keys::One),
        (None, Some(path)) => load_jwks(path, algorithm).map(Keys::ByKid),
        (Some(_), Some(_)) => Err(AuthConfigError::invalid(
            "auth.jwt.jwks_file",
            "cannot be combined with auth.jwt.public_key_file; set one",
        )),
        (None, None) => Err(AuthConfigError::Missing {
            setting: "auth.jwt.public_key_file",
            context: format!("(or auth.jwt.jwks_file) for {algorithm:?}"),
        }),
    }
}

fn check_secret(secret: &str) -> Result<(), String> {
    if secret.len() < MIN_HMAC_SECRET_BYTES {
        return Err(format!(
            "must be at least {MIN_HMAC_SECRET_BYTES} bytes (it has {})",
            secret.len()
        ));
    }
    Ok(())
}

fn load_pem(path: &Path, algorithm: Algorithm) -> Result<DecodingKey, AuthConfigError> {
    const SETTING: &str = "auth.jwt.public_key_file";
    let pem = std::fs::read(path).map_err(|source| AuthConfigError::Read {
        setting: SETTING,
        path: path.to_owned(),
        source,
    })?;
    let invalid = |problem: String| {
        AuthConfigError::invalid(SETTING, format!("{}: {problem}", path.display()))
    };
    // The library would take a private key's bytes and then fail every
    // verification; say so at startup instead.
    if String::from_utf8_lossy(&pem).contains("PRIVATE KEY-----") {
        return Err(invalid(
            "holds a private key; give the relay the public key only".into(),
        ));
    }
    let key = match algorithm.family() {
        AlgorithmFamily::Rsa => DecodingKey::from_rsa_pem(&pem),
        AlgorithmFamily::Ec => DecodingKey::from_ec_pem(&pem),
        AlgorithmFamily::Ed => DecodingKey::from_ed_pem(&pem),
        AlgorithmFamily::Hmac => unreachable!("HMAC keys are secrets, not files"),
    }
    .map_err(|e| invalid(format!("not a PEM public key for {algorithm:?} ({e})")))?;
    if let Some(expected) = ec_point_len(algorithm) {
        let len = key.try_get_as_bytes().map(<[u8]>::len).unwrap_or_default();
        if len != expected {
            return Err(invalid(format!(
                "is not a key on the curve {algorithm:?} uses"
            )));
        }
    }
    Ok(key)
}

/// The SEC1 uncompressed point length of the curve an ECDSA algorithm uses.
fn ec_point_len(algorithm: Algorithm) -> Option<usize> {
    match algorithm {
        Algorithm::ES256 => Some(65),
        Algorithm::ES384 => Some(97),
        _ => None,
    }
}

/// Loads every signing key of a JWKS usable with `algorithm`, by `kid`.
/// Keys for encryption, for another algorithm or curve, or without a `kid`
/// are skipped (a JWKS commonly mixes them); a file with none left, or with
/// one `kid` twice, is refused.
fn load_jwks(
    path: &Path,
    algorithm: Algorithm,
) -> Result<HashMap<String, DecodingKey>, AuthConfigError> {
    const SETTING: &str = "auth.jwt.jwks_file";
    let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
        setting: SETTING,
        path: path.to_owned(),
        source,
    })?;
    let invalid = |problem: String| {
        AuthConfigError::invalid(SETTING, format!("{}: {problem}", path.display()))
    };
    let set: JwkSet =
        serde_json::from_str(&text).map_err(|e| invalid(format!("is not a JWKS ({e})")))?;

    let mut keys = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = jwk.common.key_id.as_deref() else {
            continue;
        };
        let for_signing = !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption));
        let alg_matches = jwk
            .common
            .key_algorithm
            .is_none_or(|alg| alg == KeyAlgorithm::from(algorithm));
        let kind_matches = match (&jwk.algorithm, algorithm.family()) {
            (AlgorithmParameters::RSA(_), AlgorithmFamily::Rsa) => true,
            (AlgorithmParameters::EllipticCurve(ec), AlgorithmFamily::Ec) => matches!(
                (&ec.curve, algorithm),
                (EllipticCurve::P256, Algorithm::ES256) | (EllipticCurve::P384, Algorithm::ES384)
            ),
            (AlgorithmParameters::OctetKeyPair(okp), AlgorithmFamily::Ed) => {
                okp.curve == EllipticCurve::Ed25519
            }
            _ => false,
        };
        if !(for_signing && alg_matches && kind_matches) {
            continue;
        }
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| invalid(format!("key {kid:?} is unusable ({e})")))?;
        if keys.insert(kid.to_owned(), key).is_some() {
            return Err(invalid(format!("has two keys with kid {kid:?}")));
        }
    }
    if keys.is_empty() {
        return Err(invalid(format!(
            "has no signing key with a `kid` usable with {algorithm:?}"
        )));
    }
    Ok(keys)
}

/// What a development token says about its subscriber.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenSpec {
    pub subscriber_id: String,
    pub scope_key: String,
    /// More scopes to grant: with any, the scope claim is an array.
    pub more_scopes: Vec<String>,
    /// The grants object; `Value::Null` leaves the claim out.
    pub grants: Value,
    /// How long the token is valid from now.
    pub ttl: Duration,
}

/// Which claims a minted token uses; [`MintOptions::from_config`] matches a
/// relay's configuration so its tokens verify there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MintOptions {
    pub issuer: Option<String>,
    pub audience: Option<String>,
    pub subscriber_claim: String,
    pub scope_claim: String,
    pub grants_claim: String,
}

impl Default for MintOptions {
    fn default() -> Self {
        MintOptions::from_config(&JwtConfig::default())
    }
}

impl MintOptions {
    /// The claims a relay configured with `config` reads.
    pub fn from_config(config: &JwtConfig) -> Self {
        MintOptions {
            issuer: config.issuer.clone(),
            audience: config.audience.clone(),
            subscriber_claim: config.subscriber_claim.clone(),
            scope_claim: config.scope_claim.clone(),
            grants_claim: config.grants_claim.clone(),
        }
    }
}

/// Why a development token could not be minted.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("tokens can be minted only for HMAC algorithms (HS256/HS384/HS512), not {0:?}")]
    NotHmac(Algorithm),
    #[error("the secret {0}")]
    Secret(String),
    #[error("the subscriber id must not be empty")]
    EmptySubscriberId,
    #[error("invalid scope key: {0}")]
    ScopeKey(#[from] eventrelay_wire::EnvelopeError),
    #[error("invalid grants: {0}")]
    Grants(#[from] super::GrantsError),
    #[error("the time to live must be at least one second")]
    Ttl,
    #[error("cannot sign the token: {0}")]
    Sign(#[from] jsonwebtoken::errors::Error),
}

/// Mints an HMAC-signed token for development and tests, with `iat`, `exp`,
/// optional `iss`/`aud`, and the subscriber, scope and grants claims.
/// Refuses what the relay would refuse (short secret, empty id, bad scope
/// key, malformed grants), so a minted token always verifies.
pub fn mint_token(
    secret: &str,
    algorithm: Algorithm,
    spec: &TokenSpec,
    options: &MintOptions,
) -> Result<String, MintError> {
    if algorithm.family() != AlgorithmFamily::Hmac {
        return Err(MintError::NotHmac(algorithm));
    }
    check_secret(secret).map_err(MintError::Secret)?;
    if spec.subscriber_id.is_empty() {
        return Err(MintError::EmptySubscriberId);
    }
    eventrelay_wire::validate_scope_key(&spec.scope_key)?;
    for scope_key in &spec.more_scopes {
        eventrelay_wire::validate_scope_key(scope_key)?;
    }
    Grants::parse(Some(&spec.grants))?;
    if spec.ttl.as_secs() == 0 {
        return Err(MintError::Ttl);
    }

    let now = Utc::now().timestamp();
    let ttl = i64::try_from(spec.ttl.as_secs()).map_err(|_| MintError::Ttl)?;
    let mut claims = Map::new();
    claims.insert("iat".into(), now.into());
    claims.insert("exp".into(), now.saturating_add(ttl).into());
    if let Some(issuer) = &options.issuer {
        claims.insert("iss".into(), issuer.clone().into());
    }
    if let Some(audience) = &options.audience {
        claims.insert("aud".into(), audience.clone().into());
    }
    claims.insert(
        options.subscriber_claim.clone(),
        spec.subscriber_id.clone().into(),
    );
    let scope: Value = if spec.more_scopes.is_empty() {
        spec.scope_key.clone().into()
    } else {
        std::iter::once(&spec.scope_key)
            .chain(&spec.more_scopes)
            .cloned()
            .collect::<Vec<_>>()
            .into()
    };
    claims.insert(options.scope_claim.clone(), scope);
    if !spec.grants.is_null() {
        claims.insert(options.grants_claim.clone(), spec.grants.clone());
    }
    let key = EncodingKey::from_secret(secret.as_bytes())?;
    Ok(jsonwebtoken::encode(
        &Header::new(algorithm),
        &claims,
        &key,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &str = "test-secret-0123456789abcdef-0123456789";

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/auth")
            .join(name)
    }

    fn now() -> i64 {
        Utc::now().timestamp()
    }

    fn claims() -> Value {
        json!({
            "sub": "alice",
            "scope": "org-1",
            "grants": {"orders": ["read"]},
            "exp": now() + 600,
        })
    }

    fn hmac_config() -> JwtConfig {
        JwtConfig {
            secret: Some(SECRET.into()),
            ..JwtConfig::default()
        }
    }

    fn hmac(config: &JwtConfig) -> JwtResolver {
        JwtResolver::new(config).unwrap()
    }

    fn sign_hmac(algorithm: Algorithm, secret: &str, claims: &Value) -> String {
        let key = EncodingKey::from_secret(secret.as_bytes()).unwrap();
        jsonwebtoken::encode(&Header::new(algorithm), claims, &key).unwrap()
    }

    fn sign_pem(
        algorithm: Algorithm,
        private_key: &str,
        kid: Option<&str>,
        claims: &Value,
    ) -> String {
        let pem = std::fs::read(fixture(private_key)).unwrap();
        let key = match algorithm.family() {
            AlgorithmFamily::Rsa => EncodingKey::from_rsa_pem(&pem),
            AlgorithmFamily::Ec => EncodingKey::from_ec_pem(&pem),
            AlgorithmFamily::Ed => EncodingKey::from_ed_pem(&pem),
            AlgorithmFamily::Hmac => unreachable!(),
        }
        .unwrap();
        let mut header = Header::new(algorithm);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }

    fn pem_resolver(algorithm: Algorithm, public_key: &str) -> JwtResolver {
        JwtResolver::new(&JwtConfig {
            algorithm,
            public_key_file: Some(fixture(public_key)),
            ..JwtConfig::default()
        })
        .unwrap()
    }

    fn assert_invalid(result: Result<ResolvedSubscriber, AuthError>, contains: &str) {
        match result {
            Err(AuthError::InvalidToken(reason)) => {
                assert!(reason.contains(contains), "{reason:?} lacks {contains:?}")
            }
            other => panic!("expected InvalidToken({contains:?}), got {other:?}"),
        }
    }

    /// base64url without padding, written out here so the `alg: none` token
    /// is crafted by hand rather than by the library under test.
    fn b64url(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
            for i in 0..=chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn hmac_token_resolves_the_subscriber() {
        let exp = now() + 600;
        let mut claims = claims();
        claims["exp"] = exp.into();
        for algorithm in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            let resolver = hmac(&JwtConfig {
                algorithm,
                ..hmac_config()
            });
            let token = sign_hmac(algorithm, SECRET, &claims);
            let resolved = resolver.verify(&token).unwrap();
            assert_eq!(resolved.subscriber.subscriber_id, "alice");
            assert_eq!(resolved.subscriber.scope_key, "org-1");
            assert_eq!(resolved.expires_at.unwrap().timestamp(), exp);
            let evaluator = resolved.subscriber.evaluator.unwrap();
            assert!(evaluator.can(&json!("orders:read")));
            assert!(!evaluator.can(&json!("orders:write")));
        }
    }

    #[tokio::test]
    async fn resolves_through_the_authorization_header() {
        let resolver = hmac(&hmac_config());
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims());
        for scheme in ["Bearer", "bearer", "BEARER"] {
            let credentials = Credentials {
                authorization: Some(format!("{scheme} {token}")),
                cookie: None,
            };
            let resolved = resolver.resolve(&credentials).await.unwrap();
            assert_eq!(resolved.subscriber.subscriber_id, "alice");
        }
        assert_eq!(
            resolver.resolve(&Credentials::default()).await.unwrap_err(),
            AuthError::MissingCredentials
        );
        let basic = Credentials {
            authorization: Some(format!("Basic {token}")),
            cookie: None,
        };
        assert!(matches!(
            resolver.resolve(&basic).await,
            Err(AuthError::InvalidToken(_))
        ));
    }

    #[test]
    fn wrong_secret_is_refused() {
        let token = sign_hmac(
            Algorithm::HS256,
            "another-secret-0123456789abcdef-0123",
            &claims(),
        );
        assert_invalid(hmac(&hmac_config()).verify(&token), "signature");
    }

    #[test]
    fn tampered_claims_are_refused() {
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims());
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let mut forged = claims();
        forged["sub"] = "mallory".into();
        parts[1] = b64url(forged.to_string().as_bytes());
        assert_invalid(hmac(&hmac_config()).verify(&parts.join(".")), "signature");
    }

    #[test]
    fn expired_token_is_refused_beyond_the_leeway() {
        let resolver = hmac(&hmac_config());
        let mut claims = claims();
        claims["exp"] = (now() - 31).into();
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims);
        assert_eq!(resolver.verify(&token).unwrap_err(), AuthError::Expired);

        // Within the default 30 s leeway it still passes.
        claims["exp"] = (now() - 5).into();
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims);
        assert!(resolver.verify(&token).is_ok());

        let strict = hmac(&JwtConfig {
            leeway_secs: 0,
            ..hmac_config()
        });
        assert_eq!(strict.verify(&token).unwrap_err(), AuthError::Expired);
    }

    #[test]
    fn exp_is_required() {
        let mut claims = claims();
        claims.as_object_mut().unwrap().remove("exp");
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims);
        assert_invalid(hmac(&hmac_config()).verify(&token), "`exp`");
    }

    #[test]
    fn nbf_in_the_future_is_refused() {
        let resolver = hmac(&hmac_config());
        let mut claims = claims();
        claims["nbf"] = (now() + 120).into();
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims);
        assert_invalid(resolver.verify(&token), "nbf");

        claims["nbf"] = (now() - 1).into();
        let token = sign_hmac(Algorithm::HS256, SECRET, &claims);
        assert!(resolver.verify(&token).is_ok());
    }

    #[test]
    fn issuer_and_audience_are_checked_when_configured() {
        let resolver = hmac(&JwtConfig {
            issuer: Some("https://id.example".into()),
            audience: Some("eventrelay".into()),
            ..hmac_config()
        });
        let with = |iss: Option<&str>, aud: Option<Value>| {
            let mut claims = claims();
            if let Some(iss) = iss {
                claims["iss"] = iss.into();
            }
            if let Some(aud) = aud {
                claims["aud"] = aud;
            }
            resolver.verify(&sign_hmac(Algorithm::HS256, SECRET, &claims))
        };
        assert!(with(Some("https://id.example"), Some(json!("eventrelay"))).is_ok());
        assert!(
            with(
                Some("https://id.example"),
                Some(json!(["other", "eventrelay"]))
            )
            .is_ok()
        );
        assert_invalid(
            with(Some("https://evil.example"), Some(json!("eventrelay"))),
            "issuer",
        );
        assert_invalid(
            with(Some("https://id.example"), Some(json!("other"))),
            "audience",
        );
        assert_invalid(with(None, Some(json!("eventrelay"))), "`iss`");
        assert_invalid(with(Some("https://id.example"), None), "`aud`");

        // Unconfigured, neither is checked.
        let lax = hmac(&hmac_config());
        let mut claims = claims();
        claims["iss"] = "anyone".into();
        claims["aud"] = "anything".into();
        assert!(
            lax.verify(&sign_hmac(Algorithm::HS256, SECRET, &claims))
                .is_ok()
        );
    }

    #[test]
    fn alg_none_is_refused() {
        let resolver = hmac(&hmac_config());
        for alg in ["none", "None", "NONE"] {
            let header = b64url(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
            let payload = b64url(claims().to_string().as_bytes());
            for token in [
                format!("{header}.{payload}."),
                format!("{header}.{payload}"),
            ] {
                assert_invalid(resolver.verify(&token), "alg");
            }
        }
    }

    #[test]
    fn a_token_signed_with_another_algorithm_is_refused() {
        // Same secret, another HMAC algorithm.
        let token = sign_hmac(Algorithm::HS384, SECRET, &claims());
        assert_invalid(hmac(&hmac_config()).verify(&token), "accepts only HS256");

        // The classic confusion: the RSA public key used as an HMAC secret.
        let public_pem = std::fs::read_to_string(fixture("rsa-public.pem")).unwrap();
        let token = sign_hmac(Algorithm::HS256, &public_pem, &claims());
        assert_invalid(
            pem_resolver(Algorithm::RS256, "rsa-public.pem").verify(&token),
            "accepts only RS256",
        );

        // A real RS256 token offered to a PS256-pinned relay.
        let token = sign_pem(Algorithm::RS256, "rsa-private.pem", None, &claims());
        assert_invalid(
            pem_resolver(Algorithm::PS256, "rsa-public.pem").verify(&token),
            "accepts only PS256",
        );
    }

    #[test]
    fn rsa_ec_and_ed25519_public_keys_from_pem() {
        let cases = [
            (Algorithm::RS256, "rsa-private.pem", "rsa-public.pem"),
            (Algorithm::RS512, "rsa-private.pem", "rsa-public.pem"),
            (Algorithm::PS256, "rsa-private.pem", "rsa-public.pem"),
            (Algorithm::ES256, "ec256-private.pem", "ec256-public.pem"),
            (
                Algorithm::EdDSA,
                "ed25519-private.pem",
                "ed25519-public.pem",
            ),
        ];
        for (algorithm, private_key, public_key) in cases {
            let resolver = pem_resolver(algorithm, public_key);
            let token = sign_pem(algorithm, private_key, None, &claims());
            let resolved = resolver
                .verify(&token)
                .unwrap_or_else(|e| panic!("{algorithm:?}: {e}"));
            assert_eq!(resolved.subscriber.subscriber_id, "alice");
        }
        // Signed by another key of the same kind: refused.
        let token = sign_pem(Algorithm::ES256, "ec256-b-private.pem", None, &claims());
        assert_invalid(
            pem_resolver(Algorithm::ES256, "ec256-public.pem").verify(&token),
            "signature",
        );
    }

    #[test]
    fn jwks_selects_the_key_by_kid() {
        let resolver = JwtResolver::new(&JwtConfig {
            algorithm: Algorithm::ES256,
            jwks_file: Some(fixture("jwks.json")),
            ..JwtConfig::default()
        })
        .unwrap();
        for (kid, private_key) in [
            ("ec-a", "ec256-private.pem"),
            ("ec-b", "ec256-b-private.pem"),
        ] {
            let token = sign_pem(Algorithm::ES256, private_key, Some(kid), &claims());
            assert!(resolver.verify(&token).is_ok(), "{kid}");
        }
        // The right kid names a key that did not sign the token.
        let token = sign_pem(
            Algorithm::ES256,
            "ec256-b-private.pem",
            Some("ec-a"),
            &claims(),
        );
        assert_invalid(resolver.verify(&token), "signature");
        // Unknown kid, and no kid at all.
        let token = sign_pem(
            Algorithm::ES256,
            "ec256-private.pem",
            Some("ec-z"),
            &claims(),
        );
        assert_invalid(resolver.verify(&token), "not in the JWKS");
        let token = sign_pem(Algorithm::ES256, "ec256-private.pem", None, &claims());
        assert_invalid(resolver.verify(&token), "no `kid`");
    }

    #[test]
    fn subscriber_and_scope_claims_must_be_non_empty_strings() {
        let resolver = hmac(&hmac_config());
        for (claim, value) in [
            ("sub", None),
            ("sub", Some(json!(""))),
            ("sub", Some(json!(42))),
            ("sub", Some(json!(["alice"]))),
            ("scope", None),
            ("scope", Some(json!(""))),
            ("scope", Some(json!({"id": "org-1"}))),
            ("scope", Some(json!("org\u{7}1"))),
            ("scope", Some(json!("x".repeat(10_000)))),
        ] {
            let mut claims = claims();
            match value {
                Some(value) => claims[claim] = value,
                None => {
                    claims.as_object_mut().unwrap().remove(claim);
                }
            }
            let token = sign_hmac(Algorithm::HS256, SECRET, &claims);
            assert!(
                matches!(resolver.verify(&token), Err(AuthError::InvalidToken(_))),
                "{claim} = {:?}",
                claims.get(claim)
            );
        }
    }

    #[test]
    fn claim_names_are_configurable() {
        let resolver = hmac(&JwtConfig {
            subscriber_claim: "uid".into(),
            scope_claim: "tenant".into(),
            grants_claim: "https://example.com/grants".into(),
            ..hmac_config()
        });
        let claims = json!({
            "uid": "bob",
            "tenant": "org-2",
            "https://example.com/grants": {"reports": ["*"]},
            "exp": now() + 60,
        });
        let resolved = resolver
            .verify(&sign_hmac(Algorithm::HS256, SECRET, &claims))
            .unwrap();
        assert_eq!(resolved.subscriber.subscriber_id, "bob");
        assert_eq!(resolved.subscriber.scope_key, "org-2");
        assert!(
            resolved
                .subscriber
                .evaluator
                .unwrap()
                .can(&json!("reports:x"))
        );
    }

    #[test]
    fn malformed_or_missing_grants_mean_no_grants() {
        let resolver = hmac(&hmac_config());
        for grants in [
            None,
            Some(json!(["orders:read"])),
            Some(json!({"orders": "read"})),
        ] {
            let mut claims = claims();
            match grants {
                Some(grants) => claims["grants"] = grants,
                None => {
                    claims.as_object_mut().unwrap().remove("grants");
                }
            }
            let resolved = resolver
                .verify(&sign_hmac(Algorithm::HS256, SECRET, &claims))
                .unwrap();
            assert!(
                !resolved
                    .subscriber
                    .evaluator
                    .unwrap()
                    .can(&json!("orders:read"))
            );
        }
    }

    #[test]
    fn garbage_is_refused() {
        let resolver = hmac(&hmac_config());
        for token in [
            "",
            "abc",
            "a.b.c",
            "a.b",
            "....",
            "eyJhbGciOiJIUzI1NiJ9.e30.",
        ] {
            assert!(
                matches!(resolver.verify(token), Err(AuthError::InvalidToken(_))),
                "{token:?}"
            );
        }
    }

    #[test]
    fn config_errors_name_the_setting() {
        let error = |config: JwtConfig| JwtResolver::new(&config).err().unwrap();
        let cases = [
            (
                JwtConfig::default(),
                "auth.jwt.secret",
                "required for HS256",
            ),
            (
                JwtConfig {
                    secret: Some("short".into()),
                    ..JwtConfig::default()
                },
                "auth.jwt.secret",
                "at least 32 bytes",
            ),
            (
                JwtConfig {
                    public_key_file: Some(fixture("rsa-public.pem")),
                    ..hmac_config()
                },
                "auth.jwt.public_key_file",
                "public-key algorithms",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::RS256,
                    ..hmac_config()
                },
                "auth.jwt.secret",
                "not RS256",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::RS256,
                    ..JwtConfig::default()
                },
                "auth.jwt.public_key_file",
                "required (or auth.jwt.jwks_file) for RS256",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::ES256,
                    public_key_file: Some(fixture("ec256-public.pem")),
                    jwks_file: Some(fixture("jwks.json")),
                    ..JwtConfig::default()
                },
                "auth.jwt.jwks_file",
                "cannot be combined",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::RS256,
                    public_key_file: Some(fixture("does-not-exist.pem")),
                    ..JwtConfig::default()
                },
                "auth.jwt.public_key_file",
                "does-not-exist.pem",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::RS256,
                    public_key_file: Some(fixture("rsa-private.pem")),
                    ..JwtConfig::default()
                },
                "auth.jwt.public_key_file",
                "private key",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::RS256,
                    public_key_file: Some(fixture("ec256-public.pem")),
                    ..JwtConfig::default()
                },
                "auth.jwt.public_key_file",
                "not a PEM public key for RS256",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::ES384,
                    public_key_file: Some(fixture("ec256-public.pem")),
                    ..JwtConfig::default()
                },
                "auth.jwt.public_key_file",
                "curve",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::RS256,
                    jwks_file: Some(fixture("jwks.json")),
                    ..JwtConfig::default()
                },
                "auth.jwt.jwks_file",
                "no signing key",
            ),
            (
                JwtConfig {
                    algorithm: Algorithm::ES256,
                    jwks_file: Some(fixture("rsa-public.pem")),
                    ..JwtConfig::default()
                },
                "auth.jwt.jwks_file",
                "not a JWKS",
            ),
            (
                JwtConfig {
                    scope_claim: "sub".into(),
                    ..hmac_config()
                },
                "auth.jwt.scope_claim",
                "must differ from auth.jwt.subscriber_claim",
            ),
            (
                JwtConfig {
                    grants_claim: String::new(),
                    ..hmac_config()
                },
                "auth.jwt.grants_claim",
                "must not be empty",
            ),
            (
                JwtConfig {
                    issuer: Some(String::new()),
                    ..hmac_config()
                },
                "auth.jwt.issuer",
                "must not be empty",
            ),
        ];
        for (config, setting, message) in cases {
            let error = error(config);
            assert_eq!(error.setting(), setting, "{error}");
            let text = error.to_string();
            assert!(text.starts_with(setting), "{text}");
            assert!(text.contains(message), "{text:?} lacks {message:?}");
        }
    }

    #[test]
    fn debug_redacts_the_secret() {
        let debug = format!("{:?}", hmac_config());
        assert!(!debug.contains(SECRET), "{debug}");
    }

    #[test]
    fn minted_tokens_verify() {
        let config = JwtConfig {
            issuer: Some("eventrelay-dev".into()),
            audience: Some("eventrelay".into()),
            subscriber_claim: "uid".into(),
            ..hmac_config()
        };
        let spec = TokenSpec {
            subscriber_id: "alice".into(),
            scope_key: "org-1".into(),
            more_scopes: Vec::new(),
            grants: json!({"orders": ["read"]}),
            ttl: Duration::from_secs(300),
        };
        let token = mint_token(
            SECRET,
            config.algorithm,
            &spec,
            &MintOptions::from_config(&config),
        )
        .unwrap();
        let resolved = hmac(&config).verify(&token).unwrap();
        assert_eq!(resolved.subscriber.subscriber_id, "alice");
        let ttl = resolved.expires_at.unwrap() - Utc::now();
        assert!(ttl.num_seconds() > 290 && ttl.num_seconds() <= 300, "{ttl}");
        assert!(
            resolved
                .subscriber
                .evaluator
                .unwrap()
                .can(&json!("orders:read"))
        );

        // The default options match the default config.
        let spec = TokenSpec {
            grants: Value::Null,
            ..spec
        };
        let token = mint_token(SECRET, Algorithm::HS512, &spec, &MintOptions::default()).unwrap();
        let resolver = hmac(&JwtConfig {
            algorithm: Algorithm::HS512,
            ..hmac_config()
        });
        assert!(resolver.verify(&token).is_ok());
    }

    #[test]
    fn mint_refuses_what_the_relay_would_refuse() {
        let spec = TokenSpec {
            subscriber_id: "alice".into(),
            scope_key: "org-1".into(),
            more_scopes: Vec::new(),
            grants: json!({}),
            ttl: Duration::from_secs(60),
        };
        let options = MintOptions::default();
        let mint = |secret: &str, algorithm: Algorithm, spec: &TokenSpec| {
            mint_token(secret, algorithm, spec, &options)
        };
        assert!(matches!(
            mint(SECRET, Algorithm::RS256, &spec),
            Err(MintError::NotHmac(Algorithm::RS256))
        ));
        assert!(matches!(
            mint("short", Algorithm::HS256, &spec),
            Err(MintError::Secret(_))
        ));
        let bad = [
            TokenSpec {
                subscriber_id: String::new(),
                ..spec.clone()
            },
            TokenSpec {
                scope_key: String::new(),
                more_scopes: Vec::new(),
                ..spec.clone()
            },
            TokenSpec {
                grants: json!({"orders": "read"}),
                ..spec.clone()
            },
            TokenSpec {
                ttl: Duration::ZERO,
                ..spec.clone()
            },
        ];
        for spec in bad {
            assert!(mint(SECRET, Algorithm::HS256, &spec).is_err(), "{spec:?}");
        }
    }
}
