//! Witnessing the peers' checkpoints (PROTOCOL §10): every
//! `audit.witness_interval` (the first soon after start) each configured
//! peer is asked for its latest checkpoint (`audit.checkpoint`), which is
//! kept when it is signed by the peer's configured key, names the peer,
//! was not issued in the future (beyond `limits.clock_tolerance`) and is
//! not older than the last one witnessed from that peer (the core's
//! [`relay_core::witness::judge`]). A relay that rewrites its history
//! after a peer witnessed it can then be shown to have done so
//! (`relay audit verify --checkpoint`).
//!
//! # On disk
//! `<data_dir>/witness/<peer id>.jsonl`: one line per checkpoint witnessed,
//! `{"witnessed_at": <unix seconds>, "checkpoint": {…as the peer signed it…}}`,
//! oldest first, the last [`KEEP_PER_PEER`] kept (about 300 bytes a line:
//! some 50 KB per peer). The file is rewritten whole for each new line,
//! aside, fsynced and renamed (at most one a peer per interval).

use super::{private_dir, write_atomically};
use crate::peers::{CallError, PeerClient};
use ed25519_dalek::VerifyingKey;
use relay_core::clock::SharedClock;
use relay_core::witness::judge;
use relay_schemas::checkpoint::Checkpoint;
use relay_schemas::methods::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Checkpoints kept per peer (a week of them at the default interval).
pub const KEEP_PER_PEER: usize = 168;

/// The witness log's directory in a data dir.
pub fn dir_in(data_dir: &Path) -> PathBuf {
    data_dir.join("witness")
}

/// One peer's witness log in `dir`.
pub fn log_path(dir: &Path, peer: &str) -> PathBuf {
    // A relay id is `[a-z0-9.-]{1,64}`: never a path separator.
    dir.join(format!("{peer}.jsonl"))
}

/// One witnessed checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// When this relay fetched it (Unix seconds).
    pub witnessed_at: u64,
    /// The object as the peer signed it, unknown members included.
    pub checkpoint: Map<String, Value>,
}

/// A peer's witness log, oldest first (none yet: empty).
pub fn read_log(path: &Path) -> Result<Vec<Entry>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1)))
        .collect()
}

/// The peers whose logs are in `dir` (by file name), sorted.
pub fn peers_in(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut peers = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let name = entry?.file_name();
                if let Some(peer) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) {
                    if !peer.starts_with('.') {
                        peers.push(peer.to_owned());
                    }
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    peers.sort();
    Ok(peers)
}

/// Appends `entry` to the log at `path`, keeping the last [`KEEP_PER_PEER`].
pub fn append(path: &Path, entry: &Entry) -> Result<(), String> {
    let mut entries = read_log(path)?;
    entries.push(entry.clone());
    let skip = entries.len().saturating_sub(KEEP_PER_PEER);
    let mut text = String::new();
    for e in &entries[skip..] {
        text.push_str(&serde_json::to_string(e).map_err(|e| e.to_string())?);
        text.push('\n');
    }
    write_atomically(path, text.as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}

/// The witness of a running relay.
pub struct Witness {
    dir: PathBuf,
    peers: Vec<(String, VerifyingKey)>,
    client: PeerClient,
    clock: SharedClock,
    clock_tolerance: u64,
    /// The last checkpoint witnessed from each peer.
    last: Mutex<HashMap<String, Checkpoint>>,
}

impl Witness {
    /// The witness of `peers` (id, configured key), its log in `data_dir/witness`.
    pub fn open(
        data_dir: &Path,
        peers: Vec<(String, VerifyingKey)>,
        client: PeerClient,
        clock: SharedClock,
        clock_tolerance: u64,
    ) -> Result<Witness, String> {
        let dir = dir_in(data_dir);
        private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut last = HashMap::new();
        for (peer, _) in &peers {
            let entries = read_log(&log_path(&dir, peer))?;
            if let Some(cp) = entries.last().and_then(|e| Checkpoint::from_map(&e.checkpoint).ok()) {
                last.insert(peer.clone(), cp);
            }
        }
        Ok(Witness { dir, peers, client, clock, clock_tolerance, last: Mutex::new(last) })
    }

    /// Fetches every peer's checkpoint every `every`, the first `every`
    /// after start (on the current arbiter): a peer's requests to this
    /// relay's neighbours stay what its traffic makes them until then.
    pub fn start(self: Arc<Self>, every: Duration) {
        if self.peers.is_empty() {
            return;
        }
        actix_web::rt::spawn(async move {
            actix_web::rt::time::sleep(every).await;
            loop {
                for (peer, key) in &self.peers {
                    match self.witness(peer, key).await {
                        Ok(Some(cp)) => tracing::info!(peer = %peer, issued_at = cp.issued_at, streams = cp.streams,
                            events = cp.events, root = %cp.root, "peer checkpoint witnessed"),
                        Ok(None) => tracing::debug!(peer = %peer, "peer checkpoint unchanged"),
                        Err(why) => tracing::warn!(peer = %peer, reason = %why, "peer checkpoint not witnessed"),
                    }
                }
                actix_web::rt::time::sleep(every).await;
            }
        });
    }

    /// Fetches `peer`'s latest checkpoint and logs it if it is new.
    async fn witness(&self, peer: &str, key: &VerifyingKey) -> Result<Option<Checkpoint>, String> {
        // A nonce (an extension member; the params are otherwise `{}`): two
        // asks within one second would be one signed request, refused as a replay.
        let params = serde_json::json!({"nonce": relay_schemas::encoding::b64_encode(&rand::random::<[u8; 16]>())});
        let body = serde_json::to_vec(&params).map_err(|e| e.to_string())?;
        let bytes = self.client.call(peer, Method::AuditCheckpoint, body).await.map_err(|e| match e {
            CallError::Answered { code, error } => format!("answered {code}: {}", error.message),
            CallError::NotSent(e) | CallError::Unknown(e) => e.message,
        })?;
        let object: Map<String, Value> =
            serde_json::from_slice(&bytes).map_err(|e| format!("not a checkpoint object: {e}"))?;
        let now = self.clock.now().0;
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).get(peer).cloned();
        let Some(cp) = judge(&object, peer, key, last.as_ref(), now, self.clock_tolerance)? else {
            return Ok(None);
        };
        let (path, entry) = (log_path(&self.dir, peer), Entry { witnessed_at: now, checkpoint: object });
        actix_web::rt::task::spawn_blocking(move || append(&path, &entry)).await.map_err(|e| e.to_string())??;
        self.last.lock().unwrap_or_else(|e| e.into_inner()).insert(peer.to_owned(), cp.clone());
        Ok(Some(cp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use relay_schemas::checkpoint::{verify, Leaf};

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[6; 32])
    }

    fn issued(at: u64, seq: u64) -> Checkpoint {
        let leaves = [Leaf { stream: "account/a".into(), seq, hash: [1; 32] }];
        Checkpoint::issue("relay-b", at, &leaves, seq, &key()).unwrap()
    }

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn the_witness_log_keeps_the_last_checkpoints_of_each_peer() {
        let dir = tempfile::tempdir().unwrap();
        let path = log_path(dir.path(), "relay-b");
        assert_eq!(read_log(&path).unwrap(), []);
        for n in 0..KEEP_PER_PEER as u64 + 2 {
            append(&path, &Entry { witnessed_at: NOW + n, checkpoint: issued(NOW + n, n + 1).to_map() }).unwrap();
        }
        let log = read_log(&path).unwrap();
        assert_eq!(log.len(), KEEP_PER_PEER);
        assert_eq!((log[0].witnessed_at, log.last().unwrap().witnessed_at), (NOW + 2, NOW + KEEP_PER_PEER as u64 + 1));
        // The kept object still verifies: nothing of it was changed.
        verify(&log[0].checkpoint, &key().verifying_key(), "relay-b").unwrap();
        assert_eq!(peers_in(dir.path()).unwrap(), ["relay-b"]);
    }
}
