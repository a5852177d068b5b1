//! Signed checkpoints of a relay's store (PROTOCOL §10), pure.
//!
//! - A **leaf** is one stream's position: `JCS([stream, last_sequence,
//!   last_chain_hash])`, the hash as 64 lowercase hex digits (as an event's
//!   `prev` and the relay request digest are written).
//! - The **root** is the RFC 6962 Merkle tree hash over the leaves sorted
//!   by stream name, with BLAKE3 in place of SHA-256: a leaf hashes as
//!   `H(0x00 ‖ leaf)`, a node as `H(0x01 ‖ left ‖ right)`, a tree of `n > 1`
//!   leaves splits at the largest power of two below `n`, and the empty
//!   tree is `H("")`.
//! - The **checkpoint** is `{"relay_id","issued_at","streams","events",
//!   "root","signature"}` signed by the relay key under
//!   `relay/v1/checkpoint` ([`Tag::Checkpoint`]); `root` is hex too.
//! - A store **extends** a checkpoint when every stream it lists still has
//!   that event (sequence and hash) at that sequence, or was pruned past it
//!   (its marker's sequence is at or past it; at the same sequence the
//!   hashes must match): [`extends_leaf`].
//!
//! A checkpoint carries only its root, so the relay keeps the leaves of its
//! own checkpoints beside them; [`check_kept`] shows that kept leaves are
//! the ones signed (they hash to the root), before each is held against
//! the store.

use crate::encoding::{b64_encode, jcs_value};
use crate::sign::{signed_bytes, verify_object, Tag};
use crate::RelayError;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;

pub type Hash = [u8; 32];

/// One stream's position in a checkpoint: its last sequence and the chain
/// hash of the event there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Leaf {
    pub stream: String,
    pub seq: u64,
    pub hash: Hash,
}

impl Leaf {
    /// `JCS([stream, last_sequence, last_chain_hash])`: what is hashed into
    /// the tree, and how the relay keeps a leaf (one per line).
    pub fn bytes(&self) -> Vec<u8> {
        // Written directly (a checkpoint writes one per stream): serde_json
        // escapes a string as RFC 8785 does, and an integer up to 2^53 is
        // its decimal digits. Past that JCS writes the nearest double.
        if self.seq > 1 << 53 {
            let value = Value::Array(vec![
                Value::String(self.stream.clone()),
                Value::from(self.seq),
                Value::String(hex::encode(self.hash)),
            ]);
            return jcs_value(&value).expect("an array of strings and an integer canonicalizes");
        }
        let mut out = Vec::with_capacity(self.stream.len() + 96);
        out.push(b'[');
        serde_json::to_writer(&mut out, &self.stream).expect("a string serializes into a Vec");
        out.extend_from_slice(format!(",{},\"{}\"]", self.seq, hex::encode(self.hash)).as_bytes());
        out
    }

    /// A leaf from its bytes, which must be exactly its canonical form.
    pub fn parse(bytes: &[u8]) -> Result<Leaf, CheckpointError> {
        let bad = |what: &str| CheckpointError::Malformed(format!("leaf {}: {what}", String::from_utf8_lossy(bytes)));
        let value: Value = serde_json::from_slice(bytes).map_err(|e| bad(&e.to_string()))?;
        let (stream, seq, hash) = match value.as_array().map(Vec::as_slice) {
            Some([Value::String(s), seq, Value::String(h)]) => (s, seq, h),
            _ => return Err(bad("not [stream, last_sequence, last_chain_hash]")),
        };
        let seq = seq.as_u64().ok_or_else(|| bad("last_sequence is not an unsigned integer"))?;
        let hash = hex_hash(hash).ok_or_else(|| bad("last_chain_hash is not 64 lowercase hex digits"))?;
        let leaf = Leaf { stream: stream.clone(), seq, hash };
        if leaf.bytes() != bytes {
            return Err(bad("not in canonical form (RFC 8785)"));
        }
        Ok(leaf)
    }
}

/// 64 lowercase hex digits as a hash.
pub fn hex_hash(s: &str) -> Option<Hash> {
    if s.len() != 64 || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut out = [0; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// `H(0x00 ‖ leaf)`.
pub fn leaf_hash(leaf: &[u8]) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&[0x00]);
    h.update(leaf);
    *h.finalize().as_bytes()
}

/// `H(0x01 ‖ left ‖ right)`.
pub fn node_hash(left: &Hash, right: &Hash) -> Hash {
    let mut h = blake3::Hasher::new();
    h.update(&[0x01]);
    h.update(left);
    h.update(right);
    *h.finalize().as_bytes()
}

/// The Merkle tree hash (RFC 6962 §2.1) of leaves already hashed with
/// [`leaf_hash`]: `H("")` for none, the leaf hash for one, else
/// `node_hash(MTH(first k), MTH(rest))` with k the largest power of two
/// below their count.
pub fn merkle_root(leaf_hashes: &[Hash]) -> Hash {
    match leaf_hashes.len() {
        0 => *blake3::hash(b"").as_bytes(),
        1 => leaf_hashes[0],
        n => {
            let k = split(n);
            node_hash(&merkle_root(&leaf_hashes[..k]), &merkle_root(&leaf_hashes[k..]))
        }
    }
}

/// The largest power of two smaller than `n` (n ≥ 2).
fn split(n: usize) -> usize {
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// The root over `leaves` (in the order given: sorted by stream in a
/// checkpoint).
pub fn root_of(leaves: &[Leaf]) -> Hash {
    let hashes: Vec<Hash> = leaves.iter().map(|l| leaf_hash(&l.bytes())).collect();
    merkle_root(&hashes)
}

/// A signed checkpoint (the typed view; a peer's is verified and kept as
/// the object it sent, unknown members included).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub relay_id: String,
    /// Unix seconds.
    pub issued_at: u64,
    /// Leaves (streams) in the tree.
    pub streams: u64,
    /// Events in the store as the writer counts them (the relay: the sum
    /// of its streams' last sequences, pruned events included).
    pub events: u64,
    /// The Merkle root, 64 lowercase hex digits.
    pub root: String,
    pub signature: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointError {
    /// Not a checkpoint (members missing or of the wrong type, a bad leaf).
    Malformed(String),
    /// The signature does not verify under the key given.
    Signature(String),
    /// Signed by the key, but naming another relay.
    WrongRelay { expected: String, found: String },
    /// The leaves are not sorted by stream, one stream twice, or the
    /// signer's input was otherwise unusable.
    Leaves(String),
    /// Leaves kept beside a checkpoint that are not the ones it signed.
    KeptLeaves(String),
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointError::Malformed(what) => write!(f, "not a checkpoint: {what}"),
            CheckpointError::Signature(what) => write!(f, "signature: {what}"),
            CheckpointError::WrongRelay { expected, found } => {
                write!(f, "checkpoint of relay {found:?}, expected {expected:?}")
            }
            CheckpointError::Leaves(what) => write!(f, "leaves: {what}"),
            CheckpointError::KeptLeaves(what) => write!(f, "kept leaves are not the checkpointed ones: {what}"),
        }
    }
}

impl std::error::Error for CheckpointError {}

/// Leaves sorted strictly by stream name (bytes), each stream once.
fn check_sorted(leaves: &[Leaf]) -> Result<(), String> {
    match leaves.windows(2).find(|w| w[0].stream >= w[1].stream) {
        Some(w) => Err(format!("{:?} is not before {:?}", w[0].stream, w[1].stream)),
        None => Ok(()),
    }
}

impl Checkpoint {
    /// Signs a checkpoint of `leaves` (sorted by stream, each once).
    pub fn issue(
        relay_id: &str,
        issued_at: u64,
        leaves: &[Leaf],
        events: u64,
        key: &SigningKey,
    ) -> Result<Checkpoint, CheckpointError> {
        check_sorted(leaves).map_err(CheckpointError::Leaves)?;
        let mut cp = Checkpoint {
            relay_id: relay_id.to_owned(),
            issued_at,
            streams: leaves.len() as u64,
            events,
            root: hex::encode(root_of(leaves)),
            signature: String::new(),
        };
        let map = cp.map_without_signature();
        let bytes = signed_bytes(Tag::Checkpoint, &map).map_err(|e| CheckpointError::Leaves(e.message))?;
        cp.signature = b64_encode(&key.sign(&bytes).to_bytes());
        Ok(cp)
    }

    fn map_without_signature(&self) -> Map<String, Value> {
        let mut map = self.to_map();
        map.remove("signature");
        map
    }

    /// The object as a JSON map.
    pub fn to_map(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            _ => unreachable!("a struct serializes as an object"),
        }
    }

    /// The typed view of an object, without checking its signature.
    pub fn from_map(object: &Map<String, Value>) -> Result<Checkpoint, CheckpointError> {
        let cp: Checkpoint = serde_json::from_value(Value::Object(object.clone()))
            .map_err(|e| CheckpointError::Malformed(e.to_string()))?;
        cp.root_hash()?;
        Ok(cp)
    }

    /// `root` as bytes.
    pub fn root_hash(&self) -> Result<Hash, CheckpointError> {
        hex_hash(&self.root).ok_or_else(|| CheckpointError::Malformed("root is not 64 lowercase hex digits".into()))
    }

    /// Whether `other` is the same checkpoint (every signed member).
    pub fn same_as(&self, other: &Checkpoint) -> bool {
        (&self.relay_id, self.issued_at, self.streams, self.events, &self.root)
            == (&other.relay_id, other.issued_at, other.streams, other.events, &other.root)
    }
}

/// A checkpoint object verified under `key` (strictly, every member but
/// `signature` covered) and naming `relay_id`.
pub fn verify(object: &Map<String, Value>, key: &VerifyingKey, relay_id: &str) -> Result<Checkpoint, CheckpointError> {
    let cp = Checkpoint::from_map(object)?;
    verify_object(Tag::Checkpoint, object, key).map_err(|e: RelayError| CheckpointError::Signature(e.message))?;
    if cp.relay_id != relay_id {
        return Err(CheckpointError::WrongRelay { expected: relay_id.to_owned(), found: cp.relay_id });
    }
    Ok(cp)
}

/// Leaves kept beside `checkpoint` are the ones it signed: sorted by
/// stream, as many as it counts, and hashing to its root. Nothing kept can
/// then be edited without the root showing it.
pub fn check_kept(checkpoint: &Checkpoint, leaves: &[Leaf]) -> Result<(), CheckpointError> {
    check_sorted(leaves).map_err(CheckpointError::KeptLeaves)?;
    if leaves.len() as u64 != checkpoint.streams {
        return Err(CheckpointError::KeptLeaves(format!(
            "{} leaves kept, the checkpoint counts {} streams",
            leaves.len(),
            checkpoint.streams
        )));
    }
    if root_of(leaves) != checkpoint.root_hash()? {
        return Err(CheckpointError::KeptLeaves("they do not hash to the signed root".into()));
    }
    Ok(())
}

/// What a store holds now of a checkpointed stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamNow {
    /// The chain hash of its event at the leaf's sequence, if it has one.
    pub event: Option<Hash>,
    /// Its pruned marker: the sequence and chain hash of the last deleted event.
    pub marker: Option<(u64, Hash)>,
    /// Its last sequence (0 for a stream that is not there).
    pub head: u64,
}

/// How a stream fails to extend its leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Break {
    /// The event at the checkpointed sequence is another one.
    Rewritten { seq: u64, found: Hash },
    /// The stream was pruned through exactly that sequence, from another event.
    PrunedFromAnother { seq: u64, found: Hash },
    /// Nothing at or past that sequence: the stream is shorter than it was.
    RolledBack { seq: u64, head: u64 },
}

impl fmt::Display for Break {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Break::Rewritten { seq, found } => write!(
                f,
                "the event at seq {seq} is not the checkpointed one (chain hash {}…): rewritten",
                hex::encode(&found[..8])
            ),
            Break::PrunedFromAnother { seq, found } => write!(
                f,
                "pruned through seq {seq}, but from another event (chain hash {}…): rewritten",
                hex::encode(&found[..8])
            ),
            Break::RolledBack { seq, head } => {
                write!(f, "the checkpoint has seq {seq}, the store only goes to seq {head}: rolled back")
            }
        }
    }
}

/// The *extends* rule for one stream: its event at the leaf's sequence is
/// the checkpointed one, or it was pruned past it (its marker at or past
/// that sequence; at the same sequence, with the same hash).
pub fn extends_leaf(leaf: &Leaf, now: &StreamNow) -> Result<(), Break> {
    if let Some(found) = now.event {
        return if found == leaf.hash { Ok(()) } else { Err(Break::Rewritten { seq: leaf.seq, found }) };
    }
    match now.marker {
        Some((seq, _)) if seq > leaf.seq => Ok(()),
        Some((seq, hash)) if seq == leaf.seq && hash == leaf.hash => Ok(()),
        Some((seq, found)) if seq == leaf.seq => Err(Break::PrunedFromAnother { seq, found }),
        _ => Err(Break::RolledBack { seq: leaf.seq, head: now.head }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn h(bytes: &[u8]) -> Hash {
        *blake3::hash(bytes).as_bytes()
    }

    fn leaf(stream: &str, seq: u64, fill: u8) -> Leaf {
        Leaf { stream: stream.into(), seq, hash: [fill; 32] }
    }

    fn leaves(n: usize) -> Vec<Leaf> {
        (0..n).map(|i| leaf(&format!("account/{i:04}"), i as u64 + 1, i as u8)).collect()
    }

    fn lh(l: &Leaf) -> Hash {
        h(&[&[0u8][..], &l.bytes()].concat())
    }

    fn node(a: Hash, b: Hash) -> Hash {
        h(&[&[1u8][..], &a, &b].concat())
    }

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[9; 32])
    }

    #[test]
    fn a_leaf_is_the_jcs_of_stream_last_sequence_and_hex_chain_hash() {
        let l = leaf("account/ab", 7, 0xab);
        let expected = format!("[\"account/ab\",7,\"{}\"]", "ab".repeat(32));
        assert_eq!(l.bytes(), expected.as_bytes());
        assert_eq!(Leaf::parse(&l.bytes()).unwrap(), l);
        // Written directly, the bytes are what the JCS writer gives, for
        // any stream id and sequence.
        for (stream, seq) in [("account/ab", 0), ("a\"b\\c\u{1}\u{7f}", 1 << 53), ("delivery/x/y", (1 << 53) + 1)] {
            let l = Leaf { stream: stream.into(), seq, hash: [3; 32] };
            let jcs = jcs_value(&json!([stream, seq, hex::encode([3u8; 32])])).unwrap();
            assert_eq!(l.bytes(), jcs, "{stream:?} {seq}");
        }
        // A kept leaf must be its canonical bytes: spacing, uppercase hex or a float are refused.
        for bad in [
            format!("[\"account/ab\", 7,\"{}\"]", "ab".repeat(32)),
            format!("[\"account/ab\",7,\"{}\"]", "AB".repeat(32)),
            format!("[\"account/ab\",7.0,\"{}\"]", "ab".repeat(32)),
            "[\"account/ab\",7]".to_string(),
        ] {
            assert!(Leaf::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_empty_tree_hashes_to_the_hash_of_the_empty_string() {
        assert_eq!(merkle_root(&[]), h(b""));
        assert_eq!(root_of(&[]), h(b""));
    }

    #[test]
    fn rfc6962_one_leaf_is_its_leaf_hash_with_the_0x00_prefix() {
        let l = leaves(1);
        assert_eq!(root_of(&l), lh(&l[0]));
        assert_ne!(root_of(&l), h(&l[0].bytes()), "the prefix is part of the leaf hash");
    }

    #[test]
    fn rfc6962_two_leaves_make_one_node_with_the_0x01_prefix() {
        let l = leaves(2);
        assert_eq!(root_of(&l), node(lh(&l[0]), lh(&l[1])));
    }

    #[test]
    fn rfc6962_three_leaves_split_at_two() {
        let l = leaves(3);
        assert_eq!(root_of(&l), node(node(lh(&l[0]), lh(&l[1])), lh(&l[2])));
    }

    #[test]
    fn rfc6962_seven_leaves_split_at_four_then_two() {
        let l = leaves(7);
        let x: Vec<Hash> = l.iter().map(lh).collect();
        let left = node(node(x[0], x[1]), node(x[2], x[3]));
        let right = node(node(x[4], x[5]), x[6]);
        assert_eq!(root_of(&l), node(left, right));
    }

    #[test]
    fn the_split_is_the_largest_power_of_two_below_the_count() {
        for (n, k) in [(2, 1), (3, 2), (4, 2), (5, 4), (7, 4), (8, 4), (9, 8), (1025, 1024)] {
            assert_eq!(split(n), k, "n = {n}");
        }
    }

    #[test]
    fn a_checkpoint_verifies_under_its_relays_key_and_domain_tag() {
        let l = leaves(3);
        let cp = Checkpoint::issue("relay-a", 1_700_000_000, &l, 6, &key()).unwrap();
        assert_eq!((cp.streams, cp.events, cp.root.clone()), (3, 6, hex::encode(root_of(&l))));
        let map = cp.to_map();
        assert_eq!(verify(&map, &key().verifying_key(), "relay-a").unwrap(), cp);
        // The signed bytes are the domain tag, a newline and the JCS without the signature.
        let bytes = signed_bytes(Tag::Checkpoint, &map).unwrap();
        assert!(bytes.starts_with(b"relay/v1/checkpoint\n{\"events\":6,\"issued_at\":1700000000,"));

        let other = SigningKey::from_bytes(&[8; 32]).verifying_key();
        assert!(matches!(verify(&map, &other, "relay-a"), Err(CheckpointError::Signature(_))));
        assert!(matches!(verify(&map, &key().verifying_key(), "relay-b"), Err(CheckpointError::WrongRelay { .. })));
        for (member, value) in
            [("events", json!(7)), ("issued_at", json!(1_700_000_001)), ("root", json!("00".repeat(32)))]
        {
            let mut altered = map.clone();
            altered.insert(member.into(), value);
            assert!(verify(&altered, &key().verifying_key(), "relay-a").is_err(), "{member}");
        }
        // Under another object's tag, the same signature means nothing.
        let mut as_route = map.clone();
        crate::sign::sign_object(Tag::Route, &mut as_route, &key());
        assert!(matches!(verify(&as_route, &key().verifying_key(), "relay-a"), Err(CheckpointError::Signature(_))));
    }

    #[test]
    fn a_checkpoint_needs_its_leaves_sorted_by_stream_each_once() {
        let mut l = leaves(3);
        l.swap(0, 1);
        assert!(matches!(Checkpoint::issue("relay-a", 1, &l, 0, &key()), Err(CheckpointError::Leaves(_))));
        let twice = vec![leaf("account/a", 1, 1), leaf("account/a", 2, 2)];
        assert!(Checkpoint::issue("relay-a", 1, &twice, 0, &key()).is_err());
    }

    #[test]
    fn kept_leaves_must_hash_to_the_signed_root() {
        let l = leaves(7);
        let cp = Checkpoint::issue("relay-a", 1, &l, 28, &key()).unwrap();
        check_kept(&cp, &l).unwrap();
        let mut edited = l.clone();
        edited[4].hash[0] ^= 1;
        assert!(matches!(check_kept(&cp, &edited), Err(CheckpointError::KeptLeaves(_))));
        let mut rolled = l.clone();
        rolled[2].seq -= 1;
        assert!(check_kept(&cp, &rolled).is_err());
        assert!(check_kept(&cp, &l[..6]).is_err(), "a dropped leaf");
        let mut reordered = l.clone();
        reordered.swap(1, 2);
        assert!(check_kept(&cp, &reordered).is_err());
    }

    fn now(event: Option<Hash>, marker: Option<(u64, Hash)>, head: u64) -> StreamNow {
        StreamNow { event, marker, head }
    }

    #[test]
    fn a_stream_with_the_checkpointed_event_at_its_sequence_extends_it() {
        let l = leaf("account/a", 5, 1);
        assert_eq!(extends_leaf(&l, &now(Some([1; 32]), None, 5)), Ok(()));
        // Grown since: still the same event at seq 5.
        assert_eq!(extends_leaf(&l, &now(Some([1; 32]), None, 9)), Ok(()));
        // With its prefix pruned, the event still there.
        assert_eq!(extends_leaf(&l, &now(Some([1; 32]), Some((3, [3; 32])), 9)), Ok(()));
    }

    #[test]
    fn a_rewritten_event_does_not_extend_the_checkpoint() {
        let l = leaf("account/a", 5, 1);
        assert_eq!(extends_leaf(&l, &now(Some([2; 32]), None, 9)), Err(Break::Rewritten { seq: 5, found: [2; 32] }));
    }

    #[test]
    fn a_rolled_back_stream_does_not_extend_the_checkpoint() {
        let l = leaf("account/a", 5, 1);
        assert_eq!(extends_leaf(&l, &now(None, None, 3)), Err(Break::RolledBack { seq: 5, head: 3 }));
        assert_eq!(extends_leaf(&l, &now(None, None, 0)), Err(Break::RolledBack { seq: 5, head: 0 }));
        // Pruned, but not as far as the checkpointed sequence.
        assert_eq!(extends_leaf(&l, &now(None, Some((4, [4; 32])), 4)), Err(Break::RolledBack { seq: 5, head: 4 }));
    }

    #[test]
    fn a_stream_pruned_past_the_sequence_extends_the_checkpoint() {
        let l = leaf("account/a", 5, 1);
        assert_eq!(extends_leaf(&l, &now(None, Some((8, [8; 32])), 8)), Ok(()));
        assert_eq!(extends_leaf(&l, &now(None, Some((8, [8; 32])), 12)), Ok(()));
    }

    #[test]
    fn a_stream_pruned_through_the_sequence_must_have_the_checkpointed_hash() {
        let l = leaf("account/a", 5, 1);
        assert_eq!(extends_leaf(&l, &now(None, Some((5, [1; 32])), 5)), Ok(()));
        assert_eq!(
            extends_leaf(&l, &now(None, Some((5, [7; 32])), 5)),
            Err(Break::PrunedFromAnother { seq: 5, found: [7; 32] })
        );
    }
}
