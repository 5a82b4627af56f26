//! Forward mode: the relay asks the application who the caller is. For each
//! connection it sends `GET <url>` with the caller's `Authorization` and
//! `Cookie` headers and reads the subscriber from the JSON answer, caching
//! answers briefly so a burst of reconnects does not become a burst of
//! calls to the application.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use reqwest::header::{ACCEPT, AUTHORIZATION, COOKIE, HeaderValue};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    AuthConfigError, AuthError, Credentials, Grants, ResolvedSubscriber, SubscriberResolver,
    check_identity,
};

/// How many answers the cache holds at most; past it the oldest goes.
pub const CACHE_CAPACITY: usize = 10_000;

/// The largest answer body read from the application.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// `[auth]` with `mode = "forward"`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardConfig {
    /// The application's endpoint, `http://` or `https://`.
    pub url: String,
    /// The whole call (connect, answer, body) must finish within this.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// How long answers (resolutions and refusals) are reused; 0 disables
    /// the cache.
    #[serde(default = "default_cache_secs")]
    pub cache_secs: u64,
    /// `auth.query_param`: see [`AuthConfig::query_param`](super::AuthConfig::query_param).
    #[serde(default)]
    pub query_param: Option<String>,
}

fn default_timeout_ms() -> u64 {
    2000
}

fn default_cache_secs() -> u64 {
    5
}

/// The application's answer to a 200. Unknown fields are ignored, so the
/// application may send more than the relay needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Answer {
    subscriber_id: String,
    /// One scope key, or an array of them.
    scope_key: Value,
    #[serde(default)]
    grants: Option<Value>,
    #[serde(default)]
    expires_at: Option<DateTime<Utc>>,
    /// `false` keeps the subscriber out of presence member lists.
    #[serde(default)]
    presence: Option<Value>,
    #[serde(default)]
    presence_info: Option<Value>,
}

/// Resolves subscribers by asking the application.
pub struct ForwardResolver {
    client: reqwest::Client,
    url: Url,
    cache: Mutex<AnswerCache>,
}

impl ForwardResolver {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: &ForwardConfig) -> Result<Self, AuthConfigError> {
        const URL: &str = "auth.forward.url";
        if config.url.trim().is_empty() {
            return Err(AuthConfigError::Missing {
                setting: URL,
                context: "for mode = \"forward\"".into(),
            });
        }
        let url = Url::parse(&config.url)
            .map_err(|e| AuthConfigError::invalid(URL, format!("is not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(AuthConfigError::invalid(
                URL,
                format!("must be an http or https URL, not {}:", url.scheme()),
            ));
        }
        if config.timeout_ms == 0 {
            return Err(AuthConfigError::invalid(
                "auth.forward.timeout_ms",
                "must be at least 1",
            ));
        }
        let timeout = Duration::from_millis(config.timeout_ms);
        let client = reqwest::Client::builder()
            // A redirect would carry the caller's credentials elsewhere.
            .redirect(reqwest::redirect::Policy::none())
            // The application sits next to the relay; credentials must not
            // travel through a proxy picked up from the environment.
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| AuthConfigError::invalid(URL, format!("cannot build a client ({e})")))?;
        Ok(ForwardResolver {
            client,
            url,
            cache: Mutex::new(AnswerCache::new(
                Duration::from_secs(config.cache_secs),
                CACHE_CAPACITY,
            )),
        })
    }

    async fn resolve_uncached(&self, credentials: &Credentials) -> Outcome {
        let header = |value: &Option<String>| match value.as_deref() {
            None => Ok(None),
            Some(value) => HeaderValue::from_str(value).map(Some),
        };
        let (Ok(authorization), Ok(cookie)) = (
            header(&credentials.authorization),
            header(&credentials.cookie),
        ) else {
            return Outcome::Fail(AuthError::InvalidToken(
                "the credentials are not valid header values".into(),
            ));
        };
        let mut request = self
            .client
            .get(self.url.clone())
            .header(ACCEPT, "application/json");
        if let Some(authorization) = authorization {
            request = request.header(AUTHORIZATION, authorization);
        }
        if let Some(cookie) = cookie {
            request = request.header(COOKIE, cookie);
        }

        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return self.unavailable(format!("the call failed: {error}")),
        };
        match response.status() {
            StatusCode::OK => {}
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                tracing::debug!(status = %response.status(), "forward auth refused the caller");
                return Outcome::Refused;
            }
            status => return self.unavailable(format!("it answered {status}")),
        }
        let body = match read_bounded(response).await {
            Ok(body) => body,
            Err(reason) => return self.unavailable(reason),
        };
        let answer: Answer = match serde_json::from_slice(&body) {
            Ok(answer) => answer,
            Err(error) => return self.unavailable(format!("its answer is not usable: {error}")),
        };
        let (scope_key, more_scopes) =
            match check_identity(&answer.subscriber_id, Some(&answer.scope_key)) {
                Ok(scopes) => scopes,
                Err(reason) => {
                    return self.unavailable(format!("its answer is not usable: {reason}"));
                }
            };
        let presence = match crate::presence::PresenceClaims::from_claims(
            answer.presence.as_ref(),
            answer.presence_info.as_ref(),
        ) {
            Ok(presence) => presence,
            Err(reason) => return self.unavailable(format!("its answer is not usable: {reason}")),
        };
        let grants = Grants::parse_or_none(answer.grants.as_ref(), &answer.subscriber_id);
        Outcome::Resolved(ResolvedSubscriber {
            presence,
            subscriber: grants.into_subscriber(scope_key, answer.subscriber_id),
            more_scopes,
            expires_at: answer.expires_at,
        })
    }

    fn unavailable(&self, reason: String) -> Outcome {
        tracing::warn!(url = %self.url, %reason, "forward auth is unavailable");
        Outcome::Fail(AuthError::Unavailable(format!(
            "the forward-auth endpoint could not answer: {reason}"
        )))
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, AnswerCache> {
        // The cache holds no invariant a panic elsewhere could break.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SubscriberResolver for ForwardResolver {
    fn resolve<'a>(
        &'a self,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<ResolvedSubscriber, AuthError>> {
        Box::pin(async move {
            if credentials.is_empty() {
                return Err(AuthError::MissingCredentials);
            }
            let key = cache_key(credentials);
            let cached = self.cache().get(&key, Instant::now());
            let answer = match cached {
                Some(answer) => answer,
                None => match self.resolve_uncached(credentials).await {
                    Outcome::Resolved(resolved) => {
                        let answer = Cached::Resolved(resolved);
                        self.cache().insert(key, answer.clone(), Instant::now());
                        answer
                    }
                    Outcome::Refused => {
                        self.cache().insert(key, Cached::Refused, Instant::now());
                        Cached::Refused
                    }
                    Outcome::Fail(error) => return Err(error),
                },
            };
            match answer {
                Cached::Refused => Err(AuthError::Refused),
                Cached::Resolved(resolved) => match resolved.expires_at {
                    Some(expires_at) if expires_at <= Utc::now() => Err(AuthError::Expired),
                    _ => Ok(resolved),
                },
            }
        })
    }
}

/// The result of one call to the application. Failures are never cached:
/// the next connection should try again.
enum Outcome {
    Resolved(ResolvedSubscriber),
    Refused,
    Fail(AuthError),
}

/// A cacheable answer.
#[derive(Clone, Debug)]
enum Cached {
    Resolved(ResolvedSubscriber),
    Refused,
}

type CacheKey = [u8; 32];

/// SHA-256 of both header values, each with a presence flag and its length,
/// so no two different pairs share a key and the cache holds no credential.
fn cache_key(credentials: &Credentials) -> CacheKey {
    let mut hasher = Sha256::new();
    for value in [&credentials.authorization, &credentials.cookie] {
        match value {
            None => hasher.update([0]),
            Some(value) => {
                hasher.update([1]);
                hasher.update((value.len() as u64).to_le_bytes());
                hasher.update(value.as_bytes());
            }
        }
    }
    hasher.finalize().into()
}

/// Reads the body, refusing one larger than [`MAX_ANSWER_BYTES`].
async fn read_bounded(mut response: reqwest::Response) -> Result<Vec<u8>, String> {
    let too_large = || format!("its answer is larger than {MAX_ANSWER_BYTES} bytes");
    if response
        .content_length()
        .is_some_and(|len| len > MAX_ANSWER_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("reading its answer failed: {e}"))?
    {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A bounded map of recent answers. Every entry lives at most `ttl` (less
/// when the answer's `expiresAt` comes sooner); `order` lists insertions
/// oldest first, so expired and overflowing entries leave from its front.
struct AnswerCache {
    ttl: Duration,
    capacity: usize,
    entries: HashMap<CacheKey, Entry>,
    order: VecDeque<(CacheKey, Instant)>,
}

struct Entry {
    answer: Cached,
    inserted: Instant,
    deadline: Instant,
}

impl AnswerCache {
    fn new(ttl: Duration, capacity: usize) -> Self {
        AnswerCache {
            ttl,
            capacity,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn get(&mut self, key: &CacheKey, now: Instant) -> Option<Cached> {
        let entry = self.entries.get(key)?;
        if entry.deadline <= now {
            self.entries.remove(key);
            return None;
        }
        Some(entry.answer.clone())
    }

    fn insert(&mut self, key: CacheKey, answer: Cached, now: Instant) {
        if self.ttl.is_zero() || self.capacity == 0 {
            return;
        }
        let mut deadline = now + self.ttl;
        if let Cached::Resolved(ResolvedSubscriber {
            expires_at: Some(expires_at),
            ..
        }) = &answer
        {
            let left = (*expires_at - Utc::now()).to_std().unwrap_or_default();
            deadline = deadline.min(now + left);
        }
        // Drop what has outlived the longest possible lifetime, then make
        // room by dropping the oldest.
        while let Some(&(_, inserted)) = self.order.front() {
            if inserted + self.ttl > now && self.order.len() < self.capacity {
                break;
            }
            self.pop_oldest();
        }
        self.entries.insert(
            key,
            Entry {
                answer,
                inserted: now,
                deadline,
            },
        );
        self.order.push_back((key, now));
    }

    fn pop_oldest(&mut self) {
        if let Some((key, inserted)) = self.order.pop_front() {
            // The key may have been answered again since; keep the newer.
            if self
                .entries
                .get(&key)
                .is_some_and(|e| e.inserted == inserted)
            {
                self.entries.remove(&key);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use actix_web::dev::ServerHandle;
    use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
    use serde_json::json;

    /// What the test application saw: the number of calls and the
    /// credential headers of the last one.
    #[derive(Default)]
    struct Seen {
        calls: AtomicUsize,
        last: Mutex<Option<(Option<String>, Option<String>)>>,
    }

    /// A real HTTP application on 127.0.0.1, answering by path.
    struct TestApp {
        base: String,
        seen: Arc<Seen>,
        handle: ServerHandle,
    }

    impl TestApp {
        async fn start() -> TestApp {
            let seen = Arc::new(Seen::default());
            let data = web::Data::from(seen.clone());
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(data.clone())
                    .default_service(web::to(answer))
            })
            .workers(1)
            .disable_signals()
            .shutdown_timeout(0)
            .listen(listener)
            .unwrap()
            .run();
            let handle = server.handle();
            tokio::spawn(server);
            TestApp { base, seen, handle }
        }

        fn resolver(&self, path: &str, timeout_ms: u64, cache_secs: u64) -> ForwardResolver {
            ForwardResolver::new(&ForwardConfig {
                url: format!("{}{path}", self.base),
                timeout_ms,
                cache_secs,
                query_param: None,
            })
            .unwrap()
        }

        fn calls(&self) -> usize {
            self.seen.calls.load(Ordering::SeqCst)
        }

        fn last(&self) -> Option<(Option<String>, Option<String>)> {
            self.seen.last.lock().unwrap().clone()
        }

        async fn stop(self) {
            self.handle.stop(false).await;
        }
    }

    async fn answer(request: HttpRequest, seen: web::Data<Seen>) -> HttpResponse {
        seen.calls.fetch_add(1, Ordering::SeqCst);
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        *seen.last.lock().unwrap() = Some((header("authorization"), header("cookie")));
        let ok = |body: Value| HttpResponse::Ok().json(body);
        match request.path() {
            "/ok" => ok(json!({
                "subscriberId": "alice",
                "scopeKey": "org-1",
                "grants": {"orders": ["read"]},
                "expiresAt": "2999-01-01T00:00:00Z",
                "displayName": "Alice",
            })),
            "/no-grants" => ok(json!({"subscriberId": "bob", "scopeKey": "org-2"})),
            "/expired" => ok(json!({
                "subscriberId": "alice",
                "scopeKey": "org-1",
                "expiresAt": "2001-01-01T00:00:00Z",
            })),
            "/401" => HttpResponse::Unauthorized().finish(),
            "/403" => HttpResponse::Forbidden().finish(),
            "/500" => HttpResponse::InternalServerError().finish(),
            "/redirect" => HttpResponse::Found()
                .insert_header(("location", "/ok"))
                .finish(),
            "/not-json" => HttpResponse::Ok().body("welcome!"),
            "/empty-id" => ok(json!({"subscriberId": "", "scopeKey": "org-1"})),
            "/bad-scope" => ok(json!({"subscriberId": "alice", "scopeKey": ""})),
            "/huge" => ok(json!({
                "subscriberId": "alice",
                "scopeKey": "org-1",
                "padding": "x".repeat(MAX_ANSWER_BYTES),
            })),
            "/slow" => {
                actix_web::rt::time::sleep(Duration::from_secs(3)).await;
                ok(json!({"subscriberId": "alice", "scopeKey": "org-1"}))
            }
            _ => HttpResponse::NotFound().finish(),
        }
    }

    fn bearer(token: &str) -> Credentials {
        Credentials {
            authorization: Some(format!("Bearer {token}")),
            cookie: None,
        }
    }

    #[tokio::test]
    async fn passes_the_headers_and_resolves_on_200() {
        let app = TestApp::start().await;
        let resolver = app.resolver("/ok", 2000, 0);
        let credentials = Credentials {
            authorization: Some("Bearer abc".into()),
            cookie: Some("session=s1; theme=dark".into()),
        };
        let resolved = resolver.resolve(&credentials).await.unwrap();
        assert_eq!(
            app.last(),
            Some((
                Some("Bearer abc".into()),
                Some("session=s1; theme=dark".into())
            ))
        );
        assert_eq!(resolved.subscriber.subscriber_id, "alice");
        assert_eq!(resolved.subscriber.scope_key, "org-1");
        assert_eq!(
            resolved.expires_at,
            Some("2999-01-01T00:00:00Z".parse().unwrap())
        );
        let evaluator = resolved.subscriber.evaluator.unwrap();
        assert!(evaluator.can(&json!("orders:read")));
        assert!(!evaluator.can(&json!("orders:write")));

        // Only a cookie: only the cookie is passed.
        let cookie_only = Credentials {
            authorization: None,
            cookie: Some("session=s2".into()),
        };
        let resolved = app
            .resolver("/no-grants", 2000, 0)
            .resolve(&cookie_only)
            .await
            .unwrap();
        assert_eq!(app.last(), Some((None, Some("session=s2".into()))));
        assert_eq!(resolved.subscriber.subscriber_id, "bob");
        assert_eq!(resolved.expires_at, None);
        assert!(
            !resolved
                .subscriber
                .evaluator
                .unwrap()
                .can(&json!("orders:read"))
        );
        app.stop().await;
    }

    #[tokio::test]
    async fn refuses_on_401_and_403() {
        let app = TestApp::start().await;
        for path in ["/401", "/403"] {
            let error = app
                .resolver(path, 2000, 0)
                .resolve(&bearer("abc"))
                .await
                .unwrap_err();
            assert_eq!(error, AuthError::Refused, "{path}");
            assert!(error.is_client_error());
        }
        app.stop().await;
    }

    #[tokio::test]
    async fn unavailable_on_errors_redirects_and_bad_bodies() {
        let app = TestApp::start().await;
        for path in [
            "/500",
            "/404",
            "/redirect",
            "/not-json",
            "/empty-id",
            "/bad-scope",
            "/huge",
        ] {
            let error = app
                .resolver(path, 2000, 0)
                .resolve(&bearer("abc"))
                .await
                .unwrap_err();
            assert!(
                matches!(&error, AuthError::Unavailable(_)),
                "{path}: {error:?}"
            );
            assert!(!error.is_client_error());
        }
        // Seven calls: the redirect was not followed to /ok.
        assert_eq!(app.calls(), 7);
        app.stop().await;
    }

    #[tokio::test]
    async fn unavailable_on_timeout_and_connection_refused() {
        let app = TestApp::start().await;
        let started = Instant::now();
        let error = app
            .resolver("/slow", 200, 5)
            .resolve(&bearer("abc"))
            .await
            .unwrap_err();
        assert!(matches!(error, AuthError::Unavailable(_)), "{error:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        app.stop().await;

        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let resolver = ForwardResolver::new(&ForwardConfig {
            url: format!("http://127.0.0.1:{port}/auth"),
            timeout_ms: 2000,
            cache_secs: 5,
            query_param: None,
        })
        .unwrap();
        let error = resolver.resolve(&bearer("abc")).await.unwrap_err();
        assert!(matches!(error, AuthError::Unavailable(_)), "{error:?}");
    }

    #[tokio::test]
    async fn expired_answer_is_refused() {
        let app = TestApp::start().await;
        let resolver = app.resolver("/expired", 2000, 5);
        for _ in 0..2 {
            assert_eq!(
                resolver.resolve(&bearer("abc")).await.unwrap_err(),
                AuthError::Expired
            );
        }
        // Already expired: never cached.
        assert_eq!(app.calls(), 2);
        app.stop().await;
    }

    #[tokio::test]
    async fn missing_credentials_make_no_call() {
        let app = TestApp::start().await;
        let resolver = app.resolver("/ok", 2000, 5);
        for credentials in [
            Credentials::default(),
            Credentials {
                authorization: Some(" ".into()),
                cookie: Some(String::new()),
            },
        ] {
            assert_eq!(
                resolver.resolve(&credentials).await.unwrap_err(),
                AuthError::MissingCredentials
            );
        }
        assert_eq!(app.calls(), 0);
        app.stop().await;
    }

    #[tokio::test]
    async fn answers_are_cached_per_credentials_and_expire() {
        let app = TestApp::start().await;
        let resolver = app.resolver("/ok", 2000, 1);
        let started = Instant::now();
        let first = resolver.resolve(&bearer("abc")).await.unwrap();
        let second = resolver.resolve(&bearer("abc")).await.unwrap();
        assert_eq!(
            app.calls(),
            1,
            "the second identical request is served from the cache"
        );
        assert_eq!(
            second.subscriber.subscriber_id,
            first.subscriber.subscriber_id
        );
        assert!(
            second
                .subscriber
                .evaluator
                .unwrap()
                .can(&json!("orders:read"))
        );

        // Other credentials are another entry.
        resolver.resolve(&bearer("xyz")).await.unwrap();
        assert_eq!(app.calls(), 2);

        // After cache_secs the application is asked again.
        let deadline = started + Duration::from_secs(10);
        while app.calls() < 3 {
            assert!(Instant::now() < deadline, "the cache never expired");
            resolver.resolve(&bearer("abc")).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(started.elapsed() >= Duration::from_secs(1));
        app.stop().await;
    }

    #[tokio::test]
    async fn refusals_are_cached_and_failures_are_not() {
        let app = TestApp::start().await;
        let refusing = app.resolver("/401", 2000, 60);
        for _ in 0..3 {
            assert_eq!(
                refusing.resolve(&bearer("abc")).await.unwrap_err(),
                AuthError::Refused
            );
        }
        assert_eq!(app.calls(), 1);

        let failing = app.resolver("/500", 2000, 60);
        for _ in 0..3 {
            assert!(matches!(
                failing.resolve(&bearer("abc")).await,
                Err(AuthError::Unavailable(_))
            ));
        }
        assert_eq!(app.calls(), 4);
        app.stop().await;
    }

    #[test]
    fn cache_key_separates_the_two_headers() {
        let pair = |authorization: Option<&str>, cookie: Option<&str>| {
            cache_key(&Credentials {
                authorization: authorization.map(str::to_owned),
                cookie: cookie.map(str::to_owned),
            })
        };
        assert_ne!(pair(Some("a"), None), pair(None, Some("a")));
        assert_ne!(pair(Some("ab"), Some("c")), pair(Some("a"), Some("bc")));
        assert_ne!(pair(Some(""), None), pair(None, None));
        assert_eq!(pair(Some("a"), Some("b")), pair(Some("a"), Some("b")));
    }

    #[test]
    fn cache_is_bounded_and_evicts_the_oldest() {
        let mut cache = AnswerCache::new(Duration::from_secs(60), 3);
        let now = Instant::now();
        let key = |n: u8| [n; 32];
        for n in 0..5 {
            cache.insert(
                key(n),
                Cached::Refused,
                now + Duration::from_millis(n.into()),
            );
        }
        assert_eq!(cache.len(), 3);
        let later = now + Duration::from_secs(1);
        assert!(cache.get(&key(0), later).is_none());
        assert!(cache.get(&key(1), later).is_none());
        for n in 2..5 {
            assert!(cache.get(&key(n), later).is_some(), "{n}");
        }
        // Expired entries are dropped on lookup and before evicting.
        let expired = now + Duration::from_secs(61);
        assert!(cache.get(&key(4), expired).is_none());
        cache.insert(key(9), Cached::Refused, expired);
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn cache_entry_ends_when_the_answer_expires() {
        let mut cache = AnswerCache::new(Duration::from_secs(60), 10);
        let now = Instant::now();
        let resolved = |expires_in: i64| {
            Cached::Resolved(ResolvedSubscriber {
                presence: Default::default(),
                subscriber: eventrelay_wire::Subscriber::new("org-1", "alice"),
                more_scopes: Vec::new(),
                expires_at: Some(Utc::now() + chrono::Duration::seconds(expires_in)),
            })
        };
        cache.insert([1; 32], resolved(2), now);
        cache.insert([2; 32], resolved(3600), now);
        let in_ten = now + Duration::from_secs(10);
        assert!(cache.get(&[1; 32], in_ten).is_none());
        assert!(cache.get(&[2; 32], in_ten).is_some());
    }

    #[test]
    fn config_errors_name_the_setting() {
        let error = |url: &str, timeout_ms: u64| {
            ForwardResolver::new(&ForwardConfig {
                url: url.into(),
                timeout_ms,
                cache_secs: 5,
                query_param: None,
            })
            .err()
            .unwrap()
        };
        for (url, timeout_ms, setting, message) in [
            ("", 2000, "auth.forward.url", "is required"),
            ("not a url", 2000, "auth.forward.url", "is not a URL"),
            ("ftp://app/auth", 2000, "auth.forward.url", "http or https"),
            (
                "http://app/auth",
                0,
                "auth.forward.timeout_ms",
                "at least 1",
            ),
        ] {
            let error = error(url, timeout_ms);
            assert_eq!(error.setting(), setting);
            assert!(error.to_string().contains(message), "{error}");
        }
    }
}
