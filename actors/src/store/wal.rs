//! Framing of the store's log (its segments): one record per group. Pure (no IO).
//!
//! ```text
//! record := len (u32 LE, of payload) ‖ crc32 (u32 LE, of len ‖ payload) ‖ payload
//! payload := op*
//! op := 0x01 ‖ klen (u32 LE) ‖ key ‖ vlen (u32 LE) ‖ value    (put)
//!     | 0x02 ‖ klen (u32 LE) ‖ key                           (remove)
//! ```
//!
//! Reading stops at the first record that is short (a write torn by the
//! crash), fails its checksum or does not parse: nothing after it is
//! trusted, since groups were written in order and only a prefix of them
//! can have been acknowledged.

use super::engine::Write;

pub(super) const HEADER: usize = 8;
const PUT: u8 = 1;
const REMOVE: u8 = 2;

/// Appends the record of `group` to `out`.
pub(super) fn encode(group: &[Write], out: &mut Vec<u8>) {
    encode_iter(group.iter(), out)
}

/// Bytes `w` takes in a record.
pub(super) fn encoded_len(w: &Write) -> usize {
    match w {
        Write::Put(k, v) => 9 + k.len() + v.len(),
        Write::Remove(k) => 5 + k.len(),
    }
}

/// Appends one record of `writes`, in order, to `out`.
pub(super) fn encode_iter<'a>(writes: impl Iterator<Item = &'a Write>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    for w in writes {
        match w {
            Write::Put(k, v) => {
                out.push(PUT);
                put_bytes(out, k);
                put_bytes(out, v);
            }
            Write::Remove(k) => {
                out.push(REMOVE);
                put_bytes(out, k);
            }
        }
    }
    let payload = &out[start + HEADER..];
    let len = u32::try_from(payload.len()).expect("a group larger than 4 GiB");
    let crc = checksum(len, payload);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
}

/// Covers the length too, so a run of zeroes (a file extended but not
/// written before the crash) is not a record of an empty group.
fn checksum(len: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a key or value larger than 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// Where each write's value lies in the record of `group` that starts at
/// `at` in its file (`None` for a remove): the value log points there
/// instead of copying the value.
pub(super) fn value_offsets(group: &[Write], at: u64) -> impl Iterator<Item = Option<u64>> + '_ {
    let mut pos = at + HEADER as u64;
    group.iter().map(move |w| {
        // A put's value is the last thing its encoding holds.
        let value = match w {
            Write::Put(_, v) => Some(pos + (encoded_len(w) - v.len()) as u64),
            Write::Remove(_) => None,
        };
        pos += encoded_len(w) as u64;
        value
    })
}

/// What a log holds: the groups of its valid prefix with where each
/// record starts, and that prefix's length.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Decoded {
    pub groups: Vec<Vec<Write>>,
    pub starts: Vec<usize>,
    pub valid_len: usize,
}

pub(super) fn decode(log: &[u8]) -> Decoded {
    let mut decoded = Decoded::default();
    let mut at = 0;
    while let Some((group, len)) = record(&log[at..]) {
        decoded.groups.push(group);
        decoded.starts.push(at);
        at += len;
    }
    decoded.valid_len = at;
    decoded
}

/// A record's whole length from its header (what to read to decode it).
pub(super) fn record_len(header: &[u8; HEADER]) -> usize {
    HEADER + u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize
}

/// The group at the start of `bytes` and the record's length, if whole and sound.
pub(super) fn record(bytes: &[u8]) -> Option<(Vec<Write>, usize)> {
    let len32 = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
    let len = len32 as usize;
    let crc = u32::from_le_bytes(bytes.get(4..HEADER)?.try_into().ok()?);
    let payload = bytes.get(HEADER..HEADER.checked_add(len)?)?;
    if checksum(len32, payload) != crc {
        return None;
    }
    let mut group = Vec::new();
    let mut rest = payload;
    while let Some((&op, tail)) = rest.split_first() {
        let (key, tail) = take_bytes(tail)?;
        rest = match op {
            PUT => {
                let (value, tail) = take_bytes(tail)?;
                group.push(Write::Put(key.to_vec(), value.to_vec()));
                tail
            }
            REMOVE => {
                group.push(Write::Remove(key.to_vec()));
                tail
            }
            _ => return None,
        };
    }
    Some((group, HEADER + len))
}

fn take_bytes(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let len = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let rest = &bytes[4..];
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<Vec<Write>> {
        vec![
            vec![Write::Put(b"a".to_vec(), b"1".to_vec()), Write::Remove(b"b".to_vec())],
            vec![],
            vec![Write::Put(b"c".to_vec(), vec![7; 300])],
        ]
    }

    fn written() -> (Vec<u8>, Vec<usize>) {
        let mut log = Vec::new();
        let mut ends = Vec::new();
        for g in groups() {
            encode(&g, &mut log);
            ends.push(log.len());
        }
        (log, ends)
    }

    #[test]
    fn records_decode_to_the_groups_written() {
        let (log, ends) = written();
        let starts = vec![0, ends[0], ends[1]];
        assert_eq!(decode(&log), Decoded { groups: groups(), starts, valid_len: log.len() });
    }

    #[test]
    fn value_offsets_point_at_each_put_value_in_its_record() {
        let (log, _) = written();
        let decoded = decode(&log);
        for (group, &start) in decoded.groups.iter().zip(&decoded.starts) {
            for (w, at) in group.iter().zip(value_offsets(group, start as u64)) {
                match (w, at) {
                    (Write::Put(_, v), Some(at)) => assert_eq!(&log[at as usize..at as usize + v.len()], v),
                    (Write::Remove(_), None) => {}
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_torn_final_record_is_ignored() {
        let (log, ends) = written();
        for cut in ends[1] + 1..log.len() {
            let d = decode(&log[..cut]);
            assert_eq!(d.groups, groups()[..2], "cut at {cut}");
            assert_eq!(d.valid_len, ends[1]);
        }
    }

    #[test]
    fn a_checksum_bad_record_stops_the_replay_there() {
        let (mut log, ends) = written();
        log[ends[0] + HEADER - 1] ^= 0x40; // the empty group's crc
        let d = decode(&log);
        assert_eq!(d.groups, groups()[..1]);
        assert_eq!(d.valid_len, ends[0]);
        let (mut log, ends) = written();
        log[ends[1] + HEADER + 3] ^= 1; // a byte of the last group's payload
        assert_eq!(decode(&log).groups, groups()[..2]);
    }

    #[test]
    fn zeroes_are_not_a_record_of_an_empty_group() {
        // crc32 of nothing is 0: without the length under the checksum, a
        // zeroed tail would read as empty groups.
        let (mut log, ends) = written();
        log.extend_from_slice(&[0; 64]);
        let d = decode(&log);
        assert_eq!(d.valid_len, ends[2]);
    }
}
