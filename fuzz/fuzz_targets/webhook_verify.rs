//! Standard Webhooks verification against a fixed secret and a fixed `now`.
//!
//! Input: one mode byte, then `id`, `timestamp` and `signature` header values
//! separated by `\n` (header values cannot hold a line break), then the body
//! (any bytes, after the third `\n`).
//!
//! * Mode bit 0 clear: the headers are used as given. `verify_at` must never
//!   panic, must give exactly the error its contract names, and may accept
//!   only when one space-separated candidate is the true `v1,` signature of
//!   (id, timestamp, body), so arbitrary input never verifies.
//! * Mode bit 0 set: the message is signed correctly (at the given timestamp
//!   when it is valid and in tolerance, else at `now`) and the signature is
//!   appended to the given candidates: it must verify, and once the body, id
//!   or timestamp change it must give what the oracle says (only a planted
//!   true signature of the changed message may verify it).
//! * Mode bit 1 set: the id is also parsed as a secret, which must not panic
//!   and, when accepted, must survive `to_whsec` and back.
#![no_main]

use eventrelay_wire::webhook::{
    TIMESTAMP_TOLERANCE_SECS, VerifyError, WebhookHeaders, WebhookSecret, sign, verify_at,
};
use libfuzzer_sys::fuzz_target;

/// The Standard Webhooks documentation's example secret.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// 2023-11-14T22:13:20Z.
const NOW: i64 = 1_700_000_000;

fn expected(
    secret: &WebhookSecret,
    headers: WebhookHeaders<'_>,
    body: &[u8],
) -> Result<(), VerifyError> {
    if headers.id.is_empty() {
        return Err(VerifyError::MissingId);
    }
    let Ok(timestamp) = headers.timestamp.trim().parse::<i64>() else {
        return Err(VerifyError::InvalidTimestamp);
    };
    if timestamp < NOW - TIMESTAMP_TOLERANCE_SECS {
        return Err(VerifyError::TimestampTooOld);
    }
    if timestamp > NOW + TIMESTAMP_TOLERANCE_SECS {
        return Err(VerifyError::TimestampTooNew);
    }
    let good = sign(secret, headers.id, timestamp, body);
    if headers.signature.split(' ').any(|candidate| candidate == good) {
        Ok(())
    } else {
        Err(VerifyError::NoMatchingSignature)
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut parts = rest.splitn(4, |&b| b == b'\n');
    let id = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let timestamp = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let signature = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let body = parts.next().unwrap_or_default();
    let secret = WebhookSecret::parse(SECRET).unwrap();

    if mode & 2 != 0 {
        if let Ok(parsed) = WebhookSecret::parse(&id) {
            assert_eq!(WebhookSecret::parse(&parsed.to_whsec()), Ok(parsed));
        }
    }

    if mode & 1 == 0 {
        let headers = WebhookHeaders {
            id: &id,
            timestamp: &timestamp,
            signature: &signature,
        };
        assert_eq!(
            verify_at(&secret, headers, body, NOW),
            expected(&secret, headers, body),
            "headers: {headers:?}, body: {body:?}"
        );
        return;
    }

    let (at, timestamp) = match timestamp.trim().parse::<i64>() {
        Ok(t) if (NOW - TIMESTAMP_TOLERANCE_SECS..=NOW + TIMESTAMP_TOLERANCE_SECS).contains(&t) => {
            (t, timestamp.into_owned())
        }
        _ => (NOW, NOW.to_string()),
    };
    let good = sign(&secret, &id, at, body);
    let signature = if signature.is_empty() {
        good.clone()
    } else {
        format!("{signature} {good}")
    };
    let headers = WebhookHeaders {
        id: &id,
        timestamp: &timestamp,
        signature: &signature,
    };
    let result = verify_at(&secret, headers, body, NOW);
    if id.is_empty() {
        assert_eq!(result, Err(VerifyError::MissingId));
        return;
    }
    assert_eq!(result, Ok(()), "correctly signed message rejected: {headers:?}, body: {body:?}");

    // Changing the body, the id or the timestamp must break the signature.
    // The oracle decides, not a flat "must fail": libFuzzer sees the oracle's
    // string comparisons and can plant the true signature of a changed message
    // among the given candidates, and then it rightly verifies.
    let mut other_body = body.to_vec();
    other_body.push(b'x');
    let changed_body = verify_at(&secret, headers, &other_body, NOW);
    assert_eq!(changed_body, expected(&secret, headers, &other_body), "changed body");
    let other_id = format!("{id}x");
    let changed_id = WebhookHeaders { id: &other_id, ..headers };
    assert_eq!(
        verify_at(&secret, changed_id, body, NOW),
        expected(&secret, changed_id, body),
        "changed id"
    );
    let other_at = if at > NOW - TIMESTAMP_TOLERANCE_SECS { at - 1 } else { at + 1 };
    let other_timestamp = other_at.to_string();
    let changed_timestamp = WebhookHeaders { timestamp: &other_timestamp, ..headers };
    assert_eq!(
        verify_at(&secret, changed_timestamp, body, NOW),
        expected(&secret, changed_timestamp, body),
        "changed timestamp"
    );
    if !signature.contains(' ') {
        // Only the true signature was given: nothing else may verify.
        assert!(changed_body.is_err(), "changed body verified");
    }
});
