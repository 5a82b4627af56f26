//! `decode_notification` never panics on any payload, and whatever it accepts
//! re-encodes (with the encoder of its form) to a payload that
//! decodes to an equal value; the re-encoding is canonical (stable).
#![no_main]

use eventrelay_wire::{
    DELIVERIES_QUEUED, EncodeError, EventNotification, MAX_NOTIFY_PAYLOAD_BYTES,
    decode_notification, encode_inline, encode_inline_batch, encode_pointer,
    encode_pointer_carrying,
};
use libfuzzer_sys::fuzz_target;

fn encode(notification: &EventNotification) -> Result<String, EncodeError> {
    match notification {
        EventNotification::Pointer {
            scope_key,
            seq,
            carried: None,
        } => encode_pointer(scope_key, *seq),
        EventNotification::Pointer {
            carried: Some(rows),
            ..
        } => encode_pointer_carrying(rows.txid, &rows.events),
        EventNotification::Inline { envelope } => encode_inline(envelope),
        // The encoder splits what does not fit in one payload: for the
        // round trip, that is the batch being too large.
        EventNotification::InlineBatch { envelopes, .. } => {
            let mut payloads = encode_inline_batch(envelopes)?;
            if payloads.len() == 1 {
                Ok(payloads.remove(0))
            } else {
                Err(EncodeError::TooLarge {
                    len: payloads.iter().map(String::len).sum(),
                    max: MAX_NOTIFY_PAYLOAD_BYTES,
                })
            }
        }
        EventNotification::DeliveriesQueued => Ok(DELIVERIES_QUEUED.to_owned()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(decoded) = decode_notification(data) else {
        return;
    };
    // A batch of one is written in the one-event form, which decodes to
    // another variant: not a round trip to compare.
    if matches!(&decoded, EventNotification::InlineBatch { envelopes, .. } if envelopes.len() < 2)
    {
        return;
    }
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
