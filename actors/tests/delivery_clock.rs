//! The delivery actor under an injected manual clock and a scripted
//! transport: deadlines, the timetable and the peer-status shortcut are
//! decided from the clock, not from sleeps.

use relay_actors::account::{AccountCmd, Reply};
use relay_actors::delivery;
use relay_actors::delivery::{LocalFuture, Transport};
use relay_actors::Supervisor;
use relay_core::clock::ManualClock;
use relay_core::delivery::aggregate::DeliveryEvent;
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::route_lookup::RouteLookup;
use relay_core::policy::Policy;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::methods::{DeliverParams, RegisterParams, SendParams};
use relay_schemas::objects::{DeliveryStatus, RelayRef, Route, Status, Wire};
use relay_schemas::{ErrorCode, RelayError, UnixSecs};
use serde_json::json;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T0: u64 = 1_800_000_000;

/// A transport whose remote relay is down, and whose "other home relay"
/// answers `peer_status` from a switch.
#[derive(Default)]
struct Scripted {
    delivered: Mutex<u32>,
    peer_says_accepted: Mutex<bool>,
    peer_asked: Mutex<u32>,
    route: Mutex<Option<Wire<Route>>>,
}

/// The transport handed to the supervisor; the test keeps the script.
struct Fake(Arc<Scripted>);

impl Transport for Fake {
    fn deliver(&self, _: &RelayRef, _: &DeliverParams) -> LocalFuture<AttemptOutcome> {
        *self.0.delivered.lock().unwrap() += 1;
        Box::pin(async { AttemptOutcome::NotAttempted(RelayError::unavailable("connection refused")) })
    }
    fn fetch_route(&self, _: &str) -> LocalFuture<RouteLookup> {
        let r = self.0.route.lock().unwrap().clone();
        Box::pin(
            async move { r.map_or_else(|| RouteLookup::Unknown("no route in this test".into()), RouteLookup::Found) },
        )
    }
    fn is_peer(&self, relay_id: &str) -> bool {
        relay_id == "relay-b"
    }
    fn peer_status(&self, _: &RelayRef, _: &str, _: &str) -> LocalFuture<Option<DeliveryStatus>> {
        *self.0.peer_asked.lock().unwrap() += 1;
        let yes = *self.0.peer_says_accepted.lock().unwrap();
        Box::pin(async move { yes.then(|| DeliveryStatus::target_accepted(T0)) })
    }
}

struct World {
    sup: Supervisor,
    clock: Arc<ManualClock>,
    script: Arc<Scripted>,
    alice: Account,
    phone: Device,
    bob: Account,
}

/// Alice on relay-a (this relay; her route may also name `alice_second`),
/// Bob served by relay-b (down).
async fn world(alice_second: Option<&str>) -> World {
    world_with(alice_second, Policy::with_relay_id("relay-a").timers_in_memory).await
}

fn policy(timers_in_memory: usize) -> Policy {
    let mut policy = Policy::with_relay_id("relay-a");
    policy.delivery_age_limit = 3600;
    policy.timers_in_memory = timers_in_memory;
    policy
}

async fn world_with(alice_second: Option<&str>, timers_in_memory: usize) -> World {
    let clock = ManualClock::at_ms(T0 * 1000);
    let script = Arc::new(Scripted::default());
    let policy = policy(timers_in_memory);
    let store = relay_actors::store::Store::temporary().unwrap();
    let sup = Supervisor::new(store, policy, clock.clone(), Arc::new(Fake(script.clone())));
    sup.start().unwrap();
    let (alice, phone, bob) =
        (Account::from_seed([1; 32]), Device::from_seed("phone", [2; 32]), Account::from_seed([3; 32]));
    let mut relays = vec![("relay-a", "http://a")];
    relays.extend(alice_second.map(|id| (id, "http://second")));
    let reg =
        alice.register_params(&alice.route(1, &relays, T0), &alice.certificate(&phone, T0, None), "relay-a", false, T0);
    let params: RegisterParams = serde_json::from_str(&reg.to_string()).unwrap();
    sup.ask(&alice.id, AccountCmd::AccountRegister { params, digest: "r".into(), known: None }).await.unwrap();
    *script.route.lock().unwrap() = Some(Wire::from_value(&bob.route(1, &[("relay-b", "http://b")], T0)).unwrap());
    World { sup, clock, script, alice, phone, bob }
}

impl World {
    async fn send(&self, n: u64) -> (String, DeliveryStatus) {
        let mid = format!("msg-{n:016}");
        let env = self.phone.envelope(&self.alice.id, &self.bob.id, &mid, T0, b"x");
        let p = json!({"envelope": env, "recipient_boxes": [key_box("laptop", b"k")]});
        let params: SendParams = serde_json::from_str(&p.to_string()).unwrap();
        let sent = self.sup.message_send(&self.alice.id, "phone".into(), params, format!("d{n}")).await.unwrap();
        let first_attempt = sent.first_attempt.expect("a delivery to another relay");
        let st = tokio::time::timeout(Duration::from_secs(10), first_attempt).await.unwrap().unwrap();
        (mid, st)
    }

    async fn status(&self, mid: &str) -> DeliveryStatus {
        let cmd = AccountCmd::MessageDeliveryStatus { device: "phone".into(), message_id: mid.into() };
        match self.sup.ask(&self.alice.id, cmd).await.unwrap() {
            Reply::Status(s) => s,
            other => panic!("{other:?}"),
        }
    }

    /// Runs the delivery's due step now (what its timer does), and waits
    /// for the step to finish.
    async fn fire(&self, mid: &str) -> DeliveryStatus {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.sup.start_delivery(&delivery::stream_id(&self.alice.id, mid), Some(tx));
        tokio::time::timeout(Duration::from_secs(10), rx).await.unwrap().unwrap()
    }

    fn attempts(&self, mid: &str) -> Vec<DeliveryEvent> {
        let store = self.sup.store();
        store
            .read(&delivery::stream_id(&self.alice.id, mid), 0)
            .map(|e| serde_json::from_str(e.unwrap().data.get()).unwrap())
            .filter(|e| matches!(e, DeliveryEvent::AttemptFailed { .. }))
            .collect()
    }
}

#[actix_rt::test]
async fn failed_attempts_are_rescheduled_on_the_timetable_from_acceptance() {
    let w = world(None).await;
    let (mid, st) = w.send(1).await;
    assert_eq!(st.status, Status::Delivering);
    w.clock.advance_ms(30_000);
    w.fire(&mid).await;
    let due: Vec<u64> = w
        .attempts(&mid)
        .iter()
        .map(|e| match e {
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => next_due_ms.since(UnixSecs(T0).millis()),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(due, vec![30_000, 300_000], "next attempts at +30 s and +5 min from acceptance");
    assert_eq!(*w.script.delivered.lock().unwrap(), 2);
}

#[actix_rt::test]
async fn delivery_unfinished_at_its_deadline_fails_with_message_expired() {
    let w = world(None).await;
    let (mid, _) = w.send(1).await;
    w.clock.advance_ms(3600 * 1000); // created_at + delivery_age_limit
    let st = w.fire(&mid).await;
    assert_eq!(st.status, Status::Failed);
    assert_eq!(st.error.as_ref().unwrap().code, ErrorCode::MessageExpired);
    assert_eq!(*w.script.delivered.lock().unwrap(), 1, "no attempt at or after the deadline");
    // The sender's status says the same, with the source accepted_at.
    assert_eq!(w.status(&mid).await, DeliveryStatus { accepted_at: T0, ..st });
    // The timer firing again changes nothing: terminal states are final.
    w.clock.advance_ms(3600 * 1000);
    assert_eq!(w.fire(&mid).await.error.unwrap().code, ErrorCode::MessageExpired);
}

#[actix_rt::test]
async fn other_home_relay_reporting_target_accepted_ends_the_delivery_without_contacting_the_recipient() {
    let w = world(Some("relay-a2")).await;
    let (mid, _) = w.send(1).await;
    w.clock.advance_ms(30_000);
    w.fire(&mid).await; // the second attempt: not yet asked
    assert_eq!(*w.script.delivered.lock().unwrap(), 2);
    *w.script.peer_says_accepted.lock().unwrap() = true;
    w.clock.advance_ms(270_000);
    let st = w.fire(&mid).await; // the third attempt asks the other home relay first
    assert_eq!(st.status, Status::TargetAccepted);
    assert_eq!(*w.script.delivered.lock().unwrap(), 2, "the recipient was not contacted");
}

/// SHiNE's two servers share results: a `target_accepted` that came from
/// the other home by `timeline.replicate` ends this home's delivery at its
/// next due step, before any attempt and without asking.
#[actix_rt::test]
async fn a_result_replicated_from_the_other_home_ends_the_delivery_without_asking_or_contacting() {
    use relay_core::account::method::timeline_replicate::{Item, Page};
    use relay_core::account::AccountEvent;
    let w = world(Some("relay-a2")).await;
    let (mid, _) = w.send(1).await;
    assert_eq!(*w.script.delivered.lock().unwrap(), 1);
    let route =
        Wire::from_value(&w.alice.route(1, &[("relay-a", "http://a"), ("relay-a2", "http://second")], T0)).unwrap();
    let status = DeliveryStatus::target_accepted(T0);
    let event = AccountEvent::DeliveryUpdated { message_id: mid.clone(), status };
    let item = Item { sequence: 7, event, status: None, deliver: None };
    let page = Page { items: vec![item], next: 7, has_more: false, route: Some(route) };
    let cmd =
        AccountCmd::ReplicaApply { partner: "relay-a2".into(), page: Box::new(page), known: None, senders: vec![] };
    w.sup.ask(&w.alice.id, cmd).await.unwrap();
    assert_eq!(w.status(&mid).await.status, Status::TargetAccepted, "the account learned it");

    w.clock.advance_ms(30_000);
    let st = w.fire(&mid).await;
    assert_eq!(st.status, Status::TargetAccepted);
    assert_eq!(*w.script.delivered.lock().unwrap(), 1, "the recipient was not contacted again");
    assert_eq!(*w.script.peer_asked.lock().unwrap(), 0, "nor the other home asked");
}

/// The process manager runs detached from its caller: a client that goes
/// away right after `message.send` left (a closed socket) neither leaves
/// the accepted delivery unstarted nor stops it between its commits.
#[actix_rt::test]
async fn a_send_whose_caller_goes_away_still_makes_its_first_attempt() {
    let w = world(None).await;
    let mid = "msg-0000000000000042".to_string();
    let env = w.phone.envelope(&w.alice.id, &w.bob.id, &mid, T0, b"x");
    let p = json!({"envelope": env, "recipient_boxes": [key_box("laptop", b"k")]});
    let params: SendParams = serde_json::from_str(&p.to_string()).unwrap();
    {
        let mut send = std::pin::pin!(w.sup.message_send(&w.alice.id, "phone".into(), params, "d42".into()));
        let once = std::future::poll_fn(|cx| std::task::Poll::Ready(send.as_mut().poll(cx))).await;
        assert!(once.is_pending(), "the send has started, not finished");
    } // dropped: the caller went away

    // The detached process manager runs on this test's arbiter (its commits
    // on the store's writer thread): let it run until the attempt is made.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while w.attempts(&mid).is_empty() {
        assert!(std::time::Instant::now() < deadline, "no attempt was made");
        tokio::task::yield_now().await;
    }
    assert_eq!(*w.script.delivered.lock().unwrap(), 1, "the first attempt went out once");
    assert_eq!(w.status(&mid).await.status, Status::Delivering, "accepted, waiting for its next slot");
}

/// Found by relay-sim: this relay's own attempt at a recipient it serves
/// asked no sender check, where a `message.deliver` from another relay
/// would (PROTOCOL §5 *Who may deliver*: a relay that serves the sender
/// takes a message only from a sending device valid in its own state), so
/// a device revoked here while its message waited for a retry reached a
/// local recipient.
#[actix_rt::test]
async fn a_local_attempt_checks_the_sending_device_as_a_delivery_from_another_relay_would() {
    use relay_schemas::methods::{DeviceAddParams, DeviceRevokeParams};
    let w = world(None).await;
    let laptop = Device::from_seed("laptop", [4; 32]);
    let cert = Wire::from_value(&w.alice.certificate(&laptop, T0, None)).unwrap();
    let add = AccountCmd::DeviceAdd { device: "phone".into(), params: DeviceAddParams { device_certificate: cert } };
    w.sup.ask(&w.alice.id, add).await.unwrap();
    // Carol's homes are this relay and relay-b (down); she registers here
    // only after the first attempt, which this relay answers `not_found`.
    let (carol, carol_phone) = (Account::from_seed([5; 32]), Device::from_seed("carol-phone", [6; 32]));
    let carol_route = carol.route(1, &[("relay-a", "http://a"), ("relay-b", "http://b")], T0);
    *w.script.route.lock().unwrap() = Some(Wire::from_value(&carol_route).unwrap());
    let mid = format!("msg-{:016}", 1);
    let env = laptop.envelope(&w.alice.id, &carol.id, &mid, T0, b"x");
    let p = json!({"envelope": env, "recipient_boxes": [key_box("carol-phone", b"k")]});
    let params: SendParams = serde_json::from_str(&p.to_string()).unwrap();
    let sent = w.sup.message_send(&w.alice.id, "laptop".into(), params, "d1".into()).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), sent.first_attempt.expect("a delivery")).await;
    assert_eq!(first.unwrap().unwrap().status, Status::Delivering);

    let reg = carol.register_params(&carol_route, &carol.certificate(&carol_phone, T0, None), "relay-a", true, T0);
    let params: RegisterParams = serde_json::from_str(&reg.to_string()).unwrap();
    w.sup.ask(&carol.id, AccountCmd::AccountRegister { params, digest: "c".into(), known: None }).await.unwrap();
    let revocation = Wire::from_value(&w.alice.revocation("laptop", T0)).unwrap();
    let revoke = AccountCmd::DeviceRevoke { device: "phone".into(), params: DeviceRevokeParams { revocation } };
    w.sup.ask(&w.alice.id, revoke).await.unwrap();

    w.clock.advance_ms(30_000);
    let st = w.fire(&mid).await;
    assert_ne!(st.status, Status::TargetAccepted, "{st:?}");
    match w.sup.ask(&carol.id, AccountCmd::Backlog { device: "carol-phone".into() }).await.unwrap() {
        Reply::Backlog(latest) => assert_eq!(latest, None, "carol holds the revoked laptop's message"),
        other => panic!("{other:?}"),
    }
}

/// `delivery.timers_in_memory`: past the bound, pending deliveries wait in
/// the store's due index and are read back in due order as memory
/// empties; none is lost and none fires late, after a restart included.
#[actix_rt::test]
async fn timers_past_the_bound_wait_in_the_index_and_every_one_fires_on_time() {
    let w = world_with(None, 4).await;
    let mut mids = Vec::new();
    for n in 0..12 {
        let (mid, st) = w.send(n).await;
        assert_eq!(st.status, Status::Delivering);
        mids.push(mid);
    }
    w.sup.timers_armed().await;
    assert!(w.sup.timers_in_memory().await <= 4, "12 pending, 4 in memory at most");
    // Each relay stops before the next starts, as a process would: two
    // schedulers over one store would race for the same deliveries, and
    // the loser's retries are held past the bound.
    w.sup.stop_timers().await;
    // Each attempt is due 30 s after acceptance, then 5 min. A relay that
    // starts then (its timers read back from the index) makes them all,
    // reading the index back in turns while it holds 4.
    for (elapsed_ms, attempts) in [(30_000, 2), (300_000, 3)] {
        w.clock.set_ms(T0 * 1000 + elapsed_ms);
        let transport = Arc::new(Fake(w.script.clone()));
        let sup = Supervisor::new(w.sup.store(), policy(4), w.clock.clone(), transport);
        sup.start().unwrap();
        let all_made = || mids.iter().all(|m| w.attempts(m).len() == attempts);
        for _ in 0..1000 {
            if all_made() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let made: Vec<usize> = mids.iter().map(|m| w.attempts(m).len()).collect();
        assert_eq!(made, vec![attempts; 12], "every delivery made its attempt {attempts} at +{elapsed_ms} ms");
        // Held within the bound while the restart works through the index
        // (what waits to start counts in it when a timer is set).
        sup.timers_armed().await;
        assert!(sup.timers_in_memory().await <= 4);
        sup.stop_timers().await;
    }
}
