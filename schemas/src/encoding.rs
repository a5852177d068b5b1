//! Wire encodings (PROTOCOL §1): base64url without padding, RFC 8785
//! canonical JSON and the blake3 digest of it.

use crate::RelayError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Serialize;
use serde_json::{Map, Value};

/// Decodes base64url without padding; anything else is `invalid_params`.
pub fn b64_decode(field: &str, s: &str) -> Result<Vec<u8>, RelayError> {
    URL_SAFE_NO_PAD.decode(s).map_err(|_| RelayError::invalid_params(format!("{field}: not base64url without padding")))
}

/// Decodes base64url into exactly `N` bytes.
pub fn b64_decode_array<const N: usize>(field: &str, s: &str) -> Result<[u8; N], RelayError> {
    let bytes = b64_decode(field, s)?;
    bytes.try_into().map_err(|_| RelayError::invalid_params(format!("{field}: expected {N} bytes")))
}

pub fn b64_encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The decoded length of a base64url string, without allocating; `None` when
/// the length cannot be a padless base64url encoding.
pub fn b64_decoded_len(s: &str) -> Option<usize> {
    match s.len() % 4 {
        1 => None,
        r => Some(s.len() / 4 * 3 + r.saturating_sub(1)),
    }
}

/// RFC 8785 (JCS) bytes of any serializable value (its JSON value's; raw
/// JSON members included).
pub fn jcs<T: Serialize>(value: &T) -> Result<Vec<u8>, RelayError> {
    let value = serde_json::to_value(value).map_err(|e| cannot(&e))?;
    jcs_value(&value)
}

/// RFC 8785 (JCS) bytes of a JSON value.
pub fn jcs_value(value: &Value) -> Result<Vec<u8>, RelayError> {
    let mut out = Vec::with_capacity(256);
    match canonical::value(&mut out, value) {
        Ok(()) => Ok(out),
        Err(canonical::Es6Number) => serde_json_canonicalizer::to_vec(value).map_err(|e| cannot(&e)),
    }
}

/// JCS of an object without some of its members (a signed object without
/// its `signature`), without copying it.
pub fn jcs_object_without(object: &Map<String, Value>, skip: &str) -> Result<Vec<u8>, RelayError> {
    jcs_members(object.iter().filter(|(k, _)| k.as_str() != skip))
}

/// JCS of an object, without copying it into a [`Value`].
pub fn jcs_object(object: &Map<String, Value>) -> Result<Vec<u8>, RelayError> {
    jcs_members(object.iter())
}

fn jcs_members<'a>(kept: impl Iterator<Item = (&'a String, &'a Value)> + Clone) -> Result<Vec<u8>, RelayError> {
    let mut out = Vec::with_capacity(256);
    match canonical::object(&mut out, kept.clone()) {
        Ok(()) => Ok(out),
        Err(canonical::Es6Number) => {
            let kept: Map<String, Value> = kept.map(|(k, v)| (k.clone(), v.clone())).collect();
            serde_json_canonicalizer::to_vec(&kept).map_err(|e| cannot(&e))
        }
    }
}

/// `blake3(JCS(value))`: what idempotency compares (PROTOCOL §1 allows the
/// digest in place of the bytes).
pub fn jcs_digest(value: &Value) -> Result<[u8; 32], RelayError> {
    Ok(*blake3::hash(&jcs_value(value)?).as_bytes())
}

fn cannot(e: &dyn std::fmt::Display) -> RelayError {
    RelayError::invalid_params(format!("cannot canonicalize: {e}"))
}

/// The JCS writer of the messages the relay handles, where every number is
/// an integer a double holds exactly. It writes what RFC 8785 prescribes
/// for them: members ordered by UTF-16 code units, strings escaped as
/// serde_json escapes them (the same rules: `\b \t \n \f \r \" \\`, other
/// controls as lowercase `\u00xx`, everything else as is), integers in
/// decimal. Any other number needs ES6 formatting: the caller then leaves
/// the value to `serde_json_canonicalizer`, which takes 2.4x as long on a
/// send's params (`cargo bench --bench benches -- canonical`: 6.0 µs
/// against 2.5 µs); it builds a UTF-16 key per member.
mod canonical {
    use serde_json::Value;

    /// A number that is not an integer within ±2^53.
    pub(super) struct Es6Number;

    const SAFE: u64 = 1 << 53;

    pub(super) fn value(out: &mut Vec<u8>, v: &Value) -> Result<(), Es6Number> {
        match v {
            Value::Null => out.extend_from_slice(b"null"),
            Value::Bool(true) => out.extend_from_slice(b"true"),
            Value::Bool(false) => out.extend_from_slice(b"false"),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) if u <= SAFE => write(out, n),
                (_, Some(i)) if i.unsigned_abs() <= SAFE => write(out, n),
                _ => return Err(Es6Number),
            },
            Value::String(s) => string(out, s),
            Value::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    value(out, item)?;
                }
                out.push(b']');
            }
            Value::Object(m) => object(out, m.iter())?,
        }
        Ok(())
    }

    /// Members ordered by the UTF-16 code units of their keys. A map
    /// iterates by UTF-8 bytes (code point order), which is that order
    /// unless keys differ at a character from U+E000 on: checked, and
    /// sorted only then.
    pub(super) fn object<'a>(
        out: &mut Vec<u8>,
        members: impl Iterator<Item = (&'a String, &'a Value)> + Clone,
    ) -> Result<(), Es6Number> {
        if members.clone().zip(members.clone().skip(1)).all(|(a, b)| utf16_lt(a.0, b.0)) {
            return members_in_order(out, members);
        }
        let mut sorted: Vec<_> = members.collect();
        sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
        members_in_order(out, sorted.into_iter())
    }

    fn members_in_order<'a>(
        out: &mut Vec<u8>,
        members: impl Iterator<Item = (&'a String, &'a Value)>,
    ) -> Result<(), Es6Number> {
        out.push(b'{');
        for (i, (k, v)) in members.enumerate() {
            if i > 0 {
                out.push(b',');
            }
            string(out, k);
            out.push(b':');
            value(out, v)?;
        }
        out.push(b'}');
        Ok(())
    }

    fn utf16_lt(a: &str, b: &str) -> bool {
        a.encode_utf16().lt(b.encode_utf16())
    }

    fn string(out: &mut Vec<u8>, s: &str) {
        write(out, s);
    }

    fn write<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
        serde_json::to_writer(&mut *out, v).expect("a string or a number serializes into a Vec");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64url_rejects_padding_and_standard_alphabet() {
        assert_eq!(b64_decode("x", "AQID").unwrap(), vec![1, 2, 3]);
        assert!(b64_decode("x", "AQ==").is_err());
        assert!(b64_decode("x", "a+b/").is_err());
        assert_eq!(b64_decode("x", "-_8").unwrap(), vec![0xfb, 0xff]);
    }

    #[test]
    fn decoded_len_matches_decoding() {
        for n in 0..70 {
            let s = b64_encode(&vec![7u8; n]);
            assert_eq!(b64_decoded_len(&s), Some(n));
        }
        assert_eq!(b64_decoded_len("A"), None);
    }
}
