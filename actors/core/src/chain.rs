//! The hash chain of a stored stream: each event's body is its fields in
//! one JSON layout, and `hash_i = blake3(prev_hash ‖ body_i)`, `prev_hash`
//! being the hash of the event before it (zeros for the first). The store
//! writes `hash ‖ body` (relay-actors' `store::codec`); the simulator keeps
//! the same chain for its streams. Pure: no store, bytes in, bytes out.

use serde::Serialize;

/// A chain hash (BLAKE3, 32 bytes).
pub type Hash = [u8; 32];

/// The `prev` of a stream's first event.
pub const ZERO: Hash = [0; 32];

/// The hashed body, as written. Field order is part of the stored format.
#[derive(Serialize)]
struct Body<'a, D: ?Sized> {
    stream: &'a str,
    seq: u64,
    #[serde(rename = "type")]
    event_type: &'a str,
    version: u32,
    at: u64,
    prev: &'a str,
    data: &'a D,
}

/// The body of event `seq` of `stream`: the bytes the chain hashes and
/// the store keeps after the hash. `prev` in lowercase hex; `data` as is
/// when it is already JSON (`RawValue`), else serialized in the same pass,
/// which gives the same bytes as serializing it first (compact JSON is
/// written verbatim either way) without the copy.
pub fn body<D: Serialize + ?Sized>(
    stream: &str,
    seq: u64,
    event_type: &str,
    version: u32,
    at: u64,
    prev: &Hash,
    data: &D,
) -> Result<Vec<u8>, serde_json::Error> {
    let prev = blake3::Hash::from(*prev).to_hex();
    serde_json::to_vec(&Body { stream, seq, event_type, version, at, prev: prev.as_str(), data })
}

/// `blake3(prev ‖ body)`: the hash of the event whose body is `body`.
pub fn hash(prev: &Hash, body: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(prev);
    h.update(body);
    *h.finalize().as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::value::RawValue;

    fn data(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.into()).unwrap()
    }

    #[test]
    fn a_body_lays_out_its_fields_in_the_stored_order_with_prev_in_lowercase_hex() {
        let mut prev = ZERO;
        prev[0] = 0xAB;
        let body = body("account/a", 7, "message_sent", 3, 1_700_000_000, &prev, &data(r#"{"x":1}"#)).unwrap();
        let hex = format!("ab{}", "0".repeat(62));
        let want = format!(
            r#"{{"stream":"account/a","seq":7,"type":"message_sent","version":3,"at":1700000000,"prev":"{hex}","data":{{"x":1}}}}"#
        );
        assert_eq!(String::from_utf8(body).unwrap(), want);
    }

    #[test]
    fn a_body_serialized_in_one_pass_is_the_body_of_its_json() {
        let event = serde_json::json!({"b": [1, "two", {"c": null}], "a": "é\n"});
        let json = serde_json::value::to_raw_value(&event).unwrap();
        let one_pass = body("delivery/a/m", 2, "accepted", 1, 5, &ZERO, &event).unwrap();
        assert_eq!(one_pass, body("delivery/a/m", 2, "accepted", 1, 5, &ZERO, &json).unwrap());
    }

    #[test]
    fn each_hash_covers_the_previous_hash_and_the_body() {
        let body = b"{}";
        let first = hash(&ZERO, body);
        assert_eq!(first, *blake3::hash(&[&ZERO[..], body].concat()).as_bytes());
        // The same body after another event hashes differently: a chain.
        assert_ne!(hash(&first, body), first);
    }
}
