//! The origin rules of `http.allowed_origins`: exact origins,
//! `https://*.example.com` subdomain patterns, or `*` alone. Parsed when
//! the configuration is validated, so a bad entry stops the relay at start
//! (and `check-config`), and matched by the CORS policy on every request.

use std::fmt;
use std::net::Ipv6Addr;

/// Why an `http.allowed_origins` entry is refused; the message says what a
/// valid entry looks like.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginPatternError {
    #[error(
        "`*` lets every site read the stream, so it cannot go with credentials: \
         set http.allow_credentials = false to use it (bearer tokens still work), \
         or list the origins"
    )]
    AnyWithCredentials,
    #[error("`*` allows every origin already; list it alone")]
    AnyAmongOthers,
    #[error("{entry:?}: {reason}")]
    Malformed { entry: String, reason: &'static str },
}

fn malformed(entry: &str, reason: &'static str) -> OriginPatternError {
    OriginPatternError::Malformed {
        entry: entry.to_owned(),
        reason,
    }
}

/// A serialized origin, `scheme://host[:port]`, normalized the way browsers
/// send it in `Origin`: lower case, without a default port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Origin {
    https: bool,
    host: String,
    port: Option<u16>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}", self.host)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// One rule of `http.allowed_origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OriginRule {
    /// Exactly this origin.
    Exact(Origin),
    /// Any host one or more labels below `suffix` (`*.example.com` takes
    /// `a.example.com` and `a.b.example.com`, never `example.com`), with
    /// this scheme and port.
    Subdomains {
        https: bool,
        suffix: String,
        port: Option<u16>,
    },
}

impl OriginRule {
    fn allows(&self, origin: &Origin) -> bool {
        match self {
            OriginRule::Exact(exact) => exact == origin,
            OriginRule::Subdomains {
                https,
                suffix,
                port,
            } => {
                *https == origin.https
                    && *port == origin.port
                    && origin
                        .host
                        .strip_suffix(suffix.as_str())
                        .and_then(|rest| rest.strip_suffix('.'))
                        .is_some_and(|labels| !labels.is_empty())
            }
        }
    }
}

/// The parsed `http.allowed_origins`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OriginRules {
    rules: Vec<OriginRule>,
    any: bool,
}

impl OriginRules {
    /// Parses every entry; `credentials` is `http.allow_credentials`, which
    /// `*` refuses.
    pub fn parse(entries: &[String], credentials: bool) -> Result<Self, OriginPatternError> {
        if entries.iter().any(|entry| entry == "*") {
            if entries.len() > 1 {
                return Err(OriginPatternError::AnyAmongOthers);
            }
            if credentials {
                return Err(OriginPatternError::AnyWithCredentials);
            }
            return Ok(OriginRules {
                rules: Vec::new(),
                any: true,
            });
        }
        let rules = entries
            .iter()
            .map(|entry| parse_rule(entry))
            .collect::<Result<_, _>>()?;
        Ok(OriginRules { rules, any: false })
    }

    /// Whether the `Origin` header value `origin` may read the stream.
    pub fn allows(&self, origin: &str) -> bool {
        if self.any {
            return true;
        }
        let Ok(origin) = parse_origin(origin, false) else {
            return false;
        };
        self.rules.iter().any(|rule| rule.allows(&origin))
    }

    /// True for `*`.
    pub fn allows_any(&self) -> bool {
        self.any
    }

    /// True when no cross-origin access is configured.
    pub fn is_empty(&self) -> bool {
        !self.any && self.rules.is_empty()
    }
}

fn parse_rule(entry: &str) -> Result<OriginRule, OriginPatternError> {
    let origin = parse_origin(entry, true)?;
    Ok(match origin.host.strip_prefix("*.") {
        Some(suffix) => OriginRule::Subdomains {
            https: origin.https,
            suffix: suffix.to_owned(),
            port: origin.port,
        },
        None => OriginRule::Exact(origin),
    })
}

/// Parses `scheme://host[:port]`. With `pattern`, the host may start with
/// `*.` (and then needs at least two labels after it).
fn parse_origin(text: &str, pattern: bool) -> Result<Origin, OriginPatternError> {
    let bad = |reason| Err(malformed(text, reason));
    if text == "null" {
        return bad(
            "`null` is the origin of sandboxed frames and local files, which any page can \
             produce; it cannot be allowed",
        );
    }
    let Some((scheme, rest)) = text.split_once("://") else {
        return bad("an origin is scheme://host[:port], such as https://app.example.com");
    };
    let https = match scheme.to_ascii_lowercase().as_str() {
        "https" => true,
        "http" => false,
        _ => return bad("the scheme must be http or https"),
    };
    if rest.contains('/') {
        return bad("an origin has no path, not even a trailing `/`");
    }
    if rest.contains(['?', '#']) {
        return bad("an origin has no query or fragment");
    }
    if rest.contains('@') {
        return bad("an origin has no user name or password");
    }
    if !rest.is_ascii() {
        return bad("write an international host name in its xn-- (punycode) form");
    }
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let Some((address, after)) = bracketed.split_once(']') else {
            return bad("an IPv6 host needs its closing `]`");
        };
        let Ok(address) = address.parse::<Ipv6Addr>() else {
            return bad("not an IPv6 address between the brackets");
        };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(port) => Some(port),
                None => return bad("only a `:port` may follow the host"),
            },
        };
        (format!("[{address}]"), port)
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
            None => (rest.to_ascii_lowercase(), None),
        }
    };
    let port = match port {
        None => None,
        Some(port) => match port.parse::<u16>() {
            Ok(0) | Err(_) => return bad("the port must be a number from 1 to 65535"),
            // Browsers leave the default port out of `Origin`.
            Ok(443) if https => None,
            Ok(80) if !https => None,
            Ok(port) => Some(port),
        },
    };
    if !host.starts_with('[') {
        let name = match host.strip_prefix("*.") {
            Some(suffix) if pattern => {
                if suffix.split('.').count() < 2 {
                    return bad(
                        "a `*.` pattern needs a domain of at least two labels after it, \
                         such as https://*.example.com",
                    );
                }
                suffix
            }
            _ => host.as_str(),
        };
        if name.contains('*') {
            return bad("`*` may only stand for the leftmost labels, as in https://*.example.com");
        }
        if !is_host_name(name) {
            return bad(
                "the host must be a domain name or an IP address (letters, digits, `-` and `.`)",
            );
        }
    }
    Ok(Origin { https, host, port })
}

/// Whether `name` is a DNS name (or an IPv4 address): dot-separated labels
/// of 1 to 63 letters, digits and inner hyphens, 253 bytes at most.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}
