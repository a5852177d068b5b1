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

use super::AuditError;
use relay_actors::store::{Store, StoredEvent};
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

/// What an export wrote and skipped.
#[derive(Clone, Debug, Default)]
pub struct Exported {
    pub lines: u64,
    /// Records that could not be read (stream, seq, what): not exported.
    pub unreadable: Vec<String>,
}

/// Writes the events of every stream (or only `stream`) with `at >= since`
/// to `out`, one JSON line each. Unreadable records are skipped and listed
/// in the result; the export goes on.
pub fn export(
    store: &Store,
    stream: Option<&str>,
    since: Option<u64>,
    out: &mut dyn Write,
) -> Result<Exported, AuditError> {
    let streams: Box<dyn Iterator<Item = Result<String, _>>> = match stream {
        Some(s) => Box::new(std::iter::once(Ok(s.to_owned()))),
        None => Box::new(store.streams()),
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
