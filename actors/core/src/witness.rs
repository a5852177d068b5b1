//! What a peer's checkpoint is judged by before it is witnessed (PROTOCOL
//! §10): signed by the peer's configured key and naming the peer, not
//! issued in the future beyond the clock tolerance, and not older than the
//! last one witnessed from that peer. The server's witness fetches the
//! checkpoints on a timer and keeps the ones judged new in its log.

use ed25519_dalek::VerifyingKey;
use relay_schemas::checkpoint::{verify, Checkpoint};
use serde_json::{Map, Value};

/// Whether a checkpoint `object` fetched from `peer` is one to keep:
/// `Ok(Some)` a new one, `Ok(None)` the one witnessed last, `Err` why it
/// is refused. `now` and `clock_tolerance` in seconds.
pub fn judge(
    object: &Map<String, Value>,
    peer: &str,
    key: &VerifyingKey,
    last: Option<&Checkpoint>,
    now: u64,
    clock_tolerance: u64,
) -> Result<Option<Checkpoint>, String> {
    let cp = verify(object, key, peer).map_err(|e| e.to_string())?;
    if cp.issued_at > now.saturating_add(clock_tolerance) {
        return Err(format!("issued at {}, in the future (now {now}, tolerance {clock_tolerance} s)", cp.issued_at));
    }
    match last {
        Some(last) if cp.issued_at < last.issued_at => Err(format!(
            "issued at {}, older than the last one witnessed from this peer (issued at {})",
            cp.issued_at, last.issued_at
        )),
        Some(last) if cp.same_as(last) => Ok(None),
        _ => Ok(Some(cp)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use relay_schemas::checkpoint::Leaf;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[6; 32])
    }

    fn issued(at: u64, seq: u64) -> Checkpoint {
        let leaves = [Leaf { stream: "account/a".into(), seq, hash: [1; 32] }];
        Checkpoint::issue("relay-b", at, &leaves, seq, &key()).unwrap()
    }

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn a_new_checkpoint_signed_by_the_peer_is_witnessed_and_the_same_one_again_is_not() {
        let (vk, cp) = (key().verifying_key(), issued(NOW, 3));
        assert_eq!(judge(&cp.to_map(), "relay-b", &vk, None, NOW, 300), Ok(Some(cp.clone())));
        assert_eq!(judge(&cp.to_map(), "relay-b", &vk, Some(&cp), NOW + 60, 300), Ok(None));
        let later = issued(NOW + 60, 4);
        assert_eq!(judge(&later.to_map(), "relay-b", &vk, Some(&cp), NOW + 60, 300), Ok(Some(later)));
    }

    #[test]
    fn a_checkpoint_older_than_the_last_witnessed_is_refused() {
        let (vk, last) = (key().verifying_key(), issued(NOW, 5));
        let older = issued(NOW - 1, 6);
        let why = judge(&older.to_map(), "relay-b", &vk, Some(&last), NOW, 300).unwrap_err();
        assert!(why.contains("older than the last one witnessed"), "{why}");
    }

    #[test]
    fn a_checkpoint_from_the_future_beyond_the_clock_tolerance_is_refused() {
        let vk = key().verifying_key();
        assert!(judge(&issued(NOW + 300, 1).to_map(), "relay-b", &vk, None, NOW, 300).is_ok());
        let why = judge(&issued(NOW + 301, 1).to_map(), "relay-b", &vk, None, NOW, 300).unwrap_err();
        assert!(why.contains("in the future"), "{why}");
    }

    #[test]
    fn a_checkpoint_not_signed_by_the_peers_configured_key_or_naming_another_relay_is_refused() {
        let cp = issued(NOW, 1).to_map();
        let other = SigningKey::from_bytes(&[7; 32]).verifying_key();
        assert!(judge(&cp, "relay-b", &other, None, NOW, 300).unwrap_err().contains("signature"));
        assert!(judge(&cp, "relay-c", &key().verifying_key(), None, NOW, 300).unwrap_err().contains("relay-b"));
    }
}
