//! The world: relays, clients and the network between them, driven by one
//! seeded event queue on one simulated clock.
//!
//! Every delivery decision is relay-core's, reached through [`crate::core`];
//! what the sim models itself (the sender's ledger, the recipient's
//! receipt, replication pages, revocation) is kept to the rules a delivery
//! needs, and says so where it is.

use crate::check::{inv, Coverage, Violation};
use crate::core::{self, AttemptOutcome, DeliveryEvent, DeliveryState};
use crate::relay::{Acct, Attempt, Effect, Item, Ix, Rec, Relay};
use crate::Plant;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use relay_core::Policy;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::Route;
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, Status, UnixMillis, UnixSecs, Wire};
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

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
const CLIENT_TIMEOUT_MS: u64 = 15 * SEC;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Client,
    Relay(Ix),
}

#[derive(Clone, Debug)]
pub enum Req {
    Send { msg: usize, try_no: u32, mid: String },
    Deliver { mid: String, attempt: u32, params: Box<DeliverParams> },
    PeerStatus { mid: String, attempts: u32 },
    Pull { account: Acct, after: usize },
}

#[derive(Debug)]
pub enum Resp {
    SendAck { msg: usize, try_no: u32, mid: String, result: Result<DeliveryStatus, RelayError> },
    Outcome { mid: String, attempt: u32, target: Ix, outcome: AttemptOutcome },
    PeerStatus { mid: String, attempts: u32, status: Option<DeliveryStatus> },
    Pulled { partner: Ix, account: Acct, partner_inc: u64, after: usize, items: Vec<Item> },
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
        }
    }
}

/// A queued event, ordered by (time, sequence): ties go in the order
/// they were scheduled, so nothing depends on the heap's layout.
struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
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
    /// Routes by revision (index = revision - 1), and their relays.
    routes: Vec<Wire<Route>>,
    homes: Vec<Vec<Ix>>,
    /// The highest revision issued so far.
    current: u64,
}

/// One message a client means to send (a logical message: its id may
/// change only under the `retry-new-id` plant).
struct Msg {
    from: Acct,
    device: u8,
    to: Acct,
    created_at_ms: u64,
    mid: String,
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
    policy: Policy,
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
        let mut policy = Policy::with_relay_id("sim");
        policy.clock_tolerance = 5 * 60;
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
            policy,
            plant,
            relays,
            accounts: vec![],
            msgs: vec![],
            logical: BTreeMap::new(),
            faults,
            fault_count: 0,
            deadlines: BTreeMap::new(),
            finals: BTreeMap::new(),
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
        self.queue.push(Queued { at: at.max(self.now), seq: self.seq, ev });
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
        for a in 0..accounts {
            let id = format!("{:032x}", 0xacc0_0000_u64 + a as u64);
            let two = self.rng.random_bool(0.4);
            let first = self.rng.random_range(0..n);
            let mut homes = vec![first];
            if two {
                homes.push((first + self.rng.random_range(1..n)) % n);
            }
            let mut all = vec![homes.clone()];
            // Some accounts move one home to another relay during the run.
            if self.rng.random_bool(0.3) {
                let mut moved = homes.clone();
                let last = moved.len() - 1;
                let new = (0..n).filter(|r| !homes.contains(r)).nth(self.rng.random_range(0..n - homes.len()));
                if let Some(new) = new {
                    moved[last] = new;
                    all.push(moved);
                    let at = self.rng.random_range(MIN..20 * MIN);
                    self.at(at, Ev::RouteChange { account: a });
                }
            }
            let routes = all.iter().enumerate().map(|(i, h)| self.route(&id, i as u64 + 1, h)).collect();
            self.accounts.push(Account { id, routes, homes: all, current: 1 });
        }
        for m in 0..messages {
            let from = self.rng.random_range(0..accounts);
            let to = (from + self.rng.random_range(1..accounts)) % accounts;
            let created_at_ms = self.rng.random_range(0..SEND_WINDOW_MS);
            let mid = format!("m{m:06}-0-{}", self.rng.random_range(0..u32::MAX));
            self.logical.insert(mid.clone(), m);
            let device = self.rng.random_range(0..2u8);
            let msg = Msg { from, device, to, created_at_ms, mid, try_no: 0, acked: None, done: false };
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
        }
        self.at(HEAL_MS, Ev::Heal);
    }

    /// A route object as the core reads it (the core checks no signature;
    /// the shells do, before anything reaches it).
    fn route(&self, account: &str, revision: u64, homes: &[Ix]) -> Wire<Route> {
        let relays: Vec<_> =
            homes.iter().map(|h| serde_json::json!({"id": self.relays[*h].id, "url": format!("sim://{h}")})).collect();
        let v = serde_json::json!({"account_id": account, "account_key": "sim", "revision": revision,
            "relays": relays, "issued_at": T0_MS / 1000, "signature": "sim"});
        Wire::from_value(&v).expect("a route the sim builds parses")
    }

    fn relay_of(&self, id: &str) -> Option<Ix> {
        self.relays.iter().position(|r| r.id == id)
    }

    /// The route of `account` as relay `r` knows it.
    fn known_route(&self, r: Ix, account: Acct) -> &Wire<Route> {
        let rev = self.relays[r].route(account) as usize;
        &self.accounts[account].routes[rev - 1]
    }

    fn serves(&self, r: Ix, account: Acct) -> bool {
        let rev = self.relays[r].route(account) as usize;
        self.accounts[account].homes[rev - 1].contains(&r)
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
            self.dispatch(q.ev);
        }
        if self.violation.is_none() {
            self.finish();
        }
        let acked = self.msgs.iter().filter(|m| m.acked.is_some()).count();
        let delivered = self.msgs.iter().filter(|m| self.delivered_anywhere(m)).count();
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
                        let mid = format!("m{msg:06}-{}-{}", try_no + 1, self.rng.random_range(0..u32::MAX));
                        self.logical.insert(mid.clone(), msg);
                        self.msgs[msg].mid = mid;
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
            Ev::PullTick { .. } => {}
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
        if self.now > m.created_at_ms + self.policy.delivery_age_limit * SEC {
            self.msgs[msg].done = true;
            return;
        }
        let from = m.from;
        let acct = &self.accounts[from];
        let homes = acct.homes[acct.current as usize - 1].clone();
        let home = homes[self.rng.random_range(0..homes.len())];
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
            Err(e) if matches!(e.code, ErrorCode::DeviceUnknown | ErrorCode::MessageExpired) => m.done = true,
            // Not served there (a route change): try again elsewhere.
            Err(_) if m.try_no == try_no => {
                let backoff = self.rng.random_range(SEC..10 * SEC);
                self.after(backoff, Ev::ClientSend { msg });
            }
            Err(_) => {}
        }
    }

    // ---- a relay's requests ---------------------------------------------

    fn on_request(&mut self, r: Ix, from: Node, req: Req) {
        match req {
            Req::Send { msg, try_no, mid } => {
                let result = self.accept(r, msg, &mid);
                let resp = |result| Resp::SendAck { msg, try_no, mid, result };
                match result {
                    Ok(status) if self.plant == Some(Plant::AckBeforeBarrier) => {
                        self.respond(r, from, resp(Ok(status)));
                    }
                    Ok(status) => self.after_barrier(r, Effect::Reply(from, resp(Ok(status)))),
                    Err(e) => self.respond(r, from, resp(Err(e))),
                }
            }
            Req::Deliver { mid, attempt, params } => {
                let outcome = self.receive(r, &mid, &params);
                let resp = Resp::Outcome { mid, attempt, target: r, outcome };
                // A receipt is answered once durable (persist before effect).
                self.after_barrier(r, Effect::Reply(from, resp));
            }
            Req::PeerStatus { mid, attempts } => {
                let status = self.relays[r].deliveries.get(&mid).map(DeliveryState::status);
                self.respond(r, from, Resp::PeerStatus { mid, attempts, status });
            }
            Req::Pull { account, after } => {
                let log = self.relays[r].repl_log.get(&account).map(Vec::as_slice).unwrap_or_default();
                let items = log.iter().skip(after).take(64).cloned().collect();
                let partner_inc = self.relays[r].inc;
                self.respond(r, from, Resp::Pulled { partner: r, account, partner_inc, after, items });
            }
        }
    }

    /// `message.send` at the sender's home `r`, as the sim models the
    /// sender's account: idempotent by message id, refused for a device
    /// this home knows revoked; times and deadline by the core's rule
    /// (`sent_times`), the delivery begun by `decide_acceptance`.
    fn accept(&mut self, r: Ix, msg: usize, mid: &str) -> Result<DeliveryStatus, RelayError> {
        let m = &self.msgs[msg];
        let (from, to, device, created_at) = (m.from, m.to, m.device, (T0_MS + m.created_at_ms) / 1000);
        if !self.serves(r, from) {
            return Err(RelayError::new(ErrorCode::TargetNotLocal, "not a home of the sender"));
        }
        if let Some(s) = self.relays[r].deliveries.get(mid) {
            return Ok(s.status());
        }
        let revoked = self.relays[r].revoked_at(from, device).filter(|at| *at <= created_at);
        if revoked.is_some() && self.plant != Some(Plant::DeliverAfterRevocation) {
            return Err(RelayError::device_unknown("sending device revoked"));
        }
        let now = self.ctx_now(r);
        if created_at + self.policy.delivery_age_limit <= now.0 {
            return Err(RelayError::new(ErrorCode::MessageExpired, "past the delivery age limit"));
        }
        if revoked.is_some() {
            self.violate(inv::REVOKED, Some(mid), format!("relay-{r} accepted {mid} from a device it knows revoked"));
        }
        let params = self.params(r, msg, mid);
        let route = self.known_route(r, to).clone();
        // The send process (actors/src/send.rs): a recipient served here
        // alone takes its receipt first (commit 1), and the acceptance
        // carries that attempt's outcome (commit 2). A crash between the
        // two leaves a receipt without an acceptance; the client retries.
        let local = core::local_first(&route, &self.relays[r].id);
        if local && self.relays[r].has_record(to, mid) {
            self.cov.receipt_before_acceptance += 1;
        }
        let first = local.then(|| self.receive(r, mid, &params));
        let now_ms = UnixMillis(self.relay_now(r));
        let (accepted_at, begun) =
            core::accept(params, format!("digest-{mid}"), created_at, now_ms, &route, first, &self.policy);
        let deadline = begun.state.deadline.0;
        let mut group = vec![Rec::Sent { mid: mid.into(), from, device, created_at, accepted_at }];
        group.extend(begun.events.into_iter().map(|event| Rec::Delivery { mid: mid.into(), event }));
        self.persist(r, group);
        self.note(|| format!("relay-{r} accepted {mid} deadline {deadline}"));
        if begun.state.in_flight.is_some() {
            self.after_barrier(r, Effect::SendAttempt(mid.into()));
        } else if let Some(due) = begun.due_ms {
            self.schedule_due(r, mid, due);
        }
        Ok(begun.state.status())
    }

    /// The deliver params the sender's home builds (the certificate and
    /// route on file; nothing here is verified by the core).
    fn params(&self, r: Ix, msg: usize, mid: &str) -> DeliverParams {
        let m = &self.msgs[msg];
        let (from, to) = (&self.accounts[m.from].id, &self.accounts[m.to].id);
        let created_at = (T0_MS + m.created_at_ms) / 1000;
        let text = format!(
            r#"{{"envelope":{{"message_id":"{mid}","from":"{from}","from_device_id":"d{dev}","to":"{to}","created_at":{created_at},"ciphertext":"AA","signature":"sim"}},
            "recipient_boxes":[{{"device_id":"d0","box":"AA"}}],
            "sender_device_certificate":{{"account_id":"{from}","account_key":"sim","device_id":"d{dev}","device_key":"sim","box_key":"sim","issued_at":1,"signature":"sim"}},
            "sender_route":{route}}}"#,
            dev = m.device,
            route = self.known_route(r, m.from).raw().get(),
        );
        serde_json::from_str(&text).expect("params the sim builds parse")
    }

    /// `message.deliver` at a recipient's home, as the sim models the
    /// recipient's account: refused when this relay does not serve the
    /// recipient, or serves the sender and knows the device revoked;
    /// idempotent by message id.
    fn receive(&mut self, r: Ix, mid: &str, params: &DeliverParams) -> AttemptOutcome {
        let env = &params.envelope;
        let (Some(to), Some(from)) = (self.account_of(&env.to), self.account_of(&env.from)) else {
            return AttemptOutcome::Rejected(RelayError::new(ErrorCode::InvalidParams, "unknown account"));
        };
        if !self.serves(r, to) {
            return AttemptOutcome::Rejected(RelayError::new(ErrorCode::TargetNotLocal, "moved"));
        }
        if !self.faults.healed && self.rng.random_bool(self.faults.server_error) {
            let e = match self.rng.random_range(0..3) {
                0 => RelayError::internal("sim"),
                1 => RelayError::unavailable("sim"),
                _ => RelayError::new(ErrorCode::RateLimited, "sim")
                    .with_data(serde_json::json!({"retry_after": self.rng.random_range(1..60)})),
            };
            return AttemptOutcome::Rejected(e);
        }
        let device: u8 = env.from_device_id.trim_start_matches('d').parse().unwrap_or(0);
        let revoked = self.serves(r, from)
            && self.relays[r].revoked_at(from, device).is_some_and(|at| at <= env.created_at)
            && !self.relays[r].has_record(to, mid);
        if revoked {
            if self.plant != Some(Plant::DeliverAfterRevocation) {
                return AttemptOutcome::Rejected(RelayError::device_unknown("sending device revoked"));
            }
            self.violate(inv::REVOKED, Some(mid), format!("relay-{r} took {mid} from a device it knows revoked"));
        }
        if let Some(rec) = self.relays[r].records.get(&to).and_then(|v| v.iter().find(|x| x.mid == mid)) {
            return AttemptOutcome::Answered(DeliveryStatus::target_accepted(rec.accepted_at));
        }
        let accepted_at = self.ctx_now(r).0;
        let rec = Rec::Received { to, mid: mid.into(), from, device, created_at: env.created_at, accepted_at };
        self.persist(r, vec![rec]);
        AttemptOutcome::Answered(DeliveryStatus::target_accepted(accepted_at))
    }

    fn account_of(&self, id: &str) -> Option<Acct> {
        self.accounts.iter().position(|a| a.id == id)
    }

    // ---- the disk -------------------------------------------------------

    /// Writes a group (readers of this relay see it at once) and arms the
    /// barrier; checks what the group changes as it goes.
    fn persist(&mut self, r: Ix, group: Vec<Rec>) {
        if group.is_empty() {
            return;
        }
        for rec in &group {
            self.check_write(r, rec);
            self.relays[r].apply(rec);
        }
        self.relays[r].disk.append(group);
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
        self.relays[r].waiting.push((group, effect));
    }

    fn flush(&mut self, r: Ix) {
        let relay = &mut self.relays[r];
        relay.flush_armed = false;
        let mut finals = vec![];
        for rec in relay.disk.barrier().iter().flatten() {
            if let Rec::Delivery { mid, event } = rec {
                match event {
                    DeliveryEvent::Accepted { deadline, .. } => finals.push((mid.clone(), Err(*deadline))),
                    DeliveryEvent::Finished { status } => finals.push((mid.clone(), Ok(status.clone()))),
                    _ => {}
                }
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
        let durable = self.relays[r].disk.durable();
        let waiting = std::mem::take(&mut self.relays[r].waiting);
        let (ready, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(g, _)| *g <= durable);
        self.relays[r].waiting = rest;
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
            Rec::Received { to, mid, .. } => {
                let logical = self.logical.get(mid).copied();
                let twice = self.relays[r]
                    .records
                    .get(to)
                    .is_some_and(|v| v.iter().any(|x| x.mid == *mid || self.logical.get(&x.mid).copied() == logical));
                if twice {
                    let d = format!("relay-{r}: account {to} got message {logical:?} ({mid}) a second time");
                    self.violate(inv::DELIVERED_TWICE, Some(mid), d);
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
            let req = Req::PeerStatus { mid: mid.into(), attempts };
            if self.request(Node::Relay(r), other, req) {
                self.relays[r].asking.insert(mid.into(), attempts);
                let inc = self.relays[r].inc;
                let timeout = self.policy.attempt_timeout_ms;
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
        let mut events = core::due(s, UnixMillis(self.relay_now(r)), &route);
        let other_revision = s.target.as_ref().is_some_and(|t| t.revision != route.revision);
        if self.plant == Some(Plant::LowerRevision) && s.may_switch && other_revision {
            let (revision, relays) = (route.revision, route.relays.clone());
            events.insert(0, DeliveryEvent::RouteRefreshed { revision, relays });
        }
        let ends = events.iter().any(DeliveryEvent::ends);
        let group = events.into_iter().map(|event| Rec::Delivery { mid: mid.into(), event }).collect();
        self.persist(r, group);
        if !ends {
            self.after_barrier(r, Effect::SendAttempt(mid.into()));
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
                Some(self.receive(r, mid, &params))
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
        let (inc, timeout) = (self.relays[r].inc, self.policy.attempt_timeout_ms);
        self.after(timeout, Ev::AttemptTimeout { relay: r, inc, mid: mid.into(), attempt });
    }

    /// The attempt's answers (a timeout for those missing), by the core.
    fn conclude(&mut self, r: Ix, mid: &str) {
        let Some(a) = self.relays[r].attempts.remove(mid) else { return };
        let timed_out = || AttemptOutcome::Unknown(RelayError::unavailable("delivery attempt timed out"));
        let outcome = core::combine(a.outcomes.into_iter().map(|o| o.unwrap_or_else(timed_out)).collect());
        self.note(|| format!("relay-{r} attempt {} of {mid}: {outcome:?}", a.attempt));
        let s = &self.relays[r].deliveries[mid];
        let events = core::outcome(s, a.attempt, outcome, UnixMillis(self.relay_now(r)), &self.policy);
        let next = events.iter().find_map(|e| match e {
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => Some(*next_due_ms),
            _ => None,
        });
        let group = events.into_iter().map(|event| Rec::Delivery { mid: mid.into(), event }).collect();
        self.persist(r, group);
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
                let changed = core::outcome(s, attempt, outcome, UnixMillis(self.relay_now(r)), &self.policy);
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
                    let events = core::peer_confirmed(&self.relays[r].deliveries[&mid]);
                    let group = events.into_iter().map(|event| Rec::Delivery { mid: mid.clone(), event }).collect();
                    return self.persist(r, group);
                }
                self.start_attempt(r, &mid);
            }
            Resp::Pulled { partner, account, partner_inc, after, items } => {
                self.pulled(r, partner, account, partner_inc, after, items)
            }
            Resp::SendAck { .. } => {}
        }
    }

    // ---- two homes ----------------------------------------------------

    /// Every few seconds a home pulls what its account's other home wrote.
    fn pull_tick(&mut self, r: Ix) {
        for a in 0..self.accounts.len() {
            if !self.serves(r, a) {
                continue;
            }
            let rev = self.relays[r].route(a) as usize;
            let Some(&partner) = self.accounts[a].homes[rev - 1].iter().find(|x| **x != r) else { continue };
            let after = self.relays[r].cursors.get(&(a, partner)).map_or(0, |c| c.1);
            if !self.request(Node::Relay(r), partner, Req::Pull { account: a, after }) {
                self.cov.partner_home_apart += 1;
            }
        }
        let inc = self.relays[r].inc;
        self.after(PULL_EVERY_MS, Ev::PullTick { relay: r, inc });
    }

    /// A page from the other home: what is new here is written here. A
    /// partner that restarted may have lost its tail: read it again from
    /// the start.
    fn pulled(&mut self, r: Ix, partner: Ix, account: Acct, partner_inc: u64, after: usize, items: Vec<Item>) {
        let cursor = self.relays[r].cursors.entry((account, partner)).or_insert((partner_inc, 0));
        if cursor.0 != partner_inc {
            *cursor = (partner_inc, 0);
            return;
        }
        if cursor.1 != after {
            return;
        }
        cursor.1 += items.len();
        for item in items {
            self.take_item(r, account, item);
        }
    }

    fn take_item(&mut self, r: Ix, account: Acct, item: Item) {
        match item {
            Item::Sent { mid, params, digest, created_at, accepted_at } => {
                if self.relays[r].ledger.contains_key(&mid) {
                    return;
                }
                let device: u8 = params.envelope.from_device_id.trim_start_matches('d').parse().unwrap_or(0);
                if self.relays[r].revoked_at(account, device).is_some_and(|at| at <= created_at) {
                    return;
                }
                let now_ms = UnixMillis(self.relay_now(r));
                let (accepted_at, begun) =
                    core::forwarded(params, digest, (created_at, accepted_at), now_ms, &self.policy);
                self.cov.forwarded_deliveries += 1;
                let mut group = vec![Rec::Sent { mid: mid.clone(), from: account, device, created_at, accepted_at }];
                group.extend(begun.events.into_iter().map(|event| Rec::Delivery { mid: mid.clone(), event }));
                self.persist(r, group);
                if let Some(due) = begun.due_ms {
                    self.schedule_due(r, &mid, due);
                }
            }
            Item::Received { to, mid, from, device, created_at, accepted_at } => {
                let twice = self.plant == Some(Plant::ReplicateTwice);
                if self.relays[r].has_record(to, &mid) && !twice {
                    return;
                }
                self.persist(r, vec![Rec::Received { to, mid, from, device, created_at, accepted_at }]);
            }
            Item::Revoked { device, at } => {
                if self.relays[r].revoked_at(account, device).is_none() {
                    self.persist(r, vec![Rec::Revoked { account, device, at }]);
                }
            }
        }
    }

    fn route_change(&mut self, a: Acct) {
        let acct = &mut self.accounts[a];
        acct.current += 1;
        let rev = acct.current;
        // Both the old homes and the new learn it with the change (it is
        // their migration); the others when they look it up.
        let mut homes: Vec<Ix> = acct.homes[rev as usize - 2].clone();
        homes.extend(acct.homes[rev as usize - 1].iter().copied());
        homes.sort_unstable();
        homes.dedup();
        self.note(|| format!("route of account {a} → revision {rev} {homes:?}"));
        for h in homes {
            // A home that is down learns it at its restart.
            if self.relays[h].up {
                self.persist(h, vec![Rec::Route { account: a, revision: rev }]);
            }
        }
    }

    fn revoke(&mut self, account: Acct, device: u8) {
        let acct = &self.accounts[account];
        let homes = acct.homes[acct.current as usize - 1].clone();
        let Some(&home) = homes.iter().find(|h| self.relays[**h].up) else { return };
        let at = (T0_MS + self.now) / 1000;
        self.note(|| format!("relay-{home} revokes device {device} of account {account}"));
        self.persist(home, vec![Rec::Revoked { account, device, at }]);
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
        relay.refold();
        self.note(|| format!("crash relay-{r} power_cut={power_cut} kept {keep}/{pending} pending groups"));
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
            let known = self.relays[r].route(a);
            let listed = acct.homes[..acct.current as usize].iter().any(|h| h.contains(&r));
            if known < acct.current && listed {
                let revision = acct.current;
                self.persist(r, vec![Rec::Route { account: a, revision }]);
            }
        }
        let mids: Vec<String> = self.relays[r].deliveries.keys().cloned().collect();
        for mid in mids {
            if self.plant == Some(Plant::ForgetDeadline) {
                let now = self.ctx_now(r);
                let s = self.relays[r].deliveries.get_mut(&mid).expect("listed");
                s.deadline = now.plus(self.policy.delivery_age_limit);
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
    }

    /// Every acknowledged message (or just `only`, as its answer arrives)
    /// is still held by a sender's home (its ledger) or by a recipient's
    /// home (its record).
    fn check_acked(&mut self, only: Option<usize>) {
        for i in only.map_or(0..self.msgs.len(), |i| i..i + 1) {
            let Some(mid) = &self.msgs[i].acked else { continue };
            let to = self.msgs[i].to;
            let held = self.relays.iter().any(|x| x.ledger.contains_key(mid) || x.has_record(to, mid));
            if !held {
                let mid = mid.clone();
                let d = format!("message {i} ({mid}) was acknowledged and no relay holds it");
                return self.violate(inv::ACKED_LOST, Some(&mid), d);
            }
        }
    }

    fn delivered_anywhere(&self, m: &Msg) -> bool {
        let mid = m.acked.as_ref().unwrap_or(&m.mid);
        self.relays.iter().any(|x| x.has_record(m.to, mid))
    }

    // ---- the end ------------------------------------------------------

    /// After the heal and every deadline: liveness, convergence, and what
    /// was acknowledged arrived.
    fn finish(&mut self) {
        for r in 0..self.relays.len() {
            self.flush(r);
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
                let slots = core::slots_between(&s, heal_ms, &self.policy);
                let revoked = done.error.as_ref().is_some_and(|e| e.code == ErrorCode::DeviceUnknown);
                if slots >= 2 && done.status != Status::TargetAccepted && !revoked {
                    let d = format!("relay-{r} {mid}: ended {done:?} with {slots} attempts left after the heal");
                    return self.violate(inv::LIVENESS, Some(&mid), d);
                }
                let to = self.account_of(&s.to).expect("known");
                if done.status == Status::TargetAccepted && !self.relays.iter().any(|x| x.has_record(to, &mid)) {
                    let d = format!("relay-{r} {mid}: target_accepted and no home of the recipient holds it");
                    return self.violate(inv::ACKED_LOST, Some(&mid), d);
                }
            }
        }
        for a in 0..self.accounts.len() {
            let acct = &self.accounts[a];
            let homes = &acct.homes[acct.current as usize - 1];
            if let [x, y] = homes[..] {
                let mids = |r: Ix| -> Vec<String> {
                    let mut v: Vec<String> =
                        self.relays[r].records.get(&a).into_iter().flatten().map(|x| x.mid.clone()).collect();
                    v.sort();
                    v
                };
                let (mx, my) = (mids(x), mids(y));
                if mx != my {
                    let odd = mx.iter().chain(&my).find(|m| !mx.contains(m) || !my.contains(m)).cloned();
                    let d =
                        format!("account {a}: relay-{x} holds {} records, relay-{y} {}; {odd:?}", mx.len(), my.len());
                    return self.violate(inv::CONVERGE, odd.as_deref(), d);
                }
            }
        }
    }
}
