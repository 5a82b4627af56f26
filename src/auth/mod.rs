//! Subscriber authentication: turning the credentials on `GET /v1/events`
//! into a wire [`Subscriber`](eventrelay_wire::Subscriber) (scope, id and
//! permission evaluator).
//!
//! The seam is [`SubscriberResolver`]. The service builds one from
//! configuration with [`build_resolver`]: [`jwt`] verifies a bearer token
//! locally, [`forward`] asks the application over HTTP. Either way the
//! permission evaluator is the declarative rule in [`grants`]. An application
//! embedding the relay as a library implements [`SubscriberResolver`] itself
//! and may hand the wire subscriber any permission closure it likes.
//!
//! The resolver runs on every connection, and connections are capped in age,
//! so a revoked credential stops working at the next reconnect at the latest.

pub mod forward;
pub mod grants;
pub mod jwt;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde::Deserialize;

pub use forward::{ForwardConfig, ForwardResolver};
pub use grants::{Grants, GrantsError};
pub use jwt::{Algorithm, JwtConfig, JwtResolver, MintError, MintOptions, TokenSpec, mint_token};

/// A credentials header whose value is not visible ASCII (the header's
/// name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not visible ASCII")]
pub struct UnreadableHeader(pub String);

/// What the relay knows about the caller of `GET /v1/events`: the raw
/// `Authorization` and `Cookie` header values, if any.
///
/// `Debug` redacts both values so credentials never end up in logs.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    pub authorization: Option<String>,
    pub cookie: Option<String>,
}

impl Credentials {
    /// Reads the credentials from request headers. Several `Cookie` headers
    /// (HTTP/2 may split them) are joined with `"; "`; of several
    /// `Authorization` headers the first is used. A value that is not
    /// visible ASCII is refused rather than skipped, so a mangled header is
    /// reported as such instead of as missing credentials.
    pub fn from_headers(
        headers: &actix_web::http::header::HeaderMap,
    ) -> Result<Self, UnreadableHeader> {
        use actix_web::http::header::{AUTHORIZATION, COOKIE};

        fn text<'a>(
            name: &actix_web::http::header::HeaderName,
            value: &'a actix_web::http::header::HeaderValue,
        ) -> Result<&'a str, UnreadableHeader> {
            value
                .to_str()
                .map_err(|_| UnreadableHeader(name.as_str().to_owned()))
        }
        let authorization = headers
            .get(AUTHORIZATION)
            .map(|value| text(&AUTHORIZATION, value).map(str::to_owned))
            .transpose()?;
        let cookies = headers
            .get_all(COOKIE)
            .map(|value| text(&COOKIE, value))
            .collect::<Result<Vec<&str>, _>>()?;
        let cookie = (!cookies.is_empty()).then(|| cookies.join("; "));
        Ok(Credentials {
            authorization,
            cookie,
        })
    }

    /// The token of an `Authorization: Bearer <token>` header (the scheme is
    /// case-insensitive).
    pub fn bearer_token(&self) -> Result<&str, AuthError> {
        let header = self
            .authorization
            .as_deref()
            .map(str::trim)
            .filter(|header| !header.is_empty())
            .ok_or(AuthError::MissingCredentials)?;
        let (scheme, token) = header.split_once(' ').unwrap_or((header, ""));
        let token = token.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Err(AuthError::InvalidToken(
                "the Authorization header must be `Bearer <token>`".into(),
            ));
        }
        Ok(token)
    }

    /// Takes a bearer token from the query parameter `name` (the
    /// `auth.query_param` setting) when no `Authorization` header was sent,
    /// for clients that cannot set headers, such as the browser's native
    /// `EventSource`. The header wins when both are present. The token is
    /// then resolved exactly like `Authorization: Bearer <token>` (forward
    /// auth receives it as that header, never in a URL).
    pub fn or_query_token(mut self, query_string: &str, name: &str) -> Self {
        let header_sent = self
            .authorization
            .as_deref()
            .is_some_and(|value| !value.trim().is_empty());
        if header_sent {
            return self;
        }
        // A malformed query string is the handler's to refuse; here it just
        // carries no token.
        let token = actix_web::web::Query::<Vec<(String, String)>>::from_query(query_string)
            .ok()
            .and_then(|pairs| {
                pairs
                    .into_inner()
                    .into_iter()
                    .find(|(key, value)| key == name && !value.trim().is_empty())
            })
            .map(|(_, value)| value);
        if let Some(token) = token {
            self.authorization = Some(format!("Bearer {}", token.trim()));
        }
        self
    }

    /// True when neither header carries anything.
    pub fn is_empty(&self) -> bool {
        let blank = |value: &Option<String>| value.as_deref().is_none_or(|v| v.trim().is_empty());
        blank(&self.authorization) && blank(&self.cookie)
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |value: &Option<String>| value.as_ref().map(|_| "[redacted]");
        f.debug_struct("Credentials")
            .field("authorization", &shown(&self.authorization))
            .field("cookie", &shown(&self.cookie))
            .finish()
    }
}

/// A resolved subscriber: the wire subscriber (scope key, subscriber id,
/// permission evaluator) and when its credentials expire, so the session can
/// end the connection then rather than at its age cap.
#[derive(Clone, Debug)]
pub struct ResolvedSubscriber {
    /// Its first (or only) scope is `subscriber.scope_key`.
    pub subscriber: eventrelay_wire::Subscriber,
    /// The scopes its credentials grant beyond `subscriber.scope_key`, when
    /// they grant several (a scope claim that is an array), in their order.
    pub more_scopes: Vec<String>,
    pub expires_at: Option<DateTime<Utc>>,
    /// Its presence claims: hidden from member lists, and its `info`.
    pub presence: crate::presence::PresenceClaims,
}

/// Why a caller could not be resolved. Every variant but
/// [`AuthError::Unavailable`] is the caller's fault (401); `Unavailable` is
/// ours or the application's (503), so the client should retry, not log out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no credentials: send an `Authorization: Bearer <token>` header or a session cookie")]
    MissingCredentials,
    #[error("invalid credentials: {0}")]
    InvalidToken(String),
    #[error("the credentials have expired")]
    Expired,
    #[error("the application refused these credentials")]
    Refused,
    #[error("authentication is unavailable: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// True for the errors to answer with 401; false for
    /// [`AuthError::Unavailable`] (503).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, AuthError::Unavailable(_))
    }
}

/// Resolves the caller of `GET /v1/events` to a subscriber.
///
/// Service mode uses [`JwtResolver`] or [`ForwardResolver`]; an application
/// embedding the relay implements this itself, typically by validating its
/// own session and returning a subscriber whose evaluator is an arbitrary
/// closure over its own permission model.
pub trait SubscriberResolver: Send + Sync + 'static {
    fn resolve<'a>(
        &'a self,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<ResolvedSubscriber, AuthError>>;
}

/// The `[auth]` configuration table, chosen by its `mode` key.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum AuthConfig {
    /// Verify a bearer JWT locally.
    Jwt(JwtConfig),
    /// Ask the application over HTTP.
    Forward(ForwardConfig),
    /// Development mode, asked for by name: tokens are signed with a local
    /// throwaway secret and anyone who reaches the relay can mint one at
    /// `/inspector/token`. Without `[auth]` the relay runs so only on a
    /// loopback address or the embedded database.
    Development(DevelopmentConfig),
}

/// `auth.mode = "development"` takes no other setting.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevelopmentConfig {}

impl AuthConfig {
    /// `auth.query_param`: the query parameter that may carry a bearer token
    /// on `GET /v1/events`, or `None` (the default) when only headers count.
    /// Off by default because URLs end up in logs (proxies, browser
    /// history): the relay never logs it, and such tokens should be short
    /// lived.
    pub fn query_param(&self) -> Option<&str> {
        match self {
            AuthConfig::Jwt(config) => config.query_param.as_deref(),
            AuthConfig::Forward(config) => config.query_param.as_deref(),
            AuthConfig::Development(_) => None,
        }
    }
}

/// The stream's own query parameters, which a token parameter must not
/// shadow.
const STREAM_QUERY_PARAMS: [&str; 3] = ["lastEventId", "until", "scope"];

/// Checks `auth.query_param`: a plain parameter name that the stream does
/// not use itself.
fn check_query_param(name: Option<&str>) -> Result<(), AuthConfigError> {
    const SETTING: &str = "auth.query_param";
    let Some(name) = name else {
        return Ok(());
    };
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if name.is_empty() || name.len() > 64 || !plain {
        return Err(AuthConfigError::invalid(
            SETTING,
            "must be 1 to 64 letters, digits, `_`, `-` or `.`, such as \"access_token\"",
        ));
    }
    if STREAM_QUERY_PARAMS.contains(&name) {
        return Err(AuthConfigError::invalid(
            SETTING,
            format!("must not be {name:?}, which GET /v1/events reads itself"),
        ));
    }
    Ok(())
}

/// A configuration mistake found when building a resolver; each names the
/// setting at fault (e.g. `auth.jwt.secret`).
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("{setting} is required {context}")]
    Missing {
        setting: &'static str,
        context: String,
    },
    #[error("{setting} {problem}")]
    Invalid {
        setting: &'static str,
        problem: String,
    },
    #[error("{setting}: cannot read {}: {source}", .path.display())]
    Read {
        setting: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AuthConfigError {
    /// The setting at fault, such as `auth.jwt.secret`.
    pub fn setting(&self) -> &'static str {
        match self {
            AuthConfigError::Missing { setting, .. }
            | AuthConfigError::Invalid { setting, .. }
            | AuthConfigError::Read { setting, .. } => setting,
        }
    }

    fn invalid(setting: &'static str, problem: impl Into<String>) -> Self {
        AuthConfigError::Invalid {
            setting,
            problem: problem.into(),
        }
    }
}

/// Validates `config`, loads its keys and returns the resolver it describes.
pub fn build_resolver(config: &AuthConfig) -> Result<Arc<dyn SubscriberResolver>, AuthConfigError> {
    check_query_param(config.query_param())?;
    Ok(match config {
        AuthConfig::Jwt(config) => Arc::new(JwtResolver::new(config)?),
        AuthConfig::Forward(config) => Arc::new(ForwardResolver::new(config)?),
        AuthConfig::Development(_) => {
            return Err(AuthConfigError::invalid(
                "auth.mode",
                "development mode signs tokens with a local secret and has no resolver to build",
            ));
        }
    })
}

impl ResolvedSubscriber {
    /// Every scope the credentials grant, the first one first.
    pub fn granted_scopes(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.subscriber.scope_key.as_str())
            .chain(self.more_scopes.iter().map(String::as_str))
    }

    /// Whether the credentials grant `scope_key`.
    pub fn grants_scope(&self, scope_key: &str) -> bool {
        self.granted_scopes().any(|granted| granted == scope_key)
    }
}

/// The most scopes one set of credentials may grant.
pub const MAX_GRANTED_SCOPES: usize = 1_000;

/// Checks what both service-mode resolvers get from their source, so the two
/// modes accept exactly the same identities: a non-empty subscriber id, and
/// a scope that is one key or a non-empty array of keys. Returns the first
/// scope and the others (repeats dropped), or why it is unusable.
fn check_identity(
    subscriber_id: &str,
    scope: Option<&serde_json::Value>,
) -> Result<(String, Vec<String>), String> {
    use serde_json::Value;

    if subscriber_id.is_empty() {
        return Err("the subscriber id is empty".into());
    }
    let keys: Vec<&str> = match scope {
        Some(Value::String(key)) => vec![key],
        Some(Value::Array(keys)) if !keys.is_empty() && keys.len() <= MAX_GRANTED_SCOPES => keys
            .iter()
            .map(|key| {
                key.as_str()
                    .ok_or_else(|| "the scope array holds something else than strings".to_owned())
            })
            .collect::<Result<_, _>>()?,
        Some(Value::Array(keys)) if !keys.is_empty() => {
            return Err(format!(
                "the scope array holds {} keys; at most {MAX_GRANTED_SCOPES} are accepted",
                keys.len()
            ));
        }
        _ => {
            return Err("the scope must be a scope key or a non-empty array of scope keys".into());
        }
    };
    let mut scopes: Vec<String> = Vec::with_capacity(keys.len());
    for key in keys {
        eventrelay_wire::validate_scope_key(key)
            .map_err(|error| format!("the scope key is unusable: {error}"))?;
        if !scopes.iter().any(|seen| seen == key) {
            scopes.push(key.to_owned());
        }
    }
    let first = scopes.remove(0);
    Ok((first, scopes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventrelay_wire::Subscriber;
    use figment::Figment;
    use figment::providers::{Format, Toml};
    use serde_json::Value;

    #[test]
    fn bearer_token_parsing() {
        let with = |header: &str| Credentials {
            authorization: Some(header.into()),
            cookie: None,
        };
        assert_eq!(with("Bearer abc").bearer_token(), Ok("abc"));
        assert_eq!(with("bearer abc").bearer_token(), Ok("abc"));
        assert_eq!(with("BEARER   abc  ").bearer_token(), Ok("abc"));
        for bad in ["Basic abc", "Bearer", "Bearer   ", "abc", "Bearerabc"] {
            assert!(
                matches!(with(bad).bearer_token(), Err(AuthError::InvalidToken(_))),
                "{bad}"
            );
        }
        assert_eq!(
            Credentials::default().bearer_token(),
            Err(AuthError::MissingCredentials)
        );
        assert_eq!(
            with("  ").bearer_token(),
            Err(AuthError::MissingCredentials)
        );
    }

    #[test]
    fn credentials_from_headers_and_redacted_debug() {
        use actix_web::http::header::{AUTHORIZATION, COOKIE, HeaderMap, HeaderValue};

        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer t0ken"));
        headers.append(COOKIE, HeaderValue::from_static("a=1"));
        headers.append(COOKIE, HeaderValue::from_static("b=2"));
        let credentials = Credentials::from_headers(&headers).unwrap();
        assert_eq!(credentials.authorization.as_deref(), Some("Bearer t0ken"));
        assert_eq!(credentials.cookie.as_deref(), Some("a=1; b=2"));
        let debug = format!("{credentials:?}");
        assert!(
            !debug.contains("t0ken") && !debug.contains("a=1"),
            "{debug}"
        );

        assert!(
            Credentials::from_headers(&HeaderMap::new())
                .unwrap()
                .is_empty()
        );

        let mut mangled = HeaderMap::new();
        mangled.insert(COOKIE, HeaderValue::from_bytes(b"a=\xff").unwrap());
        assert_eq!(
            Credentials::from_headers(&mangled).unwrap_err().to_string(),
            "cookie is not visible ASCII"
        );
    }

    #[test]
    fn errors_map_to_401_or_503() {
        for error in [
            AuthError::MissingCredentials,
            AuthError::InvalidToken("x".into()),
            AuthError::Expired,
            AuthError::Refused,
        ] {
            assert!(error.is_client_error());
        }
        let unavailable = AuthError::Unavailable("down".into());
        assert!(!unavailable.is_client_error());
    }

    /// Library mode: the application implements the seam with its own
    /// permission closure, and the resolver is used through the trait object.
    #[tokio::test]
    async fn library_mode_resolver_with_its_own_closure() {
        struct AppSessions;
        impl SubscriberResolver for AppSessions {
            fn resolve<'a>(
                &'a self,
                credentials: &'a Credentials,
            ) -> BoxFuture<'a, Result<ResolvedSubscriber, AuthError>> {
                Box::pin(async move {
                    if credentials.cookie.as_deref() != Some("session=alice") {
                        return Err(AuthError::Refused);
                    }
                    let subscriber = Subscriber::new("org-1", "alice")
                        .with_evaluator(|permission: &Value| permission == "admin");
                    Ok(ResolvedSubscriber {
                        subscriber,
                        more_scopes: Vec::new(),
                        expires_at: None,
                        presence: Default::default(),
                    })
                })
            }
        }

        let resolver: Arc<dyn SubscriberResolver> = Arc::new(AppSessions);
        let alice = Credentials {
            authorization: None,
            cookie: Some("session=alice".into()),
        };
        let resolved = resolver.resolve(&alice).await.unwrap();
        let evaluator = resolved.subscriber.evaluator.unwrap();
        assert!(evaluator.can(&Value::from("admin")));
        assert!(!evaluator.can(&Value::from("orders:read")));
        assert_eq!(
            resolver.resolve(&Credentials::default()).await.unwrap_err(),
            AuthError::Refused
        );
    }

    fn auth_from_toml(toml: &str) -> Result<AuthConfig, String> {
        Figment::from(Toml::string(toml))
            .extract_inner("auth")
            .map_err(|e| e.to_string())
    }

    #[test]
    fn config_is_chosen_by_mode_and_fills_defaults() {
        let jwt = auth_from_toml(
            "[auth]\nmode = \"jwt\"\nalgorithm = \"HS256\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n",
        )
        .unwrap();
        let AuthConfig::Jwt(jwt) = jwt else {
            panic!("expected jwt mode")
        };
        assert_eq!(jwt.subscriber_claim, "sub");
        assert_eq!(jwt.scope_claim, "scope");
        assert_eq!(jwt.grants_claim, "grants");
        assert_eq!(jwt.leeway_secs, 30);

        let forward =
            auth_from_toml("[auth]\nmode = \"forward\"\nurl = \"http://app/auth\"\n").unwrap();
        assert_eq!(
            forward,
            AuthConfig::Forward(ForwardConfig {
                url: "http://app/auth".into(),
                timeout_ms: 2000,
                cache_secs: 5,
                query_param: None,
            })
        );

        assert_eq!(
            auth_from_toml("[auth]\nmode = \"development\"\n").unwrap(),
            AuthConfig::Development(DevelopmentConfig {})
        );
        assert!(auth_from_toml("[auth]\nmode = \"development\"\nsecret = \"x\"\n").is_err());
    }

    #[test]
    fn config_refuses_unknown_keys_and_modes() {
        assert!(auth_from_toml("[auth]\nmode = \"jwt\"\nsecrett = \"x\"\n").is_err());
        assert!(
            auth_from_toml("[auth]\nmode = \"forward\"\nurl = \"http://a\"\nttl = 3\n").is_err()
        );
        assert!(auth_from_toml("[auth]\nmode = \"basic\"\n").is_err());
        assert!(auth_from_toml("[auth]\nmode = \"jwt\"\nalgorithm = \"none\"\n").is_err());
    }

    /// Every `toml` block of docs/src/auth.md must parse, so the docs cannot
    /// drift from the configuration they describe.
    #[test]
    fn docs_toml_snippets_parse() {
        let docs = include_str!("../../docs/src/auth.md");
        let mut blocks = 0;
        for block in docs.split("```toml").skip(1) {
            let toml = block.split("```").next().unwrap();
            auth_from_toml(toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
            blocks += 1;
        }
        assert!(blocks >= 2, "docs/src/auth.md should show both modes");
    }

    #[test]
    fn build_resolver_names_the_setting() {
        let error = build_resolver(&AuthConfig::Jwt(JwtConfig::default()))
            .err()
            .unwrap();
        assert_eq!(error.setting(), "auth.jwt.secret");
        assert_eq!(error.to_string(), "auth.jwt.secret is required for HS256");

        let error = build_resolver(&AuthConfig::Forward(ForwardConfig {
            url: "ftp://app".into(),
            timeout_ms: 2000,
            cache_secs: 5,
            query_param: None,
        }))
        .err()
        .unwrap();
        assert_eq!(error.setting(), "auth.forward.url");
    }

    #[test]
    fn a_query_token_counts_only_without_an_authorization_header() {
        let none = Credentials::default();
        let taken = none
            .clone()
            .or_query_token("until=x&access_token=t0k", "access_token");
        assert_eq!(taken.authorization.as_deref(), Some("Bearer t0k"));
        assert_eq!(taken.bearer_token(), Ok("t0k"));
        // Percent-encoding is decoded; an empty value is no token.
        let encoded = none
            .clone()
            .or_query_token("access_token=a%2Bb%3D", "access_token");
        assert_eq!(encoded.authorization.as_deref(), Some("Bearer a+b="));
        assert!(
            none.clone()
                .or_query_token("access_token=", "access_token")
                .is_empty()
        );
        assert!(
            none.clone()
                .or_query_token("token=t0k", "access_token")
                .is_empty()
        );
        let header = Credentials {
            authorization: Some("Bearer from-header".into()),
            cookie: None,
        };
        assert_eq!(
            header
                .clone()
                .or_query_token("access_token=t0k", "access_token"),
            header
        );
        assert!(!format!("{taken:?}").contains("t0k"));
    }

    #[test]
    fn the_query_param_setting_is_checked() {
        let with = |name: &str| {
            build_resolver(&AuthConfig::Jwt(JwtConfig {
                secret: Some("0123456789abcdef0123456789abcdef".into()),
                query_param: Some(name.into()),
                ..JwtConfig::default()
            }))
        };
        assert!(with("access_token").is_ok());
        for bad in ["", "a b", "lastEventId", "until", "x&y", &"a".repeat(65)] {
            let error = with(bad).err().unwrap();
            assert_eq!(error.setting(), "auth.query_param", "{bad}");
        }
        let forward = auth_from_toml(
            "[auth]\nmode = \"forward\"\nurl = \"http://app/auth\"\nquery_param = \"access_token\"\n",
        )
        .unwrap();
        assert_eq!(forward.query_param(), Some("access_token"));
    }
}
