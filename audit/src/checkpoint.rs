//! Checkpoints in `relay audit` (PROTOCOL §10):
//!
//! - `relay audit checkpoint`: the relay's latest checkpoint, as signed;
//! - `relay audit verify --checkpoint FILE`: whether the store extends a
//!   checkpoint (this relay's own, or one a peer witnessed): the leaves the
//!   relay kept for it must hash to its signed root, then each stream must
//!   still have that event at that sequence, or have been pruned past it.
//!   Without kept leaves for it, the store cannot be shown to extend it: a
//!   failure too (a relay restored from before the checkpoint, or one that
//!   dropped them);
//! - `relay audit witnesses`: the peers' checkpoints this relay witnessed.
//!
//! The checkpoint and witness files are read as they are (neither needs
//! the store, so these work beside a running relay); `verify` opens the
//! store of a stopped relay.

use super::{open_store, AuditError};
use ed25519_dalek::VerifyingKey;
use relay::checkpoint::{self, witness};
use relay_actors::store::Store;
use relay_schemas::checkpoint::{check_kept, extends_leaf, Checkpoint, Leaf, StreamNow};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::Path;

/// Prints the latest kept checkpoint (one JSON line, as signed); exit 1
/// when there is none.
pub fn print_latest(data_dir: &Path, out: &mut dyn Write) -> Result<u8, AuditError> {
    let dir = checkpoint::dir_in(data_dir);
    match checkpoint::kept(&dir)?.pop() {
        Some(latest) => {
            writeln!(out, "{}", serde_json::to_string(&latest.checkpoint).unwrap_or_default())?;
            Ok(0)
        }
        None => {
            eprintln!("relay audit checkpoint: no checkpoint in {}", dir.display());
            Ok(1)
        }
    }
}

/// Prints the witness log, one JSON line per witnessed checkpoint
/// (`{"peer","witnessed_at","checkpoint"}`), of every peer or only `peer`;
/// with `latest`, only each peer's latest checkpoint object (a FILE for
/// `verify --checkpoint`).
pub fn print_witnesses(
    data_dir: &Path,
    peer: Option<&str>,
    latest: bool,
    out: &mut dyn Write,
) -> Result<u8, AuditError> {
    let dir = witness::dir_in(data_dir);
    let peers = match peer {
        Some(p) => {
            relay_schemas::ids::check_relay_id("--peer", p).map_err(|e| AuditError::Usage(e.message))?;
            vec![p.to_owned()]
        }
        None => witness::peers_in(&dir)?,
    };
    let mut printed = 0;
    for p in &peers {
        let entries = witness::read_log(&witness::log_path(&dir, p)).map_err(AuditError::Usage)?;
        let shown = if latest { entries.len().saturating_sub(1) } else { 0 };
        for e in &entries[shown..] {
            let line = if latest {
                Value::Object(e.checkpoint.clone())
            } else {
                json!({"peer": p, "witnessed_at": e.witnessed_at, "checkpoint": e.checkpoint})
            };
            writeln!(out, "{line}")?;
            printed += 1;
        }
    }
    if printed == 0 {
        eprintln!("relay audit witnesses: nothing witnessed in {}", dir.display());
    }
    Ok(u8::from(printed == 0))
}

/// The relay's id and public key from its config (`relay.key_file`), to
/// check a checkpoint's signature; `None` without a config.
pub fn relay_key(config: Option<&Path>) -> Result<Option<(String, VerifyingKey)>, AuditError> {
    let Some(path) = config else { return Ok(None) };
    let cfg = relay::config::Config::load(path).map_err(|e| AuditError::Usage(e.to_string()))?;
    let key = relay::keys::load(&cfg.relay.key_file).map_err(AuditError::Usage)?;
    Ok(Some((cfg.relay.id, key.verifying_key())))
}

/// A checkpoint object from FILE: the object itself, or a witness log line
/// holding it (`{"witnessed_at","checkpoint"}`).
pub fn read_checkpoint_file(path: &Path) -> Result<Map<String, Value>, AuditError> {
    let text = std::fs::read_to_string(path).map_err(|e| AuditError::Usage(format!("{}: {e}", path.display())))?;
    let bad = |what: String| AuditError::Usage(format!("{}: {what}", path.display()));
    let mut object: Map<String, Value> = serde_json::from_str(text.trim()).map_err(|e| bad(e.to_string()))?;
    if let Some(Value::Object(inner)) = object.remove("checkpoint") {
        object = inner;
    }
    Checkpoint::from_map(&object).map_err(|e| bad(e.to_string()))?;
    Ok(object)
}

/// What `verify --checkpoint` found.
#[derive(Debug, Default)]
pub struct Report {
    /// Why the store cannot be shown to extend the checkpoint at all (no
    /// kept leaves, leaves that are not the signed ones, a bad signature).
    pub cannot: Vec<String>,
    /// Streams that do not extend their leaf, and how.
    pub broken: Vec<(String, String)>,
    /// Leaves checked against the store.
    pub checked: u64,
    /// Whether the signature was checked against the relay's key.
    pub signature_checked: bool,
}

impl Report {
    pub fn extends(&self) -> bool {
        self.cannot.is_empty() && self.broken.is_empty()
    }
}

/// Whether `store` extends the checkpoint `object`, with the leaves kept in
/// `data_dir`; its signature checked when `key` (the relay's id and key) is given.
pub fn verify(
    store: &Store,
    data_dir: &Path,
    object: &Map<String, Value>,
    key: Option<&(String, VerifyingKey)>,
) -> Result<Report, AuditError> {
    let cp = Checkpoint::from_map(object).map_err(|e| AuditError::Usage(e.to_string()))?;
    let mut report = Report::default();
    if let Some((relay_id, key)) = key {
        report.signature_checked = true;
        if let Err(e) = relay_schemas::checkpoint::verify(object, key, relay_id) {
            report.cannot.push(format!("not a checkpoint of this relay: {e}"));
        }
    }
    let kept = checkpoint::kept(&checkpoint::dir_in(data_dir))?;
    let Some(file) = kept.iter().rev().find(|k| k.checkpoint.same_as(&cp)) else {
        report.cannot.push(format!(
            "no leaves kept for it in {} (the relay keeps its last {}): the store cannot be shown to extend it",
            checkpoint::dir_in(data_dir).display(),
            checkpoint::KEEP
        ));
        return Ok(report);
    };
    let leaves = match checkpoint::read_leaves(&file.path) {
        Ok(leaves) => leaves,
        Err(e) => {
            report.cannot.push(format!("kept leaves unreadable: {e}"));
            return Ok(report);
        }
    };
    // Checked against the root of the checkpoint given, not of the file.
    if let Err(e) = check_kept(&cp, &leaves) {
        report.cannot.push(format!("{} ({})", e, file.path.display()));
        return Ok(report);
    }
    for leaf in &leaves {
        report.checked += 1;
        if let Some(why) = leaf_against_store(store, leaf) {
            report.broken.push((leaf.stream.clone(), why));
        }
    }
    Ok(report)
}

/// Why `leaf`'s stream in `store` does not extend it, if it does not.
fn leaf_against_store(store: &Store, leaf: &Leaf) -> Option<String> {
    let now = (|| {
        let event = match store.read(&leaf.stream, leaf.seq.saturating_sub(1)).next() {
            Some(Ok(ev)) if ev.seq == leaf.seq => Some(ev.hash),
            Some(Ok(_)) | None => None,
            Some(Err(e)) => return Err(format!("the event at seq {} is unreadable: {e}", leaf.seq)),
        };
        let marker = store.pruned(&leaf.stream).map_err(|e| e.to_string())?.map(|p| (p.head.seq, p.head.hash));
        let head = store.head(&leaf.stream).map_err(|e| e.to_string())?.seq;
        Ok(StreamNow { event, marker, head })
    })();
    match now {
        Ok(now) => extends_leaf(leaf, &now).err().map(|b| b.to_string()),
        Err(why) => Some(why),
    }
}

/// `relay audit verify --checkpoint FILE` on the stopped relay's data dir.
pub fn run_verify(data_dir: &Path, config: Option<&Path>, file: &Path, out: &mut dyn Write) -> Result<u8, AuditError> {
    let object = read_checkpoint_file(file)?;
    let key = relay_key(config)?;
    let store = open_store(data_dir)?;
    let report = verify(&store, data_dir, &object, key.as_ref())?;
    store.close()?;
    let cp = Checkpoint::from_map(&object).map_err(|e| AuditError::Usage(e.to_string()))?;
    for (stream, why) in &report.broken {
        writeln!(out, "stream {stream:?}: {why}")?;
    }
    for why in &report.cannot {
        writeln!(out, "checkpoint: {why}")?;
    }
    if !report.signature_checked {
        writeln!(out, "note: signature not checked (give --config to check it against the relay's key)")?;
    }
    let what = format!(
        "the checkpoint of {} issued at {} ({} streams, {} events, root {}…)",
        cp.relay_id,
        cp.issued_at,
        cp.streams,
        cp.events,
        &cp.root[..16]
    );
    let summary = if report.extends() {
        format!("{}: the store extends {what}", data_dir.display())
    } else if report.cannot.is_empty() {
        let n = report.broken.len();
        format!("{}: the store does not extend {what}: {n} stream{}", data_dir.display(), if n == 1 { "" } else { "s" })
    } else {
        format!("{}: cannot show that the store extends {what}", data_dir.display())
    };
    writeln!(out, "{summary}")?;
    Ok(u8::from(!report.extends()))
}
