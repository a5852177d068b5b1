//! The value log's space: live bytes per segment, and the walk that moves
//! a mostly dead segment's live values out of it (`sled_engine.rs`, step 7,
//! says when and why it is safe).
//!
//! Live bytes are the value bytes that pointers in sled name, per segment.
//! `install` learns them for free: sled's `insert` and `remove` return the
//! value they replace, so the pointer an overwrite or removal kills is
//! known without a read. What sled held at open is counted by a scan
//! beside the writer, in chunks taken under the same lock `install` holds,
//! so each key is counted once: a key the scan has passed is counted by
//! `install`, one ahead of it by the scan (which sees its latest value).
//! No victim is chosen before the scan ends.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::engine::Write;
use super::types::StoreError;
use super::{codec, wal};

/// A value sled holds in place of the bytes it names in the log (segment,
/// offset, length): here, beside the walk that moves those bytes.
pub(super) const POINTER_LEN: usize = 20;

/// Whether sled holds `key`'s value as a pointer when it came from a
/// segment (`sled_engine.rs`, step 3): the one rule for writes and reads.
pub(super) fn pointed(key: &[u8]) -> bool {
    matches!(key.first(), Some(&codec::EVENT | &codec::BLOB))
}

pub(super) fn pointer(segment: u64, offset: u64, len: usize) -> [u8; POINTER_LEN] {
    let mut p = [0; POINTER_LEN];
    p[..8].copy_from_slice(&segment.to_be_bytes());
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..].copy_from_slice(&u32::try_from(len).expect("a value larger than 4 GiB").to_be_bytes());
    p
}

/// (segment, offset, len) of a [`pointer`]; `value` is `POINTER_LEN` long.
pub(super) fn parse_pointer(value: &[u8]) -> (u64, u64, u64) {
    let be = |r: std::ops::Range<usize>| value[r].iter().fold(0u64, |n, &b| n << 8 | u64::from(b));
    (be(0..8), be(8..16), be(16..POINTER_LEN))
}

/// How much of a segment one writer turn walks: compaction runs between
/// groups on the writer thread, so this bounds the pause it adds to a
/// commit (measured in `tests/store.rs`, see docs/performance-journal.md).
#[derive(Clone, Copy, Debug)]
pub(super) struct Budget {
    /// Pointed puts looked up in sled.
    pub keys: usize,
    /// Value bytes copied.
    pub bytes: usize,
    /// Records read from the segment.
    pub records: usize,
}

impl Budget {
    pub const TURN: Budget = Budget { keys: 256, bytes: 256 << 10, records: 64 };
    pub const UNBOUNDED: Budget = Budget { keys: usize::MAX, bytes: usize::MAX, records: usize::MAX };
}

/// Keys the open's scan counts per hold of the lock `install` takes.
pub(super) const SCAN_CHUNK: usize = 512;

#[derive(Clone, Copy, Debug, Default)]
struct Seg {
    live: u64,
    len: u64,
}

enum Scan {
    /// Every pointed key up to this one (none yet: `None`) is counted.
    Upto(Option<Vec<u8>>),
    Done,
}

/// Live bytes per segment (module doc).
pub(super) struct Accounts {
    segs: BTreeMap<u64, Seg>,
    scan: Scan,
    /// A segment lost live bytes, or `before` moved, since the last
    /// look for a victim that found none.
    changed: bool,
    last_before: u64,
}

/// One segment's space, as [`super::SledEngine::log_space`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSpace {
    pub segment: u64,
    /// Value bytes that pointers in sled name.
    pub live: u64,
    /// The file's length when last seen.
    pub len: u64,
}

/// The log's space ([`super::SledEngine::log_space`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSpace {
    /// Whether the open's count of live bytes has ended (no compaction before).
    pub counted: bool,
    /// Segments still in the log, ascending.
    pub segments: Vec<SegmentSpace>,
    /// Value bytes compaction copied since the open.
    pub compacted_bytes: u64,
    /// Segments removed since the open.
    pub removed_segments: u64,
    /// The longest compaction step the writer took between two groups
    /// (the most it delayed a group).
    pub longest_step: std::time::Duration,
    /// The segment a reopen replays from: the last checkpoint made every
    /// segment before it a candidate.
    pub replay_from: u64,
}

/// (segment, value length) of a pointer under `key`, if `value` is one.
fn pointer_of(key: &[u8], value: &[u8]) -> Option<(u64, u64)> {
    (pointed(key) && value.len() == POINTER_LEN).then(|| {
        let (segment, _, len) = parse_pointer(value);
        (segment, len)
    })
}

impl Accounts {
    /// Segments and their lengths found at open, none counted yet.
    pub fn new(lens: impl IntoIterator<Item = (u64, u64)>) -> Accounts {
        let segs = lens.into_iter().map(|(s, len)| (s, Seg { live: 0, len })).collect();
        Accounts { segs, scan: Scan::Upto(None), changed: true, last_before: 0 }
    }

    pub fn set_len(&mut self, segment: u64, len: u64) {
        self.segs.entry(segment).or_default().len = len;
    }

    pub fn is_counted(&self) -> bool {
        matches!(self.scan, Scan::Done)
    }

    fn counted(&self, key: &[u8]) -> bool {
        match &self.scan {
            Scan::Done => true,
            Scan::Upto(upto) => upto.as_deref().is_some_and(|upto| key <= upto),
        }
    }

    /// `key`'s value in sled went from `old` to `new` (`install`).
    pub fn note(&mut self, key: &[u8], old: Option<&[u8]>, new: Option<&[u8]>) {
        if !pointed(key) || !self.counted(key) {
            return;
        }
        if let Some((segment, len)) = old.and_then(|v| pointer_of(key, v)) {
            if let Some(seg) = self.segs.get_mut(&segment) {
                seg.live = seg.live.saturating_sub(len);
                self.changed = true;
            }
        }
        if let Some((segment, len)) = new.and_then(|v| pointer_of(key, v)) {
            self.segs.entry(segment).or_default().live += len;
        }
    }

    /// Counts up to `n` more of the pointers sled holds; whether the scan
    /// has ended. The caller holds the lock `install` takes.
    pub fn scan_chunk(&mut self, db: &sled::Db, n: usize) -> Result<bool, StoreError> {
        let Scan::Upto(upto) = &self.scan else { return Ok(true) };
        let mut upto = upto.clone();
        let mut left = n;
        // Pointed keys live in these spaces, ascending.
        for space in [codec::BLOB, codec::EVENT] {
            let from = match &upto {
                Some(k) if k[0] > space => continue,
                Some(k) if k[0] == space => [k.as_slice(), &[0]].concat(),
                _ => vec![space],
            };
            for kv in db.range(from.as_slice()..[space + 1].as_slice()) {
                if left == 0 {
                    self.scan = Scan::Upto(upto);
                    return Ok(false);
                }
                let (k, v) = kv?;
                if let Some((segment, len)) = pointer_of(&k, &v) {
                    self.segs.entry(segment).or_default().live += len;
                }
                upto = Some(k.to_vec());
                left -= 1;
            }
        }
        self.scan = Scan::Done;
        self.changed = true;
        Ok(true)
    }

    /// The segment to compact next, if any: of those before `before` (not
    /// replayed), one with no live bytes, or one whose dead bytes are more
    /// than half its length and at least `min_dead`; the lowest live share
    /// first. None until the scan has ended.
    pub fn victim(&mut self, before: u64, min_dead: u64) -> Option<u64> {
        if before != self.last_before {
            (self.last_before, self.changed) = (before, true);
        }
        if !self.is_counted() || !self.changed {
            return None;
        }
        let worth = |s: &Seg| s.live == 0 || (s.live * 2 < s.len && s.len - s.live >= min_dead);
        let found = self
            .segs
            .range(..before)
            .filter(|(_, s)| worth(s))
            .min_by(|(_, a), (_, b)| (a.live as u128 * b.len as u128).cmp(&(b.live as u128 * a.len as u128)))
            .map(|(&n, _)| n);
        self.changed = found.is_some();
        found
    }

    /// A segment walked whole: nothing points into it any more.
    pub fn forget(&mut self, segment: u64) {
        self.segs.remove(&segment);
    }

    pub fn space(&self) -> Vec<SegmentSpace> {
        self.segs.iter().map(|(&segment, s)| SegmentSpace { segment, live: s.live, len: s.len }).collect()
    }
}

/// A record being walked: its writes, their values' offsets, and the next
/// write to look at.
type Record = (Vec<Write>, Vec<Option<u64>>, usize);

/// A victim's records, read in order; each put whose value sled still
/// points at here is copied out.
pub(super) struct Walk {
    pub segment: u64,
    pub len: u64,
    file: File,
    /// Where the next record starts.
    next: u64,
    record: Option<Record>,
}

impl Walk {
    pub fn open(path: &Path, segment: u64) -> std::io::Result<Walk> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Walk { segment, len, file, next: 0, record: None })
    }

    /// Appends to `out` the live values found within `budget`, as puts of
    /// the same keys with the same bytes; whether the walk reached the
    /// segment's end (or a torn record: nothing after it was installed).
    pub fn step(&mut self, db: &sled::Db, budget: Budget, out: &mut Vec<Write>) -> Result<bool, StoreError> {
        let (mut keys, mut bytes, mut records) = (0, 0, 0);
        loop {
            if self.record.is_none() {
                if records >= budget.records {
                    return Ok(false);
                }
                records += 1;
                match self.read_record().map_err(|e| StoreError::Io(format!("read a segment to compact: {e}")))? {
                    Some(record) => self.record = Some(record),
                    None => return Ok(true),
                }
            }
            let Some((group, offsets, next)) = self.record.as_mut() else { unreachable!() };
            while *next < group.len() {
                if keys >= budget.keys || bytes >= budget.bytes {
                    return Ok(false);
                }
                let i = *next;
                *next += 1;
                let (Write::Put(k, v), Some(at)) = (&mut group[i], offsets[i]) else { continue };
                if !pointed(k) {
                    continue;
                }
                keys += 1;
                let here = pointer(self.segment, at, v.len());
                if db.get(&k[..])?.is_some_and(|now| now == here[..]) {
                    bytes += v.len();
                    out.push(Write::Put(std::mem::take(k), std::mem::take(v)));
                }
            }
            self.record = None;
        }
    }

    fn read_record(&mut self) -> std::io::Result<Option<Record>> {
        let mut header = [0; wal::HEADER];
        if self.next + wal::HEADER as u64 > self.len {
            return Ok(None);
        }
        self.file.read_exact_at(&mut header, self.next)?;
        let total = wal::record_len(&header) as u64;
        if self.next + total > self.len {
            return Ok(None);
        }
        let mut bytes = vec![0; total as usize];
        self.file.read_exact_at(&mut bytes, self.next)?;
        let Some((group, len)) = wal::record(&bytes) else { return Ok(None) };
        let offsets = wal::value_offsets(&group, self.next).collect();
        self.next += len as u64;
        Ok(Some((group, offsets, 0)))
    }
}
