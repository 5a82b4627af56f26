//! Integers that a JSON number cannot carry to a browser exactly.
//!
//! JavaScript reads every JSON number as a double, which holds each integer
//! only up to 2^53 (9007199254740992) in magnitude: a larger one, such as a
//! 64-bit id in an event's `data`, reaches a page silently rounded to a
//! neighbour. The publish API refuses a body holding one rather than relay
//! a value its subscribers would read wrong; the sender can put it in a
//! string. Numbers with a fraction or an exponent are left alone: whoever
//! writes one has chosen a double's precision.
//!
//! The body is scanned as text, after it parsed as JSON, so an integer too
//! large for any Rust integer (which serde_json would turn into a float) is
//! caught as well.

/// The largest magnitude of an integer JavaScript holds exactly: 2^53.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// 2^53 in decimal, as long as any integer within bounds can be.
const LIMIT_DIGITS: &[u8] = b"9007199254740992";

/// The first integer literal in `json` whose magnitude is above
/// [`MAX_EXACT_INTEGER`], as written (sign included).
///
/// `json` must be valid JSON (parse it first): outside strings, every digit
/// then belongs to a number, and a number has no leading zeros.
pub fn inexact_integer(json: &[u8]) -> Option<&str> {
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        match byte {
            b'"' => at = after_string(json, at + 1),
            b'-' | b'0'..=b'9' => {
                let start = at;
                at += 1;
                while json
                    .get(at)
                    .is_some_and(|b| matches!(b, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-'))
                {
                    at += 1;
                }
                let number = &json[start..at];
                if is_inexact_integer(number) {
                    return std::str::from_utf8(number).ok();
                }
            }
            _ => at += 1,
        }
    }
    None
}

/// The index just past the string whose contents start at `at`.
fn after_string(json: &[u8], mut at: usize) -> usize {
    while let Some(&byte) = json.get(at) {
        match byte {
            b'\\' => at += 2,
            b'"' => return at + 1,
            _ => at += 1,
        }
    }
    at
}

/// True for an integer literal (no fraction, no exponent) above 2^53 in
/// magnitude.
fn is_inexact_integer(number: &[u8]) -> bool {
    if number.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        return false;
    }
    let digits = number.strip_prefix(b"-").unwrap_or(number);
    // Without leading zeros, more digits is larger, and at equal length
    // the byte order is the numeric order.
    match digits.len().cmp(&LIMIT_DIGITS.len()) {
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Equal => digits > LIMIT_DIGITS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_two_to_the_53() {
        assert_eq!(LIMIT_DIGITS, MAX_EXACT_INTEGER.to_string().as_bytes());
        // The first integer a double cannot hold.
        assert_eq!((MAX_EXACT_INTEGER + 1) as f64 as u64, MAX_EXACT_INTEGER);
    }

    #[test]
    fn integers_up_to_two_to_the_53_pass_and_larger_ones_are_found() {
        for fine in [
            "0",
            "-0",
            "9007199254740992",
            "-9007199254740992",
            "999999999999999",
            r#"{"n": 9007199254740991, "m": [1, -2, 3]}"#,
            // Floats are left alone, however large.
            "9007199254740993.0",
            "1e300",
            "-12345678901234567890E-2",
            // Digits in strings are text.
            r#"{"id": "9007199254740993", "q": "\"12345678901234567890\""}"#,
            r#"{"9007199254740993": true}"#,
        ] {
            assert_eq!(inexact_integer(fine.as_bytes()), None, "{fine}");
        }
        for (body, found) in [
            ("9007199254740993", "9007199254740993"),
            ("-9007199254740993", "-9007199254740993"),
            (r#"{"n": 10000000000000000}"#, "10000000000000000"),
            (
                r#"[{"data": {"big": [1, 18446744073709551615]}}]"#,
                "18446744073709551615",
            ),
            // Beyond every Rust integer too.
            (
                r#"{"n": 123456789012345678901234567890}"#,
                "123456789012345678901234567890",
            ),
            (r#"{"s": "a\\", "n": 9999999999999999}"#, "9999999999999999"),
            ("[1.5, 2e3, 9007199254740993]", "9007199254740993"),
        ] {
            assert_eq!(inexact_integer(body.as_bytes()), Some(found), "{body}");
        }
    }

    #[test]
    fn what_is_found_is_what_serde_json_rounds() {
        for n in [
            "9007199254740993",
            "-9007199254740995",
            "18446744073709551615",
        ] {
            let value: serde_json::Value = serde_json::from_str(n).unwrap();
            assert_ne!(value.as_f64().unwrap().to_string(), n);
            assert_eq!(inexact_integer(n.as_bytes()), Some(n));
        }
    }
}
