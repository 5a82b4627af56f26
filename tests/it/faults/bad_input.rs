//! Bad input, systematically: one table of malformed, oversized, forged and
//! unauthorised requests against every HTTP endpoint of a real relay over
//! TCP, each expected to be refused with its documented status and stable
//! JSON error `code`, or (for a few inputs the API accepts on purpose) to be
//! delivered intact and framed on one `event:` line. After every case, a
//! subscriber connected before the table began still receives the next
//! durable event, with no loss, and refused publishes write nothing.
//! Garbage on the notification channel is dropped, counted and harmless.

use crate::support::server::{PUBLISH_TOKEN, SseStream, TEST_SECRET, TestServer, token};
use crate::support::{DEADLINE, TestDb};
use eventrelay::config::Config;
use eventrelay::publisher::{NewEvent, Publisher};
use reqwest::Method;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "admin-token-for-bad-input";
const MAX_BODY_BYTES: usize = 16 * 1024;
const MAX_BATCH: usize = 5;
/// The one registered type the survival ticks use.
const TICK: &str = "bystander.tick";
/// An event id published before the table runs.
const USED_ID: &str = "9f0c2a58-7d1e-4c1b-8a57-3f0e8e6b2c11";
/// An event id no accepted request uses.
const FRESH_ID: &str = "5b1d7c3e-2a4f-4e8b-9c6d-0a1b2c3d4e5f";

/// Which relay a case is sent to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Relay {
    /// Publish, admin, schema registry, small body and batch limits.
    Configured,
    /// No publish token and no admin token: both APIs are off.
    Unconfigured,
}

#[derive(Clone, Debug)]
enum Expect {
    /// Refused with this status and this stable code in a JSON error body.
    Refused(u16, &'static str),
    /// Refused by the HTTP layer before the API sees it: any 4xx will do.
    ClientError,
    /// Accepted by the publish API, and delivered to the probe subscriber
    /// with exactly this type on its `event:` line and this data.
    DeliveredIntact { event_type: String, data: Value },
}

struct Case {
    name: String,
    relay: Relay,
    method: Method,
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<Vec<u8>>,
    expect: Expect,
}

impl Case {
    fn new(name: impl Into<String>, method: Method, path: impl Into<String>) -> Self {
        let name: String = name.into();
        Case {
            name: clip(&name, 120),
            relay: Relay::Configured,
            method,
            path: path.into(),
            headers: Vec::new(),
            body: None,
            expect: Expect::ClientError,
        }
    }

    fn get(name: impl Into<String>, path: impl Into<String>) -> Self {
        Self::new(name, Method::GET, path)
    }

    fn post(name: impl Into<String>, path: impl Into<String>) -> Self {
        Self::new(name, Method::POST, path)
    }

    fn header(mut self, name: &'static str, value: impl AsRef<[u8]>) -> Self {
        self.headers.push((
            HeaderName::from_static(name),
            HeaderValue::from_bytes(value.as_ref()).expect("a header value reqwest can send"),
        ));
        self
    }

    fn bearer(self, token: &str) -> Self {
        self.header("authorization", format!("Bearer {token}"))
    }

    fn raw(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self.header("content-type", "application/json")
    }

    fn json(self, body: &Value) -> Self {
        self.raw(serde_json::to_vec(body).unwrap())
    }

    fn on(mut self, relay: Relay) -> Self {
        self.relay = relay;
        self
    }

    fn refused(mut self, status: u16, code: &'static str) -> Self {
        self.expect = Expect::Refused(status, code);
        self
    }

    fn client_error(mut self) -> Self {
        self.expect = Expect::ClientError;
        self
    }

    fn delivered_intact(mut self, event_type: &str, data: Value) -> Self {
        self.expect = Expect::DeliveredIntact {
            event_type: event_type.to_owned(),
            data,
        };
        self
    }
}

// ---------------------------------------------------------------- tokens

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A JWT assembled by hand: any header, any claims, any signature bytes.
fn hand_made_jwt(header: &Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        base64url(header.to_string().as_bytes()),
        base64url(claims.to_string().as_bytes()),
        base64url(signature)
    )
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims the relay would accept, for `mallory` in scope `probe`.
fn good_claims() -> Value {
    json!({"sub": "mallory", "scope": "probe", "iat": now(), "exp": now() + 600})
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    if value.is_null() {
        claims.as_object_mut().unwrap().remove(key);
    } else {
        claims[key] = value;
    }
    claims
}

fn signed(algorithm: jsonwebtoken::Algorithm, secret: &str, claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(algorithm),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn hs256(claims: &Value) -> String {
    signed(jsonwebtoken::Algorithm::HS256, TEST_SECRET, claims)
}

fn token_cases() -> Vec<Case> {
    let stream = |name: &str| Case::get(format!("stream: {name}"), "/v1/events");
    let valid = hs256(&good_claims());
    let (valid_header, _) = valid.split_once('.').unwrap();
    let valid_signature = valid.rsplit_once('.').unwrap().1;
    let swapped_claims = format!(
        "{valid_header}.{}.{valid_signature}",
        base64url(
            with(good_claims(), "scope", json!("bystanders"))
                .to_string()
                .as_bytes()
        )
    );
    let none_header = json!({"alg": "none", "typ": "JWT"});
    let mut cases = vec![
        stream("no credentials"),
        stream("empty bearer").header("authorization", "Bearer "),
        stream("bearer without a token").header("authorization", "Bearer"),
        stream("garbage token").bearer("garbage"),
        stream("three empty segments").bearer(".."),
        stream("three garbage segments").bearer("a.b.c"),
        stream("basic scheme").header("authorization", "Basic bWFsbG9yeTpwYXNzd29yZA=="),
        stream("token without a scheme").header("authorization", valid.as_str()),
        stream("8 KiB of garbage token").bearer(&"x".repeat(8 * 1024)),
        stream("wrong key").bearer(&signed(
            jsonwebtoken::Algorithm::HS256,
            "another-secret-that-is-long-enough-for-hs256",
            &good_claims(),
        )),
        stream("claims swapped under a valid signature").bearer(&swapped_claims),
        stream("signature stripped").bearer(&format!("{}.", valid.rsplit_once('.').unwrap().0)),
        stream("expired").bearer(&hs256(&with(good_claims(), "exp", json!(now() - 3600)))),
        stream("not valid yet").bearer(&hs256(&with(good_claims(), "nbf", json!(now() + 3600)))),
        stream("no exp").bearer(&hs256(&with(good_claims(), "exp", Value::Null))),
        stream("exp a string").bearer(&hs256(&with(good_claims(), "exp", json!("tomorrow")))),
        stream("exp past the calendar").bearer(&hs256(&with(
            good_claims(),
            "exp",
            json!(i64::MAX),
        ))),
        stream("alg none, empty signature").bearer(&hand_made_jwt(
            &none_header,
            &good_claims(),
            b"",
        )),
        stream("alg none, copied signature").bearer(&format!(
            "{}.{}.{valid_signature}",
            base64url(none_header.to_string().as_bytes()),
            base64url(good_claims().to_string().as_bytes())
        )),
        stream("alg None, capitalised").bearer(&hand_made_jwt(
            &json!({"alg": "None", "typ": "JWT"}),
            &good_claims(),
            b"",
        )),
        stream("alg HS512 with the right secret").bearer(&signed(
            jsonwebtoken::Algorithm::HS512,
            TEST_SECRET,
            &good_claims(),
        )),
        stream("alg HS384 with the right secret").bearer(&signed(
            jsonwebtoken::Algorithm::HS384,
            TEST_SECRET,
            &good_claims(),
        )),
        stream("alg RS256 over an HMAC signature").bearer(&format!(
            "{}.{}.{valid_signature}",
            base64url(json!({"alg": "RS256", "typ": "JWT"}).to_string().as_bytes()),
            base64url(good_claims().to_string().as_bytes())
        )),
        stream("header not JSON").bearer(&format!(
            "{}.{}.{valid_signature}",
            base64url(b"{alg"),
            base64url(good_claims().to_string().as_bytes())
        )),
        stream("claims not JSON").bearer(&format!(
            "{valid_header}.{}.{valid_signature}",
            base64url(b"[1,2")
        )),
    ];
    for (name, claims) in [
        ("no scope claim", with(good_claims(), "scope", Value::Null)),
        ("empty scope", with(good_claims(), "scope", json!(""))),
        ("scope a number", with(good_claims(), "scope", json!(7))),
        (
            "scope with a newline",
            with(good_claims(), "scope", json!("probe\nx")),
        ),
        (
            "scope over 200 bytes",
            with(good_claims(), "scope", json!("s".repeat(201))),
        ),
        ("no sub claim", with(good_claims(), "sub", Value::Null)),
        ("empty sub", with(good_claims(), "sub", json!(""))),
        (
            "sub an object",
            with(good_claims(), "sub", json!({"id": 1})),
        ),
    ] {
        cases.push(stream(name).bearer(&hs256(&claims)));
    }
    cases
        .into_iter()
        .map(|case| case.refused(401, "unauthorized"))
        .collect()
}

// ---------------------------------------------------------------- the stream

fn stream_cases() -> Vec<Case> {
    let prober = token("prober", "probe", json!({}));
    let stream = |name: &str, query: &str| {
        Case::get(format!("stream: {name}"), format!("/v1/events{query}")).bearer(&prober)
    };
    let mut cases = Vec::new();
    for (name, value) in [
        ("letters", "abc"),
        ("negative", "-1"),
        ("overflowing i64", "99999999999999999999"),
        ("empty", ""),
        ("only whitespace", " \t "),
        ("three parts", "1.5.6"),
        ("a negative horizon", "1.-5"),
        ("an empty horizon", "7."),
        ("an overflowing horizon", "1.99999999999999999999"),
        ("a plus sign", "+3"),
        ("hexadecimal", "0x10"),
        ("an exponent", "1e3"),
        ("two numbers", "1 2"),
        ("digits then letters", "12abc"),
    ] {
        cases.push(
            stream(&format!("Last-Event-ID {name}"), "")
                .header("last-event-id", value)
                .refused(400, "invalid_last_event_id"),
        );
    }
    for (name, value) in [
        ("letters", "abc"),
        ("negative", "-1"),
        ("overflowing i64", "99999999999999999999"),
        ("empty", ""),
        ("NUL", "%00"),
        ("a plus sign", "%2B3"),
        ("three parts", "1.5.6"),
        ("invalid UTF-8", "%FF"),
    ] {
        cases.push(
            stream(
                &format!("lastEventId {name}"),
                &format!("?lastEventId={value}"),
            )
            .refused(400, "invalid_last_event_id"),
        );
    }
    cases.extend([
        stream("Last-Event-ID not ASCII", "")
            .header("last-event-id", b"\xd9\xa3")
            .refused(400, "invalid_header"),
        stream(
            "Last-Event-ID bad even with a good lastEventId",
            "?lastEventId=1",
        )
        .header("last-event-id", "x")
        .refused(400, "invalid_last_event_id"),
        stream("lastEventId twice", "?lastEventId=1&lastEventId=2").refused(400, "invalid_query"),
        stream("until empty", "?until=").refused(400, "invalid_query"),
        stream("until with a newline", "?until=a%0Ab").refused(400, "invalid_query"),
        stream("until with NUL", "?until=a%00").refused(400, "invalid_query"),
        stream(
            "until over 200 bytes",
            &format!("?until={}", "u".repeat(201)),
        )
        .refused(400, "invalid_query"),
        stream("until twice", "?until=a&until=b").refused(400, "invalid_query"),
        Case::get("stream: Authorization not ASCII", "/v1/events")
            .header("authorization", b"Bearer \xff\xfe")
            .refused(400, "invalid_header"),
        stream("Cookie not ASCII", "")
            .header("cookie", b"sid=\xff")
            .refused(400, "invalid_header"),
    ]);
    cases
}

// ---------------------------------------------------------------- publish

fn publish_cases() -> Vec<Case> {
    let publish =
        |name: &str| Case::post(format!("publish: {name}"), "/v1/events").bearer(PUBLISH_TOKEN);
    let event = |event_type: &str, scope: &str| json!({"type": event_type, "scopeKey": scope, "lane": "durable", "data": {}});
    let tick = || event(TICK, "probe");
    let mut cases = vec![
        Case::post("publish: no credentials", "/v1/events")
            .json(&tick())
            .refused(401, "unauthorized"),
        Case::post("publish: wrong token", "/v1/events")
            .bearer("not-the-publish-token")
            .json(&tick())
            .refused(401, "unauthorized"),
        Case::post("publish: the admin token", "/v1/events")
            .bearer(ADMIN_TOKEN)
            .json(&tick())
            .refused(401, "unauthorized"),
        Case::post("publish: a subscriber's JWT", "/v1/events")
            .bearer(&token("prober", "probe", json!({})))
            .json(&tick())
            .refused(401, "unauthorized"),
        Case::post("publish: basic scheme", "/v1/events")
            .header("authorization", format!("Basic {PUBLISH_TOKEN}"))
            .json(&tick())
            .refused(401, "unauthorized"),
        Case::post("publish: the token as a prefix", "/v1/events")
            .bearer(&format!("{PUBLISH_TOKEN}x"))
            .json(&tick())
            .refused(401, "unauthorized"),
        Case::post("publish: API off", "/v1/events")
            .on(Relay::Unconfigured)
            .bearer(PUBLISH_TOKEN)
            .json(&tick())
            .refused(403, "publish_disabled"),
    ];
    for (name, body) in [
        ("empty body", b"".to_vec()),
        ("truncated JSON", b"{\"type\":".to_vec()),
        ("not JSON", b"nope".to_vec()),
        ("a number", b"3".to_vec()),
        ("null", b"null".to_vec()),
        ("a string", b"\"order.created\"".to_vec()),
        ("an empty batch", b"[]".to_vec()),
        (
            "trailing garbage",
            b"{\"type\":\"a\",\"scopeKey\":\"probe\",\"lane\":\"durable\"} x".to_vec(),
        ),
        ("a byte order mark", b"\xef\xbb\xbf{}".to_vec()),
        ("invalid UTF-8", b"{\"type\":\"\xff\"}".to_vec()),
        (
            "nested 5000 deep",
            format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        ),
    ] {
        cases.push(publish(name).raw(body).refused(400, "invalid_body"));
    }
    cases.push(
        publish("one event over the batch limit")
            .json(&Value::Array(vec![tick(); MAX_BATCH + 1]))
            .refused(400, "batch_too_large"),
    );
    let mut fields = |name: &str, key: &str, value: Value| {
        cases.push(
            publish(name)
                .json(&with(tick(), key, value))
                .refused(400, "invalid_event"),
        );
    };
    fields("no type", "type", Value::Null);
    fields("no scopeKey", "scopeKey", Value::Null);
    fields("no lane", "lane", Value::Null);
    fields("type a number", "type", json!(42));
    fields("scopeKey an array", "scopeKey", json!(["probe"]));
    fields("unknown lane", "lane", json!("sometimes"));
    fields("lane capitalised", "lane", json!("Durable"));
    fields("audience a string", "audience", json!("everyone"));
    fields(
        "audience with an unknown rule",
        "audience",
        json!({"roles": ["admin"]}),
    );
    fields(
        "audience users a string",
        "audience",
        json!({"users": "alice"}),
    );
    fields(
        "audience users numbers",
        "audience",
        json!({"users": [1, 2]}),
    );
    fields("resources a string", "resources", json!("order:1"));
    fields("resources numbers", "resources", json!([1]));
    fields("id not a UUID", "id", json!("not-a-uuid"));
    fields("empty type", "type", json!(""));
    fields("type over 200 bytes", "type", json!("t".repeat(201)));
    fields("empty scopeKey", "scopeKey", json!(""));
    fields(
        "scopeKey over 200 bytes",
        "scopeKey",
        json!("s".repeat(201)),
    );
    fields("scopeKey with a newline", "scopeKey", json!("probe\nx"));
    for (name, event_type) in [
        ("LF", "order.created\nevent: forged"),
        ("CR", "order.created\rdata: forged"),
        ("CRLF", "order.created\r\n\r\nid: 1"),
        ("NUL", "order\0created"),
        ("ESC", "order.\u{1b}[31mcreated"),
        ("DEL", "order.created\u{7f}"),
        ("NEL (C1)", "order.\u{85}created"),
        ("TAB", "order.\tcreated"),
    ] {
        fields(&format!("type with {name}"), "type", json!(event_type));
    }
    cases.extend([
        publish("a good event then a bad one")
            .json(&json!([tick(), with(tick(), "lane", json!("never"))]))
            .refused(400, "invalid_event"),
        publish(&format!("body over {MAX_BODY_BYTES} bytes"))
            .json(&with(
                tick(),
                "data",
                json!({"pad": "x".repeat(MAX_BODY_BYTES * 2)}),
            ))
            .refused(413, "payload_too_large"),
        publish("ephemeral event over the NOTIFY limit")
            .json(
                &json!({"type": TICK, "scopeKey": "probe", "lane": "ephemeral",
                          "data": {"pad": "x".repeat(9000)}}),
            )
            .refused(413, "event_too_large"),
        publish("unregistered type")
            .json(&event("order.deleted", "probe"))
            .refused(422, "schema_violation"),
        publish("data failing its schema")
            .json(&event("order.created", "probe"))
            .refused(422, "schema_violation"),
        publish("data of the wrong type for its schema")
            .json(&with(
                event("order.created", "probe"),
                "data",
                json!({"orderId": "42"}),
            ))
            .refused(422, "schema_violation"),
        publish("data with an escaped NUL")
            .raw(
                format!(r#"{{"type":"{TICK}","scopeKey":"probe","lane":"durable","data":{{"text":"a\u0000b"}}}}"#)
                    .into_bytes(),
            )
            .refused(400, "invalid_event"),
        publish("type with LINE SEPARATOR")
            .json(&with(tick(), "type", json!("line\u{2028}separated")))
            .refused(400, "invalid_event"),
        publish("type with PARAGRAPH SEPARATOR")
            .json(&with(tick(), "type", json!("paragraph\u{2029}separated")))
            .refused(400, "invalid_event"),
        publish("the control frame's name as an event type")
            .json(&with(tick(), "type", json!("ready")))
            .refused(400, "invalid_event"),
        publish("a type under the reserved prefix")
            .json(&with(tick(), "type", json!("eventrelay.resync")))
            .refused(400, "invalid_event"),
        publish("a reserved type in a batch")
            .json(&json!([tick(), with(tick(), "type", json!("error"))]))
            .refused(400, "invalid_event"),
        publish("resources with NUL")
            .json(&with(tick(), "resources", json!(["order:\u{0}"])))
            .refused(400, "invalid_event"),
        publish("audience users with NUL")
            .json(&with(tick(), "audience", json!({"users": ["al\u{0}ice"]})))
            .refused(400, "invalid_event"),
        publish("an id already used")
            .json(&with(tick(), "id", json!(USED_ID)))
            .refused(409, "conflict"),
        publish("one id twice in a batch")
            .json(&json!([
                with(tick(), "id", json!(FRESH_ID)),
                with(tick(), "id", json!(FRESH_ID))
            ]))
            .refused(409, "conflict"),
        publish("a registered type with trailing space")
            .json(&event("order.created ", "probe"))
            .refused(422, "schema_violation"),
    ]);
    // Accepted on purpose: none of these can split or forge a frame.
    for (name, event_type, data) in [
        (
            "data forging a frame",
            TICK,
            json!({"text": "a\n\nevent: forged\ndata: {}\nid: 999999\r\n\r\n"}),
        ),
        (
            "data with NUL-like escapes",
            TICK,
            json!({"text": "\u{1b}[2J \u{7f} \u{85} \u{feff}"}),
        ),
    ] {
        cases.push(
            publish(name)
                .json(&json!({"type": event_type, "scopeKey": "probe", "lane": "durable", "data": data}))
                .delivered_intact(event_type, data),
        );
    }
    cases
}

// ---------------------------------------------------------------- admin

/// Every admin route, with a body each would accept.
fn admin_routes() -> Vec<(Method, &'static str, Option<Value>)> {
    vec![
        (
            Method::POST,
            "/v1/admin/subscriptions",
            Some(json!({"id": "fresh", "url": "https://example.com/hook"})),
        ),
        (Method::GET, "/v1/admin/subscriptions", None),
        (Method::GET, "/v1/admin/subscriptions/existing", None),
        (
            Method::PATCH,
            "/v1/admin/subscriptions/existing",
            Some(json!({"types": ["a.*"]})),
        ),
        (Method::DELETE, "/v1/admin/subscriptions/existing", None),
        (
            Method::POST,
            "/v1/admin/subscriptions/existing/rotate-secret",
            None,
        ),
        (Method::POST, "/v1/admin/subscriptions/existing/pause", None),
        (
            Method::POST,
            "/v1/admin/subscriptions/existing/resume",
            None,
        ),
        (
            Method::POST,
            "/v1/admin/subscriptions/existing/redeliver-failed",
            Some(json!({"since": "2000-01-01T00:00:00Z"})),
        ),
        (Method::GET, "/v1/admin/scopes", None),
        (Method::GET, "/v1/admin/subscribers", None),
        (
            Method::POST,
            "/v1/admin/subscribers/someone/disconnect",
            None,
        ),
        (Method::GET, "/v1/admin/deliveries", None),
        (
            Method::POST,
            "/v1/admin/deliveries/prune",
            Some(json!({"before": "2000-01-01T00:00:00Z"})),
        ),
        (Method::GET, "/v1/admin/deliveries/1", None),
        (Method::POST, "/v1/admin/deliveries/1/redeliver", None),
    ]
}

fn admin_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (method, path, body) in admin_routes() {
        let case = |name: &str| {
            let case = Case::new(
                format!("admin {method} {path}: {name}"),
                method.clone(),
                path,
            );
            match &body {
                Some(body) => case.json(body),
                None => case,
            }
        };
        cases.extend([
            case("no credentials").refused(401, "unauthorized"),
            case("wrong token")
                .bearer("not-the-admin-token")
                .refused(401, "unauthorized"),
            case("the publish token")
                .bearer(PUBLISH_TOKEN)
                .refused(401, "unauthorized"),
            case("the token with a suffix")
                .bearer(&format!("{ADMIN_TOKEN}!"))
                .refused(401, "unauthorized"),
            case("token not ASCII")
                .header("authorization", b"Bearer \xff")
                .refused(401, "unauthorized"),
            case("API off")
                .on(Relay::Unconfigured)
                .bearer(ADMIN_TOKEN)
                .refused(403, "admin_disabled"),
        ]);
    }

    let admin = |name: &str, method: Method, path: &str| {
        Case::new(format!("admin {method} {path}: {name}"), method, path).bearer(ADMIN_TOKEN)
    };
    let create = |name: &str| admin(name, Method::POST, "/v1/admin/subscriptions");
    let good = || json!({"id": "fresh", "url": "https://example.com/hook"});
    for (name, body) in [
        ("empty body", b"".to_vec()),
        ("truncated JSON", b"{\"id\":".to_vec()),
        ("an array", b"[]".to_vec()),
        ("null", b"null".to_vec()),
        ("invalid UTF-8", b"{\"id\":\"\xff\"}".to_vec()),
        (
            "nested 5000 deep",
            format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
        ),
    ] {
        cases.push(create(name).raw(body).refused(400, "invalid_body"));
    }
    for (name, key, value) in [
        ("no id", "id", Value::Null),
        ("no url", "url", Value::Null),
        ("id a number", "id", json!(5)),
        ("empty id", "id", json!("")),
        ("id with a space", "id", json!("a b")),
        ("id with a slash", "id", json!("a/b")),
        ("id with a newline", "id", json!("a\nb")),
        ("id over 100 characters", "id", json!("i".repeat(101))),
        ("url not a URL", "url", json!("not a url")),
        ("url ftp", "url", json!("ftp://example.com/hook")),
        ("url javascript", "url", json!("javascript:alert(1)")),
        ("empty url", "url", json!("")),
        ("url a number", "url", json!(443)),
        ("url without a host", "url", json!("https://")),
        (
            "url with a space in the host",
            "url",
            json!("https://exa mple.com/hook"),
        ),
        (
            "url with a newline",
            "url",
            json!("https://example.com/\nhook"),
        ),
        ("url with NUL", "url", json!("https://example.com/\u{0}")),
        ("types a string", "types", json!("*")),
        ("no types", "types", json!([])),
        ("an empty type", "types", json!([""])),
        ("a star inside a type", "types", json!(["a*"])),
        ("a star prefix", "types", json!(["*.a"])),
        ("only a wildcard suffix", "types", json!([".*"])),
        ("types numbers", "types", json!([5])),
        ("a type with NUL", "types", json!(["order\u{0}"])),
        ("a type with a newline", "types", json!(["order\ncreated"])),
        ("a type over 200 bytes", "types", json!(["t".repeat(201)])),
        ("empty scopeKey", "scopeKey", json!("")),
        ("scopeKey a number", "scopeKey", json!(5)),
        ("scopeKey with NUL", "scopeKey", json!("org\u{0}")),
        (
            "scopeKey over 200 bytes",
            "scopeKey",
            json!("s".repeat(201)),
        ),
        ("empty secret", "secret", json!("")),
        ("secret bad base64", "secret", json!("whsec_***")),
        ("secret a number", "secret", json!(7)),
        ("secret with NUL", "secret", json!("abc\u{0}def")),
        ("an unknown field", "color", json!("red")),
    ] {
        cases.push(
            create(name)
                .json(&with(good(), key, value))
                .refused(400, "invalid_body"),
        );
    }
    cases.push(
        create(&format!("body over {MAX_BODY_BYTES} bytes"))
            .json(&with(
                good(),
                "types",
                json!(["x".repeat(MAX_BODY_BYTES * 2)]),
            ))
            .refused(413, "payload_too_large"),
    );

    let patch = |name: &str| admin(name, Method::PATCH, "/v1/admin/subscriptions/existing");
    for (name, body) in [
        ("empty body", b"".to_vec()),
        ("not JSON", b"{".to_vec()),
        ("an array", b"[]".to_vec()),
    ] {
        cases.push(patch(name).raw(body).refused(400, "invalid_body"));
    }
    for (name, body) in [
        ("url ftp", json!({"url": "ftp://example.com"})),
        ("url a number", json!({"url": 5})),
        (
            "url with a newline",
            json!({"url": "https://example.com/\nhook"}),
        ),
        ("url with NUL", json!({"url": "https://example.com/\u{0}"})),
        ("no types", json!({"types": []})),
        ("a star inside a type", json!({"types": ["a*b"]})),
        ("a type with NUL", json!({"types": ["order\u{0}"]})),
        ("empty scopeKey", json!({"scopeKey": ""})),
        ("scopeKey with NUL", json!({"scopeKey": "org\u{0}"})),
        ("changing the id", json!({"id": "renamed"})),
        (
            "changing the secret",
            json!({"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}),
        ),
    ] {
        cases.push(patch(name).json(&body).refused(400, "invalid_body"));
    }
    cases.push(
        patch(&format!("body over {MAX_BODY_BYTES} bytes"))
            .json(&json!({"types": ["x".repeat(MAX_BODY_BYTES * 2)]}))
            .refused(413, "payload_too_large"),
    );

    let missing = "/v1/admin/subscriptions/missing";
    cases.extend([
        admin("missing", Method::GET, missing).refused(404, "not_found"),
        admin("missing", Method::PATCH, missing)
            .json(&json!({"types": ["*"]}))
            .refused(404, "not_found"),
        admin("missing", Method::DELETE, missing).refused(404, "not_found"),
        admin("missing", Method::POST, &format!("{missing}/rotate-secret"))
            .refused(404, "not_found"),
        admin("NUL id", Method::GET, "/v1/admin/subscriptions/%00").refused(404, "not_found"),
        admin("NUL id", Method::DELETE, "/v1/admin/subscriptions/%00").refused(404, "not_found"),
        admin(
            "invalid UTF-8 id",
            Method::GET,
            "/v1/admin/subscriptions/%FF",
        )
        .refused(404, "not_found"),
        admin(
            "a 4 KiB id",
            Method::GET,
            &format!("/v1/admin/subscriptions/{}", "i".repeat(4096)),
        )
        .refused(404, "not_found"),
    ]);

    for query in [
        "status=lost",
        "status=DEAD",
        "status=dead&status=gone",
        "limit=0",
        "limit=501",
        "limit=-1",
        "limit=abc",
        "limit=99999999999999999999",
        "before=x",
        "before=1.5",
        "before=99999999999999999999",
        "eventId=x",
        "eventId=%00",
        "scopeKey=org%00",
        "scopeKey=org%0A1",
        "subscriptionId=%00",
        "color=red",
    ] {
        cases.push(
            admin(query, Method::GET, &format!("/v1/admin/deliveries?{query}"))
                .refused(400, "invalid_query"),
        );
    }
    for id in ["abc", "-1", "1.5", "99999999999999999999", "%00", "0x1"] {
        cases.push(
            admin(id, Method::GET, &format!("/v1/admin/deliveries/{id}")).refused(404, "not_found"),
        );
        cases.push(
            admin(
                id,
                Method::POST,
                &format!("/v1/admin/deliveries/{id}/redeliver"),
            )
            .refused(404, "not_found"),
        );
    }
    let prune = |name: &str| admin(name, Method::POST, "/v1/admin/deliveries/prune");
    for (name, body) in [
        ("empty body", b"".to_vec()),
        ("not JSON", b"{".to_vec()),
        ("no before", b"{}".to_vec()),
        ("before not a time", br#"{"before":"yesterday"}"#.to_vec()),
        ("before a number", br#"{"before":5}"#.to_vec()),
        ("before a date only", br#"{"before":"2020-01-01"}"#.to_vec()),
        (
            "before past the calendar",
            br#"{"before":"+999999-01-01T00:00:00Z"}"#.to_vec(),
        ),
        (
            "an unknown field",
            br#"{"before":"2020-01-01T00:00:00Z","all":true}"#.to_vec(),
        ),
    ] {
        cases.push(prune(name).raw(body).refused(400, "invalid_body"));
    }
    cases
}

// ---------------------------------------------------------------- the rest

fn other_cases() -> Vec<Case> {
    let mint = |name: &str| Case::post(format!("inspector token: {name}"), "/inspector/token");
    let mut cases = vec![
        mint("empty body")
            .raw(b"".to_vec())
            .refused(400, "invalid_body"),
        mint("not JSON")
            .raw(b"{".to_vec())
            .refused(400, "invalid_body"),
        mint("missing fields")
            .json(&json!({}))
            .refused(400, "invalid_body"),
        mint("fields of the wrong type")
            .json(&json!({"subscriber": 1, "scope": []}))
            .refused(400, "invalid_body"),
        mint("not JSON content")
            .header("content-type", "text/plain")
            .refused(400, "invalid_body"),
        // Refused before the body is read: any body, or none.
        mint("outside development mode")
            .json(&json!({"subscriber": "mallory", "scope": "probe"}))
            .on(Relay::Unconfigured)
            .refused(403, "minting_disabled"),
        mint("outside development mode, not JSON")
            .raw(b"{".to_vec())
            .on(Relay::Unconfigured)
            .refused(403, "minting_disabled"),
    ];
    for (method, path) in [
        (Method::GET, "/v2/nothing"),
        (Method::GET, "/v1/events/extra"),
        (Method::PUT, "/v1/events"),
        (Method::DELETE, "/v1/events"),
        (Method::POST, "/healthz"),
        (Method::POST, "/readyz"),
        (Method::DELETE, "/metrics"),
        (Method::PUT, "/openapi.json"),
        (Method::GET, "/v1/admin"),
        (Method::GET, "/v1/admin/nothing"),
        (Method::PUT, "/v1/admin/subscriptions"),
        (Method::GET, "/v1/admin/deliveries/1/attempts"),
    ] {
        cases.push(
            Case::new(format!("routing: {method} {path}"), method, path)
                .bearer(ADMIN_TOKEN)
                .refused(404, "not_found"),
        );
    }
    // Over actix-web's header limits: any 4xx, and the relay goes on.
    // actix-web refuses a request head over 32 KiB.
    let huge = "9".repeat(40 * 1024);
    cases.extend([
        Case::get("headers: a 40 KiB Authorization", "/v1/events")
            .bearer(&huge)
            .client_error(),
        Case::get("headers: a 40 KiB Last-Event-ID", "/v1/events")
            .header("last-event-id", &huge)
            .client_error(),
        Case::post("headers: a 40 KiB publish token", "/v1/events")
            .bearer(&huge)
            .json(&json!({}))
            .client_error(),
        Case::get("headers: a 40 KiB admin token", "/v1/admin/subscriptions")
            .bearer(&huge)
            .client_error(),
        Case::get(
            "headers: a 40 KiB path",
            format!("/v1/admin/subscriptions/{huge}"),
        )
        .client_error(),
    ]);
    let mut many = Case::get("headers: 200 headers", "/v1/events");
    for n in 0..200 {
        many.headers.push((
            HeaderName::from_bytes(format!("x-filler-{n}").as_bytes()).unwrap(),
            HeaderValue::from_static("filler"),
        ));
    }
    cases.push(many.client_error());
    cases
}

// ---------------------------------------------------------------- running

/// What came back for one request.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: Vec<u8>,
}

async fn send(client: &reqwest::Client, base: &str, case: &Case) -> Result<Answer, String> {
    let mut request = client.request(case.method.clone(), format!("{base}{}", case.path));
    for (name, value) in &case.headers {
        request = request.header(name.clone(), value.clone());
    }
    if let Some(body) = &case.body {
        request = request.body(body.clone());
    }
    let response = tokio::time::timeout(DEADLINE, request.send())
        .await
        .map_err(|_| "no answer before the deadline".to_owned())?
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = tokio::time::timeout(DEADLINE, response.bytes())
        .await
        .map_err(|_| "no body before the deadline".to_owned())?
        .map_err(|e| format!("body failed: {e}"))?
        .to_vec();
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// At most `chars` characters of `text`, for readable failure messages.
fn clip(text: &str, chars: usize) -> String {
    text.chars().take(chars).collect()
}

/// Checks one answer against its expectation; `Err` says what differs.
fn judge(case: &Case, answer: &Answer) -> Result<(), String> {
    let shown = String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).into_owned();
    match &case.expect {
        Expect::Refused(status, code) => {
            let body: Value = serde_json::from_slice(&answer.body).map_err(|_| {
                format!(
                    "{} with a non-JSON body ({}): {shown:?}",
                    answer.status, answer.content_type
                )
            })?;
            let got_code = body["error"]["code"].as_str();
            let message = body["error"]["message"].as_str().unwrap_or_default();
            if (answer.status, got_code) != (*status, Some(*code)) || message.is_empty() {
                return Err(format!(
                    "expected {status} {code}, got {} {shown}",
                    answer.status
                ));
            }
            if !answer.content_type.starts_with("application/json") {
                return Err(format!("error body served as {:?}", answer.content_type));
            }
            Ok(())
        }
        Expect::ClientError => {
            if (400..500).contains(&answer.status) {
                Ok(())
            } else {
                Err(format!("expected a 4xx, got {} {shown}", answer.status))
            }
        }
        Expect::DeliveredIntact { .. } => {
            if answer.status == 200 {
                Ok(())
            } else {
                Err(format!("expected 200, got {} {shown}", answer.status))
            }
        }
    }
}

/// A subscriber connected before the table runs, which must keep receiving.
struct Bystander {
    stream: SseStream,
    received: usize,
}

impl Bystander {
    async fn connect(server: &TestServer, name: &str) -> Self {
        let (stream, _) = server
            .subscribe(&token(name, "bystanders", json!({})), None, "")
            .await;
        Bystander {
            stream,
            received: 0,
        }
    }

    /// The next event is exactly `id`.
    async fn receives(&mut self, id: &str, after: &str) {
        let frame = self.stream.next_event().await;
        assert_eq!(
            frame.json()["id"].as_str(),
            Some(id),
            "a bystander missed an event after {after:?}: got {frame:?}"
        );
        self.received += 1;
    }
}

fn schemas_dir(db: &TestDb) -> String {
    let dir = std::env::temp_dir().join(format!("eventrelay-bad-input-{}", db.schema));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{TICK}.json")), r#"{"type": "object"}"#).unwrap();
    std::fs::write(
        dir.join("order.created.json"),
        r#"{"type": "object", "required": ["orderId"],
            "properties": {"orderId": {"type": "integer"}}}"#,
    )
    .unwrap();
    dir.to_string_lossy().into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_refuses_bad_input_with_a_stable_code_and_keeps_serving() {
    let db = TestDb::new().await;
    let schemas = schemas_dir(&db);
    // The configured relay mints inspector tokens (development mode's
    // secret, the one its JWT auth checks); the unconfigured one does not.
    let configured = TestServer::start(&db, |c: &mut Config| {
        c.development_secret = Some(TEST_SECRET.into());
        c.http.max_body_bytes = MAX_BODY_BYTES;
        c.publish.max_batch = MAX_BATCH;
        c.publish.schemas_dir = Some(schemas.clone());
        c.admin.token = Some(ADMIN_TOKEN.into());
        c.webhooks.enabled = false;
    });
    let unconfigured = TestServer::start(&db, |c: &mut Config| {
        c.publish.token = None;
        c.admin.token = None;
        c.webhooks.enabled = false;
    });
    configured.ready().await;
    unconfigured.ready().await;
    let client = reqwest::Client::new();

    // A subscription the admin cases can find.
    let created = client
        .post(configured.url("/v1/admin/subscriptions"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"id": "existing", "url": "https://example.com/hook", "types": ["order.*"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let (status, _) = configured
        .publish(json!({"id": USED_ID, "type": TICK, "scopeKey": "elsewhere",
                        "lane": "durable", "data": {}}))
        .await;
    assert_eq!(status, 200);
    let mut written = 1;

    let mut bystanders = [
        Bystander::connect(&configured, "bystander-1").await,
        Bystander::connect(&unconfigured, "bystander-2").await,
    ];
    let (mut probe, _) = configured
        .subscribe(&token("prober", "probe", json!({})), None, "")
        .await;

    let groups = [
        ("tokens", token_cases()),
        ("stream", stream_cases()),
        ("publish", publish_cases()),
        ("admin", admin_cases()),
        ("inspector, routing and header limits", other_cases()),
    ];
    let sizes: Vec<String> = groups
        .iter()
        .map(|(group, cases)| format!("{} {group}", cases.len()))
        .collect();
    let cases: Vec<Case> = groups.into_iter().flat_map(|(_, cases)| cases).collect();

    let mut failures = Vec::new();
    let (mut refused, mut client_errors, mut delivered) = (0, 0, 0);
    for case in &cases {
        let base = match case.relay {
            Relay::Configured => &configured.base,
            Relay::Unconfigured => &unconfigured.base,
        };
        match send(&client, base, case).await {
            Ok(answer) => match judge(case, &answer) {
                Ok(()) => match &case.expect {
                    Expect::Refused(..) => refused += 1,
                    Expect::ClientError => client_errors += 1,
                    Expect::DeliveredIntact { event_type, data } => {
                        let envelope: Value = serde_json::from_slice(&answer.body).unwrap();
                        let envelope = &envelope["events"][0];
                        let frame = probe.next_event().await;
                        assert_eq!(
                            frame.event.as_deref(),
                            Some(event_type.as_str()),
                            "{}",
                            case.name
                        );
                        assert_eq!(frame.seq(), envelope["seq"].as_i64());
                        assert_eq!(frame.json()["type"], json!(event_type), "{}", case.name);
                        assert_eq!(&frame.json()["data"], data, "{}", case.name);
                        written += 1;
                        delivered += 1;
                    }
                },
                Err(why) => failures.push(format!("{}: {}", case.name, clip(&why, 300))),
            },
            Err(why) => failures.push(format!("{}: {}", case.name, clip(&why, 300))),
        }

        // Everyone else is still served: the publish API answers and both
        // relays deliver the next durable event to their bystanders.
        let (status, body) = configured
            .publish(
                json!({"type": TICK, "scopeKey": "bystanders", "lane": "durable",
                            "data": {"after": case.name}}),
            )
            .await;
        assert_eq!(
            status, 200,
            "the publish API stopped serving after {:?}: {body}",
            case.name
        );
        written += 1;
        let id = body["events"][0]["id"].as_str().unwrap().to_owned();
        for bystander in &mut bystanders {
            bystander.receives(&id, &case.name).await;
        }
    }

    // Nothing refused reached the probe subscriber or the outbox.
    let (status, body) = configured
        .publish(json!({"type": TICK, "scopeKey": "probe", "lane": "durable", "data": {}}))
        .await;
    assert_eq!(status, 200);
    written += 1;
    let frame = probe.next_event().await;
    assert_eq!(
        frame.json()["id"],
        body["events"][0]["id"],
        "a refused event was delivered"
    );
    assert_eq!(db.outbox_count().await, written);
    for bystander in &bystanders {
        assert_eq!(bystander.received, cases.len());
    }

    eprintln!(
        "bad input: {} inputs ({}); {refused} refused with their documented status and JSON code, \
         {client_errors} refused with a 4xx by the HTTP layer, {delivered} accepted and framed intact \
         on one event: line; {} mismatches; both bystanders received all {} interleaved events",
        cases.len(),
        sizes.join(", "),
        failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} cases misbehaved:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let _ = std::fs::remove_dir_all(schemas);
}

// ---------------------------------------------------------------- NOTIFY

#[tokio::test]
async fn garbage_notifications_are_dropped_counted_and_harmless() {
    let db = TestDb::new().await;
    let server = TestServer::start(&db, |_| {});
    server.ready().await;
    let (mut stream, _) = server
        .subscribe(&token("alice", "org-1", json!({})), None, "")
        .await;
    let malformed: Vec<String> = vec![
        String::new(),
        "not json".into(),
        "null".into(),
        "[]".into(),
        "42".into(),
        "\"ptr\"".into(),
        "{}".into(),
        r#"{"k":null}"#.into(),
        r#"{"k":"zip"}"#.into(),
        r#"{"k":"PTR","s":"org-1","q":1}"#.into(),
        r#"{"k":"ptr"}"#.into(),
        r#"{"k":"ptr","s":"org-1"}"#.into(),
        r#"{"k":"ptr","q":1}"#.into(),
        r#"{"k":"ptr","s":"","q":1}"#.into(),
        r#"{"k":"ptr","s":"org\n1","q":1}"#.into(),
        r#"{"k":"ptr","s":7,"q":1}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":"1"}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":1.5}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":0}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":-5}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":99999999999999999999}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":1e400}"#.into(),
        r#"{"k":"ptr","s":"org-1","q":1} trailing"#.into(),
        r#"{"k":"evt"}"#.into(),
        r#"{"k":"evt","e":null}"#.into(),
        r#"{"k":"evt","e":{"type":"x"}}"#.into(),
        format!(
            r#"{{"k":"evt","e":{{"id":"{}","type":"x","scopeKey":"org-1","lane":"durable","seq":1,"data":{{}},"resources":[],"occurredAt":"2024-01-01T00:00:00Z"}}}}"#,
            uuid::Uuid::new_v4()
        ),
        format!(
            r#"{{"k":"evt","e":{{"id":"{}","type":"x\n","scopeKey":"org-1","lane":"ephemeral","data":{{}},"resources":[],"occurredAt":"2024-01-01T00:00:00Z"}}}}"#,
            uuid::Uuid::new_v4()
        ),
        // An inline event under the control frame's name, as `notify_inline`
        // could send it: never shown, or clients would take it for `ready`.
        format!(
            r#"{{"k":"evt","e":{{"id":"{}","type":"ready","scopeKey":"org-1","lane":"ephemeral","data":{{"resync":false}},"resources":[],"occurredAt":"2024-01-01T00:00:00Z"}}}}"#,
            uuid::Uuid::new_v4()
        ),
        // The batched inline form: a version this relay does not read, no
        // events, events that are not a list, a durable event inside.
        r#"{"k":"evts","v":9,"e":[]}"#.into(),
        r#"{"k":"evts","v":1,"e":[]}"#.into(),
        r#"{"k":"evts","v":1,"e":{"k":"evt"}}"#.into(),
        format!(
            r#"{{"k":"evts","v":1,"e":[{{"id":"{}","type":"x","scopeKey":"org-1","lane":"durable","seq":1,"data":{{}},"resources":[],"occurredAt":"2024-01-01T00:00:00Z"}}]}}"#,
            uuid::Uuid::new_v4()
        ),
        "\u{1}\u{2}\u{3}\u{7f}\u{fffd}\u{feff}ÿþ".into(),
        "\\x00\\xff\\xfe binary-looking".into(),
        format!("{}{}", "[".repeat(1000), "]".repeat(1000)),
        "x".repeat(eventrelay::wire::MAX_NOTIFY_PAYLOAD_BYTES),
    ];
    let client = db.connect().await;
    let before = server
        .metric("eventrelay_notifications_malformed_total")
        .await;
    for garbage in &malformed {
        db.notify_sealed(garbage).await;
    }
    // Well-formed pointers that lead nowhere: a seq past every row, and a
    // scope no one watches. They decode, so they are not counted, and
    // deliver nothing. Rows carried into a scope no one watches are
    // dropped unread, so even unreadable ones are not counted.
    for pointer in [
        format!(r#"{{"k":"ptr","s":"org-1","q":{}}}"#, i64::MAX),
        r#"{"k":"ptr","s":"nobody-here","q":1}"#.to_owned(),
        r#"{"k":"ptr","s":"nobody-here","q":1,"x":9,"r":[{"id":"not an event"}]}"#.to_owned(),
    ] {
        db.notify_sealed(&pointer).await;
    }
    let publisher = Publisher::new(db.schema.as_str()).unwrap();
    let mut emitted = Vec::new();
    for n in 0..3 {
        emitted.push(
            publisher
                .emit(
                    &client,
                    NewEvent::durable("after.garbage", "org-1", json!({"n": n})),
                )
                .await
                .unwrap()
                .id
                .to_string(),
        );
    }
    let received: Vec<String> = stream
        .events(3)
        .await
        .iter()
        .map(|f| f.json()["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        received, emitted,
        "the events after the garbage arrive, in order, once"
    );
    // The listener handles notifications in order, so by now every piece of
    // garbage has been judged.
    let counted = server
        .metric("eventrelay_notifications_malformed_total")
        .await
        - before;
    assert_eq!(counted, malformed.len() as f64);
    assert!(server.metric("eventrelay_listener_reconnects_total").await == 0.0);
    // And nothing else is pending for the subscriber: the next event is the
    // next one emitted.
    let last = publisher
        .emit(&client, NewEvent::durable("last", "org-1", json!({})))
        .await
        .unwrap();
    let frame = stream.next_event().await;
    assert_eq!(frame.json()["id"], last.id.to_string());
    eprintln!(
        "bad notifications: {} malformed payloads dropped and counted, 3 stray pointers ignored, \
         {} later events delivered in order",
        malformed.len(),
        emitted.len() + 1
    );
}
