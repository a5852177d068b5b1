//! The store's data-format version: a `FORMAT` file in the store's
//! directory holding one decimal number.
//!
//! A release opens the versions up to [`FORMAT_VERSION`] and refuses a
//! newer one before it touches anything, naming both: a newer binary's
//! data may mean something this one would misread, and a store once
//! written by an older binary cannot be taken back. Stores made before the
//! marker existed have none: they are version 1 (what this engine still
//! opens, value log or not), and a writer's first open writes the marker.
//! Bump the version when a release writes something an older one would
//! misread, and commit a fixture of the old version (docs/operate).
//!
//! - 1: sled's files in the store's directory, events in the value log
//!   or inline.
//! - 2: sled may live in `tree.<n>`, named by the file `tree` (its rewrite,
//!   `sled_engine.rs` step 9). A store is marked 2 by its first rewrite.
//! - 3: a retention index entry covers a run of an account's messages, not
//!   one (`relay_core::retention`): a release of format 2 would sweep only
//!   each run's first message on time. A writer's open marks the store 3
//!   (the first message it takes may start a run), and a backup's copy is 3.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;

use super::types::StoreError;

/// The newest data format this release opens and writes.
pub const FORMAT_VERSION: u32 = 3;

/// The version of a store without a marker (made before it existed).
const UNMARKED: u32 = 1;

pub(super) const FORMAT_FILE: &str = "FORMAT";

/// The version the store in `dir` holds, refusing a newer one than this
/// release opens; an unmarked store (or none yet) is version 1.
pub(super) fn check(dir: &Path) -> Result<(u32, bool), StoreError> {
    let path = dir.join(FORMAT_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((UNMARKED, false)),
        Err(e) => return Err(StoreError::Io(format!("read {}: {e}", path.display()))),
    };
    let found = text.trim().parse::<u32>().map_err(|_| StoreError::Format {
        found: format!("{:?} (not a version number)", text.trim()),
        supported: FORMAT_VERSION,
    })?;
    if found > FORMAT_VERSION || found == 0 {
        return Err(StoreError::Format { found: found.to_string(), supported: FORMAT_VERSION });
    }
    Ok((found, true))
}

/// Writes `version` as the marker of the store in `dir`: aside, synced,
/// renamed, the directory synced, so a crash leaves the old marker or
/// the new one.
pub(super) fn write(dir: &Path, version: u32) -> Result<(), StoreError> {
    let io = |e: std::io::Error| StoreError::Io(format!("write {}: {e}", dir.join(FORMAT_FILE).display()));
    let aside = dir.join(format!("{FORMAT_FILE}.new"));
    let mut f = File::create(&aside).map_err(io)?;
    f.write_all(format!("{version}\n").as_bytes()).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&aside, dir.join(FORMAT_FILE)).map_err(io)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}
