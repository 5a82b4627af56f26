//! SQL identifiers that come from configuration (the schema name, the
//! notification channel), checked once so they can be spliced into SQL.

use std::fmt;

/// A lower-case Postgres identifier: `[a-z_][a-z0-9_]*`, at most 63 bytes.
///
/// The narrow alphabet means the name needs no quoting rules and reads the
/// same in SQL, in `LISTEN` and in logs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identifier(String);

/// Why a configured name is not a usable identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a valid name: use 1 to 63 lower-case letters, digits and underscores, not starting with a digit"
)]
pub struct IdentifierError(pub String);

impl Identifier {
    pub fn new(name: &str) -> Result<Self, IdentifierError> {
        let mut chars = name.chars();
        let valid_start = chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let valid_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if valid_start && valid_rest && name.len() <= 63 {
            Ok(Identifier(name.to_owned()))
        } else {
            Err(IdentifierError(name.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Identifier {
    type Err = IdentifierError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Identifier::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_refuses_the_rest() {
        for ok in ["eventrelay", "_x", "app_events_2"] {
            assert!(Identifier::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1abc", "Upper", "a-b", "a\"b", "a b", &"x".repeat(64)] {
            assert!(Identifier::new(bad).is_err(), "{bad}");
        }
    }
}
