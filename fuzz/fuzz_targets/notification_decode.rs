//! `decode_notification` never panics on any payload, and whatever it accepts
//! re-encodes (with `encode_pointer` / `encode_inline`) to a payload that
//! decodes to an equal value; the re-encoding is canonical (stable).
#![no_main]

use eventrelay_wire::{
    EncodeError, EventNotification, MAX_NOTIFY_PAYLOAD_BYTES, decode_notification, encode_inline,
    encode_pointer,
};
use libfuzzer_sys::fuzz_target;

fn encode(notification: &EventNotification) -> Result<String, EncodeError> {
    match notification {
        EventNotification::Pointer { scope_key, seq } => encode_pointer(scope_key, *seq),
        EventNotification::Inline { envelope } => encode_inline(envelope),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(decoded) = decode_notification(data) else {
        return;
    };
    let encoded = match encode(&decoded) {
        Ok(encoded) => encoded,
        // Decoding accepts non-canonical JSON (`1E15`, omitted defaults,
        // offsets in times) that re-encodes longer; over the NOTIFY limit the
        // encoder must refuse it, and nothing else.
        Err(EncodeError::TooLarge { len, max }) => {
            assert_eq!(max, MAX_NOTIFY_PAYLOAD_BYTES);
            assert!(len > max, "TooLarge for {len} <= {max} bytes");
            return;
        }
        Err(e) => panic!("accepted notification does not re-encode: {e}\ndecoded: {decoded:?}"),
    };
    assert!(encoded.len() <= MAX_NOTIFY_PAYLOAD_BYTES);
    let again = decode_notification(encoded.as_bytes()).unwrap_or_else(|e| {
        panic!("re-encoded notification does not decode: {e}\nencoded: {encoded}")
    });
    assert_eq!(
        again, decoded,
        "round trip changed the notification\nencoded: {encoded}"
    );
    let encoded_again = encode(&again).expect("the round-tripped value encodes");
    assert_eq!(encoded_again, encoded, "encoding is not stable");
});
