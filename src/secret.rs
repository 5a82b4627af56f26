//! Values that must never be printed: tokens, signing secrets, and the
//! password inside a database URL.
//!
//! Configuration holds them in these wrappers, whose `Debug` and `Display`
//! never show the secret part, so `check-config`, the start-up banner, a
//! log line or a panic message cannot leak one, and a new field of this
//! type cannot forget to be hidden. The value itself is read explicitly,
//! through `Deref` to `str` or [`Secret::expose`]. Serialization keeps the
//! real value, because the configuration's defaults travel through it.

use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

/// A secret string: printed as `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl Deref for Secret {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Secret {
        Secret(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Secret {
        Secret(value.to_owned())
    }
}

/// A Postgres URL, printed with its password (and any `password=`
/// parameter) replaced by `***`, so the rest stays readable.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DatabaseUrl(String);

impl DatabaseUrl {
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL fit for a log line.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl Deref for DatabaseUrl {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl From<String> for DatabaseUrl {
    fn from(value: String) -> DatabaseUrl {
        DatabaseUrl(value)
    }
}

impl From<&str> for DatabaseUrl {
    fn from(value: &str) -> DatabaseUrl {
        DatabaseUrl(value.to_owned())
    }
}

/// The prefixes that make a connection string a URI, as libpq and
/// tokio-postgres tell one (case-sensitively); a connection string without
/// a URL scheme is the `keyword = value` form, even with a `://` inside a
/// value.
const URI_PREFIXES: [&str; 2] = ["postgresql://", "postgres://"];

/// `postgres://user:pw@host/db?password=pw` → `postgres://user:***@host/db?password=***`,
/// and the same for libpq's `keyword = value` form, in every spelling
/// libpq accepts: spaces around `=`, quoted values with escapes, and
/// percent-encoded query keys. The parts are found as the connectors find
/// them: a Postgres URI's credentials run to its first `@`, so a password
/// may hold a `?` or a `/`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url
        .split_once("://")
        .filter(|(scheme, _)| is_scheme(scheme))
    else {
        return redact_keywords(url);
    };
    let credentials_end = if URI_PREFIXES.iter().any(|p| url.starts_with(p)) {
        // tokio-postgres, which the relay connects with, takes the
        // credentials to the first `@` anywhere (libpq only before a `/`):
        // hiding to that one hides the password by either reading.
        rest.find('@')
    } else {
        // Any other URL (a webhook's) as the URL standard reads it: the
        // userinfo runs to the last `@` of the authority.
        let authority = rest.find(['/', '?', '#']).map_or(rest, |end| &rest[..end]);
        authority.rfind('@')
    };
    let (credentials, after) = match credentials_end {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let credentials = match credentials {
        Some(credentials) => match credentials.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => format!("{credentials}@"),
        },
        None => String::new(),
    };
    let (location, query) = match after.split_once('?') {
        Some((location, query)) => (location, Some(query)),
        None => (after, None),
    };
    let location = format!("{credentials}{location}");
    let Some(query) = query else {
        return format!("{scheme}://{location}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if is_password_key(&percent_decoded(key)) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}://{location}?{}", query.join("&"))
}

/// A URL scheme: a letter, then letters, digits, `+`, `-` or `.`; so a
/// keyword string whose value holds `://` is never taken for a URL.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

fn is_password_key(key: &str) -> bool {
    key.trim().eq_ignore_ascii_case("password")
}

/// A URI query key as libpq reads it (`%XX` decoded; anything malformed is
/// kept as written).
fn percent_decoded(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|pair| std::str::from_utf8(pair).ok())
            .and_then(|pair| u8::from_str_radix(pair, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// libpq's `keyword = value` connection string with every password value
/// replaced by `***`. Values are a run of non-space characters or a
/// single-quoted string in which `\'` and `\\` are escapes; an unterminated
/// quote runs to the end, as libpq would reject it anyway.
fn redact_keywords(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let (space, after) = split_space(rest);
        shown.push_str(space);
        let key_len = after
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(after.len());
        let (key, after) = after.split_at(key_len);
        shown.push_str(key);
        let (space, after) = split_space(after);
        shown.push_str(space);
        let Some(after) = after.strip_prefix('=') else {
            rest = after;
            continue;
        };
        shown.push('=');
        let (space, after) = split_space(after);
        shown.push_str(space);
        let value_len = value_length(after);
        let (value, after) = after.split_at(value_len);
        shown.push_str(if is_password_key(key) { "***" } else { value });
        rest = after;
    }
    shown
}

fn split_space(text: &str) -> (&str, &str) {
    let trimmed = text.trim_start();
    text.split_at(text.len() - trimmed.len())
}

/// The byte length of the value at the start of `text`.
fn value_length(text: &str) -> usize {
    if !text.starts_with('\'') {
        return text.find(char::is_whitespace).unwrap_or(text.len());
    }
    let mut escaped = false;
    for (at, c) in text.char_indices().skip(1) {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '\'') => return at + 1,
            _ => {}
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secret = Secret::from("hunter2-hunter2-hunter2");
        assert_eq!(
            format!("{secret:?} {secret} {:?}", Some(&secret)),
            "*** *** Some(***)"
        );
        assert_eq!(secret.expose(), "hunter2-hunter2-hunter2");
        assert_eq!(&*secret, "hunter2-hunter2-hunter2");
    }

    #[test]
    fn database_urls_print_without_their_passwords() {
        for (url, shown) in [
            (
                "postgres://app:pw@db:5432/app",
                "postgres://app:***@db:5432/app",
            ),
            ("postgres://app@db/app", "postgres://app@db/app"),
            (
                "postgres://a:p%40ss@db/app?sslmode=require&password=pw",
                "postgres://a:***@db/app?sslmode=require&password=***",
            ),
            (
                "host=db user=app password=pw",
                "host=db user=app password=***",
            ),
            (
                "host=db user=app password = hunter2 dbname=app",
                "host=db user=app password = *** dbname=app",
            ),
            (
                "host=db password='a b' user=app",
                "host=db password=*** user=app",
            ),
            (
                r"host=db PASSWORD='it\'s \\ secret' sslmode=require",
                "host=db PASSWORD=*** sslmode=require",
            ),
            ("password='unterminated and more", "password=***"),
            (
                "postgres://app@db/app?pass%77ord=X&sslmode=require",
                "postgres://app@db/app?pass%77ord=***&sslmode=require",
            ),
            (
                "postgresql://app@db/app?%70assword=X",
                "postgresql://app@db/app?%70assword=***",
            ),
            // A `://` inside a value does not make a URI.
            (
                "application_name=x://y password=hunter2",
                "application_name=x://y password=***",
            ),
            // A `?` or a `/` in a URI's password is part of it.
            (
                "postgres://app:hun?ter2@db/app",
                "postgres://app:***@db/app",
            ),
            ("postgres://app:pa/ss@db/app", "postgres://app:***@db/app"),
            (
                "postgres://app:pw@db/app?application_name=a@b",
                "postgres://app:***@db/app?application_name=a@b",
            ),
            // A webhook URL: the userinfo runs to the authority's last `@`.
            (
                "https://user:p@ss@hooks.example.com/in?password=x",
                "https://user:***@hooks.example.com/in?password=***",
            ),
        ] {
            let url = DatabaseUrl::from(url);
            assert_eq!(url.to_string(), shown);
            assert_eq!(format!("{url:?}"), format!("{shown:?}"));
        }
    }

    use proptest::prelude::*;

    /// A password as a connection string may carry it: marked, so that
    /// finding it in the output cannot be chance, with the characters that
    /// confuse splitting (`?`, `=`, `&`, `:`, `#`, spaces, quotes).
    fn password() -> impl Strategy<Value = String> {
        "PW[A-Za-z0-9?=&:#!/@+]{4,12}"
    }

    /// Connection strings in the URI form, the credentials and the query
    /// both able to hold a password.
    fn uri() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["postgres://", "postgresql://"]),
            password(),
            prop::sample::select(vec!["db", "db:5432", "127.0.0.1:5432", "h1,h2:5433"]),
            prop::option::of(password()),
            prop::sample::select(vec!["", "application_name=x://y", "sslmode=require"]),
        )
            .prop_map(|(prefix, pw, host, query_pw, extra)| {
                let mut url = format!("{prefix}app:{pw}@{host}/app");
                let mut query: Vec<String> = Vec::new();
                if !extra.is_empty() {
                    query.push(extra.to_owned());
                }
                if let Some(pw) = query_pw {
                    query.push(format!(
                        "password={}",
                        pw.replace('&', "%26").replace('#', "%23")
                    ));
                }
                if !query.is_empty() {
                    url.push('?');
                    url.push_str(&query.join("&"));
                }
                url
            })
    }

    /// Connection strings in the `keyword = value` form, the password
    /// quoted or bare, with spaces around `=`, and a value holding `://`.
    fn keywords() -> impl Strategy<Value = String> {
        (
            password(),
            any::<bool>(),
            prop::sample::select(vec!["=", " = ", "= "]),
            prop::sample::select(vec![
                "",
                "application_name=x://y ",
                "application_name='a b' ",
            ]),
        )
            .prop_map(|(pw, quoted, equals, extra)| {
                let value = if quoted { format!("'{} \\'q'", pw) } else { pw };
                format!("{extra}host=db user=app password{equals}{value} dbname=app")
            })
    }

    proptest! {
        /// Whatever password tokio-postgres would connect with never
        /// appears in what is printed.
        #[test]
        fn no_password_the_connector_reads_is_printed(text in prop_oneof![uri(), keywords()]) {
            // Strings the connector refuses are never connected with.
            let Ok(config) = text.parse::<tokio_postgres::Config>() else {
                return Ok(());
            };
            let Some(password) = config.get_password() else {
                return Ok(());
            };
            let password = String::from_utf8_lossy(password).into_owned();
            let shown = DatabaseUrl::from(text.as_str()).to_string();
            prop_assert!(!shown.contains(&password), "{} shown as {}", text, shown);
            prop_assert!(!shown.contains("PW"), "{} shown as {}", text, shown);
        }
    }
}
