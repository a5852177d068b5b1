//! `message.timeline.sync` (PROTOCOL §4): which records one page holds. The shell hands
//! in the timeline index from the cursor on and a way to read an event;
//! the rules here choose the page: records the device may read, at most
//! `limit` of them and about `max_page_bytes` of them, and a bounded scan
//! past records it may not read, so one call costs at most a few pages of
//! index whatever the account holds.

use crate::account::decision::json;
use crate::account::decision::{Decision, Reads};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, Ctx};
use crate::account::state::AccountState;
use crate::account::timeline::{fits_page, IndexEntry, RECORD_OVERHEAD};
use relay_schemas::methods::{SyncParams, SyncResult, SYNC_DEFAULT_LIMIT, SYNC_MAX_LIMIT};
use relay_schemas::objects::{DeliveryStatus, Direction, TimelineRecord};
use relay_schemas::RelayError;

/// Reads one page through the reads view; writes nothing.
pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &SyncParams,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    let index = reads.timeline_after(params.after);
    let page = page(device, params, ctx.policy.max_page_bytes, index, |seq| reads.event(seq))?;
    let records = records(device, &page.found, |id| Ok(reads.send_entry(id)?.map(|e| e.status)))?;
    Ok(Decision::reply(json(&SyncResult { records, next: page.next, has_more: page.has_more })?))
}

/// Index entries scanned per record asked for, at most.
const SCAN_PER_RECORD: usize = 10;

/// One page: the records' sequences and events, the cursor to continue
/// from, and whether there is more.
#[derive(Debug)]
pub struct Page {
    pub found: Vec<(u64, AccountEvent)>,
    pub next: u64,
    pub has_more: bool,
}

/// Chooses the page `device` gets for `p`. `index` yields the timeline
/// index in sequence order from `p.after + 1`; `load` reads the event an
/// entry points at (only for records the device may read).
pub fn page(
    device: &str,
    p: &SyncParams,
    max_page_bytes: usize,
    index: impl Iterator<Item = Result<(u64, IndexEntry), RelayError>>,
    mut load: impl FnMut(u64) -> Result<AccountEvent, RelayError>,
) -> Result<Page, RelayError> {
    let limit = p.limit.unwrap_or(SYNC_DEFAULT_LIMIT);
    if !(1..=SYNC_MAX_LIMIT).contains(&limit) {
        return Err(RelayError::invalid_params(format!("limit must be 1..={SYNC_MAX_LIMIT}")));
    }
    let (limit, max_scan) = (limit as usize, limit as usize * SCAN_PER_RECORD);
    let mut index = index.peekable();
    let (mut found, mut next, mut page_bytes, mut scanned, mut full) = (Vec::new(), p.after, 0, 0, false);
    while found.len() < limit && scanned < max_scan {
        let Some(item) = index.peek() else { break };
        let (seq, entry) = item.as_ref().map_err(Clone::clone)?;
        let seq = *seq;
        if entry.visible.iter().any(|d| d == device) {
            let event = load(entry.event)?;
            let size = record_bytes(&event, device);
            // Capped in bytes too: one answer must not pin more than about
            // `max_page_bytes` in the relay's write buffers.
            if !fits_page(page_bytes, found.len(), size, max_page_bytes) {
                full = true;
                break;
            }
            page_bytes += size;
            found.push((seq, event));
        }
        index.next();
        scanned += 1;
        next = seq;
    }
    let has_more = full || index.peek().is_some();
    Ok(Page { found, next, has_more })
}

/// The size a record of `event` takes in `device`'s page.
pub fn record_bytes(event: &AccountEvent, device: &str) -> usize {
    let Some(record) = event.record() else { return 0 };
    let own_box = record.boxes.iter().find(|b| b.device_id == device).map_or(0, |b| b.raw().get().len());
    record.envelope.raw().get().len() + own_box + RECORD_OVERHEAD
}

/// The wire records of a page for `device`; `status` gives a sent
/// message's current delivery status (from the ledger).
pub fn records<'a>(
    device: &str,
    found: &'a [(u64, AccountEvent)],
    mut status: impl FnMut(&str) -> Result<Option<DeliveryStatus>, RelayError>,
) -> Result<Vec<TimelineRecord<'a>>, RelayError> {
    let mut records = Vec::with_capacity(found.len());
    for (seq, event) in found {
        // A record replicated from the other home reads as the original.
        let (direction, accepted_at, delivery) = match event.origin() {
            AccountEvent::MessageSent { message_id, accepted_at, .. } => {
                (Direction::Sent, *accepted_at, status(message_id)?)
            }
            AccountEvent::SelfDelivered { accepted_at, .. } | AccountEvent::MessageReceived { accepted_at, .. } => {
                (Direction::Received, *accepted_at, None)
            }
            _ => continue,
        };
        let Some(record) = event.record() else { continue };
        let Some(b) = record.boxes.iter().find(|b| b.device_id == device) else { continue };
        records.push(TimelineRecord {
            sequence: *seq,
            direction,
            accepted_at,
            expires_at: record.expires_at,
            envelope: record.envelope.raw(),
            key_box: b.raw(),
            delivery,
        });
    }
    Ok(records)
}

#[cfg(test)]
/// The page's own rules, on hand-made index entries.
mod page {
    use super::*;
    use serde_json::json;

    /// A received record at `seq` readable by `visible`, with a ciphertext
    /// of `size` bytes (base64 text).
    fn received(seq: u64, visible: &[&str], size: usize) -> AccountEvent {
        let env = json!({"message_id": format!("m{seq}"), "from": "a", "from_device_id": "d", "to": "b",
                         "created_at": 1, "ciphertext": "A".repeat(size), "signature": "s"});
        let boxes: Vec<_> = visible.iter().map(|d| json!({"device_id": d, "box": "AA"})).collect();
        let v = json!({"message_received": {"from": "a", "message_id": format!("m{seq}"), "digest": "x",
            "accepted_at": 100 + seq, "retention_until": 1_000,
            "record": {"sequence": seq, "expires_at": 1_000, "envelope": env, "boxes": boxes, "visible": visible}}});
        serde_json::from_str(&v.to_string()).unwrap()
    }

    /// An account whose timeline holds `events` at sequences 1..; the
    /// index entry of sequence n points at event n.
    struct Timeline(Vec<AccountEvent>);

    impl Timeline {
        fn page(&self, device: &str, after: u64, limit: Option<u32>, max_bytes: usize) -> Result<Page, RelayError> {
            let index = self.0.iter().enumerate().skip(after as usize).map(|(i, e)| {
                let visible = e.record().map(|r| r.visible.clone()).unwrap_or_default();
                Ok((i as u64 + 1, IndexEntry { event: i as u64 + 1, visible }))
            });
            let load = |n: u64| Ok(self.0[n as usize - 1].clone());
            page(device, &SyncParams { after, limit }, max_bytes, index, load)
        }
    }

    fn seqs(p: &Page) -> Vec<u64> {
        p.found.iter().map(|(s, _)| *s).collect()
    }

    #[test]
    fn a_limit_outside_one_to_the_maximum_is_invalid_params() {
        let t = Timeline(vec![received(1, &["phone"], 4)]);
        for limit in [0, SYNC_MAX_LIMIT + 1] {
            let e = t.page("phone", 0, Some(limit), 1 << 20).unwrap_err();
            assert_eq!(e.code, relay_schemas::ErrorCode::InvalidParams);
        }
    }

    #[test]
    fn a_page_holds_only_records_the_device_may_read_and_the_cursor_passes_the_others() {
        let t = Timeline(vec![received(1, &["phone"], 4), received(2, &["laptop"], 4), received(3, &["phone"], 4)]);
        let p = t.page("phone", 0, None, 1 << 20).unwrap();
        assert_eq!((seqs(&p), p.next, p.has_more), (vec![1, 3], 3, false));
        let p = t.page("laptop", 2, None, 1 << 20).unwrap();
        assert_eq!((seqs(&p), p.next, p.has_more), (vec![], 3, false), "the cursor moves past unreadable records");
    }

    #[test]
    fn a_page_stops_at_the_limit_and_says_there_is_more() {
        let t = Timeline((1..=5).map(|n| received(n, &["phone"], 4)).collect());
        let p = t.page("phone", 0, Some(2), 1 << 20).unwrap();
        assert_eq!((seqs(&p), p.next, p.has_more), (vec![1, 2], 2, true));
        let p = t.page("phone", p.next, Some(10), 1 << 20).unwrap();
        assert_eq!((seqs(&p), p.next, p.has_more), (vec![3, 4, 5], 5, false));
    }

    #[test]
    fn a_page_stops_before_the_byte_cap_but_always_serves_its_first_record() {
        let t = Timeline(vec![received(1, &["phone"], 3_000), received(2, &["phone"], 3_000)]);
        let one = record_bytes(&t.0[0], "phone");
        let p = t.page("phone", 0, None, one + 10).unwrap();
        assert_eq!((seqs(&p), p.next, p.has_more), (vec![1], 1, true));
        let p = t.page("phone", 0, None, 10).unwrap();
        assert_eq!(seqs(&p), vec![1], "a record over the cap still comes, alone");
    }

    #[test]
    fn one_call_scans_a_bounded_number_of_unreadable_records() {
        let t = Timeline((1..=100).map(|n| received(n, &["laptop"], 4)).collect());
        let p = t.page("phone", 0, Some(2), 1 << 20).unwrap();
        assert_eq!((seqs(&p), p.next, p.has_more), (vec![], 2 * SCAN_PER_RECORD as u64, true));
    }

    #[test]
    fn records_carry_the_devices_own_box_and_a_sent_messages_status() {
        let t = Timeline(vec![received(1, &["phone", "laptop"], 4)]);
        let p = t.page("laptop", 0, None, 1 << 20).unwrap();
        let r = records("laptop", &p.found, |_| panic!("no sent record here")).unwrap();
        assert_eq!((r.len(), r[0].sequence, r[0].direction, r[0].accepted_at), (1, 1, Direction::Received, 101));
        assert_eq!(r[0].key_box.get(), r#"{"box":"AA","device_id":"laptop"}"#, "its own box, as stored");
    }
}

#[cfg(test)]
mod tests {
    //! Timeline sequences and `message.timeline.ack`.
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    use relay_schemas::methods::SyncParams;

    #[test]
    fn sync_pages_the_records_the_device_may_read_through_the_reads_view() {
        let mut s = given_alice([]);
        s.apply(&receive_event(&s, &bob_to_alice(1)));
        s.apply(&send_event(&s, &alice_to_self(2, &["phone"])));
        s.apply(&receive_event(&s, &bob_to_alice(3)));
        let sync = |device: &str, after: u64, limit: u32| {
            let params: SyncParams = parse(&json!({"after": after, "limit": limit}));
            reply_json(&when(&s, Cmd::MessageTimelineSync { device: device.into(), params }).unwrap().reply)
        };
        let page = sync("laptop", 0, 10);
        let seqs: Vec<_> = page["records"].as_array().unwrap().iter().map(|r| r["sequence"].clone()).collect();
        assert_eq!(seqs, [json!(1), json!(3)]);
        assert_eq!((page["next"].clone(), page["has_more"].clone()), (json!(3), json!(false)));
        let page = sync("phone", 0, 2);
        assert_eq!(page["records"].as_array().unwrap().len(), 2);
        assert_eq!((page["next"].clone(), page["has_more"].clone()), (json!(2), json!(true)));
    }

    #[test]
    fn timeline_sequences_strictly_increase_across_sent_self_and_received_records() {
        let mut events = alice_history();
        let mut sequences = Vec::new();
        let mut step = |events: &mut Vec<AccountEvent>, event: AccountEvent| {
            if let Some(r) = event.record() {
                sequences.push(r.sequence);
            }
            events.push(event);
        };
        let s = given(&alice(), &events);
        step(&mut events, send_event(&s, &alice_to_bob(1)));
        let s = given(&alice(), &events);
        let no_record = send_value(envelope(&phone(), &alice(), &bob(), 2, NOW), &["bob-phone"], None);
        step(&mut events, send_event(&s, &no_record));
        let s = given(&alice(), &events);
        step(&mut events, receive_event(&s, &bob_to_alice(3)));
        let s = given(&alice(), &events);
        step(&mut events, send_event(&s, &alice_to_self(4, &["phone"])));
        let s = given(&alice(), &events);
        let grant = alice().grant("grant-carol", &carol().id, ISSUED, None);
        let from_carol = with_auth(
            deliver_value(
                envelope(&carol_phone(), &carol(), &alice(), 5, NOW),
                &["laptop"],
                cert(&carol(), &carol_phone()),
            ),
            grant_auth(grant),
        );
        step(&mut events, receive_event(&s, &from_carol));
        let s = given(&alice(), &events);
        step(&mut events, send_event(&s, &alice_to_bob(6)));
        let s = given(&alice(), &events);
        assert_eq!(sequences, vec![1, 2, 3, 4, 5]);
        assert_eq!(s.last_sequence, 5);
        assert_eq!(s.sent(&mid(1)).sequence, Some(1));
        assert_eq!(s.sent(&mid(2)).sequence, None);
        assert_eq!(s.sent(&mid(4)).sequence, Some(3));
        assert_eq!(s.sent(&mid(6)).sequence, Some(5));
    }
}
