//! Byte layout of the one sled tree that holds everything.
//!
//! One tree, so that a single `apply_batch` is atomic across events,
//! snapshots and kv entries. A one-byte prefix tells the record kinds apart:
//!
//! | key                                  | value                              |
//! |--------------------------------------|------------------------------------|
//! | `b'e' ‖ stream ‖ 0x00 ‖ seq (u64 BE)` | `hash (32) ‖ body (JSON)`          |
//! | `b's' ‖ stream`                      | `seq (u64 BE) ‖ hash (32) ‖ state` |
//! | `b'k' ‖ key`                         | value                              |
//! | `b'b' ‖ key`                         | value (a blob: see below)          |
//! | `b'p' ‖ stream`                      | `seq ‖ hash (32) ‖ at ‖ state`     |
//!
//! Big-endian seqs make key order equal seq order, and the 0x00 separator
//! (stream ids never contain it) keeps stream `a` from overlapping `ab`.
//!
//! A `b'p'` entry is a stream's pruned marker ([`super::Pruned`]): the seq
//! and chain hash of the last event deleted from the stream's prefix, when
//! (u64 BE seconds), and the state folded through it (may be empty).
//!
//! Blobs are kv entries that the sled engine, as it does events, keeps in
//! its log with a pointer in sled (`sled_engine.rs`): values read by key
//! alone, which sled's leaves should not carry (the idempotency ledger).

use serde::Deserialize;
use serde_json::value::RawValue;

use std::borrow::Cow;
use std::ops::Range;

use super::types::{Hash, Head, Pruned, RawEvent, Snapshot, StoreError, StoredEvent};

pub(super) const EVENT: u8 = b'e';
pub(super) const SNAPSHOT: u8 = b's';
pub(super) const KV: u8 = b'k';
pub(super) const BLOB: u8 = b'b';
pub(super) const PRUNED: u8 = b'p';

/// Stream ids are non-empty ASCII without 0x00 (the key separator).
pub(super) fn check_stream(stream: &str) -> Result<(), StoreError> {
    if stream.is_empty() || !stream.bytes().all(|b| b != 0 && b.is_ascii()) {
        return Err(StoreError::Invalid(format!("stream id {stream:?} must be non-empty ASCII without NUL")));
    }
    Ok(())
}

fn stream_prefix(stream: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(stream.len() + 10);
    key.push(EVENT);
    key.extend_from_slice(stream.as_bytes());
    key.push(0);
    key
}

pub(super) fn event_key(stream: &str, seq: u64) -> Vec<u8> {
    let mut key = stream_prefix(stream);
    key.extend_from_slice(&seq.to_be_bytes());
    key
}

/// First key after every event key of `stream`.
pub(super) fn stream_end(stream: &str) -> Vec<u8> {
    let mut end = stream_prefix(stream);
    end.pop();
    end.push(1);
    end
}

/// Key range of the events of `stream` with seq > `after`; `None` when empty.
pub(super) fn event_range(stream: &str, after: u64) -> Option<(Vec<u8>, Vec<u8>)> {
    Some((event_key(stream, after.checked_add(1)?), stream_end(stream)))
}

/// Splits an event key into (stream, seq).
pub(super) fn parse_event_key(key: &[u8]) -> Result<(String, u64), StoreError> {
    let lossy = || String::from_utf8_lossy(key).into_owned();
    let corrupt = |what: &str| StoreError::Corrupt { stream: lossy(), seq: 0, what: format!("event key: {what}") };
    if key.len() < 11 || key[0] != EVENT || key[key.len() - 9] != 0 {
        return Err(corrupt("bad layout"));
    }
    let (stream, seq) = key[1..].split_at(key.len() - 10);
    let stream = std::str::from_utf8(stream).map_err(|_| corrupt("stream is not UTF-8"))?;
    let mut be = [0; 8];
    be.copy_from_slice(&seq[1..]);
    Ok((stream.to_owned(), u64::from_be_bytes(be)))
}

pub(super) fn snapshot_key(stream: &str) -> Vec<u8> {
    let mut key = vec![SNAPSHOT];
    key.extend_from_slice(stream.as_bytes());
    key
}

pub(super) fn pruned_key(stream: &str) -> Vec<u8> {
    spaced(PRUNED, stream.as_bytes())
}

pub(super) fn encode_pruned(p: &Pruned) -> Vec<u8> {
    let mut v = Vec::with_capacity(48 + p.state.len());
    v.extend_from_slice(&p.head.seq.to_be_bytes());
    v.extend_from_slice(&p.head.hash);
    v.extend_from_slice(&p.at.to_be_bytes());
    v.extend_from_slice(&p.state);
    v
}

pub(super) fn decode_pruned(stream: &str, value: &[u8]) -> Result<Pruned, StoreError> {
    if value.len() < 48 {
        return Err(StoreError::Corrupt {
            stream: stream.to_owned(),
            seq: 0,
            what: format!("pruned marker of {} bytes", value.len()),
        });
    }
    let be = |at: usize| {
        let mut n = [0; 8];
        n.copy_from_slice(&value[at..at + 8]);
        u64::from_be_bytes(n)
    };
    let mut hash = [0; 32];
    hash.copy_from_slice(&value[8..40]);
    Ok(Pruned { head: Head { seq: be(0), hash }, at: be(40), state: value[48..].to_vec() })
}

/// `key` in the key space `space` ([`KV`] or [`BLOB`]).
pub(super) fn spaced(space: u8, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(space);
    k.extend_from_slice(key);
    k
}

pub(super) fn kv_key(key: &[u8]) -> Vec<u8> {
    spaced(KV, key)
}

pub(super) fn blob_key(key: &[u8]) -> Vec<u8> {
    spaced(BLOB, key)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BodyIn {
    stream: String,
    seq: u64,
    #[serde(rename = "type")]
    event_type: String,
    version: u32,
    at: u64,
    prev: String,
    data: Box<RawValue>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn encode_body(
    stream: &str,
    seq: u64,
    event_type: &str,
    version: u32,
    at: u64,
    prev: &Hash,
    data: &RawValue,
) -> Result<Vec<u8>, StoreError> {
    relay_core::chain::body(stream, seq, event_type, version, at, prev, data)
        .map_err(|e| StoreError::Invalid(format!("encode event: {e}")))
}

/// `hash_i = blake3(prev_hash ‖ body_i)` (relay-core's `chain`).
pub(super) fn chain_hash(prev: &Hash, body: &[u8]) -> Hash {
    relay_core::chain::hash(prev, body)
}

/// Decodes a stored event and checks it against its key and its stored hash.
pub(super) fn decode_event(key: &[u8], value: &[u8]) -> Result<StoredEvent, StoreError> {
    let (stream, seq) = parse_event_key(key)?;
    let corrupt = |what: String| StoreError::Corrupt { stream: stream.clone(), seq, what };
    if value.len() < 32 {
        return Err(corrupt(format!("value of {} bytes", value.len())));
    }
    let (stored_hash, body) = value.split_at(32);
    let b: BodyIn = serde_json::from_slice(body).map_err(|e| corrupt(format!("body: {e}")))?;
    if b.stream != stream || b.seq != seq {
        return Err(corrupt(format!("body says stream {:?} seq {}", b.stream, b.seq)));
    }
    let mut prev = [0; 32];
    hex::decode_to_slice(&b.prev, &mut prev).map_err(|e| corrupt(format!("prev: {e}")))?;
    if chain_hash(&prev, body) != stored_hash {
        return Err(StoreError::HashMismatch { stream, seq });
    }
    let mut hash = [0; 32];
    hash.copy_from_slice(stored_hash);
    Ok(StoredEvent { stream, seq, event_type: b.event_type, version: b.version, at: b.at, data: b.data, prev, hash })
}

/// The parts of a body laid out exactly as [`encode_body`] writes it, found
/// by one scan of its bytes (no JSON tree, `data` not parsed): `None` for
/// any other layout, which [`decode_event`] then reads the slow way. Only
/// the one layout counts: with stream and seq equal to the key's, numbers
/// without leading zeros, `prev` in lowercase hex, strings escaped as
/// `serde_json` escapes them and `data` without surrounding whitespace, the
/// body is the encoding of its own fields again (given `data` is JSON,
/// which its decoder checks).
pub(super) struct Layout {
    pub event_type: String,
    pub version: u32,
    pub at: u64,
    pub prev: Hash,
    pub data: Range<usize>,
}

pub(super) fn scan_body(stream: &str, seq: u64, body: &[u8]) -> Option<Layout> {
    let expect = |bytes: &[u8], at: &mut usize| -> Option<()> {
        body.get(*at..*at + bytes.len()).filter(|b| *b == bytes)?;
        *at += bytes.len();
        Some(())
    };
    let mut at = 0;
    expect(b"{\"stream\":", &mut at)?;
    let s = json_string(body, &mut at)?;
    if s != stream {
        return None;
    }
    expect(b",\"seq\":", &mut at)?;
    if number(body, &mut at)? != seq {
        return None;
    }
    expect(b",\"type\":", &mut at)?;
    let event_type = json_string(body, &mut at)?;
    expect(b",\"version\":", &mut at)?;
    let version = u32::try_from(number(body, &mut at)?).ok()?;
    expect(b",\"at\":", &mut at)?;
    let time = number(body, &mut at)?;
    expect(b",\"prev\":\"", &mut at)?;
    let hex = body.get(at..at + 64)?;
    if !hex.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
        return None;
    }
    let mut prev = [0; 32];
    decode_lower_hex(hex, &mut prev);
    at += 64;
    expect(b"\",\"data\":", &mut at)?;
    let end = body.len().checked_sub(1).filter(|&end| end > at && body[end] == b'}')?;
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    if space(body[at]) || space(body[end - 1]) {
        return None;
    }
    Some(Layout { event_type: event_type.into_owned(), version, at: time, prev, data: at..end })
}

/// `hex` (lowercase hex digits only, checked by the caller) into `out`:
/// what `hex::decode_to_slice` gives, without its per-digit branches (it
/// was 5 % of the audit's CPU, one `prev` per event).
fn decode_lower_hex(hex: &[u8], out: &mut [u8; 32]) {
    // '0'..='9' are 0x30..=0x39, 'a'..='f' 0x61..=0x66: the low nibble,
    // plus 9 for a letter (bit 6 set).
    let nibble = |b: u8| (b & 0x0f) + 9 * (b >> 6);
    for (byte, pair) in out.iter_mut().zip(hex.chunks_exact(2)) {
        *byte = nibble(pair[0]) << 4 | nibble(pair[1]);
    }
}

/// The JSON string at `at`, if `serde_json` writes that string so: plain
/// bytes borrowed, escapes checked by writing the string again (rare).
fn json_string<'a>(body: &'a [u8], at: &mut usize) -> Option<Cow<'a, str>> {
    let start = *at;
    if body.get(start) != Some(&b'"') {
        return None;
    }
    let mut i = start + 1;
    let mut escaped = false;
    loop {
        match *body.get(i)? {
            b'"' => break,
            b'\\' => {
                escaped = true;
                i += 2;
            }
            b if b < 0x20 => return None,
            _ => i += 1,
        }
    }
    *at = i + 1;
    let quoted = &body[start..=i];
    if escaped {
        let s: String = serde_json::from_slice(quoted).ok()?;
        let again = serde_json::to_vec(&s).ok()?;
        return (again == quoted).then_some(s.into());
    }
    let s = std::str::from_utf8(&quoted[1..quoted.len() - 1]).ok()?;
    Some(s.into())
}

/// A decimal number as `serde_json` writes a `u64`: no sign, no leading zero.
fn number(body: &[u8], at: &mut usize) -> Option<u64> {
    let start = *at;
    let mut n: u64 = 0;
    while let Some(d) = body.get(*at).filter(|b| b.is_ascii_digit()) {
        n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        *at += 1;
    }
    let len = *at - start;
    (len == 1 || (len > 1 && body[start] != b'0')).then_some(n)
}

/// A stored event of `stream` read for the chain check: its hash checked
/// over the bytes as stored, the rest found by [`scan_body`], its body
/// borrowed from `value`; a body of another layout is decoded
/// ([`decode_event`]) and kept as it encodes.
pub(super) fn raw_event<'a>(stream: &str, key: &[u8], value: &'a [u8]) -> Result<RawEvent<'a>, StoreError> {
    let seq = match key.len().checked_sub(8) {
        Some(n) if n == stream.len() + 2 => {
            let mut be = [0; 8];
            be.copy_from_slice(&key[n..]);
            u64::from_be_bytes(be)
        }
        _ => parse_event_key(key)?.1,
    };
    let layout = value.get(32..).and_then(|body| scan_body(stream, seq, body));
    let Some(layout) = layout else {
        let ev = decode_event(key, value)?;
        let sound = ev.compute_hash()? == ev.hash;
        let body = encode_body(&ev.stream, ev.seq, &ev.event_type, ev.version, ev.at, &ev.prev, &ev.data)?;
        // What `encode_body` writes scans, whatever its strings hold.
        let layout = scan_body(&ev.stream, ev.seq, &body).ok_or_else(|| StoreError::Corrupt {
            stream: ev.stream.clone(),
            seq,
            what: "body does not scan as it was encoded".into(),
        })?;
        let body = String::from_utf8(body).map_err(|e| StoreError::Invalid(e.to_string()))?;
        return Ok(RawEvent::new(seq, ev.hash, layout, body.into(), sound));
    };
    let (stored, body) = value.split_at(32);
    let mut hash = [0; 32];
    hash.copy_from_slice(stored);
    if chain_hash(&layout.prev, body) != hash {
        return Err(StoreError::HashMismatch { stream: stream.to_owned(), seq });
    }
    let body = std::str::from_utf8(body).map_err(|_| StoreError::Corrupt {
        stream: stream.to_owned(),
        seq,
        what: "body is not UTF-8".into(),
    })?;
    Ok(RawEvent::new(seq, hash, layout, body.into(), true))
}

pub(super) fn encode_snapshot(snap: &Snapshot) -> Vec<u8> {
    let mut v = Vec::with_capacity(40 + snap.state.len());
    v.extend_from_slice(&snap.seq.to_be_bytes());
    v.extend_from_slice(&snap.hash);
    v.extend_from_slice(&snap.state);
    v
}

pub(super) fn decode_snapshot(stream: &str, value: &[u8]) -> Result<Snapshot, StoreError> {
    if value.len() < 40 {
        return Err(StoreError::Corrupt {
            stream: stream.to_owned(),
            seq: 0,
            what: format!("snapshot of {} bytes", value.len()),
        });
    }
    let mut seq = [0; 8];
    seq.copy_from_slice(&value[..8]);
    let mut hash = [0; 32];
    hash.copy_from_slice(&value[8..40]);
    Ok(Snapshot { seq: u64::from_be_bytes(seq), hash, state: value[40..].to_vec() })
}

/// The first key after every key that starts with `prefix`; `None` when
/// there is none (a prefix of 0xff bytes only).
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl StoredEvent {
    /// `blake3(prev ‖ body)` with the body encoded again from the fields;
    /// equal to the stored bytes' hash because encoding is deterministic.
    pub fn compute_hash(&self) -> Result<Hash, StoreError> {
        Ok(chain_hash(&self.prev, &self.body()?))
    }

    /// The value the store keeps for this event (`hash ‖ body`), encoded
    /// again from its fields: for tests that rewrite history on purpose.
    #[doc(hidden)]
    pub fn encoded(&self) -> Result<Vec<u8>, StoreError> {
        let body = self.body()?;
        Ok([&chain_hash(&self.prev, &body)[..], &body].concat())
    }

    /// The body encoded again from the fields.
    fn body(&self) -> Result<Vec<u8>, StoreError> {
        encode_body(&self.stream, self.seq, &self.event_type, self.version, self.at, &self.prev, &self.data)
    }
}

impl<'a> RawEvent<'a> {
    fn new(seq: u64, hash: Hash, layout: Layout, body: Cow<'a, str>, sound: bool) -> RawEvent<'a> {
        let Layout { event_type, version, at, prev, data } = layout;
        RawEvent { seq, event_type, version, at, prev, hash, sound, body, data }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prev_in_lowercase_hex_decodes_as_the_hex_crate_decodes_it() {
        // Every byte value, in both places of a pair.
        for chunk in (0..=255u8).collect::<Vec<_>>().chunks(32) {
            let mut bytes = [0u8; 32];
            bytes[..chunk.len()].copy_from_slice(chunk);
            let text = hex::encode(bytes);
            let mut out = [0; 32];
            decode_lower_hex(text.as_bytes(), &mut out);
            assert_eq!(out, bytes, "{text}");
        }
    }
}
