//! Sealed notifications: what makes the channel useless to a stranger.
//!
//! Any role that can log in to a Postgres database may `LISTEN` on any
//! channel and `NOTIFY` any payload, so the channel itself proves nothing.
//! eventrelay's SQL functions therefore seal every payload they send with a
//! key only the schema's owner and the relay's role can read: AES-256-CBC
//! with a random IV, then HMAC-SHA256 over the IV and the ciphertext
//! (encrypt-then-MAC, the construction pgcrypto's primitives allow), the
//! whole in standard base64 so it stays text:
//!
//! ```text
//! base64( iv[16] || ciphertext || hmac_sha256(mac_key, iv || ciphertext)[32] )
//! ```
//!
//! The plaintext is one letter of [`Origin`] and then the notification:
//! whoever may call the function that sealed it decides what it may say,
//! so an emitter that may send ephemeral events cannot have a pointer
//! sealed.
//!
//! The 64-byte key is the AES key followed by the MAC key. A relay opens
//! each payload before decoding it; one that does not open (forged,
//! truncated, or sealed with another key) is dropped and counted. Base64
//! costs a third, so a sealed payload of at most 7,999 bytes (Postgres's
//! limit) holds at most [`MAX_SEALED_PLAINTEXT_BYTES`] of notification.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::Pkcs7};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::notification::POSTGRES_NOTIFY_LIMIT_BYTES;

/// The key's length: a 32-byte AES-256 key, then a 32-byte HMAC key.
pub const SEAL_KEY_BYTES: usize = 64;
const IV_BYTES: usize = 16;
const TAG_BYTES: usize = 32;
const BLOCK_BYTES: usize = 16;

/// The longest notification that still fits once sealed: base64 of the IV,
/// the padded ciphertext of the origin letter and the notification (PKCS#7
/// always adds 1 to 16 bytes) and the tag must stay within
/// [`POSTGRES_NOTIFY_LIMIT_BYTES`].
pub const MAX_SEALED_PLAINTEXT_BYTES: usize = {
    let raw = POSTGRES_NOTIFY_LIMIT_BYTES / 4 * 3;
    let ciphertext = (raw - IV_BYTES - TAG_BYTES) / BLOCK_BYTES * BLOCK_BYTES;
    ciphertext - 1 - 1
};

/// The length of a notification of `len` bytes once sealed: what a
/// reader may allow before opening.
pub const fn sealed_len(len: usize) -> usize {
    let ciphertext = (len + 1) / BLOCK_BYTES * BLOCK_BYTES + BLOCK_BYTES;
    (IV_BYTES + ciphertext + TAG_BYTES).div_ceil(3) * 4
}

/// Who chose a sealed notification's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// eventrelay's own functions, from committed rows: pointers and `due`.
    Rows,
    /// An emitter's encoded ephemeral event(s), sealed as given: a relay
    /// accepts nothing else from this origin.
    Emitter,
}

impl Origin {
    fn letter(self) -> u8 {
        match self {
            Origin::Rows => b'P',
            Origin::Emitter => b'E',
        }
    }
}

type Encryptor = cbc::Encryptor<aes::Aes256>;
type Decryptor = cbc::Decryptor<aes::Aes256>;

/// Why a payload did not open. Every case means the payload is dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("the key must be {SEAL_KEY_BYTES} bytes, got {0}")]
    KeyLength(usize),
    #[error("payload is not sealed (not base64)")]
    NotBase64,
    #[error("payload is too short to be sealed")]
    TooShort,
    #[error("payload's authentication tag does not match: not sealed with this relay's key")]
    BadTag,
    #[error("payload's ciphertext is malformed")]
    BadCiphertext,
    #[error("sealed payload is not UTF-8")]
    NotUtf8,
    #[error("sealed payload names no known origin")]
    UnknownOrigin,
}

impl SealError {
    /// A short, stable name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            SealError::KeyLength(_) => "key_length",
            SealError::NotBase64 | SealError::TooShort => "not_sealed",
            SealError::BadTag => "bad_tag",
            SealError::BadCiphertext | SealError::NotUtf8 | SealError::UnknownOrigin => {
                "bad_ciphertext"
            }
        }
    }
}

/// The channel key: opens what eventrelay's SQL functions sealed.
#[derive(Clone)]
pub struct SealKey {
    cipher: [u8; 32],
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(***)")
    }
}

impl SealKey {
    /// The key as stored in the schema's `notify_key` table.
    pub fn new(key: &[u8]) -> Result<Self, SealError> {
        if key.len() != SEAL_KEY_BYTES {
            return Err(SealError::KeyLength(key.len()));
        }
        let mut cipher = [0u8; 32];
        cipher.copy_from_slice(&key[..32]);
        let mac =
            Hmac::<Sha256>::new_from_slice(&key[32..]).map_err(|_| SealError::KeyLength(0))?;
        Ok(SealKey { cipher, mac })
    }

    /// Checks the tag (in constant time) before decrypting anything, and
    /// returns the notification inside and who chose it.
    pub fn open(&self, payload: &str) -> Result<(Origin, String), SealError> {
        let raw = STANDARD
            .decode(payload.as_bytes())
            .map_err(|_| SealError::NotBase64)?;
        if raw.len() < IV_BYTES + BLOCK_BYTES + TAG_BYTES {
            return Err(SealError::TooShort);
        }
        let (sealed, tag) = raw.split_at(raw.len() - TAG_BYTES);
        let mut mac = self.mac.clone();
        mac.update(sealed);
        mac.verify_slice(tag).map_err(|_| SealError::BadTag)?;
        let (iv, ciphertext) = sealed.split_at(IV_BYTES);
        let plain = Decryptor::new(&self.cipher.into(), iv.into())
            .decrypt_padded_vec_mut::<Pkcs7>(ciphertext)
            .map_err(|_| SealError::BadCiphertext)?;
        let origin = match plain.first() {
            Some(b'P') => Origin::Rows,
            Some(b'E') => Origin::Emitter,
            _ => return Err(SealError::UnknownOrigin),
        };
        let mut text = String::from_utf8(plain).map_err(|_| SealError::NotUtf8)?;
        text.remove(0);
        Ok((origin, text))
    }

    /// Seals `plaintext` as the SQL side does, with `iv`, which must be
    /// unpredictable (random) and never reused. For writers other than the
    /// SQL functions, and for tests.
    pub fn seal(&self, origin: Origin, notification: &str, iv: [u8; IV_BYTES]) -> String {
        let mut plain = Vec::with_capacity(1 + notification.len());
        plain.push(origin.letter());
        plain.extend_from_slice(notification.as_bytes());
        let ciphertext =
            Encryptor::new(&self.cipher.into(), &iv.into()).encrypt_padded_vec_mut::<Pkcs7>(&plain);
        let mut raw = Vec::with_capacity(IV_BYTES + ciphertext.len() + TAG_BYTES);
        raw.extend_from_slice(&iv);
        raw.extend_from_slice(&ciphertext);
        let mut mac = self.mac.clone();
        mac.update(&raw);
        raw.extend_from_slice(&mac.finalize().into_bytes());
        STANDARD.encode(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SealKey {
        SealKey::new(&(0..64).collect::<Vec<u8>>()).unwrap()
    }

    #[test]
    fn what_is_sealed_opens() {
        let sealed = key().seal(Origin::Rows, r#"{"k":"due"}"#, [7; 16]);
        assert_eq!(
            key().open(&sealed).unwrap(),
            (Origin::Rows, r#"{"k":"due"}"#.to_owned())
        );
        assert!(!sealed.contains("due"));
        let sealed = key().seal(Origin::Emitter, "{}", [7; 16]);
        assert_eq!(key().open(&sealed).unwrap().0, Origin::Emitter);
    }

    #[test]
    fn the_largest_plaintext_fits_the_notify_limit_and_one_more_byte_does_not() {
        let fits = "x".repeat(MAX_SEALED_PLAINTEXT_BYTES);
        assert!(key().seal(Origin::Rows, &fits, [0; 16]).len() <= POSTGRES_NOTIFY_LIMIT_BYTES);
        assert_eq!(
            key().seal(Origin::Rows, &fits, [0; 16]).len(),
            sealed_len(MAX_SEALED_PLAINTEXT_BYTES)
        );
        for len in [0, 1, 14, 15, 16, 17, 100] {
            let text = "y".repeat(len);
            assert_eq!(
                key().seal(Origin::Rows, &text, [0; 16]).len(),
                sealed_len(len)
            );
        }
        let over = "x".repeat(MAX_SEALED_PLAINTEXT_BYTES + 1);
        assert!(key().seal(Origin::Rows, &over, [0; 16]).len() > POSTGRES_NOTIFY_LIMIT_BYTES);
    }

    #[test]
    fn plain_forged_and_tampered_payloads_do_not_open() {
        let k = key();
        assert_eq!(k.open(r#"{"k":"due"}"#), Err(SealError::NotBase64));
        assert_eq!(k.open("AAAA"), Err(SealError::TooShort));
        let other = SealKey::new(&[9; 64]).unwrap();
        assert_eq!(
            k.open(&other.seal(Origin::Rows, r#"{"k":"due"}"#, [1; 16])),
            Err(SealError::BadTag)
        );
        let sealed = k.seal(Origin::Rows, r#"{"k":"due"}"#, [1; 16]);
        let mut raw = STANDARD.decode(&sealed).unwrap();
        raw[20] ^= 1;
        assert_eq!(k.open(&STANDARD.encode(raw)), Err(SealError::BadTag));
        assert_eq!(SealKey::new(&[0; 63]).err(), Some(SealError::KeyLength(63)));
    }
}
