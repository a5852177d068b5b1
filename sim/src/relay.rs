//! One simulated relay: its disk (groups of records and a barrier) and the
//! state folded from what the disk holds. A crash keeps the disk and loses
//! the rest; a power cut also loses groups after the last barrier.
//!
//! An account's stream is relay-core's own events, folded by its own
//! `AccountState::apply` and `Ledger::apply`; a delivery's stream is the
//! delivery core's events. What the sim adds is only the disk and the
//! indexes its checks read (records by account).
//!
//! Every event written is also linked into its stream's hash chain as the
//! store links it (relay-core's `chain`: the body the store's codec writes,
//! `blake3(prev ‖ body)`), under the stream name the relay gives it
//! (`account/{id}`, `delivery/{from}/{message_id}`). The writer's heads are
//! memory, folded again from what survived a crash.

use relay_core::account::ledger::{Ledger, ReceiptEntry, SendEntry};
use relay_core::account::timeline::IndexEntry;
use relay_core::account::{AccountEvent, AccountState, Reads};
use relay_core::chain::{self, Hash};
use relay_core::delivery::aggregate::{DeliveryEvent, DeliveryState};
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::retention::LedgerSweep;
use relay_schemas::methods::DeliverParams;
use relay_schemas::RelayError;
use std::collections::{BTreeMap, BTreeSet};

/// Index of an account in the world's table.
pub type Acct = usize;
/// Index of a relay in the world's table.
pub type Ix = usize;

/// What a relay writes.
#[derive(Clone, Debug)]
pub enum Rec {
    /// An event of an account's stream, as relay-core decided it.
    Account {
        account: Acct,
        event: AccountEvent,
    },
    Delivery {
        mid: String,
        event: DeliveryEvent,
    },
    /// A route revision this relay's route book learned.
    Route {
        account: Acct,
        revision: u64,
    },
    /// The retention sweep removed the traces of the message accepted in
    /// event `seq` of `account`'s stream (relay-core's `traces`), leaving
    /// its ledger entry as `ledger` says.
    Swept {
        account: Acct,
        seq: u64,
        ledger: LedgerSweep,
    },
}

/// A stream with a hash chain: an account's, or a delivery's (by its
/// message id, which the sim's ids make unique).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Chain {
    Account(Acct),
    Delivery(String),
}

/// An event's place in its stream's chain, as the store keeps it: its
/// sequence, the hash it follows, and its own (of the body the store
/// would write; the sim's disk never changes a byte it holds, so the body
/// is not kept to be hashed again).
#[derive(Clone, Debug)]
pub struct Link {
    pub seq: u64,
    pub prev: Hash,
    pub hash: Hash,
}

/// A record as written: an event carries its link.
#[derive(Clone, Debug)]
pub struct Written {
    pub rec: Rec,
    pub link: Option<(Chain, Link)>,
}

/// Groups in the order applied, and how many a barrier made durable.
#[derive(Default)]
pub struct Disk {
    groups: Vec<Vec<Written>>,
    durable: usize,
    /// How many groups [`Disk::verify_chains`] walked, and the heads it
    /// found there: those groups are durable (a recovery makes what it
    /// verified durable before writing), so no cut reaches them and their
    /// bytes never change; the next walk goes on from there.
    verified: (usize, BTreeMap<Chain, (u64, Hash)>),
}

impl Disk {
    /// Applies a group; returns its number (1-based).
    pub fn append(&mut self, group: Vec<Written>) -> usize {
        self.groups.push(group);
        self.groups.len()
    }
    pub fn pending(&self) -> usize {
        self.groups.len() - self.durable
    }
    /// The groups the next barrier makes durable.
    pub fn barrier(&mut self) -> &[Vec<Written>] {
        let from = self.durable;
        self.durable = self.groups.len();
        &self.groups[from..]
    }
    pub fn durable(&self) -> usize {
        self.durable
    }
    /// A power cut: what followed the barrier survives only as a prefix
    /// of `keep` groups, whole (the engine seam's promise).
    pub fn cut(&mut self, keep: usize) {
        self.groups.truncate(self.durable + keep);
        assert!(self.verified.0 <= self.groups.len(), "a cut never reaches a verified group");
    }
    pub fn groups(&self) -> &[Vec<Written>] {
        &self.groups
    }

    /// Walks every chain on the disk as a reader opening the store does:
    /// each event follows the one before it in its stream (the next
    /// sequence, its hash as `prev`). The head of each stream, or the
    /// first break. Groups walked before are not walked again
    /// (`verified`).
    pub fn verify_chains(&mut self) -> Result<BTreeMap<Chain, (u64, Hash)>, String> {
        let (from, mut heads) = self.verified.clone();
        for (key, link) in self.groups[from..].iter().flatten().filter_map(|w| w.link.as_ref()) {
            let (seq, prev) = heads.get(key).copied().unwrap_or((0, chain::ZERO));
            if link.seq != seq + 1 || link.prev != prev {
                return Err(format!(
                    "{key:?}: event {} follows {seq}, prev {} not the hash before it",
                    link.seq,
                    hex8(&link.prev)
                ));
            }
            heads.insert(key.clone(), (link.seq, link.hash));
        }
        self.verified = (self.groups.len(), heads.clone());
        Ok(heads)
    }
}

/// The first bytes of a hash, for messages.
pub fn hex8(h: &Hash) -> String {
    blake3::Hash::from(*h).to_hex()[..16].to_string()
}

/// A timeline record held for an account (an index the checks read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub mid: String,
    pub from: String,
    pub visible: Vec<String>,
    pub accepted_at: u64,
    pub retention_until: u64,
    /// The account event (its sequence in this relay's stream) holding it.
    pub seq: u64,
}

/// One account at one relay: its stream, the state and ledger folded from
/// it by relay-core, and which events the sweep removed.
#[derive(Clone, Debug)]
pub struct Here {
    pub state: AccountState,
    pub ledger: Ledger,
    /// Event `seq` is `events[seq - 1]`.
    pub events: Vec<AccountEvent>,
    pub swept: BTreeSet<u64>,
    pub records: Vec<Record>,
    /// The message ids of `records` (the checks ask for one at every
    /// receipt and crash: a scan of the records made them quadratic).
    pub held: BTreeSet<String>,
    /// (retention_until, seq) of every message event not yet swept: the
    /// sweep's index, as the store's `r/` keys.
    pub due: BTreeSet<(u64, u64)>,
}

impl Here {
    pub fn new(account_id: &str) -> Here {
        Here {
            state: AccountState::new(account_id),
            ledger: Ledger::default(),
            events: vec![],
            swept: BTreeSet::new(),
            records: vec![],
            held: BTreeSet::new(),
            due: BTreeSet::new(),
        }
    }

    fn apply(&mut self, event: &AccountEvent) {
        let id = self.state.account_id.to_string();
        self.state.apply(event);
        self.ledger.apply(&id, event);
        self.events.push(event.clone());
        let seq = self.events.len() as u64;
        if let AccountEvent::MessageSent { retention_until, .. }
        | AccountEvent::SelfDelivered { retention_until, .. }
        | AccountEvent::MessageReceived { retention_until, .. } = event.origin()
        {
            self.due.insert((*retention_until, seq));
        }
        if let AccountEvent::MessageReceived { from, message_id, accepted_at, retention_until, record, .. } =
            event.origin()
        {
            self.held.insert(message_id.clone());
            self.records.push(Record {
                mid: message_id.clone(),
                from: from.clone(),
                visible: record.visible.clone(),
                accepted_at: *accepted_at,
                retention_until: *retention_until,
                seq,
            });
        }
    }

    /// The message ids of every record held or swept here.
    pub fn mids(&self) -> BTreeSet<String> {
        let swept = self.swept.iter().filter_map(|seq| match self.events[*seq as usize - 1].origin() {
            AccountEvent::MessageReceived { message_id, .. } => Some(message_id.clone()),
            _ => None,
        });
        self.records.iter().map(|r| r.mid.clone()).chain(swept).collect()
    }

    fn sweep(&mut self, seq: u64, how: &LedgerSweep) {
        self.swept.insert(seq);
        let Some(event) = self.events.get(seq as usize - 1) else { return };
        let origin = event.origin().clone();
        self.due.retain(|(_, s)| *s != seq);
        if let Some(i) = self.records.iter().position(|r| r.seq == seq) {
            self.held.remove(&self.records.remove(i).mid);
        }
        match origin {
            AccountEvent::MessageSent { message_id, retention_until, .. }
            | AccountEvent::SelfDelivered { message_id, retention_until, .. } => match how {
                LedgerSweep::Swept { .. } => {
                    self.ledger.sends.insert(message_id, SendEntry::swept(retention_until));
                }
                LedgerSweep::Remove => {
                    self.ledger.sends.remove(&message_id);
                }
            },
            AccountEvent::MessageReceived { from, message_id, retention_until, .. } => {
                let key = format!("{from}/{message_id}");
                match how {
                    LedgerSweep::Swept { .. } => {
                        self.ledger.receipts.insert(key, ReceiptEntry::swept(retention_until));
                    }
                    LedgerSweep::Remove => {
                        self.ledger.receipts.remove(&key);
                    }
                }
            }
            _ => {}
        }
    }
}

/// What a decision at this relay reads besides the state: the account's
/// ledger and stream, and this relay's deliveries (relay-core's `Reads`).
pub struct SimReads<'a> {
    pub here: &'a Here,
    pub deliveries: &'a BTreeMap<String, DeliveryState>,
    /// Planted: the ledger read of a receipt finds nothing.
    pub forget_receipts: bool,
}

impl Reads for SimReads<'_> {
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError> {
        Ok(self.here.ledger.send(message_id).cloned())
    }
    fn receipt_entry(&self, from: &str, message_id: &str) -> Result<Option<ReceiptEntry>, RelayError> {
        if self.forget_receipts {
            return Ok(None);
        }
        Ok(self.here.ledger.receipt(from, message_id).cloned())
    }
    fn timeline_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, IndexEntry), RelayError>> {
        let here = self.here;
        here.events.iter().enumerate().filter_map(move |(i, e)| {
            let seq = i as u64 + 1;
            let r = e.record().filter(|r| r.sequence > after && !here.swept.contains(&seq))?;
            Some(Ok((r.sequence, IndexEntry { event: seq, visible: r.visible.clone() })))
        })
    }
    fn event(&self, seq: u64) -> Result<AccountEvent, RelayError> {
        self.here.events.get(seq as usize - 1).cloned().ok_or_else(|| RelayError::internal("no such event"))
    }
    fn events_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, AccountEvent), RelayError>> {
        let here = self.here;
        here.events
            .iter()
            .enumerate()
            .skip(after as usize)
            .filter(move |(i, _)| !here.swept.contains(&(*i as u64 + 1)))
            .map(|(i, e)| Ok((i as u64 + 1, e.clone())))
    }
    fn delivery_params(&self, message_id: &str) -> Result<Option<DeliverParams>, RelayError> {
        let s = self.deliveries.get(message_id).filter(|s| *s.from == *self.here.state.account_id);
        Ok(s.and_then(|s| s.params.clone()))
    }
}

/// An attempt under way (memory only): its answers so far, by target.
#[derive(Debug)]
pub struct Attempt {
    pub attempt: u32,
    pub targets: Vec<Ix>,
    pub outcomes: Vec<Option<AttemptOutcome>>,
}

#[derive(Default)]
pub struct Relay {
    pub id: String,
    pub up: bool,
    /// Bumped at every crash: timers and answers of an earlier process are
    /// dropped.
    pub inc: u64,
    pub clock_offset_ms: i64,
    pub disk: Disk,
    // Folded from the disk.
    pub accts: BTreeMap<Acct, Here>,
    pub deliveries: BTreeMap<String, DeliveryState>,
    /// The route book: the highest revision learned per account.
    pub routes: BTreeMap<Acct, u64>,
    // Memory only.
    pub attempts: BTreeMap<String, Attempt>,
    /// Deliveries waiting for the sender's other home to answer.
    pub asking: BTreeMap<String, u32>,
    pub flush_armed: bool,
    /// Crash (a power cut when `true`) right after the next write.
    pub crash_armed: Option<bool>,
    /// Pulls under way, by (account, partner).
    pub pulling: BTreeSet<(Acct, Ix)>,
    /// The writer's head of each stream (memory: folded again from the
    /// disk at restart), which the next event of the stream follows.
    pub heads: BTreeMap<Chain, (u64, Hash)>,
}

impl Relay {
    pub fn new(id: String) -> Relay {
        Relay { id, up: true, ..Relay::default() }
    }

    pub fn now_ms(&self, global_ms: u64) -> u64 {
        global_ms.saturating_add_signed(self.clock_offset_ms)
    }

    pub fn route(&self, account: Acct) -> u64 {
        self.routes.get(&account).copied().unwrap_or(1)
    }

    /// Whether `to` holds a record of message `mid`.
    pub fn has_record(&self, to: Acct, mid: &str) -> bool {
        self.accts.get(&to).is_some_and(|h| h.held.contains(mid))
    }

    /// Whether the sender's ledger here holds `mid` (swept forms too).
    pub fn has_sent(&self, from: Acct, mid: &str) -> bool {
        self.accts.get(&from).is_some_and(|h| h.ledger.send(mid).is_some())
    }

    pub fn records(&self, account: Acct) -> &[Record] {
        self.accts.get(&account).map(|h| h.records.as_slice()).unwrap_or_default()
    }

    /// Links the event of `rec` (already applied) into its stream's chain
    /// after the writer's head, stamped `at` (the relay's clock, seconds),
    /// as the store encodes it. `ids`: account ids by index.
    pub fn link(&mut self, rec: &Rec, at: u64, ids: &[String]) -> Option<(Chain, Link)> {
        let (key, stream) = match rec {
            Rec::Account { account, .. } => (Chain::Account(*account), format!("account/{}", ids[*account])),
            Rec::Delivery { mid, .. } => {
                let from = self.deliveries.get(mid).map_or(String::new(), |s| s.from.to_string());
                (Chain::Delivery(mid.clone()), format!("delivery/{from}/{mid}"))
            }
            Rec::Route { .. } | Rec::Swept { .. } => return None,
        };
        let (seq, prev) = self.heads.get(&key).copied().unwrap_or((0, chain::ZERO));
        let body = match rec {
            Rec::Account { event, .. } => {
                chain::body(&stream, seq + 1, event.event_type(), AccountEvent::VERSION, at, &prev, event)
            }
            Rec::Delivery { event, .. } => {
                chain::body(&stream, seq + 1, event.event_type(), DeliveryEvent::VERSION, at, &prev, event)
            }
            Rec::Route { .. } | Rec::Swept { .. } => return None,
        }
        .expect("events encode");
        let hash = chain::hash(&prev, &body);
        self.heads.insert(key.clone(), (seq + 1, hash));
        Some((key, Link { seq: seq + 1, prev, hash }))
    }

    /// Applies one record to the folded state (on write, and at recovery).
    /// `ids`: account ids by index.
    pub fn apply(&mut self, rec: &Rec, ids: &[String]) {
        match rec {
            Rec::Account { account, event } => {
                // The account's own route is in the route book too.
                if let AccountEvent::Registered { route, .. } | AccountEvent::RouteUpdated { route } = event.origin() {
                    let known = self.routes.entry(*account).or_insert(1);
                    *known = (*known).max(route.revision);
                }
                self.accts.entry(*account).or_insert_with(|| Here::new(&ids[*account])).apply(event);
            }
            Rec::Delivery { mid, event } => {
                self.deliveries.entry(mid.clone()).or_default().apply(event);
            }
            Rec::Route { account, revision } => {
                let known = self.routes.entry(*account).or_insert(1);
                *known = (*known).max(*revision);
            }
            Rec::Swept { account, seq, ledger } => {
                if let Some(h) = self.accts.get_mut(account) {
                    let mid = h.events.get(*seq as usize - 1).and_then(|e| match e.origin() {
                        AccountEvent::MessageSent { message_id, .. } => Some(message_id.clone()),
                        _ => None,
                    });
                    h.sweep(*seq, ledger);
                    // A cross-account send's delivery stream goes with it.
                    if let Some(mid) = mid {
                        self.deliveries.remove(&mid);
                    }
                }
            }
        }
    }

    /// Loses memory and refolds from what the disk holds.
    pub fn refold(&mut self, ids: &[String]) {
        self.accts.clear();
        self.deliveries.clear();
        self.routes.clear();
        self.attempts.clear();
        self.asking.clear();
        self.pulling.clear();
        self.heads.clear();
        self.flush_armed = false;
        let groups = std::mem::take(&mut self.disk.groups);
        for w in groups.iter().flatten() {
            self.apply(&w.rec, ids);
            if let Some((key, link)) = &w.link {
                self.heads.insert(key.clone(), (link.seq, link.hash));
            }
        }
        self.disk.groups = groups;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(account: Acct, revision: u64) -> Rec {
        Rec::Route { account, revision }
    }

    /// Two events of one stream linked as the writer links them, then the
    /// second rewritten to follow something else.
    #[test]
    fn a_chain_verifies_only_while_each_event_follows_the_hash_before_it() {
        let mut relay = Relay::new("relay-0".into());
        let ids = vec!["acct".to_string()];
        let event = AccountEvent::CursorMoved { device_id: "d1".into(), through: 1 };
        let rec = Rec::Account { account: 0, event };
        let group: Vec<Written> =
            (0..2).map(|_| Written { rec: rec.clone(), link: relay.link(&rec, 10, &ids) }).collect();
        relay.disk.append(group.clone());
        relay.disk.append(vec![Written { rec: route(0, 2), link: None }]);
        let heads = relay.disk.verify_chains().expect("as written");
        assert_eq!(heads[&Chain::Account(0)], relay.heads[&Chain::Account(0)]);

        let mut forked = group;
        if let Some((_, link)) = &mut forked[1].link {
            link.prev = chain::ZERO;
        }
        let mut disk = Disk::default();
        disk.append(forked);
        assert!(disk.verify_chains().unwrap_err().contains("not the hash before it"));
    }
}
