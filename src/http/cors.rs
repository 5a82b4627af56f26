//! Cross-origin access to `/v1/events` (CORS), for application pages
//! served from another origin than the relay.
//!
//! Owns the answer to preflight requests (the origin rules of
//! `http.allowed_origins` are a configuration value, in
//! [`crate::config::origins`]), and the CORS headers on the responses of
//! `/v1/events`. An origin that is not allowed gets no CORS header at all,
//! so the browser keeps the response from its page; a refused preflight is
//! a JSON error with a stable code, and nothing is served.

use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderMap, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, ResponseError, web};

use crate::api_error::{ApiError, ErrorCode};
use crate::config::HttpConfig;
pub use crate::config::origins::{OriginPatternError, OriginRules};
use crate::state::AppState;

/// Request headers a page may send on `GET /v1/events`: the credentials,
/// the replay watermark, and the cache directive some clients add.
pub const STREAM_HEADERS: [&str; 3] = ["authorization", "last-event-id", "cache-control"];

/// Request headers a page may send on `POST /v1/events` (when
/// `http.cors_publish` is on): the publish token and the JSON body's type.
pub const PUBLISH_HEADERS: [&str; 2] = ["authorization", "content-type"];

/// Response headers a page may read besides the CORS-safelisted ones: the
/// client honours `Retry-After` on 429 and 503.
const EXPOSED_HEADERS: &str = "retry-after, www-authenticate";

/// How long a browser may reuse a preflight answer, in seconds. Short, so a
/// changed `http.allowed_origins` takes effect soon.
const PREFLIGHT_MAX_AGE_SECS: u32 = 600;

/// The CORS behaviour of `/v1/events`, built once from `[http]`.
#[derive(Debug, Clone, Default)]
pub struct CorsPolicy {
    origins: OriginRules,
    credentials: bool,
    publish: bool,
}

/// What an allowed origin is told in `Access-Control-Allow-Origin`.
enum Grant {
    /// `*`: any origin, never with credentials.
    Any,
    /// The origin itself, with `Vary: Origin`.
    Origin(HeaderValue),
}

impl CorsPolicy {
    /// Builds the policy; the configuration was validated at load.
    pub fn new(http: &HttpConfig) -> Result<Self, OriginPatternError> {
        Ok(CorsPolicy {
            origins: OriginRules::parse(&http.allowed_origins, http.allow_credentials)?,
            credentials: http.allow_credentials,
            publish: http.cors_publish,
        })
    }

    /// True for `http.allowed_origins = ["*"]`, which start-up announces.
    pub fn allows_any_origin(&self) -> bool {
        self.origins.allows_any()
    }

    fn grant(&self, origin: Option<&HeaderValue>) -> Option<Grant> {
        let origin = origin?;
        let text = origin.to_str().ok()?;
        if !self.origins.allows(text) {
            return None;
        }
        Some(if self.origins.allows_any() {
            Grant::Any
        } else {
            Grant::Origin(origin.clone())
        })
    }

    /// The request headers a method may carry, or `None` when the method
    /// is not open to other origins.
    fn allowed_headers(&self, method: &str) -> Option<&'static [&'static str]> {
        match method {
            "GET" => Some(&STREAM_HEADERS),
            "POST" if self.publish => Some(&PUBLISH_HEADERS),
            _ => None,
        }
    }

    /// Answers a preflight: 204 with the CORS headers, or a refusal.
    fn preflight(
        &self,
        headers: &HeaderMap,
        method: &HeaderValue,
    ) -> Result<HttpResponse, ApiError> {
        let refused = |code, message: String| ApiError::new(StatusCode::FORBIDDEN, code, message);
        let origin = headers.get(header::ORIGIN);
        let grant = self.grant(origin).ok_or_else(|| {
            let shown = origin
                .and_then(|value| value.to_str().ok())
                .map(|value| value.chars().take(100).collect::<String>())
                .unwrap_or_default();
            refused(
                ErrorCode::OriginNotAllowed,
                format!("the origin {shown:?} is not in http.allowed_origins"),
            )
        })?;
        let method = method.to_str().unwrap_or_default();
        let allowed = self.allowed_headers(method).ok_or_else(|| {
            let open = if self.publish { "GET and POST" } else { "GET" };
            refused(
                ErrorCode::CorsMethodNotAllowed,
                format!(
                    "{:?} is not open to other origins on /v1/events; {open} are",
                    method.chars().take(20).collect::<String>()
                ),
            )
        })?;
        for requested in headers.get_all(header::ACCESS_CONTROL_REQUEST_HEADERS) {
            let requested = requested.to_str().unwrap_or("\u{0}");
            for name in requested
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
            {
                if !allowed.iter().any(|a| a.eq_ignore_ascii_case(name)) {
                    return Err(refused(
                        ErrorCode::CorsHeaderNotAllowed,
                        format!(
                            "the header {:?} may not be sent to {method} /v1/events from another \
                             origin; these may: {}",
                            name.chars().take(60).collect::<String>(),
                            allowed.join(", ")
                        ),
                    ));
                }
            }
        }
        let mut response = HttpResponse::NoContent();
        self.apply_grant(&mut response, grant);
        response
            .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, method.to_owned()))
            .insert_header((header::ACCESS_CONTROL_ALLOW_HEADERS, allowed.join(", ")))
            .insert_header((header::ACCESS_CONTROL_MAX_AGE, PREFLIGHT_MAX_AGE_SECS))
            .append_header((header::VARY, "Access-Control-Request-Method"))
            .append_header((header::VARY, "Access-Control-Request-Headers"));
        Ok(response.finish())
    }

    fn apply_grant(&self, response: &mut actix_web::HttpResponseBuilder, grant: Grant) {
        match grant {
            Grant::Any => {
                response.insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, "*"));
            }
            Grant::Origin(origin) => {
                response.insert_header((header::ACCESS_CONTROL_ALLOW_ORIGIN, origin));
                if self.credentials {
                    response.insert_header((header::ACCESS_CONTROL_ALLOW_CREDENTIALS, "true"));
                }
                response.append_header((header::VARY, "Origin"));
            }
        }
    }

    /// Adds the CORS headers to an answer of `method` for an allowed origin.
    fn decorate(&self, method: &Method, origin: Option<&HeaderValue>, headers: &mut HeaderMap) {
        if !self.origins.is_empty() && !self.origins.allows_any() {
            // The answer differs by origin, so caches must key on it.
            headers.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        if self.allowed_headers(method.as_str()).is_none() {
            return;
        }
        let Some(grant) = self.grant(origin) else {
            return;
        };
        let value = match grant {
            Grant::Any => HeaderValue::from_static("*"),
            Grant::Origin(origin) => {
                if self.credentials {
                    headers.insert(
                        header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                        HeaderValue::from_static("true"),
                    );
                }
                origin
            }
        };
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED_HEADERS),
        );
    }
}

/// Middleware on `/v1/events`: answers preflights itself and adds the CORS
/// headers to every other answer, errors included, so a page can read a
/// 401 or a 429 and act on it instead of seeing a network error.
pub async fn middleware(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody, actix_web::body::BoxBody>>, actix_web::Error>
{
    let policy = request
        .app_data::<web::Data<AppState>>()
        .map(|state| Arc::clone(&state.cors))
        .unwrap_or_default();
    let preflight_method = (request.method() == Method::OPTIONS)
        .then(|| request.headers().get(header::ACCESS_CONTROL_REQUEST_METHOD))
        .flatten()
        .cloned();
    if let Some(method) = preflight_method {
        let response = policy
            .preflight(request.headers(), &method)
            .unwrap_or_else(|error| error.error_response());
        return Ok(request.into_response(response).map_into_right_body());
    }
    let method = request.method().clone();
    let origin = request.headers().get(header::ORIGIN).cloned();
    let mut response = next.call(request).await?;
    policy.decorate(&method, origin.as_ref(), response.headers_mut());
    Ok(response.map_into_left_body())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(entries: &[&str]) -> Result<OriginRules, OriginPatternError> {
        let entries: Vec<String> = entries.iter().map(|e| (*e).to_owned()).collect();
        OriginRules::parse(&entries, true)
    }

    #[test]
    fn exact_origins_match_exactly() {
        let rules = rules(&["https://app.example.com", "http://127.0.0.1:5173"]).unwrap();
        assert!(rules.allows("https://app.example.com"));
        assert!(rules.allows("http://127.0.0.1:5173"));
        for other in [
            "http://app.example.com",
            "https://app.example.com:8443",
            "https://evil-app.example.com",
            "https://app.example.com.evil.net",
            "http://127.0.0.1:5174",
            "null",
            "",
        ] {
            assert!(!rules.allows(other), "{other}");
        }
    }

    #[test]
    fn default_ports_and_case_are_normalized() {
        let rules = rules(&["HTTPS://App.Example.com:443", "http://localhost:80"]).unwrap();
        assert!(rules.allows("https://app.example.com"));
        assert!(rules.allows("http://localhost"));
    }

    #[test]
    fn subdomain_patterns_take_subdomains_only() {
        let rules = rules(&["https://*.example.com"]).unwrap();
        assert!(rules.allows("https://app.example.com"));
        assert!(rules.allows("https://a.b.example.com"));
        for other in [
            "https://example.com",
            "http://app.example.com",
            "https://app.example.com:8443",
            "https://appexample.com",
            "https://app.example.com.evil.net",
            "https://.example.com",
        ] {
            assert!(!rules.allows(other), "{other}");
        }
        let with_port = super::tests::rules(&["http://*.dev.local:3000"]).unwrap();
        assert!(with_port.allows("http://a.dev.local:3000"));
        assert!(!with_port.allows("http://a.dev.local"));
    }

    #[test]
    fn ipv6_hosts() {
        let rules = rules(&["http://[::1]:8080"]).unwrap();
        assert!(rules.allows("http://[::1]:8080"));
        assert!(!rules.allows("http://[::2]:8080"));
    }

    #[test]
    fn malformed_patterns_are_refused_with_a_reason() {
        for (entry, says) in [
            ("app.example.com", "scheme://host"),
            ("https://app.example.com/", "no path"),
            ("https://app.example.com/app", "no path"),
            ("https://app.example.com?x", "no query"),
            ("https://user@app.example.com", "user name"),
            ("ftp://app.example.com", "http or https"),
            ("https://*.com", "two labels"),
            ("https://app.*.example.com", "leftmost"),
            ("https://*example.com", "leftmost"),
            ("https://app.example.com:0", "port"),
            ("https://app.example.com:99999", "port"),
            ("https://app.example.com:", "port"),
            ("https://app_example.com", "domain name"),
            ("https://", "domain name"),
            ("https://bücher.example", "punycode"),
            ("http://[::1", "closing"),
            ("http://[zz]", "IPv6"),
            ("null", "sandboxed"),
        ] {
            let error = rules(&[entry]).unwrap_err().to_string();
            assert!(error.contains(says), "{entry}: {error}");
        }
    }

    #[test]
    fn any_origin_only_alone_and_without_credentials() {
        assert_eq!(
            rules(&["*"]).unwrap_err(),
            OriginPatternError::AnyWithCredentials
        );
        assert_eq!(
            OriginRules::parse(&["*".into(), "https://a.example".into()], false).unwrap_err(),
            OriginPatternError::AnyAmongOthers
        );
        let any = OriginRules::parse(&["*".into()], false).unwrap();
        assert!(any.allows_any());
        assert!(any.allows("https://anything.example"));
    }

    #[test]
    fn no_entries_allow_nothing() {
        let none = rules(&[]).unwrap();
        assert!(none.is_empty());
        assert!(!none.allows("https://app.example.com"));
    }
}
