//! `relay audit export`: events as JSON lines, one event per line, in stream
//! order then seq order. The schema of a line is
//! `schemas/json/audit/export-line.schema.json`:
//!
//! ```text
//! {"stream":"account/…","seq":3,"type":"message_sent","version":1,"at":1764400000,
//!  "prev":"<64 hex>","hash":"<64 hex>","data":{"message_sent":{…}}}
//! ```
//!
//! `data` is the event exactly as stored (its own `version`, not upcast), so
//! a line can be checked on its own: `hash` is
//! `blake3(prev_bytes ‖ body)` where `body` is the compact JSON
//! `{"stream":…,"seq":…,"type":…,"version":…,"at":…,"prev":…,"data":…}`
//! in that member order with `data` byte for byte as it appears in the line.
//!
//! A stream whose prefix was pruned (PROTOCOL §10) starts with a line for
//! its marker, before its first kept event (or alone, for a stream pruned
//! whole):
//!
//! ```text
//! {"stream":"account/…","pruned":{"seq":40,"hash":"<64 hex>","at":1767000000,"state":{…}}}
//! ```
//!
//! `seq` and `hash` are those of the last event deleted (the next line's
//! `prev`), `at` when it was deleted, `state` the stream's state folded
//! through it (`null` when the marker keeps none).

use super::{all_streams, AuditError};
use relay_actors::store::{Pruned, Store, StoredEvent};
use serde::Serialize;
use serde_json::value::RawValue;
use std::io::Write;

/// One line of the export.
#[derive(Serialize)]
pub struct ExportLine<'a> {
    pub stream: &'a str,
    pub seq: u64,
    #[serde(rename = "type")]
    pub event_type: &'a str,
    pub version: u32,
    pub at: u64,
    pub prev: String,
    pub hash: String,
    pub data: &'a RawValue,
}

impl<'a> ExportLine<'a> {
    pub fn of(ev: &'a StoredEvent) -> Self {
        ExportLine {
            stream: &ev.stream,
            seq: ev.seq,
            event_type: &ev.event_type,
            version: ev.version,
            at: ev.at,
            prev: hex::encode(ev.prev),
            hash: hex::encode(ev.hash),
            data: &ev.data,
        }
    }
}

/// The line of a stream's pruned marker.
#[derive(Serialize)]
pub struct MarkerLine<'a> {
    pub stream: &'a str,
    pub pruned: MarkerFields,
}

#[derive(Serialize)]
pub struct MarkerFields {
    pub seq: u64,
    pub hash: String,
    pub at: u64,
    pub state: Option<Box<RawValue>>,
}

impl<'a> MarkerLine<'a> {
    /// `Err` when the marker's state is not JSON.
    pub fn of(stream: &'a str, p: &Pruned) -> Result<Self, serde_json::Error> {
        let state = match p.state.is_empty() {
            true => None,
            false => Some(serde_json::from_slice(&p.state)?),
        };
        Ok(MarkerLine {
            stream,
            pruned: MarkerFields { seq: p.head.seq, hash: hex::encode(p.head.hash), at: p.at, state },
        })
    }
}

/// What an export wrote and skipped.
#[derive(Clone, Debug, Default)]
pub struct Exported {
    pub lines: u64,
    /// Records that could not be read (stream, seq, what): not exported.
    pub unreadable: Vec<String>,
}

/// Writes the events of every stream (or only `stream`) with `at >= since`
/// to `out`, one JSON line each, each stream's pruned marker (if pruned at
/// or after `since`) before its events. Unreadable records are skipped and
/// listed in the result; the export goes on.
pub fn export(
    store: &Store,
    stream: Option<&str>,
    since: Option<u64>,
    out: &mut dyn Write,
) -> Result<Exported, AuditError> {
    let streams: Box<dyn Iterator<Item = Result<String, _>>> = match stream {
        Some(s) => Box::new(std::iter::once(Ok(s.to_owned()))),
        None => Box::new(all_streams(store)),
    };
    let mut done = Exported::default();
    let mut line = Vec::with_capacity(1024);
    for s in streams {
        let s = match s {
            Ok(s) => s,
            Err(e) => {
                done.unreadable.push(e.to_string());
                break;
            }
        };
        match store.pruned(&s) {
            Ok(Some(p)) if since.is_none_or(|t| p.at >= t) => match MarkerLine::of(&s, &p) {
                Ok(marker) => {
                    line.clear();
                    serde_json::to_writer(&mut line, &marker).map_err(std::io::Error::other)?;
                    line.push(b'\n');
                    out.write_all(&line)?;
                    done.lines += 1;
                }
                Err(e) => done.unreadable.push(format!("stream {s:?}: pruned marker's state: {e}")),
            },
            Ok(_) => {}
            Err(e) => done.unreadable.push(e.to_string()),
        }
        for item in store.read(&s, 0) {
            let ev = match item {
                Ok(ev) => ev,
                Err(e) => {
                    done.unreadable.push(e.to_string());
                    continue;
                }
            };
            if since.is_some_and(|t| ev.at < t) {
                continue;
            }
            line.clear();
            serde_json::to_writer(&mut line, &ExportLine::of(&ev)).map_err(std::io::Error::other)?;
            line.push(b'\n');
            out.write_all(&line)?;
            done.lines += 1;
        }
    }
    out.flush()?;
    Ok(done)
}
