//! The world: relays, clients and the network between them, driven by one
//! seeded event queue on one simulated clock.
//!
//! Every rule is relay-core's, reached through [`crate::core`]: the
//! account's `decide` for a send, a receipt, a revocation, a route change,
//! replication pages and peer status; the delivery core for attempts; the
//! retention rules for the sweep. The world plays the shells' part (the
//! order of commits of the send process, the `message.deliver` handler's
//! checks, the replicator's loop) and the network, disks and clocks.

use crate::check::{inv, Coverage, Violation};
use crate::core::{self, AccountCmd, AccountEvent, AttemptOutcome, Decision, DeliveryEvent, DeliveryState, Reply};
use crate::fixtures;
use crate::plant::Plant;
use crate::relay::{hex8, Acct, Attempt, Chain, Here, Ix, Link, Rec, Relay, SimReads, Written};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use relay_core::account::method::timeline_replicate::Page;
use relay_core::chain::{self, Hash};
use relay_core::policy::Policy;
use relay_schemas::client::key_box;
use relay_schemas::methods::{
    DeliverParams, DeviceAddParams, DeviceRevokeParams, PeerStatusResult, RegisterParams, ReplicateParams,
    RouteUpdateParams, SendParams,
};
use relay_schemas::objects::{DeliveryStatus, Route, Status, Wire};
use relay_schemas::{ErrorCode, RelayError, UnixMillis, UnixSecs};
use serde_json::{json, Value};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Unix time (ms) the simulated world starts at.
const T0_MS: u64 = 1_764_400_000_000;
const SEC: u64 = 1000;
const MIN: u64 = 60 * SEC;
/// Clients write messages during the first minutes.
const SEND_WINDOW_MS: u64 = 15 * MIN;
/// Faults stop, and every relay is up again, at this time.
const HEAL_MS: u64 = 30 * MIN;
/// Every deadline (created + 90 min) has passed by then.
const END_MS: u64 = SEND_WINDOW_MS + 100 * MIN;
const PULL_EVERY_MS: u64 = 10 * SEC;
const SWEEP_EVERY_MS: u64 = MIN;
const CLIENT_TIMEOUT_MS: u64 = 15 * SEC;
/// Items per replication page.
const PAGE_ITEMS: u32 = 64;

/// Who asks a relay for a receipt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// The send process's own first receipt (`Supervisor::receive`): the
    /// device was checked by the send a moment ago.
    Send,
    /// A delivery's attempt at a recipient on its own relay
    /// (`Supervisor::deliver_local`).
    OwnAttempt,
    /// `message.deliver` from another relay.
    Peer(Ix),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Client,
    Relay(Ix),
}

#[derive(Clone, Debug)]
pub enum Req {
    Send {
        msg: usize,
        try_no: u32,
        mid: String,
    },
    Deliver {
        mid: String,
        attempt: u32,
        params: Box<DeliverParams>,
    },
    PeerStatus {
        mid: String,
        from: Acct,
        attempts: u32,
    },
    /// `timeline.replicate` of `account`.
    Replicate {
        account: Acct,
        params: ReplicateParams,
    },
}

#[derive(Debug)]
pub enum Resp {
    SendAck { msg: usize, try_no: u32, mid: String, result: Result<DeliveryStatus, RelayError> },
    Outcome { mid: String, attempt: u32, target: Ix, outcome: AttemptOutcome },
    PeerStatus { mid: String, attempts: u32, status: Option<DeliveryStatus> },
    Page { partner: Ix, account: Acct, result: Result<Box<Page>, RelayError> },
}

#[derive(Debug)]
enum Ev {
    ClientSend {
        msg: usize,
    },
    ClientTimeout {
        msg: usize,
        try_no: u32,
    },
    Request {
        to: Ix,
        from: Node,
        inc: u64,
        req: Req,
    },
    Response {
        to: Node,
        inc: u64,
        resp: Resp,
    },
    Flush {
        relay: Ix,
        inc: u64,
    },
    Due {
        relay: Ix,
        inc: u64,
        mid: String,
    },
    AttemptTimeout {
        relay: Ix,
        inc: u64,
        mid: String,
        attempt: u32,
    },
    AskTimeout {
        relay: Ix,
        inc: u64,
        mid: String,
        attempts: u32,
    },
    PullTick {
        relay: Ix,
        inc: u64,
    },
    Sweep {
        relay: Ix,
        inc: u64,
    },
    Crash {
        relay: Ix,
        power_cut: bool,
    },
    /// The relay crashes right after its next write, before its barrier.
    ArmCrash {
        relay: Ix,
        power_cut: bool,
    },
    Restart {
        relay: Ix,
    },
    ClockJump {
        relay: Ix,
        offset_ms: i64,
    },
    RouteChange {
        account: Acct,
    },
    Revoke {
        account: Acct,
        device: u8,
    },
    Partition {
        a: Ix,
        b: Ix,
        blackhole: bool,
        on: bool,
    },
    Heal,
}

impl Ev {
    fn kind(&self) -> u8 {
        match self {
            Ev::ClientSend { .. } => 0,
            Ev::ClientTimeout { .. } => 1,
            Ev::Request { .. } => 2,
            Ev::Response { .. } => 3,
            Ev::Flush { .. } => 4,
            Ev::Due { .. } => 5,
            Ev::AttemptTimeout { .. } => 6,
            Ev::AskTimeout { .. } => 7,
            Ev::PullTick { .. } => 8,
            Ev::Crash { .. } => 9,
            Ev::Restart { .. } => 10,
            Ev::ClockJump { .. } => 11,
            Ev::RouteChange { .. } => 12,
            Ev::Revoke { .. } => 13,
            Ev::Partition { .. } => 14,
            Ev::Heal => 15,
            Ev::ArmCrash { .. } => 16,
            Ev::Sweep { .. } => 17,
        }
    }
}

/// What waits for the barrier covering a group: persist before effect.
#[derive(Debug)]
enum Effect {
    Reply(Node, Resp),
    SendAttempt(String),
}

/// A queued event, ordered by (time, sequence): ties go in the order
/// they were scheduled, so nothing depends on the heap's layout. The event
/// is boxed: the heap moves its entries at every push and pop, and an
/// `Ev` is a few hundred bytes.
struct Queued {
    at: u64,
    seq: u64,
    ev: Box<Ev>,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

struct Account {
    id: String,
    /// The account's key, its two devices and their certificates (the
    /// client's side: it signs the routes, certificates, revocation and
    /// envelopes), the same in every seed.
    client: &'static fixtures::Client,
    /// Routes by revision (index = revision - 1), and their relays.
    routes: Vec<Wire<Route>>,
    homes: Vec<Vec<Ix>>,
    /// The highest revision issued so far.
    current: u64,
    /// When the client revoked device 1 (Unix seconds), once it has.
    revoked: Option<u64>,
}

/// One message a client means to send (a logical message: its id may
/// change only under the `retry-new-id` plant).
struct Msg {
    from: Acct,
    device: u8,
    to: Acct,
    created_at_ms: u64,
    mid: String,
    /// Every id it had (more than one only under `retry-new-id`).
    ids: Vec<String>,
    /// The signed params and their digest, made at the first send.
    params: Option<(SendParams, String)>,
    try_no: u32,
    acked: Option<String>,
    done: bool,
}

/// The network's faults, drawn per seed; all off after the heal.
struct Faults {
    loss: f64,
    dup: f64,
    slow: f64,
    server_error: f64,
    /// Cut links: (a, b) with a < b → requests dropped (`true`) or refused.
    cut: BTreeMap<(Ix, Ix), bool>,
    healed: bool,
}

pub struct Run {
    pub violation: Option<Violation>,
    pub coverage: Coverage,
    pub trace_hash: String,
    pub trace: Vec<String>,
    pub events: u64,
    pub relays: usize,
    pub messages: usize,
    pub acked: usize,
    pub delivered: usize,
    pub faults: u64,
}

pub struct World {
    rng: StdRng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Queued>,
    /// Each relay's policy (its own relay id); all alike otherwise.
    policies: Vec<Policy>,
    plant: Option<Plant>,
    relays: Vec<Relay>,
    accounts: Vec<Account>,
    msgs: Vec<Msg>,
    /// Message id → logical message (the oracle's view).
    logical: BTreeMap<String, usize>,
    faults: Faults,
    fault_count: u64,
    /// (relay, message id) → deadline seen durable; status seen durable.
    deadlines: BTreeMap<(Ix, String), UnixSecs>,
    finals: BTreeMap<(Ix, String), DeliveryStatus>,
    /// (relay, account, message id) → a record's visible devices, durable.
    visible: BTreeMap<(Ix, Acct, String), Vec<String>>,
    /// (relay, account, logical message) of every record ever durable.
    ever_held: BTreeSet<(Ix, Acct, usize)>,
    /// Account ids by index (what a relay's fold names accounts by).
    ids: Vec<String>,
    /// Each relay's effects waiting for a barrier, with the group they
    /// wait for (memory: a crash drops them).
    waiting: Vec<Vec<(usize, Effect)>>,
    /// Each relay's chain heads as its disk holds them (the checker's
    /// own: walked at every crash, advanced at every write).
    tips: Vec<BTreeMap<Chain, (u64, Hash)>>,
    /// The last page text served per (server, puller, account), and its
    /// parse (see [`World::read_page`]).
    pages: BTreeMap<(Ix, Ix, Acct), (String, Box<Page>)>,
    cov: Coverage,
    violation: Option<Violation>,
    hash: blake3::Hasher,
    trace: Option<Vec<String>>,
    events: u64,
}

impl World {
    pub fn new(seed: u64, messages: usize, plant: Option<Plant>, trace: bool) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = rng.random_range(3..=6usize);
        let relays: Vec<Relay> = (0..n).map(|i| Relay::new(format!("relay-{i}"))).collect();
        // A quarter of the seeds keep messages only 20 to 60 minutes: the
        // sweep then runs within the run (never before a promise ends).
        let retention = rng.random_bool(0.25).then(|| rng.random_range(20 * 60..60 * 60u64));
        let policies = relays
            .iter()
            .map(|r| {
                let mut p = Policy::with_relay_id(&r.id);
                p.clock_tolerance = 5 * 60;
                if let Some(secs) = retention {
                    p.message_retention = secs;
                }
                p
            })
            .collect();
        let faults = Faults {
            loss: rng.random_range(0.0..0.08),
            dup: rng.random_range(0.0..0.05),
            slow: rng.random_range(0.0..0.04),
            server_error: rng.random_range(0.0..0.05),
            cut: BTreeMap::new(),
            healed: false,
        };
        let mut w = World {
            rng,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            policies,
            plant,
            relays,
            accounts: vec![],
            msgs: vec![],
            logical: BTreeMap::new(),
            faults,
            fault_count: 0,
            deadlines: BTreeMap::new(),
            finals: BTreeMap::new(),
            visible: BTreeMap::new(),
            ever_held: BTreeSet::new(),
            ids: vec![],
            waiting: (0..n).map(|_| vec![]).collect(),
            tips: vec![BTreeMap::new(); n],
            pages: BTreeMap::new(),
            cov: Coverage::default(),
            violation: None,
            hash: blake3::Hasher::new(),
            trace: trace.then(Vec::new),
            events: 0,
        };
        w.populate(n, messages);
        w
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued { at: at.max(self.now), seq: self.seq, ev: Box::new(ev) });
    }

    fn after(&mut self, delay: u64, ev: Ev) {
        self.at(self.now + delay, ev);
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>9} {}", self.now, line()));
        }
    }

    fn violate(&mut self, invariant: &'static str, mid: Option<&str>, detail: String) {
        if self.violation.is_none() {
            self.note(|| format!("VIOLATION {invariant}: {detail}"));
            self.violation = Some(Violation { at_ms: self.now, invariant, detail, mid: mid.map(str::to_owned) });
        }
    }

    // ---- setup --------------------------------------------------------

    fn populate(&mut self, n: usize, messages: usize) {
        let accounts = n * 4;
        let t0 = T0_MS / 1000;
        for a in 0..accounts {
            // The same keys in every seed: objects signed once are verified
            // once per process (relay-schemas' memo), as a relay's are.
            let client = fixtures::client(a, t0);
            let two = self.rng.random_bool(0.4);
            let first = self.rng.random_range(0..n);
            let mut homes = vec![first];
            if two {
                homes.push((first + self.rng.random_range(1..n)) % n);
            }
            let mut all = vec![(homes.clone(), t0 - 3_600)];
            // Some accounts move one home to another relay during the run.
            if self.rng.random_bool(0.3) {
                let mut moved = homes.clone();
                let last = moved.len() - 1;
                let new = (0..n).filter(|r| !homes.contains(r)).nth(self.rng.random_range(0..n - homes.len()));
                if let Some(new) = new {
                    moved[last] = new;
                    let at = self.rng.random_range(MIN..20 * MIN);
                    all.push((moved, t0 + at / 1000));
                    self.at(at, Ev::RouteChange { account: a });
                }
            }
            let routes =
                all.iter().enumerate().map(|(i, (h, issued_at))| self.route(a, i as u64 + 1, h, *issued_at)).collect();
            let homes = all.into_iter().map(|(h, _)| h).collect();
            let id = client.keys.id.clone();
            self.ids.push(id.clone());
            self.accounts.push(Account { id, client, routes, homes, current: 1, revoked: None });
        }
        // Each account registers at its first homes and adds its second
        // device, before any message.
        for a in 0..accounts {
            for h in self.accounts[a].homes[0].clone() {
                self.register(h, a, 1);
            }
        }
        for m in 0..messages {
            let from = self.rng.random_range(0..accounts);
            let to = (from + self.rng.random_range(1..accounts)) % accounts;
            let created_at_ms = self.rng.random_range(0..SEND_WINDOW_MS);
            // Zero-padded: always a valid id (16-64 characters).
            let mid = format!("m{m:06}-0-{:010}", self.rng.random_range(0..u32::MAX));
            self.logical.insert(mid.clone(), m);
            let device = self.rng.random_range(0..2u8);
            let ids = vec![mid.clone()];
            let msg =
                Msg { from, device, to, created_at_ms, mid, ids, params: None, try_no: 0, acked: None, done: false };
            self.msgs.push(msg);
            self.at(created_at_ms, Ev::ClientSend { msg: m });
        }
        for _ in 0..self.rng.random_range(0..3) {
            let (account, at) = (self.rng.random_range(0..accounts), self.rng.random_range(2 * MIN..SEND_WINDOW_MS));
            self.at(at, Ev::Revoke { account, device: 1 });
        }
        for _ in 0..self.rng.random_range(2..12) {
            let at = self.rng.random_range(0..HEAL_MS - MIN);
            let relay = self.rng.random_range(0..n);
            let power_cut = self.rng.random_bool(0.5);
            let ev = match self.rng.random_bool(0.5) {
                true => Ev::ArmCrash { relay, power_cut },
                false => Ev::Crash { relay, power_cut },
            };
            self.at(at, ev);
        }
        for _ in 0..self.rng.random_range(1..6) {
            let a = self.rng.random_range(0..n);
            let b = (a + self.rng.random_range(1..n)) % n;
            let at = self.rng.random_range(0..HEAL_MS - MIN);
            let blackhole = self.rng.random_bool(0.5);
            self.at(at, Ev::Partition { a: a.min(b), b: a.max(b), blackhole, on: true });
            let len = self.rng.random_range(SEC..6 * MIN);
            self.at(at + len, Ev::Partition { a: a.min(b), b: a.max(b), blackhole, on: false });
        }
        for _ in 0..self.rng.random_range(0..4) {
            let at = self.rng.random_range(0..HEAL_MS);
            let relay = self.rng.random_range(0..n);
            let offset_ms = self.rng.random_range(-120_000..120_000i64);
            self.at(at, Ev::ClockJump { relay, offset_ms });
        }
        for relay in 0..n {
            let at = self.rng.random_range(0..PULL_EVERY_MS);
            self.at(at, Ev::PullTick { relay, inc: 0 });
            if self.short_retention() {
                let at = self.rng.random_range(0..SWEEP_EVERY_MS);
                self.at(at, Ev::Sweep { relay, inc: 0 });
            }
        }
        self.at(HEAL_MS, Ev::Heal);
    }

    fn short_retention(&self) -> bool {
        self.policies[0].message_retention < 24 * 3600
    }

    /// A route signed by the account's key.
    fn route(&self, account: Acct, revision: u64, homes: &[Ix], issued_at: u64) -> Wire<Route> {
        let relays: Vec<(String, String)> =
            homes.iter().map(|h| (self.relays[*h].id.clone(), format!("http://{}.sim", self.relays[*h].id))).collect();
        fixtures::route(account, revision, &relays, issued_at, T0_MS / 1000)
    }

    fn pol(&self, r: Ix) -> &Policy {
        &self.policies[r]
    }

    fn relay_of(&self, id: &str) -> Option<Ix> {
        self.relays.iter().position(|r| r.id == id)
    }

    /// The route of `account` as relay `r` knows it.
    fn known_route(&self, r: Ix, account: Acct) -> &Wire<Route> {
        let rev = self.relays[r].route(account) as usize;
        &self.accounts[account].routes[rev - 1]
    }

    /// Whether relay `r` holds `account` and its route there names `r`.
    fn serves(&self, r: Ix, account: Acct) -> bool {
        let id = &self.relays[r].id;
        self.relays[r].accts.get(&account).and_then(|h| h.state.route()).is_some_and(|route| route.lists_relay(id))
    }

    // ---- the account side: relay-core decides, the world writes -----------

    /// Decides `cmd` on `account` as relay `r` holds it (an account not
    /// held is an empty state, as the actor loads one).
    fn decide_at(&self, r: Ix, account: Acct, cmd: &AccountCmd<()>) -> Result<Decision, RelayError> {
        let relay = &self.relays[r];
        let empty;
        let here = match relay.accts.get(&account) {
            Some(h) => h,
            None => {
                empty = Here::new(&self.ids[account]);
                &empty
            }
        };
        let forget_receipts =
            self.plant == Some(Plant::ReplicateTwice) && matches!(cmd, AccountCmd::ReplicaApply { .. });
        let reads = SimReads { here, deliveries: &relay.deliveries, forget_receipts };
        let (now, policy) = (self.ctx_now(r), self.pol(r));
        if self.plant == Some(Plant::DeliverAfterRevocation) {
            // Planted: the shell loads the account without its revocations
            // (its snapshot with them emptied).
            let mut snapshot = serde_json::to_value(&here.state).expect("a state serializes");
            snapshot["revocations"] = json!({});
            let mut state: relay_core::account::AccountState =
                serde_json::from_value(snapshot).expect("a snapshot deserializes");
            state.rebuild_caches();
            return core::decide(&state, cmd, &reads, now, policy);
        }
        core::decide(&here.state, cmd, &reads, now, policy)
    }

    /// Writes what `account` decided at `r` as one group, with `extra`
    /// (a settling delivery's last events) and the first events of the
    /// deliveries it begins; starts those. Returns the reply.
    fn commit(&mut self, r: Ix, account: Acct, d: Decision, extra: Vec<Rec>) -> Reply {
        let mut group: Vec<Rec> = d.events.into_iter().map(|event| Rec::Account { account, event }).collect();
        group.extend(extra);
        let mut begun = vec![];
        for effect in d.effects {
            let b = match effect {
                core::Effect::BeginDelivery(b) => b,
                core::Effect::Forward(b) => {
                    self.cov.forwarded_deliveries += 1;
                    b
                }
                core::Effect::StoreSession { .. } | core::Effect::EndDevice { .. } => continue,
            };
            let mid = b.state.message_id.to_string();
            group.extend(b.events.iter().map(|event| Rec::Delivery { mid: mid.clone(), event: event.clone() }));
            begun.push(b);
        }
        self.persist(r, group);
        for b in begun {
            let mid = b.state.message_id.to_string();
            let deadline = b.state.deadline.0;
            self.note(|| format!("relay-{r} begins delivery of {mid} deadline {deadline}"));
            if b.state.finished.is_some() {
                continue;
            }
            if b.state.in_flight.is_some() {
                self.after_barrier(r, Effect::SendAttempt(mid));
            } else if let Some(due) = b.due_ms {
                self.schedule_due(r, &mid, due);
            }
        }
        d.reply
    }

    /// Decides and writes; an error writes nothing.
    fn command(&mut self, r: Ix, account: Acct, cmd: &AccountCmd<()>) -> Result<Reply, RelayError> {
        let d = self.decide_at(r, account, cmd)?;
        Ok(self.commit(r, account, d, vec![]))
    }

    /// `account.register` of `account` at `h` under route `revision`, then
    /// its devices as its client adds (and revokes) them there.
    fn register(&mut self, h: Ix, account: Acct, revision: u64) {
        let now = self.ctx_now(h).0;
        let acct = &self.accounts[account];
        let route = acct.routes[revision as usize - 1].raw().get();
        let v = fixtures::register_params(account, route, &self.relays[h].id, now, T0_MS / 1000);
        let digest = blake3::Hash::from(relay_schemas::encoding::jcs_digest(&v).expect("jcs")).to_hex().to_string();
        let params: RegisterParams = parse(&v);
        let cert: Wire<_> = Wire::from_value(&acct.client.certs[1]).expect("certificate");
        let revoked = acct.revoked.map(|at| acct.client.keys.revocation("d1", at));
        let cmds = [
            Some(AccountCmd::AccountRegister { params, digest, known: None }),
            Some(AccountCmd::DeviceAdd { device: "d0".into(), params: DeviceAddParams { device_certificate: cert } }),
            revoked.map(|rev| AccountCmd::DeviceRevoke {
                device: "d0".into(),
                params: DeviceRevokeParams { revocation: Wire::from_value(&rev).expect("revocation") },
            }),
        ];
        for cmd in cmds.into_iter().flatten() {
            if let Err(e) = self.command(h, account, &cmd) {
                self.note(|| format!("relay-{h} refused {cmd:?} of account {account}: {e}"));
            }
        }
    }

    /// Relay `h` learns revision `revision` of `account`'s route: its route
    /// book; `route.update` when it holds the account; `account.register`
    /// when it is a new home.
    fn learn_route(&mut self, h: Ix, account: Acct, revision: u64) {
        self.persist(h, vec![Rec::Route { account, revision }]);
        let held = self.relays[h].accts.get(&account).is_some_and(|x| x.state.is_registered());
        if held {
            let route = self.accounts[account].routes[revision as usize - 1].clone();
            let cmd = AccountCmd::RouteUpdate { device: "d0".into(), params: RouteUpdateParams { route } };
            if let Err(e) = self.command(h, account, &cmd) {
                self.note(|| format!("relay-{h} refused the route update of account {account}: {e}"));
            }
        } else if self.accounts[account].homes[revision as usize - 1].contains(&h) {
            self.register(h, account, revision);
        }
    }

    fn relay_now(&self, r: Ix) -> u64 {
        self.relays[r].now_ms(T0_MS + self.now)
    }

    fn ctx_now(&self, r: Ix) -> UnixSecs {
        UnixMillis(self.relay_now(r)).secs()
    }

    // ---- the loop -----------------------------------------------------

    pub fn run(mut self) -> Run {
        while let Some(q) = self.queue.pop() {
            if q.at > END_MS || self.violation.is_some() {
                break;
            }
            self.now = q.at;
            self.events += 1;
            self.hash.update(&q.at.to_le_bytes());
            self.hash.update(&[q.ev.kind()]);
            self.dispatch(*q.ev);
        }
        if self.violation.is_none() {
            self.finish();
        }
        let acked = self.msgs.iter().filter(|m| m.acked.is_some()).count();
        let delivered = (0..self.msgs.len()).filter(|i| self.delivered_anywhere(*i)).count();
        if let Some(v) = &self.violation {
            self.hash.update(v.to_string().as_bytes());
        }
        Run {
            trace_hash: self.hash.finalize().to_hex().to_string(),
            violation: self.violation,
            coverage: self.cov,
            trace: self.trace.unwrap_or_default(),
            events: self.events,
            relays: self.relays.len(),
            messages: self.msgs.len(),
            acked,
            delivered,
            faults: self.fault_count,
        }
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::ClientSend { msg } => self.client_send(msg),
            Ev::ClientTimeout { msg, try_no } => {
                let m = &self.msgs[msg];
                if m.acked.is_none() && !m.done && m.try_no == try_no {
                    self.cov.client_retries += 1;
                    if self.plant == Some(Plant::RetryNewId) {
                        let mid = format!("m{msg:06}-{}-{:010}", try_no + 1, self.rng.random_range(0..u32::MAX));
                        self.logical.insert(mid.clone(), msg);
                        self.msgs[msg].ids.push(mid.clone());
                        self.msgs[msg].mid = mid;
                        self.msgs[msg].params = None;
                    }
                    let backoff = self.rng.random_range(SEC..20 * SEC);
                    self.after(backoff, Ev::ClientSend { msg });
                }
            }
            Ev::Request { to, from, inc, req } => {
                if self.relays[to].up && self.relays[to].inc == inc {
                    self.on_request(to, from, req);
                }
            }
            Ev::Response { to, inc, resp } => match to {
                Node::Client => self.client_answer(resp),
                Node::Relay(r) if self.relays[r].up && self.relays[r].inc == inc => self.on_response(r, resp),
                Node::Relay(_) => {}
            },
            Ev::Flush { relay, inc } if self.live(relay, inc) => self.flush(relay),
            Ev::Due { relay, inc, mid } if self.live(relay, inc) => self.on_due(relay, &mid),
            Ev::AttemptTimeout { relay, inc, mid, attempt } if self.live(relay, inc) => {
                if self.relays[relay].attempts.get(&mid).is_some_and(|a| a.attempt == attempt) {
                    self.conclude(relay, &mid);
                }
            }
            Ev::AskTimeout { relay, inc, mid, attempts } if self.live(relay, inc) => {
                if self.relays[relay].asking.get(&mid) == Some(&attempts) {
                    self.relays[relay].asking.remove(&mid);
                    self.cov.partner_home_apart += 1;
                    self.start_attempt(relay, &mid);
                }
            }
            Ev::PullTick { relay, inc } if self.live(relay, inc) => self.pull_tick(relay),
            Ev::Sweep { relay, inc } if self.live(relay, inc) => self.sweep(relay),
            Ev::Crash { relay, power_cut } => self.crash(relay, power_cut),
            Ev::Restart { relay } => self.restart(relay),
            Ev::ArmCrash { relay, power_cut } => self.relays[relay].crash_armed = Some(power_cut),
            Ev::ClockJump { relay, offset_ms } => {
                self.cov.clock_jumps += 1;
                self.fault_count += 1;
                self.relays[relay].clock_offset_ms = offset_ms;
                self.note(|| format!("clock relay-{relay} offset {offset_ms}ms"));
            }
            Ev::RouteChange { account } => self.route_change(account),
            Ev::Revoke { account, device } => self.revoke(account, device),
            Ev::Partition { a, b, blackhole, on } => {
                if on && !self.faults.healed {
                    self.fault_count += 1;
                    self.faults.cut.insert((a, b), blackhole);
                } else {
                    self.faults.cut.remove(&(a, b));
                }
                self.note(|| format!("partition relay-{a} relay-{b} blackhole={blackhole} on={on}"));
            }
            Ev::Heal => {
                self.faults.healed = true;
                self.faults.cut.clear();
                self.note(|| "heal".into());
                for r in 0..self.relays.len() {
                    if !self.relays[r].up {
                        self.restart(r);
                    }
                }
            }
            Ev::Flush { .. } | Ev::Due { .. } | Ev::AttemptTimeout { .. } | Ev::AskTimeout { .. } => {}
            Ev::PullTick { .. } | Ev::Sweep { .. } => {}
        }
    }

    fn live(&self, r: Ix, inc: u64) -> bool {
        self.relays[r].up && self.relays[r].inc == inc
    }

    // ---- network ------------------------------------------------------

    fn delay(&mut self) -> u64 {
        if !self.faults.healed && self.rng.random_bool(self.faults.slow) {
            // Past the attempt timeout: the answer comes late.
            self.rng.random_range(5 * SEC..25 * SEC)
        } else {
            self.rng.random_range(1..80)
        }
    }

    /// Whether the link between two nodes is cut: `Some(true)` drops,
    /// `Some(false)` refuses.
    fn cut(&self, a: Node, b: Node) -> Option<bool> {
        match (a, b) {
            (Node::Relay(a), Node::Relay(b)) => self.faults.cut.get(&(a.min(b), a.max(b))).copied(),
            _ => None,
        }
    }

    /// Sends `req` from `from` to relay `to`. Returns `false` when the
    /// connection is refused (the caller learns it at once).
    fn request(&mut self, from: Node, to: Ix, req: Req) -> bool {
        if !self.relays[to].up || self.cut(from, Node::Relay(to)) == Some(false) {
            self.cov.refused_requests += 1;
            return false;
        }
        if self.cut(from, Node::Relay(to)) == Some(true) || self.lost() {
            self.cov.lost_requests += 1;
            return true;
        }
        let inc = self.relays[to].inc;
        let d = self.delay();
        if !self.faults.healed && self.rng.random_bool(self.faults.dup) {
            self.cov.duplicated_requests += 1;
            let d2 = self.delay();
            self.after(d2, Ev::Request { to, from, inc, req: req.clone() });
        }
        self.after(d, Ev::Request { to, from, inc, req });
        true
    }

    fn lost(&mut self) -> bool {
        !self.faults.healed && self.rng.random_bool(self.faults.loss)
    }

    fn respond(&mut self, from: Ix, to: Node, resp: Resp) {
        if self.cut(Node::Relay(from), to).is_some() || self.lost() {
            self.cov.lost_requests += 1;
            return;
        }
        let inc = match to {
            Node::Relay(r) => self.relays[r].inc,
            Node::Client => 0,
        };
        let d = self.delay();
        self.after(d, Ev::Response { to, inc, resp });
    }

    // ---- clients ------------------------------------------------------

    fn client_send(&mut self, msg: usize) {
        let m = &self.msgs[msg];
        if m.acked.is_some() || m.done {
            return;
        }
        // A client stops once the relay could no longer accept it.
        if self.now > m.created_at_ms + self.policies[0].delivery_age_limit * SEC {
            self.msgs[msg].done = true;
            return;
        }
        let from = m.from;
        let acct = &self.accounts[from];
        let homes = acct.homes[acct.current as usize - 1].clone();
        let home = homes[self.rng.random_range(0..homes.len())];
        if self.msgs[msg].params.is_none() {
            self.msgs[msg].params = Some(self.send_params(msg));
        }
        let m = &mut self.msgs[msg];
        m.try_no += 1;
        let (try_no, mid) = (m.try_no, m.mid.clone());
        self.request(Node::Client, home, Req::Send { msg, try_no, mid });
        self.after(CLIENT_TIMEOUT_MS, Ev::ClientTimeout { msg, try_no });
    }

    fn client_answer(&mut self, resp: Resp) {
        let Resp::SendAck { msg, try_no, mid, result } = resp else { return };
        let m = &mut self.msgs[msg];
        if m.acked.is_some() || m.done {
            return;
        }
        match result {
            Ok(_) => {
                m.acked = Some(mid);
                self.check_acked(Some(msg));
            }
            // Refused for good: a revoked device (its session ended), an
            // expired message.
            Err(e)
                if matches!(e.code, ErrorCode::DeviceUnknown | ErrorCode::MessageExpired | ErrorCode::Unauthorized) =>
            {
                m.done = true
            }
            // Not served there (a route change): try again elsewhere.
            Err(_) if m.try_no == try_no => {
                let backoff = self.rng.random_range(SEC..10 * SEC);
                self.after(backoff, Ev::ClientSend { msg });
            }
            Err(_) => {}
        }
    }

    // ---- a relay's requests ---------------------------------------------

    /// The client's `message.send` params: its envelope signed by the
    /// sending device, a box for each of the recipient's devices.
    fn send_params(&self, msg: usize) -> (SendParams, String) {
        let m = &self.msgs[msg];
        let (from, to) = (&self.accounts[m.from], &self.accounts[m.to]);
        let created_at = (T0_MS + m.created_at_ms) / 1000;
        let env = from.client.devices[m.device as usize].envelope(&from.id, &to.id, &m.mid, created_at, b"sim");
        let v = json!({"envelope": env, "recipient_boxes": [key_box("d0", b"k0"), key_box("d1", b"k1")]});
        let digest = relay_schemas::encoding::jcs_digest(&v).expect("jcs");
        (parse(&v), blake3::Hash::from(digest).to_hex().to_string())
    }

    fn on_request(&mut self, r: Ix, from: Node, req: Req) {
        match req {
            Req::Send { msg, try_no, mid } => {
                let result = self.accept(r, msg);
                let resp = |result| Resp::SendAck { msg, try_no, mid, result };
                match result {
                    Ok(status) if self.plant == Some(Plant::AckBeforeBarrier) => {
                        self.respond(r, from, resp(Ok(status)));
                    }
                    // Answered once what it wrote (or read) is durable.
                    result => self.after_barrier(r, Effect::Reply(from, resp(result))),
                }
            }
            Req::Deliver { mid, attempt, params } => {
                let Node::Relay(c) = from else { return };
                let outcome = self.receive(r, &params, Via::Peer(c));
                let resp = Resp::Outcome { mid, attempt, target: r, outcome };
                // A receipt is answered once durable (persist before effect).
                self.after_barrier(r, Effect::Reply(from, resp));
            }
            Req::PeerStatus { mid, from: sender, attempts } => {
                let Node::Relay(c) = from else { return };
                let cmd =
                    AccountCmd::MessageDeliveryPeerStatus { peer: self.relays[c].id.clone(), message_id: mid.clone() };
                let status = match self.relays[r].accts.contains_key(&sender).then(|| self.decide_at(r, sender, &cmd)) {
                    Some(Ok(Decision { reply: Reply::Json(text), .. })) => {
                        serde_json::from_str::<PeerStatusResult>(&text).ok().and_then(|p| p.status)
                    }
                    _ => None,
                };
                self.respond(r, from, Resp::PeerStatus { mid, attempts, status });
            }
            Req::Replicate { account, params } => {
                let Node::Relay(c) = from else { return };
                let result = match self.relays[r].accts.contains_key(&account) {
                    true => {
                        let cmd = AccountCmd::TimelineReplicate { peer: self.relays[c].id.clone(), params };
                        self.command(r, account, &cmd).and_then(|reply| match reply {
                            Reply::Json(text) => self.read_page((r, c, account), text),
                            other => Err(RelayError::internal(format!("unexpected {other:?}"))),
                        })
                    }
                    false => Err(core::not_served_here(Some(self.known_route(r, account)))),
                };
                let resp = Resp::Page { partner: r, account, result };
                self.after_barrier(r, Effect::Reply(from, resp));
            }
        }
    }

    /// The page `text` says, as the puller parses it. Parsing is a pure
    /// function of the text, and most pulls of an idle account are answered
    /// the same bytes as the last one: those reuse its parse (the route and
    /// I-JSON checks of the page were ~13 % of a run).
    fn read_page(&mut self, slot: (Ix, Ix, Acct), text: String) -> Result<Box<Page>, RelayError> {
        if let Some((last, page)) = self.pages.get(&slot) {
            if *last == text {
                return Ok(page.clone());
            }
        }
        let page =
            serde_json::from_str::<Page>(&text).map(Box::new).map_err(|e| RelayError::internal(e.to_string()))?;
        self.pages.insert(slot, (text, page.clone()));
        Ok(page)
    }

    /// `message.send` at the sender's home `r`, as the send process runs
    /// it (`Supervisor::message_send`): the sender's account decides; a
    /// recipient served here alone takes its receipt first (commit 1) and
    /// the acceptance carries that attempt's outcome (commit 2), so a crash
    /// can fall between the two; otherwise the acceptance begins the
    /// delivery.
    fn accept(&mut self, r: Ix, msg: usize) -> Result<DeliveryStatus, RelayError> {
        let m = &self.msgs[msg];
        let (from, to, device) = (m.from, m.to, format!("d{}", m.device));
        let (params, digest) = m.params.clone().expect("made at the first send");
        if !self.relays[r].accts.contains_key(&from) {
            // No session can be opened here for an account not held.
            return Err(RelayError::unauthorized("session account unknown"));
        }
        let route = self.known_route(r, to).clone();
        let cmd = AccountCmd::MessageSend { device, params, digest, route: Some(route.clone()) };
        let d = self.decide_at(r, from, &cmd)?;
        let reply = match d.reply {
            Reply::Accept(acceptance) => {
                let mid = acceptance.deliver.envelope.message_id.clone();
                if self.relays[r].has_record(to, &mid) {
                    self.cov.receipt_before_acceptance += 1;
                }
                let outcome = self.receive(r, &acceptance.deliver, Via::Send);
                if let AttemptOutcome::Rejected(e) = &outcome {
                    if e.code == ErrorCode::StateConflict {
                        return Err(e.clone());
                    }
                }
                let cmd = match core::final_status(&outcome, acceptance.status.accepted_at) {
                    Some(status) => AccountCmd::Settle { acceptance, status },
                    None => AccountCmd::Accept { acceptance, route: Some(route), first: Some(outcome) },
                };
                self.command(r, from, &cmd)?
            }
            _ => self.commit(r, from, d, vec![]),
        };
        match reply {
            Reply::Status(s) | Reply::Settled { status: s, .. } => Ok(s),
            other => Err(RelayError::internal(format!("unexpected reply {other:?}"))),
        }
    }

    /// A receipt at relay `r`, as its shell runs it: `message.deliver` from
    /// another relay asks who may deliver; it and this relay's own attempts
    /// ask the sender's device when this relay serves the sender
    /// (`Supervisor::check_sending_device`); then the recipient's account
    /// decides the receipt.
    fn receive(&mut self, r: Ix, params: &DeliverParams, via: Via) -> AttemptOutcome {
        let env = &params.envelope;
        let (Some(to), Some(from)) = (self.account_of(&env.to), self.account_of(&env.from)) else {
            return AttemptOutcome::Rejected(RelayError::new(ErrorCode::InvalidParams, "unknown account"));
        };
        if !self.faults.healed && self.rng.random_bool(self.faults.server_error) {
            let e = match self.rng.random_range(0..3) {
                0 => RelayError::internal("sim"),
                1 => RelayError::unavailable("sim"),
                _ => RelayError::new(ErrorCode::RateLimited, "sim")
                    .with_data(serde_json::json!({"retry_after": self.rng.random_range(1..60)})),
            };
            return AttemptOutcome::Rejected(e);
        }
        let known = self.known_route(r, from);
        if let Via::Peer(c) = via {
            if let Err(e) = core::may_deliver(params, Some(known), &self.relays[c].id, self.ctx_now(r), self.pol(r)) {
                return AttemptOutcome::Rejected(e);
            }
        }
        let serves_sender = known.lists_relay(&self.relays[r].id);
        if via != Via::Send && serves_sender && self.relays[r].accts.contains_key(&from) {
            let cmd = AccountCmd::CheckSender { device_id: env.from_device_id.clone() };
            if let Err(e) = self.decide_at(r, from, &cmd) {
                return AttemptOutcome::Rejected(e);
            }
        }
        if !self.relays[r].accts.contains_key(&to) {
            return AttemptOutcome::Rejected(core::not_served_here(Some(self.known_route(r, to))));
        }
        let cmd = AccountCmd::MessageDeliver { params: params.clone(), digest: core::deliver_digest(params) };
        match self.command(r, to, &cmd) {
            Ok(Reply::Status(status)) => AttemptOutcome::Answered(status),
            Ok(other) => AttemptOutcome::Unknown(RelayError::internal(format!("unexpected reply {other:?}"))),
            Err(e) => AttemptOutcome::Rejected(e),
        }
    }

    fn account_of(&self, id: &str) -> Option<Acct> {
        self.ids.iter().position(|a| a == id)
    }

    // ---- the disk -------------------------------------------------------

    /// Writes a group (readers of this relay see it at once) and arms the
    /// barrier; checks what the group changes as it goes.
    fn persist(&mut self, r: Ix, group: Vec<Rec>) {
        if group.is_empty() {
            return;
        }
        let at = self.ctx_now(r).0;
        let mut written = Vec::with_capacity(group.len());
        for rec in group {
            self.check_write(r, &rec);
            self.relays[r].apply(&rec, &self.ids);
            let link = self.relays[r].link(&rec, at, &self.ids);
            if let Some((key, link)) = &link {
                self.check_link(r, key, link);
            }
            written.push(Written { rec, link });
        }
        self.relays[r].disk.append(written);
        self.hash.update(&[0xd1, r as u8]);
        if let Some(power_cut) = self.relays[r].crash_armed.take() {
            self.after(0, Ev::Crash { relay: r, power_cut });
        }
        if !self.relays[r].flush_armed {
            self.relays[r].flush_armed = true;
            let (inc, d) = (self.relays[r].inc, self.rng.random_range(1..4));
            self.after(d, Ev::Flush { relay: r, inc });
        }
    }

    fn after_barrier(&mut self, r: Ix, effect: Effect) {
        let group = self.relays[r].disk.groups().len();
        if group <= self.relays[r].disk.durable() {
            return self.run_effect(r, effect);
        }
        self.waiting[r].push((group, effect));
    }

    fn flush(&mut self, r: Ix) {
        let relay = &mut self.relays[r];
        relay.flush_armed = false;
        let mut finals = vec![];
        let mut records = vec![];
        for w in relay.disk.barrier().iter().flatten() {
            match &w.rec {
                Rec::Delivery { mid, event: DeliveryEvent::Accepted { deadline, .. } } => {
                    finals.push((mid.clone(), Err(*deadline)))
                }
                Rec::Delivery { mid, event: DeliveryEvent::Finished { status } } => {
                    finals.push((mid.clone(), Ok(status.clone())))
                }
                Rec::Account { account, event } => {
                    if let AccountEvent::MessageReceived { message_id, record, .. } = event.origin() {
                        records.push((*account, message_id.clone(), record.visible.clone()));
                    }
                }
                _ => {}
            }
        }
        for (mid, f) in finals {
            match f {
                Err(deadline) => {
                    let old = self.deadlines.entry((r, mid.clone())).or_insert(deadline);
                    if *old != deadline {
                        let d = format!("relay-{r} {mid}: durable deadline {} then {}", old.0, deadline.0);
                        self.violate(inv::DEADLINE_FIXED, Some(&mid), d);
                    }
                }
                Ok(status) => {
                    self.finals.insert((r, mid), status);
                }
            }
        }
        for (account, mid, visible) in records {
            if let Some(&logical) = self.logical.get(&mid) {
                self.ever_held.insert((r, account, logical));
            }
            self.visible.insert((r, account, mid), visible);
        }
        let durable = self.relays[r].disk.durable();
        let waiting = std::mem::take(&mut self.waiting[r]);
        let (ready, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(g, _)| *g <= durable);
        self.waiting[r] = rest;
        for (_, effect) in ready {
            self.run_effect(r, effect);
        }
    }

    fn run_effect(&mut self, r: Ix, effect: Effect) {
        match effect {
            Effect::Reply(to, resp) => self.respond(r, to, resp),
            Effect::SendAttempt(mid) => self.send_attempt(r, &mid),
        }
    }

    /// The invariants a write can break, checked before it is applied.
    fn check_write(&mut self, r: Ix, rec: &Rec) {
        match rec {
            Rec::Delivery { mid, event } => {
                let Some(s) = self.relays[r].deliveries.get(mid) else { return };
                if let Some(done) = &s.finished {
                    let d = format!("relay-{r} {mid}: {event:?} after final {:?}", done.status);
                    return self.violate(inv::STATUS_MONOTONE, Some(mid), d);
                }
                match event {
                    DeliveryEvent::RouteRefreshed { revision, .. } => {
                        if let Some(t) = &s.target {
                            if *revision < t.revision {
                                let d = format!("relay-{r} {mid}: target revision {} then {revision}", t.revision);
                                return self.violate(inv::TARGET_REVISION, Some(mid), d);
                            }
                            if s.attempts > 0 {
                                self.cov.route_change_mid_delivery += 1;
                            }
                        }
                    }
                    DeliveryEvent::Finished { status }
                        if status.error.as_ref().is_some_and(|e| e.code == ErrorCode::MessageExpired) =>
                    {
                        self.cov.deadline_expiry += 1;
                    }
                    _ => {}
                }
            }
            Rec::Account { account, event } => self.check_account_write(r, *account, event),
            Rec::Swept { account, seq, .. } => {
                let Some(h) = self.relays[r].accts.get(account) else { return };
                let Some(event) = h.events.get(*seq as usize - 1) else { return };
                let (mid, until) = match event.origin() {
                    AccountEvent::MessageSent { message_id, retention_until, .. }
                    | AccountEvent::SelfDelivered { message_id, retention_until, .. }
                    | AccountEvent::MessageReceived { message_id, retention_until, .. } => {
                        (message_id.clone(), *retention_until)
                    }
                    _ => return,
                };
                self.cov.swept += 1;
                let now = self.ctx_now(r).0;
                if now <= until {
                    let d = format!("relay-{r} account {account}: {mid} swept at {now}, kept through {until}");
                    self.violate(inv::RETENTION, Some(&mid), d);
                }
            }
            Rec::Route { .. } => {}
        }
    }

    /// An event continues its stream's chain from the head the disk holds
    /// (after a crash, the head of what survived).
    fn check_link(&mut self, r: Ix, key: &Chain, link: &Link) {
        let (seq, prev) = self.tips[r].get(key).copied().unwrap_or((0, chain::ZERO));
        if link.seq != seq + 1 || link.prev != prev {
            let mid = match key {
                Chain::Delivery(mid) => Some(mid.clone()),
                Chain::Account(_) => None,
            };
            let d = format!(
                "relay-{r} {key:?}: event {} follows {} (prev {}), the disk's head is {seq} ({})",
                link.seq,
                link.seq - 1,
                hex8(&link.prev),
                hex8(&prev)
            );
            return self.violate(inv::CHAIN, mid.as_deref(), d);
        }
        self.tips[r].insert(key.clone(), (link.seq, link.hash));
    }

    /// Every chain on `r`'s disk verifies; its heads are the checker's.
    fn verify_chains(&mut self, r: Ix) {
        match self.relays[r].disk.verify_chains() {
            Ok(heads) => self.tips[r] = heads,
            Err(e) => self.violate(inv::CHAIN, None, format!("relay-{r} {e}")),
        }
    }

    /// A write to an account's stream: no second record of one message; a
    /// record's visible devices valid here when it is accepted here; no
    /// acceptance of a later envelope of a device this home knows revoked.
    fn check_account_write(&mut self, r: Ix, account: Acct, event: &AccountEvent) {
        let replicated = matches!(event, AccountEvent::Replicated { .. });
        match event.origin() {
            AccountEvent::MessageReceived { message_id: mid, record, .. } => {
                let logical = self.logical.get(mid).copied();
                let relay = &self.relays[r];
                let ids = logical.map_or(&[][..], |l| &self.msgs[l].ids[..]);
                let held = relay.has_record(account, mid) || ids.iter().any(|id| relay.has_record(account, id));
                let before = logical.is_some_and(|l| self.ever_held.contains(&(r, account, l)));
                if held || before {
                    let d = format!("relay-{r}: account {account} got message {logical:?} ({mid}) a second time");
                    return self.violate(inv::DELIVERED_TWICE, Some(mid), d);
                }
                let state = relay.accts.get(&account).map(|h| &h.state);
                let revoked =
                    record.visible.iter().find(|v| state.is_some_and(|s| s.revocations().contains_key(v.as_str())));
                if let (false, Some(v)) = (replicated, revoked) {
                    let d = format!("relay-{r}: {mid} visible to device {v}, revoked here before its acceptance");
                    return self.violate(inv::VISIBILITY, Some(mid), d);
                }
                // A home of the sender (by its newest route known here, as the
                // handler asks) that knows the device revoked.
                let Some(sender) = self.account_of(&record.envelope.from) else { return };
                let home = self.known_route(r, sender).lists_relay(&self.relays[r].id) && self.serves(r, sender);
                if !replicated && home {
                    let state = &self.relays[r].accts[&sender].state;
                    if core::revoked_before(state, &record.envelope) {
                        let d = format!("relay-{r} took {mid} from a device it knows revoked");
                        self.violate(inv::REVOKED, Some(mid), d);
                    }
                }
            }
            // An acceptance made here (a replicated one without an envelope is
            // a result learned, and one with is checked by `check_sent`).
            AccountEvent::MessageSent { message_id: mid, .. } if !replicated => {
                let Some(&m) = self.logical.get(mid) else { return };
                let Some(h) = self.relays[r].accts.get(&account) else { return };
                let (device, created_at) =
                    (format!("d{}", self.msgs[m].device), (T0_MS + self.msgs[m].created_at_ms) / 1000);
                if h.state.revocations().get(&device).is_some_and(|x| x.revoked_at <= created_at) {
                    let d = format!("relay-{r} accepted {mid} from a device it knows revoked");
                    self.violate(inv::REVOKED, Some(mid), d);
                }
            }
            _ => {}
        }
    }

    // ---- deliveries ---------------------------------------------------

    fn schedule_due(&mut self, r: Ix, mid: &str, due_ms: UnixMillis) {
        let wait = due_ms.0.saturating_sub(self.relay_now(r));
        let inc = self.relays[r].inc;
        self.after(wait, Ev::Due { relay: r, inc, mid: mid.into() });
    }

    /// A delivery is due: ask the sender's other home first when the core
    /// says so, then attempt.
    fn on_due(&mut self, r: Ix, mid: &str) {
        let relay = &self.relays[r];
        let Some(s) = relay.deliveries.get(mid) else { return };
        if s.finished.is_some() || relay.attempts.contains_key(mid) || relay.asking.contains_key(mid) {
            return;
        }
        let now = self.relay_now(r);
        if let Some(due) = s.next_due_ms.filter(|d| d.0 > now) {
            return self.schedule_due(r, mid, due);
        }
        let from = self.account_of(&s.from).expect("a known sender");
        let sender_route = self.known_route(r, from);
        if let Some(other) = core::other_home(s, sender_route, &relay.id) {
            let attempts = s.attempts;
            let other = self.relay_of(&other).expect("a relay of the world");
            let req = Req::PeerStatus { mid: mid.into(), from, attempts };
            if self.request(Node::Relay(r), other, req) {
                self.relays[r].asking.insert(mid.into(), attempts);
                let inc = self.relays[r].inc;
                let timeout = self.pol(r).attempt_timeout_ms;
                self.after(timeout, Ev::AskTimeout { relay: r, inc, mid: mid.into(), attempts });
                return;
            }
            self.cov.partner_home_apart += 1;
        }
        self.start_attempt(r, mid);
    }

    /// The route for the next attempt: the cache, or (after a route error
    /// or with none) the highest revision any reachable relay knows.
    fn lookup(&mut self, r: Ix, to: Acct, fresh: bool) -> Wire<Route> {
        if fresh {
            let reachable: Vec<Ix> = (0..self.relays.len())
                .filter(|x| *x == r || (self.relays[*x].up && self.cut(Node::Relay(r), Node::Relay(*x)).is_none()))
                .collect();
            let rev = if self.plant == Some(Plant::LowerRevision) {
                // Planted: the first answer wins, whatever its revision.
                let pick = reachable[self.rng.random_range(0..reachable.len())];
                self.relays[pick].route(to)
            } else {
                reachable.iter().map(|x| self.relays[*x].route(to)).max().unwrap_or(1)
            };
            if rev > self.relays[r].route(to) {
                self.persist(r, vec![Rec::Route { account: to, revision: rev }]);
            }
            return self.accounts[to].routes[rev as usize - 1].clone();
        }
        self.known_route(r, to).clone()
    }

    fn start_attempt(&mut self, r: Ix, mid: &str) {
        let Some(s) = self.relays[r].deliveries.get(mid) else { return };
        let (fresh, to) = (s.wants_fresh_route(), self.account_of(&s.to).expect("a known recipient"));
        let route = self.lookup(r, to, fresh);
        let s = &self.relays[r].deliveries[mid];
        let mut events = core::due(s, UnixMillis(self.relay_now(r)), &route, self.pol(r));
        let other_revision = s.target.as_ref().is_some_and(|t| t.revision != route.revision);
        if self.plant == Some(Plant::LowerRevision) && s.may_switch && other_revision {
            let (revision, relays) = (route.revision, route.relays.clone());
            events.insert(0, DeliveryEvent::RouteRefreshed { revision, relays });
        }
        let ends = events.iter().any(DeliveryEvent::ends);
        self.write_delivery(r, mid, events);
        if !ends {
            self.after_barrier(r, Effect::SendAttempt(mid.into()));
        }
    }

    /// Writes a delivery's events; one that ends it rides in the sender's
    /// account's `RecordDelivery` commit (its status and ledger entry), as
    /// the delivery actor's settlement does.
    fn write_delivery(&mut self, r: Ix, mid: &str, events: Vec<DeliveryEvent>) {
        let status = events.iter().find_map(|e| match e {
            DeliveryEvent::Finished { status } => Some(status.clone()),
            _ => None,
        });
        let group: Vec<Rec> = events.into_iter().map(|event| Rec::Delivery { mid: mid.into(), event }).collect();
        let from = self.relays[r].deliveries.get(mid).and_then(|s| self.account_of(&s.from));
        let (Some(status), Some(from)) = (status, from) else { return self.persist(r, group) };
        let cmd = AccountCmd::RecordDelivery { message_id: mid.into(), status, settlement: None };
        match self.decide_at(r, from, &cmd) {
            Ok(d) => {
                self.commit(r, from, d, group);
            }
            Err(e) => {
                self.note(|| format!("relay-{r} {mid}: recording its status failed: {e}"));
                self.persist(r, group);
            }
        }
    }

    /// Sends the attempt in flight to every relay of its target at once.
    fn send_attempt(&mut self, r: Ix, mid: &str) {
        let Some(s) = self.relays[r].deliveries.get(mid) else { return };
        if s.finished.is_some() || s.in_flight.is_none() || self.relays[r].attempts.contains_key(mid) {
            return;
        }
        let attempt = s.attempts;
        let targets: Vec<Ix> = s.target.iter().flat_map(|t| &t.relays).filter_map(|x| self.relay_of(&x.id)).collect();
        let params = s.params.clone().map(Box::new);
        let outcomes = vec![None; targets.len()];
        self.relays[r].attempts.insert(mid.into(), Attempt { attempt, targets: targets.clone(), outcomes });
        self.note(|| format!("relay-{r} attempt {attempt} of {mid} to {targets:?}"));
        let Some(params) = params else { return self.conclude(r, mid) };
        for (i, t) in targets.iter().enumerate() {
            let outcome = if *t == r {
                Some(self.receive(r, &params, Via::OwnAttempt))
            } else {
                let req = Req::Deliver { mid: mid.into(), attempt, params: params.clone() };
                let sent = self.request(Node::Relay(r), *t, req);
                (!sent).then(|| AttemptOutcome::NotAttempted(RelayError::unavailable("connection refused")))
            };
            if let Some(a) = self.relays[r].attempts.get_mut(mid) {
                a.outcomes[i] = outcome;
            }
        }
        if self.relays[r].attempts[mid].outcomes.iter().all(Option::is_some) {
            return self.conclude(r, mid);
        }
        let (inc, timeout) = (self.relays[r].inc, self.pol(r).attempt_timeout_ms);
        self.after(timeout, Ev::AttemptTimeout { relay: r, inc, mid: mid.into(), attempt });
    }

    /// The attempt's answers (a timeout for those missing), by the core.
    fn conclude(&mut self, r: Ix, mid: &str) {
        let Some(a) = self.relays[r].attempts.remove(mid) else { return };
        let timed_out = || AttemptOutcome::Unknown(RelayError::unavailable("delivery attempt timed out"));
        let outcome = core::combine(a.outcomes.into_iter().map(|o| o.unwrap_or_else(timed_out)).collect());
        self.note(|| format!("relay-{r} attempt {} of {mid}: {outcome:?}", a.attempt));
        let s = &self.relays[r].deliveries[mid];
        let events = core::outcome(s, a.attempt, outcome, UnixMillis(self.relay_now(r)), self.pol(r));
        let next = events.iter().find_map(|e| match e {
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => Some(*next_due_ms),
            _ => None,
        });
        self.write_delivery(r, mid, events);
        if let Some(next) = next {
            self.schedule_due(r, mid, next);
        }
    }

    fn on_response(&mut self, r: Ix, resp: Resp) {
        match resp {
            Resp::Outcome { mid, attempt, target, outcome } => {
                let current = self.relays[r].attempts.get_mut(&mid).filter(|a| a.attempt == attempt);
                if let Some(a) = current {
                    if let Some(i) = a.targets.iter().position(|t| *t == target) {
                        a.outcomes[i].get_or_insert(outcome);
                    }
                    if a.outcomes.iter().all(Option::is_some) {
                        self.conclude(r, &mid);
                    }
                    return;
                }
                // An answer after its attempt was settled: the core ignores it.
                self.cov.late_reply += 1;
                let Some(s) = self.relays[r].deliveries.get(&mid) else { return };
                if s.finished.is_some() {
                    self.cov.late_reply_after_final_status += 1;
                }
                let changed = core::outcome(s, attempt, outcome, UnixMillis(self.relay_now(r)), self.pol(r));
                if !changed.is_empty() && s.in_flight != Some(attempt) {
                    let d = format!("relay-{r} {mid}: late answer to attempt {attempt} decided {changed:?}");
                    self.violate(inv::LATE_ANSWER, Some(&mid), d);
                }
            }
            Resp::PeerStatus { mid, attempts, status } => {
                if self.relays[r].asking.get(&mid) != Some(&attempts) {
                    return;
                }
                self.relays[r].asking.remove(&mid);
                if status.is_some_and(|s| s.status == Status::TargetAccepted) {
                    self.cov.peer_confirmed += 1;
                    let Some(s) = self.relays[r].deliveries.get(&mid) else { return };
                    let events = core::peer_confirmed(s, UnixMillis(self.relay_now(r)), self.pol(r));
                    return self.write_delivery(r, &mid, events);
                }
                self.start_attempt(r, &mid);
            }
            Resp::Page { partner, account, result } => self.page(r, partner, account, result),
            Resp::SendAck { .. } => {}
        }
    }

    // ---- two homes ----------------------------------------------------

    /// Every few seconds a home pulls each of its accounts from the other
    /// home its route names (the replicator's loop, `server/src/replication.rs`).
    fn pull_tick(&mut self, r: Ix) {
        let accounts: Vec<Acct> = self.relays[r].accts.keys().copied().collect();
        for a in accounts {
            self.pull(r, a);
        }
        let inc = self.relays[r].inc;
        self.after(PULL_EVERY_MS, Ev::PullTick { relay: r, inc });
    }

    /// One `timeline.replicate` of `a` from its other home, after this
    /// relay's cursor there, acknowledging what it applied.
    fn pull(&mut self, r: Ix, a: Acct) {
        let Some(h) = self.relays[r].accts.get(&a) else { return };
        let own = &self.relays[r].id;
        let Some(route) = h.state.route().filter(|route| route.lists_relay(own)) else { return };
        let Some(partner) = route.relays.iter().find(|x| x.id != *own).and_then(|x| self.relay_of(&x.id)) else {
            return;
        };
        let after = h.state.replica(&self.relays[partner].id).pulled;
        let params = ReplicateParams {
            account_id: self.ids[a].clone(),
            after,
            limit: PAGE_ITEMS,
            ack: Some(after),
            notify: false,
        };
        if !self.request(Node::Relay(r), partner, Req::Replicate { account: a, params }) {
            self.cov.partner_home_apart += 1;
        }
    }

    /// A page from the other home, applied by the account's `ReplicaApply`;
    /// the next page at once while there is more.
    fn page(&mut self, r: Ix, partner: Ix, account: Acct, result: Result<Box<Page>, RelayError>) {
        let partner_id = self.relays[partner].id.clone();
        match result {
            Ok(page) => {
                let (more, items) = (page.has_more, page.items.len());
                if items > 0 {
                    let known = Some(self.known_route(r, account).clone());
                    let cmd = AccountCmd::ReplicaApply { partner: partner_id, page, known, senders: vec![] };
                    match self.command(r, account, &cmd) {
                        // The account moved while the page was on its way.
                        Err(e) if matches!(e.code, ErrorCode::RouteStale | ErrorCode::TargetNotLocal) => return,
                        // PROTOCOL §5 refuses the page of a sent message from a
                        // device revoked here by its `created_at`, which the
                        // partner accepted before it learned the revocation,
                        // until the partner learns it (from this home's pages)
                        // and stops offering it; the homes converge after.
                        // As the replicator's pull, a refused page ends the
                        // pull: the next round asks again, not this moment.
                        Err(e)
                            if e.code == ErrorCode::Forbidden && e.message.contains("not valid here at created_at") =>
                        {
                            self.cov.replication_stalled += 1;
                            return;
                        }
                        Err(e) => {
                            let d = format!("relay-{r} refused relay-{partner}'s page of account {account}: {e}");
                            return self.violate(inv::PAGE_REFUSED, None, d);
                        }
                        Ok(_) => {}
                    }
                }
                if more || items > 0 {
                    self.pull(r, account);
                }
            }
            Err(e) if e.code == ErrorCode::RouteStale => {
                let route = e.data.as_ref().and_then(|d| Wire::<Route>::from_value(&d["route"]).ok());
                if let Some(route) = route {
                    let cmd = AccountCmd::ReplicaMoved { partner: partner_id, route };
                    let _ = self.command(r, account, &cmd);
                }
            }
            Err(_) => {}
        }
    }

    fn route_change(&mut self, a: Acct) {
        let acct = &mut self.accounts[a];
        acct.current += 1;
        let rev = acct.current;
        // The client tells its old homes (`route.update`) and registers at
        // the new one; the others learn it when they look it up.
        let mut homes: Vec<Ix> = acct.homes[rev as usize - 2].clone();
        homes.extend(acct.homes[rev as usize - 1].iter().copied());
        homes.sort_unstable();
        homes.dedup();
        self.note(|| format!("route of account {a} → revision {rev} {homes:?}"));
        for h in homes {
            // A home that is down learns it at its restart.
            if self.relays[h].up {
                self.learn_route(h, a, rev);
            }
        }
    }

    /// The client revokes `device` at one home of the account it reaches;
    /// the other home learns it by replication.
    fn revoke(&mut self, account: Acct, device: u8) {
        let acct = &self.accounts[account];
        let homes = acct.homes[acct.current as usize - 1].clone();
        let Some(&home) = homes.iter().find(|h| self.relays[**h].up) else { return };
        let at = self.ctx_now(home).0;
        let rev = acct.client.keys.revocation(&format!("d{device}"), at);
        let params = DeviceRevokeParams { revocation: Wire::from_value(&rev).expect("revocation") };
        self.note(|| format!("relay-{home} revokes device {device} of account {account}"));
        if self.command(home, account, &AccountCmd::DeviceRevoke { device: "d0".into(), params }).is_ok() {
            self.accounts[account].revoked = Some(at);
        }
    }

    // ---- retention --------------------------------------------------------

    /// The sweep: every message whose retention (fixed at acceptance) has
    /// passed loses its traces, by relay-core's retention rules.
    fn sweep(&mut self, r: Ix) {
        let mut now = self.ctx_now(r);
        if self.plant == Some(Plant::SweepEarly) {
            now = now.plus(self.pol(r).message_retention / 2);
        }
        let mut group = vec![];
        for (a, h) in &self.relays[r].accts {
            for &(_, seq) in h.due.range(..(now.0, 0)) {
                let event = &h.events[seq as usize - 1];
                if let Some(ledger) = core::sweep(&self.ids[*a], event, now, self.pol(r)) {
                    group.push(Rec::Swept { account: *a, seq, ledger });
                }
            }
        }
        self.persist(r, group);
        let inc = self.relays[r].inc;
        self.after(SWEEP_EVERY_MS, Ev::Sweep { relay: r, inc });
    }

    // ---- crashes --------------------------------------------------------

    fn crash(&mut self, r: Ix, power_cut: bool) {
        if !self.relays[r].up || self.faults.healed {
            return;
        }
        self.fault_count += 1;
        self.cov.crashes += 1;
        if !self.relays[r].attempts.is_empty() {
            self.cov.crash_with_attempt_in_flight += 1;
        }
        let pending = self.relays[r].disk.pending();
        let keep = if power_cut { self.rng.random_range(0..=pending) } else { pending };
        if keep < pending {
            self.cov.power_cut_losing_a_group += 1;
        }
        let relay = &mut self.relays[r];
        relay.disk.cut(keep);
        relay.up = false;
        relay.inc += 1;
        relay.refold(&self.ids);
        self.waiting[r].clear();
        if self.plant == Some(Plant::ForgetChainHead) {
            // Planted: the writer folds each stream's sequence, not its hash.
            self.relays[r].heads.values_mut().for_each(|(_, hash)| *hash = chain::ZERO);
        }
        self.note(|| format!("crash relay-{r} power_cut={power_cut} kept {keep}/{pending} pending groups"));
        self.verify_chains(r);
        self.check_acked(None);
        let back = self.rng.random_range(100..90 * SEC);
        self.after(back, Ev::Restart { relay: r });
    }

    /// Recovery: the state is the fold of the disk; every unfinished
    /// delivery is due again at its own due time.
    fn restart(&mut self, r: Ix) {
        if self.relays[r].up {
            return;
        }
        self.relays[r].up = true;
        // Recovery opens what survived and makes it durable before serving.
        self.relays[r].disk.barrier();
        self.note(|| format!("restart relay-{r}"));
        // A migration tells every relay of the old and new routes; one that
        // was down then learns it now.
        for a in 0..self.accounts.len() {
            let acct = &self.accounts[a];
            let held = self.relays[r].accts.get(&a).and_then(|h| h.state.route()).map_or(0, |route| route.revision);
            let listed = acct.homes[..acct.current as usize].iter().any(|h| h.contains(&r));
            if held < acct.current && listed {
                let revision = acct.current;
                self.learn_route(r, a, revision);
            }
        }
        if self.plant == Some(Plant::RecomputeVisibility) {
            let now = self.ctx_now(r);
            for h in self.relays[r].accts.values_mut() {
                let state = &h.state;
                h.records.iter_mut().for_each(|rec| rec.visible.retain(|d| state.device_valid(d, now)));
            }
        }
        // A record's visible devices are those fixed at its acceptance.
        for (a, h) in &self.relays[r].accts {
            for rec in &h.records {
                let fixed = self.visible.get(&(r, *a, rec.mid.clone()));
                if fixed.is_some_and(|v| *v != rec.visible) {
                    let d =
                        format!("relay-{r} {}: visible {:?} after restart, {fixed:?} durable", rec.mid, rec.visible);
                    let mid = rec.mid.clone();
                    return self.violate(inv::VISIBILITY, Some(&mid), d);
                }
            }
        }
        let mids: Vec<String> = self.relays[r].deliveries.keys().cloned().collect();
        for mid in mids {
            if self.plant == Some(Plant::ForgetDeadline) {
                let now = self.ctx_now(r);
                let s = self.relays[r].deliveries.get_mut(&mid).expect("listed");
                s.deadline = now.plus(self.policies[r].delivery_age_limit);
            }
            let s = self.relays[r].deliveries[&mid].clone();
            if let Some(fixed) = self.deadlines.get(&(r, mid.clone())) {
                if *fixed != s.deadline {
                    let d =
                        format!("relay-{r} {mid}: deadline {} after restart, {} at acceptance", s.deadline.0, fixed.0);
                    self.violate(inv::DEADLINE_FIXED, Some(&mid), d);
                }
            }
            if let Some(done) = self.finals.get(&(r, mid.clone())) {
                if s.finished.as_ref() != Some(done) {
                    let d = format!("relay-{r} {mid}: durable final {done:?}, {:?} after restart", s.finished);
                    self.violate(inv::STATUS_MONOTONE, Some(&mid), d);
                }
            }
            if s.finished.is_none() {
                let due = s.next_due_ms.unwrap_or(UnixMillis(0));
                self.schedule_due(r, &mid, due);
            }
        }
        let inc = self.relays[r].inc;
        self.after(PULL_EVERY_MS, Ev::PullTick { relay: r, inc });
        if self.short_retention() {
            self.after(SWEEP_EVERY_MS, Ev::Sweep { relay: r, inc });
        }
    }

    /// Whether message `i` may have reached the end of its retention (its
    /// acceptance is at least its creation less the clock tolerance and
    /// the clock offsets): its traces may be gone, and rightly so.
    fn maybe_swept(&self, i: usize) -> bool {
        let p = self.pol(0);
        let created = (T0_MS + self.msgs[i].created_at_ms) / 1000;
        self.short_retention() && (T0_MS + self.now) / 1000 + p.clock_tolerance + 240 > created + p.message_retention
    }

    /// Every acknowledged message (or just `only`, as its answer arrives)
    /// is still held by a sender's home (its ledger) or by a recipient's
    /// home (its record).
    fn check_acked(&mut self, only: Option<usize>) {
        for i in only.map_or(0..self.msgs.len(), |i| i..i + 1) {
            let Some(mid) = &self.msgs[i].acked else { continue };
            let (from, to) = (self.msgs[i].from, self.msgs[i].to);
            if self.maybe_swept(i) {
                continue;
            }
            let held = self.relays.iter().any(|x| x.has_sent(from, mid) || x.has_record(to, mid));
            if !held {
                let mid = mid.clone();
                let d = format!("message {i} ({mid}) was acknowledged and no relay holds it");
                return self.violate(inv::ACKED_LOST, Some(&mid), d);
            }
        }
    }

    /// Whether a home of the recipient holds (or held, durably, before the
    /// sweep) message `i`.
    fn delivered_anywhere(&self, i: usize) -> bool {
        let m = &self.msgs[i];
        let mid = m.acked.as_ref().unwrap_or(&m.mid);
        (0..self.relays.len()).any(|r| self.relays[r].has_record(m.to, mid) || self.ever_held.contains(&(r, m.to, i)))
    }

    // ---- the end ------------------------------------------------------

    /// Whether a delivery healed in time may still end without delivering:
    /// its sending device was revoked (the sender's homes then refuse it,
    /// `device_unknown` or `forbidden`, PROTOCOL §5 *Who may deliver*); the
    /// sender's route changed in the second the message was created; or
    /// the recipient holds the message from the sender's other home under
    /// other params (`state_conflict`: the client's retry at a home added by
    /// a route change, accepted there before it pulled the first
    /// acceptance). The last two are known limits, reported.
    fn may_fail(&mut self, s: &DeliveryState, done: &DeliveryStatus) -> bool {
        let Some(e) = &done.error else { return false };
        let revoked = || {
            let from = self.account_of(&s.from);
            let device = s.params.as_ref().map(|p| p.envelope.from_device_id.as_str());
            from.is_some_and(|a| self.accounts[a].revoked.is_some()) && device == Some("d1")
        };
        // The sender's route changed in the second its envelope was created:
        // *who may deliver* counts that route as issued before the message
        // (`issued_at <= created_at`), and refuses a home of the older one.
        let same_second = || {
            let from = self.account_of(&s.from);
            let created = s.params.as_ref().map(|p| p.envelope.created_at);
            from.is_some_and(|a| self.accounts[a].routes.iter().skip(1).any(|r| Some(r.issued_at) == created))
        };
        match e.code {
            ErrorCode::DeviceUnknown => true,
            ErrorCode::Forbidden if revoked() => true,
            ErrorCode::Forbidden if e.message.contains("superseded") && same_second() => {
                self.cov.same_second_route_change += 1;
                true
            }
            ErrorCode::StateConflict => {
                let to = self.account_of(&s.to).expect("known");
                let held = self.relays.iter().any(|x| x.has_record(to, &s.message_id));
                self.cov.other_params_conflict += u64::from(held);
                held
            }
            _ => false,
        }
    }

    /// After the heal and every deadline: liveness, convergence, and what
    /// was acknowledged arrived.
    fn finish(&mut self) {
        for r in 0..self.relays.len() {
            self.flush(r);
            self.verify_chains(r);
        }
        self.check_acked(None);
        let heal_ms = T0_MS + HEAL_MS + 2 * MIN + 90 * SEC;
        for r in 0..self.relays.len() {
            let unfinished: Vec<(String, DeliveryState)> =
                self.relays[r].deliveries.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            for (mid, s) in unfinished {
                let Some(done) = &s.finished else {
                    let d = format!("relay-{r} {mid}: unfinished after its deadline {}", s.deadline.0);
                    return self.violate(inv::LIVENESS, Some(&mid), d);
                };
                // Two slots of the timetable after the heal: enough for a
                // route error to be followed; it must have been delivered.
                let slots = core::slots_between(&s, heal_ms, self.pol(r));
                if slots >= 2 && done.status != Status::TargetAccepted && !self.may_fail(&s, done) {
                    let d = format!("relay-{r} {mid}: ended {done:?} with {slots} attempts left after the heal");
                    return self.violate(inv::LIVENESS, Some(&mid), d);
                }
                let to = self.account_of(&s.to).expect("known");
                let swept = self.logical.get(&mid).is_some_and(|m| self.maybe_swept(*m));
                if done.status == Status::TargetAccepted
                    && !swept
                    && !self.relays.iter().any(|x| x.has_record(to, &mid))
                {
                    let d = format!("relay-{r} {mid}: target_accepted and no home of the recipient holds it");
                    return self.violate(inv::ACKED_LOST, Some(&mid), d);
                }
            }
        }
        // Both homes hold the same records: each record one home holds
        // that is not near the end of its retention, the other holds too
        // (or held, and swept at the end of its own).
        let cutoff = (T0_MS + self.now) / 1000 + 15 * 60;
        for a in 0..self.accounts.len() {
            let acct = &self.accounts[a];
            let homes = &acct.homes[acct.current as usize - 1];
            if let [x, y] = &homes[..] {
                let (x, y) = (*x, *y);
                for (p, q) in [(x, y), (y, x)] {
                    let held_q = self.relays[q].accts.get(&a).map(Here::mids).unwrap_or_default();
                    let missing = self.relays[p]
                        .records(a)
                        .iter()
                        .find(|rec| rec.retention_until > cutoff && !held_q.contains(&rec.mid));
                    if let Some(rec) = missing {
                        let (n, m) = (self.relays[p].records(a).len(), self.relays[q].records(a).len());
                        let d =
                            format!("account {a}: relay-{p} holds {} ({n} records), relay-{q} does not ({m})", rec.mid);
                        let mid = rec.mid.clone();
                        return self.violate(inv::CONVERGE, Some(&mid), d);
                    }
                }
            }
        }
    }
}

/// Params the sim built, as a relay parses them from a body.
fn parse<T: serde::de::DeserializeOwned>(v: &Value) -> T {
    serde_json::from_str(&v.to_string()).expect("params the sim builds parse")
}
