//! Wire encodings (PROTOCOL §1): base64url without padding, RFC 8785
//! canonical JSON and the blake3 digest of it.

use crate::RelayError;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Serialize;

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

/// RFC 8785 (JCS) bytes of any serializable value.
pub fn jcs<T: Serialize>(value: &T) -> Result<Vec<u8>, RelayError> {
    serde_json_canonicalizer::to_vec(value).map_err(|e| RelayError::invalid_params(format!("cannot canonicalize: {e}")))
}

/// `blake3(JCS(value))`: what idempotency compares (PROTOCOL §1 allows the
/// digest in place of the bytes).
pub fn jcs_digest<T: Serialize>(value: &T) -> Result<[u8; 32], RelayError> {
    Ok(*blake3::hash(&jcs(value)?).as_bytes())
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
