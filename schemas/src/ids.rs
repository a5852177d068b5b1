//! Identifiers (PROTOCOL §1) and the key-bound `account_id`.

use crate::RelayError;

/// `account_id` = lowercase hex of the first 16 bytes of `blake3(account_key)`.
pub fn account_id_of(account_key: &[u8; 32]) -> String {
    hex::encode(&blake3::hash(account_key).as_bytes()[..16])
}

fn charset_ok(s: &str, min: usize, max: usize, ok: impl Fn(u8) -> bool) -> bool {
    (min..=max).contains(&s.len()) && s.bytes().all(ok)
}

fn id_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

fn check(field: &str, valid: bool, what: &str) -> Result<(), RelayError> {
    if valid {
        Ok(())
    } else {
        Err(RelayError::invalid_params(format!("{field}: {what}")))
    }
}

pub fn check_account_id(field: &str, s: &str) -> Result<(), RelayError> {
    let valid = charset_ok(s, 32, 32, |b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    check(field, valid, "expected 32 lowercase hex characters")
}

/// `device_id`, `grant_id`, `invite_id`: 1–64 chars of `[A-Za-z0-9_-]`.
pub fn check_id(field: &str, s: &str) -> Result<(), RelayError> {
    check(field, charset_ok(s, 1, 64, id_char), "expected 1-64 characters of [A-Za-z0-9_-]")
}

pub fn check_message_id(field: &str, s: &str) -> Result<(), RelayError> {
    check(field, charset_ok(s, 16, 64, id_char), "expected 16-64 characters of [A-Za-z0-9_-]")
}

pub fn check_relay_id(field: &str, s: &str) -> Result<(), RelayError> {
    let valid = charset_ok(s, 1, 64, |b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    check(field, valid, "expected 1-64 characters of [a-z0-9.-]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn account_id_is_first_16_bytes_of_blake3_of_the_key_in_lowercase_hex() {
        let key = [9u8; 32];
        let id = account_id_of(&key);
        assert_eq!(id.len(), 32);
        assert_eq!(id, hex::encode(&blake3::hash(&key).as_bytes()[..16]));
        check_account_id("a", &id).unwrap();
        assert!(check_account_id("a", &id.to_uppercase()).is_err());
    }

    #[test]
    fn identifier_charsets_and_lengths() {
        assert!(check_id("d", "phone_1-A").is_ok());
        assert!(check_id("d", "").is_err());
        assert!(check_id("d", &"a".repeat(65)).is_err());
        assert!(check_id("d", "pho ne").is_err());
        assert!(check_message_id("m", &"a".repeat(15)).is_err());
        assert!(check_message_id("m", &"a".repeat(16)).is_ok());
        assert!(check_relay_id("r", "relay-a.example").is_ok());
        assert!(check_relay_id("r", "Relay").is_err());
    }
}
