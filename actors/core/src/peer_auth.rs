//! Who a relay request is from (PROTOCOL §3 *Relay RPC*): a configured
//! peer's key, a `Relay-Timestamp` within the clock tolerance, and its
//! signature over the request, seen once.
//!
//! The signature covers method, target, timestamp and body, so a captured
//! request verifies again anywhere in its timestamp's window: `2 ×
//! clock_tolerance`. [`ReplayWindow`] remembers the signatures it admitted
//! until their timestamp leaves the window, with the answer each got when
//! it is small: the same signature again is not carried out a second time
//! (it spends no budget and changes nothing) but answered what the first
//! was. Ed25519 is deterministic, so an honest source that sends the very
//! same request twice in one second (a retry after a crash, a duplicate
//! it sends on purpose) repeats its signature too, and must get the
//! original answer. A copy whose answer is not kept (still being worked
//! out, or too large to keep) is answered `rate_limited` (retry after a
//! second, when the source signs a fresh timestamp) rather than
//! `unauthorized`, which would end a delivery.

use ed25519_dalek::VerifyingKey;
use relay_schemas::encoding::b64_decode_array;
use relay_schemas::sign::{relay_request_bytes, verify_bytes};
use relay_schemas::{ErrorCode, RelayError};
use std::collections::{BTreeMap, HashMap};

/// The request headers of a relay call.
pub struct RelayHeaders<'a> {
    pub relay_id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// A request whose key and timestamp check out; [`ReplayWindow::admit`]
/// decides whether it is new.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authenticated {
    pub peer: String,
    pub timestamp: u64,
    /// 128 bits of `blake3(signature bytes)`: what the window remembers.
    pub signature_digest: [u8; 16],
}

/// Who may call: configured peers and their keys.
pub struct PeerKeys {
    own_id: String,
    keys: HashMap<String, VerifyingKey>,
    clock_tolerance: u64,
}

impl PeerKeys {
    pub fn new(own_id: &str, keys: HashMap<String, VerifyingKey>, clock_tolerance: u64) -> Self {
        PeerKeys { own_id: own_id.into(), keys, clock_tolerance }
    }

    pub fn clock_tolerance(&self) -> u64 {
        self.clock_tolerance
    }

    /// The calling peer, or `unauthorized`.
    pub fn authenticate(
        &self,
        h: &RelayHeaders,
        method: &str,
        body: &[u8],
        now: u64,
    ) -> Result<Authenticated, RelayError> {
        let deny = |why: &str| RelayError::unauthorized(format!("relay authentication: {why}"));
        let id = h.relay_id.ok_or_else(|| deny("Relay-Id missing"))?;
        let key = self.keys.get(id).ok_or_else(|| deny("not a configured peer"))?;
        // Digits only: `u64::from_str` would also take a leading `+`.
        let ts: u64 = h
            .timestamp
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| deny("Relay-Timestamp missing or malformed"))?;
        if ts.abs_diff(now) > self.clock_tolerance {
            return Err(deny("Relay-Timestamp outside clock tolerance"));
        }
        let sig = h.signature.ok_or_else(|| deny("Relay-Signature missing"))?;
        verify_bytes(key, &relay_request_bytes(method, &self.own_id, ts, body), sig)
            .map_err(|_| deny("bad signature"))?;
        // Keyed by the decoded bytes, not the header's text: two spellings
        // of one signature are one request.
        let bytes: [u8; 64] = b64_decode_array("Relay-Signature", sig).map_err(|_| deny("bad signature"))?;
        let mut signature_digest = [0u8; 16];
        signature_digest.copy_from_slice(&blake3::hash(&bytes).as_bytes()[..16]);
        Ok(Authenticated { peer: id.to_owned(), timestamp: ts, signature_digest })
    }
}

/// The signatures admitted whose timestamp is still inside the window,
/// bucketed by timestamp so that what leaves the window goes in one step,
/// each with its answer `A` once known and kept. Its size is bounded by
/// `cap` signatures (what the peers' rate limits admit in one window; a
/// full window answers `rate_limited`: it holds only requests from
/// configured peers, which are over their budget anyway) and by
/// `answer_bytes` bytes of kept answers.
#[derive(Debug)]
pub struct ReplayWindow<A> {
    tolerance: u64,
    cap: usize,
    len: usize,
    answer_bytes: usize,
    kept_bytes: usize,
    by_timestamp: BTreeMap<u64, Seen<A>>,
}

/// The signatures of one timestamp, each with its kept answer and its size.
type Seen<A> = HashMap<[u8; 16], Option<(A, usize)>>;

/// What [`ReplayWindow::admit`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission<A> {
    /// Not seen in the window: carry it out, then [`ReplayWindow::answered`].
    New,
    /// Seen and answered: answer this again.
    Again(A),
}

/// Bytes of answers a window keeps at most: duplicates are rare, so this
/// only has to hold the answers of a burst of them.
pub const ANSWER_BYTES: usize = 8 << 20;
/// An answer larger than this is not kept (a page, a device list): its
/// duplicate is told to retry instead.
pub const MAX_KEPT_ANSWER: usize = 4096;

impl<A: Clone> ReplayWindow<A> {
    pub fn new(clock_tolerance: u64, cap: usize) -> Self {
        ReplayWindow {
            tolerance: clock_tolerance,
            cap: cap.max(1),
            len: 0,
            answer_bytes: ANSWER_BYTES,
            kept_bytes: 0,
            by_timestamp: BTreeMap::new(),
        }
    }

    /// The same with room for `bytes` of answers.
    pub fn with_answer_bytes(mut self, bytes: usize) -> Self {
        self.answer_bytes = bytes;
        self
    }

    /// Signatures remembered now.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Admits `a` once; the same signature again while its timestamp is
    /// in the window gets the first one's answer if it was kept, else
    /// `rate_limited`.
    pub fn admit(&mut self, a: &Authenticated, now: u64) -> Result<Admission<A>, RelayError> {
        // A timestamp older than `now - tolerance` is refused before it gets
        // here, so what is remembered for it can go.
        let live = self.by_timestamp.split_off(&now.saturating_sub(self.tolerance));
        for seen in std::mem::replace(&mut self.by_timestamp, live).into_values() {
            self.len -= seen.len();
            self.kept_bytes -= seen.values().flatten().map(|(_, n)| n).sum::<usize>();
        }
        if let Some(seen) = self.by_timestamp.get(&a.timestamp).and_then(|s| s.get(&a.signature_digest)) {
            return match seen {
                Some((answer, _)) => Ok(Admission::Again(answer.clone())),
                None => Err(refused("relay request replayed: this signed request was already received")),
            };
        }
        if self.len >= self.cap {
            return Err(refused("relay request window full"));
        }
        self.by_timestamp.entry(a.timestamp).or_default().insert(a.signature_digest, None);
        self.len += 1;
        Ok(Admission::New)
    }

    /// `a`, admitted as new, was answered `answer` of `bytes` bytes: keep
    /// it for its duplicates if it is small and there is room.
    pub fn answered(&mut self, a: &Authenticated, answer: A, bytes: usize) {
        if bytes > MAX_KEPT_ANSWER || self.kept_bytes + bytes > self.answer_bytes {
            return;
        }
        if let Some(slot @ None) = self.by_timestamp.get_mut(&a.timestamp).and_then(|s| s.get_mut(&a.signature_digest))
        {
            *slot = Some((answer, bytes));
            self.kept_bytes += bytes;
        }
    }

    /// Bytes of answers kept now.
    pub fn kept_bytes(&self) -> usize {
        self.kept_bytes
    }
}

fn refused(why: &str) -> RelayError {
    RelayError::new(ErrorCode::RateLimited, why).with_data(serde_json::json!({ "retry_after": 1 }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use relay_schemas::sign::sign_relay_request;

    const TOL: u64 = 300;

    fn keys() -> (PeerKeys, SigningKey) {
        let peer = SigningKey::from_bytes(&[7; 32]);
        let keys = HashMap::from([("relay-p".to_string(), peer.verifying_key())]);
        (PeerKeys::new("relay-x", keys, TOL), peer)
    }

    fn signed(key: &SigningKey, ts: u64, body: &[u8]) -> (String, String) {
        (ts.to_string(), sign_relay_request(key, "route.get", "relay-x", ts, body))
    }

    fn auth(keys: &PeerKeys, (ts, sig): &(String, String), body: &[u8], now: u64) -> Result<Authenticated, RelayError> {
        let h = RelayHeaders { relay_id: Some("relay-p"), timestamp: Some(ts), signature: Some(sig) };
        keys.authenticate(&h, "route.get", body, now)
    }

    #[test]
    fn a_relay_request_is_carried_out_once_within_its_timestamps_window() {
        let (keys, peer) = keys();
        let mut w = ReplayWindow::new(TOL, 1000);
        let now = 1_000_000;
        let req = signed(&peer, now, b"{}");
        let a = auth(&keys, &req, b"{}", now).unwrap();
        assert_eq!(w.admit(&a, now).unwrap(), Admission::New);
        // While its answer is not known, a copy is told to retry.
        let e = w.admit(&a, now).unwrap_err();
        assert_eq!((e.code, e.data.unwrap()["retry_after"].clone()), (ErrorCode::RateLimited, 1.into()));
        w.answered(&a, "first answer", 12);
        for later in [now, now + 1, now + TOL] {
            let again = auth(&keys, &req, b"{}", later).unwrap();
            assert_eq!(w.admit(&again, later).unwrap(), Admission::Again("first answer"), "at +{}", later - now);
        }
        // Past the window the key check refuses it; the window forgot it.
        assert_eq!(auth(&keys, &req, b"{}", now + TOL + 1).unwrap_err().code, ErrorCode::Unauthorized);
        w.admit(&auth(&keys, &signed(&peer, now + TOL + 1, b"{}"), b"{}", now + TOL + 1).unwrap(), now + TOL + 1)
            .unwrap();
        assert_eq!(w.len(), 1, "the old signature left with its timestamp");
        assert_eq!(w.kept_bytes(), 0, "and its answer with it");
    }

    #[test]
    fn a_large_answer_is_not_kept_and_kept_answers_are_bounded() {
        let (keys, peer) = keys();
        let mut w = ReplayWindow::new(TOL, 1000).with_answer_bytes(100);
        let now = 1_000_000;
        let page = auth(&keys, &signed(&peer, now, b"{\"page\":1}"), b"{\"page\":1}", now).unwrap();
        w.admit(&page, now).unwrap();
        w.answered(&page, "a page", MAX_KEPT_ANSWER + 1);
        assert_eq!(w.admit(&page, now).unwrap_err().code, ErrorCode::RateLimited, "a large answer is not kept");
        for n in 0..3 {
            let body = format!("{{\"n\":{n}}}");
            let a = auth(&keys, &signed(&peer, now, body.as_bytes()), body.as_bytes(), now).unwrap();
            w.admit(&a, now).unwrap();
            w.answered(&a, "small", 40);
        }
        assert_eq!(w.kept_bytes(), 80, "the third answer found no room");
    }

    #[test]
    fn another_body_or_timestamp_is_another_request() {
        let (keys, peer) = keys();
        let mut w = ReplayWindow::<()>::new(TOL, 1000);
        let now = 1_000_000;
        for (ts, body) in [(now, &b"{}"[..]), (now, b"{\"a\":1}"), (now + 1, b"{}"), (now - 1, b"{}")] {
            w.admit(&auth(&keys, &signed(&peer, ts, body), body, now).unwrap(), now).unwrap();
        }
        assert_eq!(w.len(), 4);
    }

    #[test]
    fn the_replay_window_holds_at_most_its_cap() {
        let (keys, peer) = keys();
        let mut w = ReplayWindow::<()>::new(TOL, 3);
        let now = 1_000_000;
        for n in 0..3 {
            let body = format!("{{\"n\":{n}}}");
            w.admit(&auth(&keys, &signed(&peer, now, body.as_bytes()), body.as_bytes(), now).unwrap(), now).unwrap();
        }
        let e = w.admit(&auth(&keys, &signed(&peer, now, b"{}"), b"{}", now).unwrap(), now).unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert_eq!(w.len(), 3);
        // Once the window has moved past them, there is room again.
        let later = now + TOL + 1;
        w.admit(&auth(&keys, &signed(&peer, later, b"{}"), b"{}", later).unwrap(), later).unwrap();
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn relay_authentication_refuses_unknown_peers_stale_timestamps_and_bad_signatures() {
        let (keys, peer) = keys();
        let now = 1_000_000;
        let stranger = SigningKey::from_bytes(&[9; 32]);
        let (ts, sig) = signed(&peer, now, b"{}");
        let forged = signed(&stranger, now, b"{}").1;
        let plus = format!("+{ts}");
        for (id, ts, sig) in [
            (Some("relay-q"), ts.as_str(), sig.as_str()),
            (Some("relay-p"), plus.as_str(), sig.as_str()),
            (Some("relay-p"), ts.as_str(), forged.as_str()),
            (None, ts.as_str(), sig.as_str()),
        ] {
            let h = RelayHeaders { relay_id: id, timestamp: Some(ts), signature: Some(sig) };
            assert_eq!(keys.authenticate(&h, "route.get", b"{}", now).unwrap_err().code, ErrorCode::Unauthorized);
        }
        let old = signed(&peer, now - TOL - 1, b"{}");
        assert_eq!(auth(&keys, &old, b"{}", now).unwrap_err().code, ErrorCode::Unauthorized);
    }
}
