//! Retention: what a relay keeps of a message, and until when (PROTOCOL
//! §10; seed *Delivery Result Retention Rules*).
//!
//! A message's traces on an account are its event in the account's stream,
//! its timeline record's index entry, its ledger entry (the idempotency
//! result and, for a send, its status) and, for a cross-account send, its
//! delivery stream. All of them are kept at least until the
//! `retention_until` fixed at acceptance (that second included) and go in
//! one sweep after it. Only the event stays longer when an older message
//! before it in the stream is still retained: a stream loses a prefix,
//! never a middle, so its chain stays checkable from its `pruned` marker.
//!
//! The sweep finds what is due through an index (`r/` ‖ `retention_until`
//! ‖ account ‖ event seq), so a turn reads only entries already due, never
//! the accounts themselves. An entry ([`DUE`]) starts a *run*: its message
//! and the account's next ones in stream order, up to the next message
//! with an entry of its own. A message gets one only when it would break
//! its run's order ([`starts_run`]): within a run `retention_until` never
//! decreases, so the sweep walks a run from its start, deletes what is
//! past and stops at the first message that is not, where the run's
//! entry moves. A message retained for less than the one before it (the
//! configured retention shortened: a stored retention is never shortened,
//! so stream order need not be time order) starts a run of its own, and
//! is not kept waiting behind the longer one. Usually an account has one
//! entry, not one per message (sled holds some 300–600 bytes per key). A
//! message whose send is still running past its retention gets an entry
//! for itself alone ([`SINGLE`]) and the walk goes on past it.
//!
//! A swept ledger entry leaves its swept form ([`crate::account::ledger::SendEntry::swept`])
//! until [`tombstone_until`] when that is later: until then a retry of the
//! message could still pass the age check and be taken as new, so it is
//! answered `message_expired` instead (the seed allows either; answering
//! it keeps a short retention from turning a client's late retry into a
//! second delivery). Under the default limits (30 days of retention, a
//! 90-minute age limit) no retry can pass by then, and the entry goes with
//! the rest: a swept form is kept only when retention is shorter than the
//! age limit and the clock tolerance.

use crate::account::events::AccountEvent;
use crate::account::ledger;
use crate::policy::Policy;
use relay_schemas::UnixSecs;

/// Every retention index key starts with this (a kv key).
pub const INDEX_PREFIX: &[u8] = b"r/";

/// The value of a run's entry: the traces of its messages are due from
/// its time on (a store written before runs has one per message: runs of
/// one).
pub const DUE: &[u8] = b"";
/// The value of an entry for its own message alone: a send deferred while
/// its delivery runs.
pub const SINGLE: &[u8] = b"s";
/// What starts the value of a second-stage entry, followed by the blob key
/// of the swept ledger entry to remove.
pub const SWEPT: u8 = b'l';

/// `retention_until` of a message accepted at `accepted_at`: fixed then,
/// with the retention configured then (later configuration never changes
/// a stored one).
pub fn retention_until(accepted_at: u64, policy: &Policy) -> u64 {
    accepted_at.saturating_add(policy.message_retention)
}

/// Whether a message kept until `until` needs an index entry of its own
/// (starts a run): `last`, the retention of the account's last message a
/// run covers, `None` when that is not known (an actor just loaded, or
/// after a sweep). A message kept no shorter than the one before continues
/// its run: the walk that stops at the first message not yet past may
/// leave the rest of the run for later.
pub fn starts_run(last: Option<u64>, until: u64) -> bool {
    last.is_none_or(|last| until < last)
}

/// A result is kept through `retention_until`, that second included.
pub fn is_past(retention_until: u64, now: UnixSecs) -> bool {
    retention_until < now.0
}

/// Until when a retry of a message accepted at `accepted_at` could still
/// pass the age check (so its swept entry must answer it): a retry carries
/// the same `created_at`, at most `accepted_at` + tolerance (it passed the
/// clock check then), and is refused once `created_at` +
/// `delivery_age_limit` ≤ now. With the limits of the time of the sweep: a
/// later, longer age limit is not covered.
pub fn tombstone_until(accepted_at: u64, policy: &Policy) -> u64 {
    accepted_at.saturating_add(policy.clock_tolerance).saturating_add(policy.delivery_age_limit)
}

/// The index key of the message in event `seq` of `account_id`'s stream.
pub fn index_key(until: u64, account_id: &str, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(INDEX_PREFIX.len() + account_id.len() + 17);
    k.extend_from_slice(INDEX_PREFIX);
    k.extend_from_slice(&until.to_be_bytes());
    k.extend_from_slice(account_id.as_bytes());
    k.push(b'/');
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The first index key not yet due at `now` (entries sort by time).
pub fn due_end(now: UnixSecs) -> Vec<u8> {
    let mut k = INDEX_PREFIX.to_vec();
    k.extend_from_slice(&now.0.to_be_bytes());
    k
}

/// An index entry: `(until, account_id, seq)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub until: u64,
    pub account_id: String,
    pub seq: u64,
}

pub fn parse_index_key(key: &[u8]) -> Option<IndexEntry> {
    let rest = key.strip_prefix(INDEX_PREFIX)?;
    let (until, rest) = rest.split_at_checked(8)?;
    let (account, seq) = rest.split_at_checked(rest.len().checked_sub(9)?)?;
    let seq = seq.strip_prefix(b"/")?;
    Some(IndexEntry {
        until: u64::from_be_bytes(until.try_into().ok()?),
        account_id: String::from_utf8(account.to_vec()).ok()?,
        seq: u64::from_be_bytes(seq.try_into().ok()?),
    })
}

/// What a message event leaves besides itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traces {
    pub accepted_at: u64,
    pub retention_until: u64,
    /// Its ledger entry's blob key.
    pub ledger_key: Vec<u8>,
    /// Its timeline record's sequence, when it has one.
    pub record: Option<u64>,
    /// A cross-account send's message id: its delivery stream goes too.
    pub delivery: Option<String>,
    /// A send's entry (else a receipt's).
    pub sent: bool,
}

/// The traces of the message `event` accepted, if it accepted one
/// (replicated ones included).
pub fn traces(account_id: &str, event: &AccountEvent) -> Option<Traces> {
    let entry = ledger::written(account_id, event, None)?;
    let (delivery, sent) = match &entry {
        ledger::Entry::Send { message_id, .. } => {
            let cross = matches!(event.origin(), AccountEvent::MessageSent { .. });
            (cross.then(|| message_id.clone()), true)
        }
        ledger::Entry::Receipt { .. } => (None, false),
    };
    let record = event.record().map(|r| r.sequence);
    let accepted_at = match event.origin() {
        AccountEvent::MessageSent { accepted_at, .. }
        | AccountEvent::SelfDelivered { accepted_at, .. }
        | AccountEvent::MessageReceived { accepted_at, .. } => *accepted_at,
        _ => return None,
    };
    let (retention_until, ledger_key) = (entry.retention_until(), entry.key(account_id));
    Some(Traces { accepted_at, retention_until, ledger_key, record, delivery, sent })
}

/// Whether `event` may leave its stream's prefix at `now`: a message's
/// once past its retention; every other event (device, settings, cursors,
/// statuses, replication) at once, its effect kept in the marker's state.
/// `replicated_through`: the lowest seq every partner home has acknowledged
/// (`None` without partners): an account event it has not seen stays.
pub fn may_prune(
    account_id: &str,
    seq: u64,
    event: &AccountEvent,
    now: UnixSecs,
    replicated_through: Option<u64>,
) -> bool {
    match traces(account_id, event) {
        Some(t) => is_past(t.retention_until, now),
        None => replicated_through.is_none_or(|through| seq <= through),
    }
}

/// What the sweep does with a message's ledger entry at `now` (past its
/// retention): leave its swept form until `until` (a second-stage index
/// entry removes it then), or remove it when no retry could pass anyway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LedgerSweep {
    Swept { until: u64 },
    Remove,
}

pub fn ledger_sweep(traces: &Traces, now: UnixSecs, policy: &Policy) -> LedgerSweep {
    let until = tombstone_until(traces.accepted_at, policy);
    if until >= now.0 {
        LedgerSweep::Swept { until }
    } else {
        LedgerSweep::Remove
    }
}

/// Whether the sweep is late at `now`: its oldest due entry (due at
/// `oldest_until`) is more than a sweep interval (`every_secs`) past its
/// time.
pub fn sweep_late(now: UnixSecs, oldest_until: u64, every_secs: u64) -> bool {
    now.0.saturating_sub(oldest_until) > every_secs
}

/// How long the sweep rests after a full turn that took `took`, so that
/// it takes at most a quarter of the account actors' time and sends keep
/// their latency (a pass's turns back to back stalled them for a second).
/// A sweep `late` (its oldest due entry is more than a sweep interval past
/// its time) takes half: it must still keep the promise to delete within
/// `limits.retention_sweep`.
pub fn rest_after(took: std::time::Duration, late: bool) -> std::time::Duration {
    if late {
        took
    } else {
        took * 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::events::AccountEvent;

    fn policy() -> Policy {
        let mut p = Policy::with_relay_id("relay-a");
        p.message_retention = 100;
        p.clock_tolerance = 5;
        p.delivery_age_limit = 50;
        p
    }

    fn received(retention_until: u64) -> AccountEvent {
        let env = serde_json::json!({"message_id": "m1", "from": "alice", "from_device_id": "d", "to": "bob",
                                     "created_at": 1, "ciphertext": "AA", "signature": "s"});
        let v = serde_json::json!({"message_received": {
            "from": "alice", "message_id": "m1", "digest": "d", "accepted_at": 10,
            "retention_until": retention_until,
            "record": {"sequence": 7, "expires_at": retention_until, "envelope": env, "boxes": [], "visible": []}}});
        serde_json::from_str(&v.to_string()).unwrap()
    }

    #[test]
    fn a_message_kept_no_shorter_than_the_one_before_continues_its_run() {
        assert!(!starts_run(Some(110), 110));
        assert!(!starts_run(Some(110), 200));
    }

    #[test]
    fn a_message_kept_shorter_than_the_one_before_starts_a_run_so_it_does_not_wait_behind_it() {
        // The retention was shortened: the later message is due first.
        assert!(starts_run(Some(200), 150));
    }

    #[test]
    fn a_message_after_an_unknown_last_retention_starts_a_run() {
        assert!(starts_run(None, 110));
    }

    #[test]
    fn a_result_is_kept_through_its_retention_that_second_included() {
        assert!(!is_past(110, UnixSecs(110)));
        assert!(is_past(110, UnixSecs(111)));
    }

    #[test]
    fn later_configuration_never_shortens_a_promised_retention() {
        // Accepted under a 100 s retention; the relay now keeps 1 s.
        let event = received(retention_until(10, &policy()));
        let mut shorter = policy();
        shorter.message_retention = 1;
        let t = traces("bob", &event).unwrap();
        assert_eq!(t.retention_until, 110, "the retention stored at acceptance counts");
        assert!(!may_prune("bob", 3, &event, UnixSecs(100), None));
        assert!(may_prune("bob", 3, &event, UnixSecs(111), None));
    }

    #[test]
    fn a_received_message_leaves_its_record_and_its_receipt_and_no_delivery() {
        let t = traces("bob", &received(110)).unwrap();
        assert_eq!(t.record, Some(7));
        assert_eq!(t.ledger_key, ledger::receipt_key("bob", "alice", "m1"));
        assert_eq!(t.delivery, None);
        assert!(!t.sent);
    }

    #[test]
    fn account_state_events_leave_no_traces_and_may_leave_the_prefix_once_partners_have_them() {
        let event = AccountEvent::SettingsUpdated { public_discovery: true, at: Some(5) };
        assert_eq!(traces("bob", &event), None);
        assert!(may_prune("bob", 4, &event, UnixSecs(0), None));
        assert!(may_prune("bob", 4, &event, UnixSecs(0), Some(4)));
        assert!(!may_prune("bob", 5, &event, UnixSecs(0), Some(4)), "a partner has not seen it");
    }

    #[test]
    fn a_swept_entry_answers_until_no_retry_could_pass_the_age_check() {
        // Accepted at 10, kept through 30: a retry's created_at is at most
        // 10 + tolerance 5, refused from 15 + age limit 50 on.
        let t = traces("bob", &received(30)).unwrap();
        assert_eq!(tombstone_until(t.accepted_at, &policy()), 65);
        assert_eq!(ledger_sweep(&t, UnixSecs(31), &policy()), LedgerSweep::Swept { until: 65 });
        assert_eq!(ledger_sweep(&t, UnixSecs(65), &policy()), LedgerSweep::Swept { until: 65 });
        assert_eq!(ledger_sweep(&t, UnixSecs(66), &policy()), LedgerSweep::Remove);
    }

    #[test]
    fn an_entry_past_a_retention_longer_than_the_age_limit_leaves_no_swept_form() {
        // Kept through 110: every retry has been refused by age since 65.
        let t = traces("bob", &received(110)).unwrap();
        assert_eq!(ledger_sweep(&t, UnixSecs(111), &policy()), LedgerSweep::Remove);
    }

    #[test]
    fn the_sweep_takes_a_quarter_of_the_time_and_half_when_it_is_late() {
        let turn = std::time::Duration::from_millis(40);
        assert_eq!(rest_after(turn, false), turn * 3);
        assert_eq!(rest_after(turn, true), turn);
    }

    #[test]
    fn index_keys_sort_by_time_and_parse_back() {
        let a = index_key(5, "bob", 9);
        let b = index_key(6, "alice", 1);
        assert!(a < b);
        assert!(a < due_end(UnixSecs(6)) && b >= due_end(UnixSecs(6)), "due at 6: only entries past by then");
        assert_eq!(parse_index_key(&a), Some(IndexEntry { until: 5, account_id: "bob".into(), seq: 9 }));
        assert_eq!(parse_index_key(b"r/short"), None);
    }

    #[test]
    fn the_sweep_is_late_once_its_oldest_due_entry_is_more_than_an_interval_past_its_time() {
        assert!(!sweep_late(UnixSecs(1_060), 1_000, 60));
        assert!(sweep_late(UnixSecs(1_061), 1_000, 60));
        assert!(!sweep_late(UnixSecs(900), 1_000, 60), "an entry not yet due is not late");
    }
}
