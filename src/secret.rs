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

/// `postgres://user:pw@host/db?password=pw` → `postgres://user:***@host/db?password=***`,
/// and the same for the `key=value` form.
pub fn redact_url(url: &str) -> String {
    let hide_parameters = |text: &str, separator: char| -> String {
        text.split(separator)
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.trim().eq_ignore_ascii_case("password") => {
                    format!("{key}=***")
                }
                _ => pair.to_owned(),
            })
            .collect::<Vec<_>>()
            .join(&separator.to_string())
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return hide_parameters(url, ' ');
    };
    let (location, query) = match rest.split_once('?') {
        Some((location, query)) => (location, Some(query)),
        None => (rest, None),
    };
    let location = match location.rsplit_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("{credentials}@{host}"),
        },
        None => location.to_owned(),
    };
    match query {
        Some(query) => format!("{scheme}://{location}?{}", hide_parameters(query, '&')),
        None => format!("{scheme}://{location}"),
    }
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
        ] {
            let url = DatabaseUrl::from(url);
            assert_eq!(url.to_string(), shown);
            assert_eq!(format!("{url:?}"), format!("{shown:?}"));
        }
    }
}
