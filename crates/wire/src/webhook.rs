//! Standard Webhooks signing and verification.
//!
//! The signed content is `"{webhook-id}.{webhook-timestamp}.{body}"`, signed
//! with HMAC-SHA256 and sent as `webhook-signature: v1,<base64>`. A receiver
//! accepts any of several space-separated signatures, so a sender can sign
//! with an old and a new secret while a rotation is under way.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How far a `webhook-timestamp` may be from the receiver's clock.
pub const TIMESTAMP_TOLERANCE_SECS: i64 = 5 * 60;

/// The fewest bytes a signing secret may have when a subscription is given
/// one: 24 bytes (192 bits) keep a forged HMAC-SHA256 signature out of
/// reach of guessing the secret. Counted after decoding, so `whsec_` plus
/// 32 base64 characters is the shortest `whsec_` secret.
pub const MIN_SECRET_BYTES: usize = 24;

const SECRET_PREFIX: &str = "whsec_";
const SIGNATURE_VERSION: &str = "v1,";

/// A signing secret. `whsec_…` secrets are base64 and used as their decoded
/// bytes; any other string is used as its UTF-8 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(..)")
    }
}

/// Why a secret is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("webhook secret must not be empty")]
    Empty,
    #[error("a whsec_ secret must be base64 after the prefix")]
    InvalidBase64,
    #[error(
        "webhook secret is {bytes} bytes; at least {MIN_SECRET_BYTES} are needed \
         (a whsec_ secret counts its decoded bytes, any other its UTF-8 bytes)"
    )]
    TooShort { bytes: usize },
    #[error(
        "webhook secret is one character repeated, or whitespace around one: \
         {MIN_SECRET_BYTES} bytes of it must vary (let eventrelay generate one)"
    )]
    Uniform,
}

impl WebhookSecret {
    /// Parses a secret as configured.
    pub fn parse(secret: &str) -> Result<Self, SecretError> {
        let bytes = match secret.strip_prefix(SECRET_PREFIX) {
            Some(encoded) => STANDARD
                .decode(encoded)
                .map_err(|_| SecretError::InvalidBase64)?,
            None => secret.as_bytes().to_vec(),
        };
        if bytes.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(WebhookSecret(bytes))
    }

    /// Parses a secret given to a subscription: as [`parse`], and refused
    /// when shorter than [`MIN_SECRET_BYTES`]. Signing and
    /// verifying still accept any secret [`parse`] does, so a receiver or a
    /// subscription stored before this rule keeps working.
    ///
    /// [`parse`]: WebhookSecret::parse
    pub fn parse_for_subscription(secret: &str) -> Result<Self, SecretError> {
        let parsed = Self::parse(secret)?;
        if parsed.0.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                bytes: parsed.0.len(),
            });
        }
        // Length alone lets through 24 spaces or `aaaa…`: what remains
        // without whitespace must be long enough and not one character
        // (of a text secret) or byte (of a `whsec_` one) repeated.
        let (bytes, uniform) = if secret.starts_with(SECRET_PREFIX) {
            (parsed.0.len(), parsed.0.iter().all(|b| *b == parsed.0[0]))
        } else {
            let mut content = secret.chars().filter(|c| !c.is_whitespace());
            let first = content.clone().next();
            let bytes = content.clone().map(char::len_utf8).sum();
            (bytes, content.all(|c| Some(c) == first))
        };
        if bytes < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort { bytes });
        }
        if uniform {
            return Err(SecretError::Uniform);
        }
        Ok(parsed)
    }

    /// Uses raw key bytes.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Self {
        WebhookSecret(bytes.into())
    }

    /// The secret in `whsec_` form, for handing to a receiver.
    pub fn to_whsec(&self) -> String {
        format!("{SECRET_PREFIX}{}", STANDARD.encode(&self.0))
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail.
        #[allow(
            clippy::expect_used,
            reason = "HMAC accepts keys of any length; new_from_slice only fails for fixed-size MACs"
        )]
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

/// The signature for one message, as `v1,<base64>`.
pub fn sign(secret: &WebhookSecret, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = secret.mac(msg_id, timestamp, body).finalize().into_bytes();
    format!("{SIGNATURE_VERSION}{}", STANDARD.encode(tag))
}

/// The three Standard Webhooks headers of a received request.
#[derive(Debug, Clone, Copy)]
pub struct WebhookHeaders<'a> {
    /// `webhook-id`
    pub id: &'a str,
    /// `webhook-timestamp` (seconds since the Unix epoch)
    pub timestamp: &'a str,
    /// `webhook-signature` (one or more space-separated signatures)
    pub signature: &'a str,
}

/// Why a received webhook was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("webhook-id is empty")]
    MissingId,
    #[error("webhook-timestamp is not an integer number of seconds")]
    InvalidTimestamp,
    #[error("webhook-timestamp is more than 5 minutes old")]
    TimestampTooOld,
    #[error("webhook-timestamp is more than 5 minutes in the future")]
    TimestampTooNew,
    #[error("no v1 signature in webhook-signature matches")]
    NoMatchingSignature,
}

/// Verifies a received webhook against the receiver's clock.
pub fn verify(
    secret: &WebhookSecret,
    headers: WebhookHeaders<'_>,
    body: &[u8],
) -> Result<(), VerifyError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    verify_at(secret, headers, body, now)
}

/// Verifies a received webhook as if the time were `now` (Unix seconds).
///
/// Every candidate is compared in constant time, so the comparison leaks
/// nothing about how much of a forged signature was right.
pub fn verify_at(
    secret: &WebhookSecret,
    headers: WebhookHeaders<'_>,
    body: &[u8],
    now: i64,
) -> Result<(), VerifyError> {
    if headers.id.is_empty() {
        return Err(VerifyError::MissingId);
    }
    let timestamp: i64 = headers
        .timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::InvalidTimestamp)?;
    if timestamp < now.saturating_sub(TIMESTAMP_TOLERANCE_SECS) {
        return Err(VerifyError::TimestampTooOld);
    }
    if timestamp > now.saturating_add(TIMESTAMP_TOLERANCE_SECS) {
        return Err(VerifyError::TimestampTooNew);
    }
    let expected = secret.mac(headers.id, timestamp, body);
    let matched = headers
        .signature
        .split(' ')
        .filter_map(|candidate| candidate.strip_prefix(SIGNATURE_VERSION))
        .filter_map(|encoded| STANDARD.decode(encoded).ok())
        .any(|tag| expected.clone().verify_slice(&tag).is_ok());
    if matched {
        Ok(())
    } else {
        Err(VerifyError::NoMatchingSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example published by the Standard Webhooks project.
    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_TIMESTAMP: i64 = 1614265330;
    const VECTOR_BODY: &[u8] = br#"{"test": 2432232314}"#;
    const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn headers<'a>(timestamp: &'a str, signature: &'a str) -> WebhookHeaders<'a> {
        WebhookHeaders {
            id: VECTOR_ID,
            timestamp,
            signature,
        }
    }

    #[test]
    fn a_subscription_secret_must_vary_beyond_whitespace() {
        let weak = [
            (" ".repeat(24), SecretError::TooShort { bytes: 0 }),
            ("a".repeat(30), SecretError::Uniform),
            (format!("  {}  ", "z".repeat(24)), SecretError::Uniform),
            (
                format!("{SECRET_PREFIX}{}", STANDARD.encode([7u8; 32])),
                SecretError::Uniform,
            ),
            (
                format!("ab cd ef {}", " ".repeat(20)),
                SecretError::TooShort { bytes: 6 },
            ),
        ];
        for (secret, why) in weak {
            assert_eq!(
                WebhookSecret::parse_for_subscription(&secret).err(),
                Some(why),
                "{secret:?}"
            );
        }
        for strong in ["correct horse battery staple", VECTOR_SECRET] {
            assert!(
                WebhookSecret::parse_for_subscription(strong).is_ok(),
                "{strong}"
            );
        }
    }

    #[test]
    fn signs_the_published_test_vector() {
        let secret = WebhookSecret::parse(VECTOR_SECRET).unwrap();
        assert_eq!(
            sign(&secret, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY),
            VECTOR_SIGNATURE
        );
        assert_eq!(
            verify_at(
                &secret,
                headers("1614265330", VECTOR_SIGNATURE),
                VECTOR_BODY,
                VECTOR_TIMESTAMP
            ),
            Ok(())
        );
    }

    #[test]
    fn accepts_any_of_several_signatures() {
        let secret = WebhookSecret::parse(VECTOR_SECRET).unwrap();
        let header = format!("v1,bm90IGl0 v2,xyz {VECTOR_SIGNATURE}");
        assert_eq!(
            verify_at(
                &secret,
                headers("1614265330", &header),
                VECTOR_BODY,
                VECTOR_TIMESTAMP
            ),
            Ok(())
        );
    }

    #[test]
    fn refuses_tampering_and_stale_or_future_timestamps() {
        let secret = WebhookSecret::parse(VECTOR_SECRET).unwrap();
        let ok = headers("1614265330", VECTOR_SIGNATURE);
        assert_eq!(
            verify_at(&secret, ok, br#"{"test": 2432232315}"#, VECTOR_TIMESTAMP),
            Err(VerifyError::NoMatchingSignature)
        );
        assert_eq!(
            verify_at(&secret, ok, VECTOR_BODY, VECTOR_TIMESTAMP + 301),
            Err(VerifyError::TimestampTooOld)
        );
        assert_eq!(
            verify_at(&secret, ok, VECTOR_BODY, VECTOR_TIMESTAMP - 301),
            Err(VerifyError::TimestampTooNew)
        );
        assert_eq!(
            verify_at(&secret, ok, VECTOR_BODY, VECTOR_TIMESTAMP + 300),
            Ok(())
        );
        assert_eq!(
            verify_at(&secret, headers("soon", VECTOR_SIGNATURE), VECTOR_BODY, 0),
            Err(VerifyError::InvalidTimestamp)
        );
        let other = WebhookSecret::parse("whsec_c2Vjb25k").unwrap();
        assert_eq!(
            verify_at(&other, ok, VECTOR_BODY, VECTOR_TIMESTAMP),
            Err(VerifyError::NoMatchingSignature)
        );
    }

    #[test]
    fn plain_secrets_are_utf8_and_whsec_secrets_are_base64() {
        let plain = WebhookSecret::parse("not-prefixed").unwrap();
        assert_eq!(plain, WebhookSecret::from_bytes(b"not-prefixed".to_vec()));
        assert_eq!(
            WebhookSecret::parse("whsec_!!!"),
            Err(SecretError::InvalidBase64)
        );
        assert_eq!(WebhookSecret::parse(""), Err(SecretError::Empty));
        let round = WebhookSecret::parse(&plain.to_whsec()).unwrap();
        assert_eq!(round, plain);
    }

    #[test]
    fn a_secret_to_sign_with_has_at_least_24_bytes_in_either_form() {
        let plain = |n: usize| (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        let whsec =
            |n: usize| WebhookSecret::from_bytes((0..n as u8).collect::<Vec<_>>()).to_whsec();
        for short in [plain(23), whsec(23)] {
            assert_eq!(
                WebhookSecret::parse_for_subscription(&short),
                Err(SecretError::TooShort { bytes: 23 }),
                "{short}"
            );
            // Still usable to verify with, as before.
            WebhookSecret::parse(&short).unwrap();
        }
        for enough in [plain(24), whsec(24), VECTOR_SECRET.to_owned()] {
            WebhookSecret::parse_for_subscription(&enough).unwrap();
        }
        // 24 characters of which some are multi-byte count their bytes.
        WebhookSecret::parse_for_subscription(&"éè".repeat(6)).unwrap();
        assert_eq!(
            WebhookSecret::parse_for_subscription(&"éè".repeat(5)),
            Err(SecretError::TooShort { bytes: 20 })
        );
        assert_eq!(
            WebhookSecret::parse_for_subscription(&"é".repeat(12)),
            Err(SecretError::Uniform)
        );
        assert_eq!(
            WebhookSecret::parse_for_subscription("whsec_!!!"),
            Err(SecretError::InvalidBase64)
        );
    }
}
