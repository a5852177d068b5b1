//! One simulated relay: its disk (groups of records and a barrier) and the
//! state folded from what the disk holds. A crash keeps the disk and loses
//! the rest; a power cut also loses groups after the last barrier.

use crate::core::{AttemptOutcome, DeliveryEvent, DeliveryState};
use relay_schemas::methods::DeliverParams;
use std::collections::{BTreeMap, BTreeSet};

/// Index of an account in the world's table.
pub type Acct = usize;
/// Index of a relay in the world's table.
pub type Ix = usize;

/// What a relay writes. The delivery stream is the core's own events; the
/// other records stand for the account streams the sim models itself.
#[derive(Clone, Debug)]
pub enum Rec {
    /// The sender's ledger entry (an acceptance, or a sent message learned
    /// from the sender's other home).
    Sent {
        mid: String,
        from: Acct,
        device: u8,
        created_at: u64,
        accepted_at: u64,
    },
    Delivery {
        mid: String,
        event: DeliveryEvent,
    },
    /// A recipient's timeline record.
    Received {
        to: Acct,
        mid: String,
        from: Acct,
        device: u8,
        created_at: u64,
        accepted_at: u64,
    },
    /// A route revision this relay learned.
    Route {
        account: Acct,
        revision: u64,
    },
    Revoked {
        account: Acct,
        device: u8,
        at: u64,
    },
}

/// What a partner home may pull, in the order this relay wrote it.
#[derive(Clone, Debug)]
pub enum Item {
    Sent { mid: String, params: Box<DeliverParams>, digest: String, created_at: u64, accepted_at: u64 },
    Received { to: Acct, mid: String, from: Acct, device: u8, created_at: u64, accepted_at: u64 },
    Revoked { device: u8, at: u64 },
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

#[derive(Clone, Debug)]
pub struct Record {
    pub mid: String,
    pub from: Acct,
    pub accepted_at: u64,
}

#[derive(Clone, Debug)]
pub struct SentEntry {
    pub from: Acct,
    pub device: u8,
    pub created_at: u64,
    pub accepted_at: u64,
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
    pub ledger: BTreeMap<String, SentEntry>,
    pub deliveries: BTreeMap<String, DeliveryState>,
    pub records: BTreeMap<Acct, Vec<Record>>,
    pub received: BTreeSet<(Acct, String)>,
    pub routes: BTreeMap<Acct, u64>,
    pub revoked: BTreeMap<(Acct, u8), u64>,
    pub repl_log: BTreeMap<Acct, Vec<Item>>,
    // Memory only.
    pub attempts: BTreeMap<String, Attempt>,
    /// Deliveries waiting for the sender's other home to answer.
    pub asking: BTreeMap<String, u32>,
    pub waiting: Vec<(usize, Effect)>,
    pub flush_armed: bool,
    /// Crash (a power cut when `true`) right after the next write.
    pub crash_armed: Option<bool>,
    /// Per (account, partner home): the partner's process (`inc`) and how
    /// far its log was pulled.
    pub cursors: BTreeMap<(Acct, Ix), (u64, usize)>,
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

    pub fn revoked_at(&self, account: Acct, device: u8) -> Option<u64> {
        self.revoked.get(&(account, device)).copied()
    }

    /// Whether `to` holds a record from `from`'s logical message `mid`.
    pub fn has_record(&self, to: Acct, mid: &str) -> bool {
        self.received.contains(&(to, mid.to_owned()))
    }

    /// Applies one record to the folded state (on write, and at recovery).
    pub fn apply(&mut self, rec: &Rec) {
        match rec {
            Rec::Sent { mid, from, device, created_at, accepted_at } => {
                let e = SentEntry { from: *from, device: *device, created_at: *created_at, accepted_at: *accepted_at };
                self.ledger.insert(mid.clone(), e);
            }
            Rec::Delivery { mid, event } => {
                let s = self.deliveries.entry(mid.clone()).or_default();
                s.apply(event);
                if let DeliveryEvent::Accepted { params, digest, accepted_at, .. } = event {
                    if let Some(e) = self.ledger.get(mid) {
                        self.repl_log.entry(e.from).or_default().push(Item::Sent {
                            mid: mid.clone(),
                            params: params.clone(),
                            digest: digest.clone(),
                            created_at: e.created_at,
                            accepted_at: accepted_at.0,
                        });
                    }
                }
            }
            Rec::Received { to, mid, from, device, created_at, accepted_at } => {
                self.received.insert((*to, mid.clone()));
                let r = Record { mid: mid.clone(), from: *from, accepted_at: *accepted_at };
                self.records.entry(*to).or_default().push(r);
                self.repl_log.entry(*to).or_default().push(Item::Received {
                    to: *to,
                    mid: mid.clone(),
                    from: *from,
                    device: *device,
                    created_at: *created_at,
                    accepted_at: *accepted_at,
                });
            }
            Rec::Route { account, revision } => {
                let known = self.routes.entry(*account).or_insert(1);
                *known = (*known).max(*revision);
            }
            Rec::Revoked { account, device, at } => {
                self.revoked.insert((*account, *device), *at);
                self.repl_log.entry(*account).or_default().push(Item::Revoked { device: *device, at: *at });
            }
        }
    }

    /// Loses memory and refolds from what the disk holds.
    pub fn refold(&mut self) {
        self.ledger.clear();
        self.deliveries.clear();
        self.records.clear();
        self.received.clear();
        self.routes.clear();
        self.revoked.clear();
        self.repl_log.clear();
        self.attempts.clear();
        self.asking.clear();
        self.waiting.clear();
        self.cursors.clear();
        self.flush_armed = false;
        let groups = std::mem::take(&mut self.disk.groups);
        for rec in groups.iter().flatten() {
            self.apply(rec);
        }
        self.disk.groups = groups;
    }
}
