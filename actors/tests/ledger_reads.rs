//! The sender's idempotency ledger is read once per send: its decision
//! reads the entry, and the later steps of the same send (the settle or the
//! delivery's report, and the write of the entry) take it from the account
//! actor's memo of its unfinished sends. What the memo answers must be what
//! the store holds: a retry, racing or late, is answered from the one entry
//! written, and the account writes one `message_sent`. A local send's two
//! commits also share one barrier.

use relay_actors::account::{AccountCmd, Reply};
use relay_actors::delivery::{LocalFuture, NoPeers, Transport};
use relay_actors::store::{Engine, KvIter, ModelEngine, Store, StoreError, Write};
use relay_actors::Supervisor;
use relay_core::account::ledger;
use relay_core::clock::ManualClock;
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::route_lookup::RouteLookup;
use relay_core::policy::Policy;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::methods::{DeliverParams, RegisterParams, SendParams};
use relay_schemas::objects::{DeliveryStatus, RelayRef, Route, Status, Wire};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T0: u64 = 1_800_000_000;

/// The model engine, counting the point reads of one key.
struct Counting {
    inner: ModelEngine,
    watched: Mutex<Vec<u8>>,
    reads: AtomicU64,
}

impl Counting {
    fn watch(&self, key: Vec<u8>) {
        *self.watched.lock().unwrap() = key;
        self.reads.store(0, Relaxed);
    }
}

impl Engine for Counting {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        // The store prefixes the kind of record; the ledger's key ends it.
        if key.ends_with(&self.watched.lock().unwrap()) {
            self.reads.fetch_add(1, Relaxed);
        }
        self.inner.get(key)
    }
    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        self.inner.range(start, end)
    }
    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError> {
        self.inner.apply(group)
    }
    fn barrier(&self) -> Result<(), StoreError> {
        self.inner.barrier()
    }
    fn bytes_written(&self) -> u64 {
        self.inner.bytes_written()
    }
    fn barriers(&self) -> u64 {
        self.inner.barriers()
    }
}

/// relay-b, which takes every delivery at once.
struct Accepting(Wire<Route>);

impl Transport for Accepting {
    fn deliver(&self, _: &RelayRef, _: &DeliverParams) -> LocalFuture<AttemptOutcome> {
        Box::pin(async { AttemptOutcome::Answered(DeliveryStatus::target_accepted(T0)) })
    }
    fn fetch_route(&self, _: &str) -> LocalFuture<RouteLookup> {
        let route = self.0.clone();
        Box::pin(async move { RouteLookup::Found(route) })
    }
    fn is_peer(&self, relay_id: &str) -> bool {
        relay_id == "relay-b"
    }
    fn peer_status(&self, _: &RelayRef, _: &str, _: &str) -> LocalFuture<Option<DeliveryStatus>> {
        Box::pin(async { None })
    }
}

struct World {
    sup: Supervisor,
    engine: Arc<Counting>,
    alice: Account,
    phone: Device,
    bob: Account,
}

/// Alice on relay-a; Bob on relay-a too (`bob_elsewhere`: on relay-b).
async fn world(bob_elsewhere: bool) -> World {
    let engine = Arc::new(Counting { inner: ModelEngine::new(), watched: Mutex::default(), reads: AtomicU64::new(0) });
    let store = Store::with_engine(engine.clone()).unwrap();
    let (alice, phone, bob) =
        (Account::from_seed([1; 32]), Device::from_seed("phone", [2; 32]), Account::from_seed([3; 32]));
    let bob_home = if bob_elsewhere { ("relay-b", "http://b") } else { ("relay-a", "http://a") };
    let bob_route = bob.route(1, &[bob_home], T0);
    let transport: Arc<dyn Transport> = match bob_elsewhere {
        true => Arc::new(Accepting(Wire::from_value(&bob_route).unwrap())),
        false => Arc::new(NoPeers),
    };
    let sup = Supervisor::new(store, Policy::with_relay_id("relay-a"), ManualClock::at_ms(T0 * 1000), transport);
    sup.start().unwrap();
    let mut accounts = vec![(&alice, &phone, alice.route(1, &[("relay-a", "http://a")], T0))];
    let bob_laptop = Device::from_seed("laptop", [4; 32]);
    if !bob_elsewhere {
        accounts.push((&bob, &bob_laptop, bob_route));
    }
    for (account, device, route) in accounts {
        // Bob takes messages from strangers (public discovery).
        let public = account.id == bob.id;
        let reg = account.register_params(&route, &account.certificate(device, T0, None), "relay-a", public, T0);
        let params: RegisterParams = serde_json::from_str(&reg.to_string()).unwrap();
        let cmd = AccountCmd::AccountRegister { params, digest: format!("r-{}", account.id), known: None };
        sup.ask(&account.id, cmd).await.unwrap();
    }
    World { sup, engine, alice, phone, bob }
}

impl World {
    fn params(&self, mid: &str) -> SendParams {
        let env = self.phone.envelope(&self.alice.id, &self.bob.id, mid, T0, b"x");
        let p = json!({"envelope": env, "recipient_boxes": [key_box("laptop", b"k")]});
        serde_json::from_str(&p.to_string()).unwrap()
    }

    /// `message.send` of `mid` until its first attempt's status.
    async fn send(&self, mid: &str) -> DeliveryStatus {
        let sent = self.sup.message_send(&self.alice.id, "phone".into(), self.params(mid), format!("d-{mid}"));
        let sent = sent.await.unwrap();
        match sent.first_attempt {
            Some(first) => tokio::time::timeout(Duration::from_secs(10), first).await.unwrap().unwrap(),
            None => sent.status,
        }
    }

    fn watch_ledger_of(&self, mid: &str) {
        self.engine.watch(ledger::send_key(&self.alice.id, mid));
    }

    fn ledger_reads(&self) -> u64 {
        self.engine.reads.load(Relaxed)
    }

    /// Alice's events of `event_type`.
    fn events_of_alice(&self, event_type: &str) -> usize {
        let stream = relay_actors::account::stream_id(&self.alice.id);
        self.sup.store().read(&stream, 0).filter(|e| e.as_ref().unwrap().event_type == event_type).count()
    }

    async fn status(&self, mid: &str) -> DeliveryStatus {
        let cmd = AccountCmd::MessageDeliveryStatus { device: "phone".into(), message_id: mid.into() };
        match self.sup.ask(&self.alice.id, cmd).await.unwrap() {
            Reply::Status(s) => s,
            other => panic!("{other:?}"),
        }
    }
}

#[actix_rt::test]
async fn a_local_send_reads_the_senders_ledger_once_and_a_retry_reads_the_entry_written() {
    let w = world(false).await;
    let mid = "msg-0000000000000001";
    w.watch_ledger_of(mid);
    let first = w.send(mid).await;
    assert_eq!(first.status, Status::TargetAccepted, "{first:?}");
    assert_eq!(w.ledger_reads(), 1, "the send's decision read the entry; its settle took it from the memo");
    // A finished send leaves the memo: the retry reads what was written
    // (from the engine, once the writer has installed it: the store's
    // overlay answers reads before then without reaching the engine).
    w.sup.store().settle_blocking().unwrap();
    let retry = w.send(mid).await;
    assert_eq!(retry, first);
    assert_eq!(w.ledger_reads(), 2);
    assert_eq!(w.events_of_alice("message_sent"), 1);
}

#[actix_rt::test]
async fn a_cross_relay_send_reads_the_senders_ledger_once_through_its_acceptance_and_report() {
    let w = world(true).await;
    let mid = "msg-0000000000000002";
    w.watch_ledger_of(mid);
    let first = w.send(mid).await;
    assert_eq!(first.status, Status::TargetAccepted);
    assert_eq!(w.ledger_reads(), 1, "the send's decision read the entry; its acceptance took it from the memo");
    // The report may be written after the first attempt's status is told;
    // once it is, the entry has left the memo and a status is read from
    // the store (one read, reaching the engine once the writer installed it).
    let reported = async {
        while w.events_of_alice("delivery_updated") == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reported).await.expect("the report is written");
    w.sup.store().settle_blocking().unwrap();
    let settled = w.status(mid).await;
    assert_eq!(settled.status, Status::TargetAccepted);
    assert_eq!(w.ledger_reads(), 2, "the report and its write took the entry from the memo");
    assert_eq!(w.events_of_alice("message_sent"), 1);
    assert_eq!(w.events_of_alice("delivery_updated"), 1);
}

#[actix_rt::test]
async fn racing_retries_of_a_local_send_settle_it_once() {
    let w = world(false).await;
    let mid = "msg-0000000000000003";
    // Both decide before either settles (one actor, commands in order):
    // the second settle must find the first one's entry, not the memo's
    // "absent" from its decision.
    let (a, b, c) = tokio::join!(w.send(mid), w.send(mid), w.send(mid));
    assert_eq!(a.status, Status::TargetAccepted);
    assert_eq!((&a, &a), (&b, &c));
    assert_eq!(w.events_of_alice("message_sent"), 1);
    assert_eq!(w.status(mid).await, a);
}

/// The receipt is answered at once and nobody asks for it to be durable:
/// the acceptance, asked for by the sender's answer, covers it. So the two
/// commits of a local send take one barrier, not one each.
#[actix_rt::test]
async fn a_local_sends_receipt_rides_in_its_acceptances_group() {
    let w = world(false).await;
    let store = w.sup.store();
    let window = Duration::from_secs(1);
    store.set_group_commit_window(window);
    // Past a window since the registrations' last group, a receipt asked
    // for (the regression this catches) would start a group of its own at
    // once; the acceptance, a moment later, then a second one.
    tokio::time::sleep(window + Duration::from_millis(100)).await;
    let before = store.stats();
    let status = w.send("msg-0000000000000004").await;
    assert_eq!(status.status, Status::TargetAccepted, "{status:?}");
    let after = store.stats();
    assert_eq!(after.commits - before.commits, 2, "a local send is two commits: {after:?}");
    assert_eq!(after.flushes - before.flushes, 1, "and one group: {after:?}");
}
