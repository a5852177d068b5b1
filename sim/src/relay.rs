//! One simulated relay: its disk (groups of records and a barrier) and the
//! state folded from what the disk holds. A crash keeps the disk and loses
//! the rest; a power cut also loses groups after the last barrier.
//!
//! An account's stream is relay-core's own events, folded by its own
//! `AccountState::apply` and `Ledger::apply`; a delivery's stream is the
//! delivery core's events. What the sim adds is only the disk and the
//! indexes its checks read (records by account).

use crate::core::{AttemptOutcome, DeliveryEvent, DeliveryState};
use relay_core::account::timeline::IndexEntry;
use relay_core::account::{AccountEvent, AccountState, Ledger, Reads, ReceiptEntry, SendEntry};
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

/// Groups in the order applied, and how many a barrier made durable.
#[derive(Default)]
pub struct Disk {
    groups: Vec<Vec<Rec>>,
    durable: usize,
}

impl Disk {
    /// Applies a group; returns its number (1-based).
    pub fn append(&mut self, group: Vec<Rec>) -> usize {
        self.groups.push(group);
        self.groups.len()
    }
    pub fn pending(&self) -> usize {
        self.groups.len() - self.durable
    }
    /// The groups the next barrier makes durable.
    pub fn barrier(&mut self) -> &[Vec<Rec>] {
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
    }
    pub fn groups(&self) -> &[Vec<Rec>] {
        &self.groups
    }
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

/// What waits for the barrier covering a group: persist before effect.
#[derive(Debug)]
pub enum Effect {
    Reply(crate::world::Node, crate::world::Resp),
    SendAttempt(String),
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
    pub waiting: Vec<(usize, Effect)>,
    pub flush_armed: bool,
    /// Crash (a power cut when `true`) right after the next write.
    pub crash_armed: Option<bool>,
    /// Pulls under way, by (account, partner).
    pub pulling: BTreeSet<(Acct, Ix)>,
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
        self.waiting.clear();
        self.pulling.clear();
        self.flush_armed = false;
        let groups = std::mem::take(&mut self.disk.groups);
        for rec in groups.iter().flatten() {
            self.apply(rec, ids);
        }
        self.disk.groups = groups;
    }
}
