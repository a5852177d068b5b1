//! The fixture of the account rules' tests: accounts, devices, routes,
//! messages and events built as clients build them, an account [`Given`]
//! as its actor has it (state, ledger, stream), and the given / when /
//! then helpers. Past events are data: `Registered` is produced by
//! `register` on an empty state (so the fixture itself passes the rules);
//! message events by `send` / `receive` on the state they are decided
//! against. Built for the core's own tests, and with the `testkit`
//! feature for the shell's tests of the same accounts.

pub mod limits;

// The rules, for tests that call another method's rule than their own.
pub use crate::account::command::AccountCmd;
pub use crate::account::decision::{Decision, Effect, Reply};
pub use crate::account::method::account_register::register;
pub use crate::account::method::account_settings_update::update_settings;
pub use crate::account::method::contact_revoke::revoke_contact;
pub use crate::account::method::device_add::add_device;
pub use crate::account::method::device_revoke::revoke_device;
pub use crate::account::method::message_deliver::{check_sender, may_deliver, receive, ReceiveDecision};
pub use crate::account::method::message_delivery_peer_status::may_ask_peer_status;
pub use crate::account::method::message_send::{record_delivery, send, settle, SendDecision, SettleDecision};
pub use crate::account::method::message_timeline_ack::ack;
pub use crate::account::method::push_subscribe::{push_subscribe, push_targets};
pub use crate::account::method::push_unsubscribe::{push_gone, push_unsubscribe};
pub use crate::account::method::route_update::update_route;
pub use crate::account::session::{Challenges, Grant};
pub use crate::account::shared::{check_session, Ctx};

pub use crate::account::events::{AccountEvent, Record};

pub use crate::account::ledger::{Ledger, ReceiptEntry, SendEntry};

pub use crate::account::state::AccountState;

pub use crate::account::timeline::IndexEntry;

pub use crate::account::Reads;

pub use crate::policy::Policy;

pub use ed25519_dalek::SigningKey;

pub use relay_schemas::client::{key_box, Account, Device};

pub use relay_schemas::encoding::jcs_digest;

pub use relay_schemas::methods::{ContactRevokeParams, DeliverParams, RegisterParams, SendParams};

pub use relay_schemas::objects::{DeliveryStatus, DeviceCertificate, DeviceRevocation, Route, Status, Wire};

pub use relay_schemas::sign::{sign_object, Tag};

pub use relay_schemas::{ErrorCode, RelayError, UnixSecs};

pub use serde::de::DeserializeOwned;

pub use serde_json::{json, Value};

pub use std::fmt::Debug;

pub use std::ops::Deref;

pub use std::sync::LazyLock;

// ---- fixture ------------------------------------------------------------------

pub const NOW: u64 = 1_764_400_000;

/// When the fixture's routes and certificates were issued.
pub const ISSUED: u64 = NOW - 86_400;

pub const RELAY: &str = "relay-a";

pub const URL_A: &str = "https://a.example";

pub const URL_B: &str = "https://b.example";

pub static POLICY: LazyLock<Policy> = LazyLock::new(|| Policy::with_relay_id(RELAY));

/// Decisions at `now` under this relay's default policy.
pub fn at(now: u64) -> Ctx<'static> {
    Ctx::new(UnixSecs(now), &POLICY)
}

/// Decisions at `now` under another policy of this relay.
pub fn under(policy: &Policy, now: u64) -> Ctx<'_> {
    Ctx::new(UnixSecs(now), policy)
}

pub fn age_limit() -> u64 {
    POLICY.delivery_age_limit
}

pub fn retention() -> u64 {
    POLICY.message_retention
}

pub fn alice() -> Account {
    Account::from_seed([1; 32])
}

pub fn bob() -> Account {
    Account::from_seed([2; 32])
}

pub fn carol() -> Account {
    Account::from_seed([3; 32])
}

// Alice's devices.
pub fn phone() -> Device {
    Device::from_seed("phone", [11; 32])
}

pub fn laptop() -> Device {
    Device::from_seed("laptop", [12; 32])
}

pub fn tablet() -> Device {
    Device::from_seed("tablet", [13; 32])
}

// Other accounts' devices.
pub fn bob_phone() -> Device {
    Device::from_seed("bob-phone", [21; 32])
}

pub fn bob_laptop() -> Device {
    Device::from_seed("bob-laptop", [22; 32])
}

pub fn carol_phone() -> Device {
    Device::from_seed("carol-phone", [31; 32])
}

/// A message id (16–64 chars).
pub fn mid(n: u32) -> String {
    format!("message-{n:012}")
}

pub fn parse<T: DeserializeOwned>(v: &Value) -> T {
    // `Wire<T>` deserializes through RawValue: go through the text.
    serde_json::from_str(&v.to_string()).expect("fixture params parse")
}

pub fn wire<T: DeserializeOwned>(v: &Value) -> Wire<T> {
    Wire::from_value(v).expect("fixture object parses")
}

/// blake3(JCS(params)), hex: what the transport hands the core.
pub fn digest(v: &Value) -> String {
    jcs_digest(v).expect("canonical").iter().map(|b| format!("{b:02x}")).collect()
}

/// Signs `v` under `tag` with `key` (for hand-made or re-signed objects).
pub fn signed(tag: Tag, v: Value, key: &SigningKey) -> Value {
    let mut m = v.as_object().expect("object").clone();
    sign_object(tag, &mut m, key);
    Value::Object(m)
}

/// `v` with `field` set to `value`, signature left as it was.
pub fn tampered(mut v: Value, field: &str, value: Value) -> Value {
    v[field] = value;
    v
}

pub fn route(acct: &Account, revision: u64, relays: &[&str]) -> Value {
    let relays: Vec<(&str, &str)> = relays.iter().map(|r| (*r, if *r == RELAY { URL_A } else { URL_B })).collect();
    acct.route(revision, &relays, ISSUED)
}

pub fn cert(acct: &Account, dev: &Device) -> Value {
    acct.certificate(dev, ISSUED, None)
}

/// The account key's Registration asking this relay to serve `acct`.
pub fn registration(acct: &Account, public_discovery: bool) -> Value {
    acct.registration(RELAY, public_discovery, NOW)
}

/// `account.register` params; the registration's `public_discovery` is the
/// one `settings` names (the earlier form, kept only where a test sets it).
pub fn register_value(acct: &Account, dev: &Device, relays: &[&str], settings: Option<Value>) -> Value {
    let public = settings.as_ref().and_then(|s| s["public_discovery"].as_bool()).unwrap_or(false);
    let mut v = json!({"route": route(acct, 1, relays), "device_certificate": cert(acct, dev),
                       "registration": registration(acct, public)});
    if let Some(s) = settings {
        v["settings"] = s;
    }
    v
}

pub fn boxes(ids: &[&str]) -> Value {
    Value::Array(ids.iter().map(|d| key_box(d, format!("box-for-{d}").as_bytes())).collect())
}

pub fn envelope(dev: &Device, from: &Account, to: &Account, n: u32, created_at: u64) -> Value {
    dev.envelope(&from.id, &to.id, &mid(n), created_at, b"opaque ciphertext")
}

pub fn send_value(env: Value, recipients: &[&str], senders: Option<&[&str]>) -> Value {
    let mut v = json!({"envelope": env, "recipient_boxes": boxes(recipients)});
    if let Some(s) = senders {
        v["sender_boxes"] = boxes(s);
    }
    v
}

pub fn deliver_value(env: Value, recipients: &[&str], sender_cert: Value) -> Value {
    json!({"envelope": env, "recipient_boxes": boxes(recipients), "sender_device_certificate": sender_cert})
}

pub fn with_auth(mut v: Value, auth: Value) -> Value {
    v["authorization"] = auth;
    v
}

pub fn grant_auth(g: Value) -> Value {
    json!({ "contact_grant": g })
}

pub fn invite_auth(i: Value) -> Value {
    json!({ "contact_invite": i })
}

/// Alice's grant letting Bob deliver to her.
pub fn grant_alice_to_bob() -> Value {
    alice().grant("grant-bob", &bob().id, ISSUED, Some(NOW + 86_400))
}

// ---- events -------------------------------------------------------------------

pub fn registered_with(acct: &Account, params: &Value) -> AccountEvent {
    let p: RegisterParams = parse(params);
    let mut events = register(&AccountState::new(&acct.id), &p, &digest(params), None, at(NOW))
        .expect("fixture registration is valid");
    assert_eq!(events.len(), 1);
    events.remove(0)
}

pub fn registered(acct: &Account, dev: &Device) -> AccountEvent {
    registered_with(acct, &register_value(acct, dev, &[RELAY], None))
}

pub fn device_added(acct: &Account, dev: &Device) -> AccountEvent {
    AccountEvent::DeviceAdded { device_certificate: wire(&cert(acct, dev)) }
}

pub fn device_added_cert(c: &Value) -> AccountEvent {
    AccountEvent::DeviceAdded { device_certificate: wire(c) }
}

pub fn device_revoked(acct: &Account, device_id: &str) -> AccountEvent {
    AccountEvent::DeviceRevoked { revocation: wire(&acct.revocation(device_id, NOW - 10)) }
}

pub fn route_updated(v: &Value) -> AccountEvent {
    AccountEvent::RouteUpdated { route: wire(v) }
}

pub fn public_discovery(on: bool) -> AccountEvent {
    AccountEvent::SettingsUpdated { public_discovery: on, at: None }
}

pub fn contact_revoked(kind: &str, id: &str) -> AccountEvent {
    AccountEvent::ContactRevoked { kind: kind.into(), id: id.into() }
}

/// Alice on this relay with her phone (registration) and laptop.
pub fn alice_history() -> Vec<AccountEvent> {
    vec![registered(&alice(), &phone()), device_added(&alice(), &laptop())]
}

pub fn history(extra: impl IntoIterator<Item = AccountEvent>) -> Vec<AccountEvent> {
    let mut h = alice_history();
    h.extend(extra);
    h
}

/// An account as its actor has it: the state its events fold to, and its
/// ledger (which the actor keeps in the store, not in the state).
#[derive(Clone, Debug)]
pub struct Given {
    pub state: AccountState,
    pub ledger: Ledger,
    /// The account's stream: event `i` has sequence `i + 1`.
    pub events: Vec<AccountEvent>,
    /// The params of the deliveries this relay runs, by message id.
    pub deliveries: std::collections::BTreeMap<String, DeliverParams>,
}

impl Deref for Given {
    type Target = AccountState;
    fn deref(&self) -> &AccountState {
        &self.state
    }
}

impl Given {
    pub fn new(account_id: &str) -> Self {
        let (ledger, events, deliveries) = Default::default();
        Given { state: AccountState::new(account_id), ledger, events, deliveries }
    }

    pub fn apply(&mut self, e: &AccountEvent) {
        self.state.apply(e);
        self.ledger.apply(&self.state.account_id, e);
        self.events.push(e.clone());
    }

    pub fn sent(&self, message_id: &str) -> &SendEntry {
        self.ledger.send(message_id).unwrap_or_else(|| panic!("no ledger entry for {message_id}"))
    }
}

/// The store's view, from memory: the ledger, and the timeline index the
/// records of the events make.
impl Reads for Given {
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError> {
        Ok(self.ledger.send(message_id).cloned())
    }

    fn receipt_entry(&self, from: &str, message_id: &str) -> Result<Option<ReceiptEntry>, RelayError> {
        Ok(self.ledger.receipt(from, message_id).cloned())
    }

    fn timeline_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, IndexEntry), RelayError>> {
        let index = self.events.iter().zip(1..).filter_map(|(e, event)| {
            e.record().map(|r| (r.sequence, IndexEntry { event, visible: r.visible.clone() }))
        });
        index.filter(move |(seq, _)| *seq > after).map(Ok)
    }

    fn event(&self, seq: u64) -> Result<AccountEvent, RelayError> {
        let i = usize::try_from(seq).ok().and_then(|s| s.checked_sub(1));
        i.and_then(|i| self.events.get(i)).cloned().ok_or_else(|| RelayError::internal("no such event"))
    }

    fn events_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, AccountEvent), RelayError>> {
        self.events.iter().cloned().zip(1..).filter(move |(_, seq)| *seq > after).map(|(e, seq)| Ok((seq, e)))
    }

    fn delivery_params(&self, message_id: &str) -> Result<Option<DeliverParams>, RelayError> {
        Ok(self.deliveries.get(message_id).cloned())
    }
}

/// The account an account's past events fold to.
pub fn given(acct: &Account, events: &[AccountEvent]) -> Given {
    let mut s = Given::new(&acct.id);
    for e in events {
        s.apply(e);
    }
    s
}

pub fn given_alice(extra: impl IntoIterator<Item = AccountEvent>) -> Given {
    given(&alice(), &history(extra))
}

// ---- commands -----------------------------------------------------------------

pub fn when_register(s: &AccountState, v: &Value, c: Ctx) -> Result<Vec<AccountEvent>, RelayError> {
    register(s, &parse(v), &digest(v), None, c)
}

/// `account.register` when this relay (or a peer) knows `known` as the
/// account's highest route.
pub fn when_register_knowing(
    s: &AccountState,
    v: &Value,
    known: &Value,
    c: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    register(s, &parse(v), &digest(v), Some(&wire(known)), c)
}

/// `message.send`, with the ledger's entry for its message id as the
/// actor reads it.
pub fn when_send(s: &Given, device: &str, v: &Value, c: Ctx) -> Result<SendDecision, RelayError> {
    let p: SendParams = parse(v);
    send(s, s.ledger.send(&p.envelope.message_id), device, &p, &digest(v), c)
}

pub fn when_receive(s: &Given, v: &Value, c: Ctx) -> Result<ReceiveDecision, RelayError> {
    let p: DeliverParams = parse(v);
    receive(s, s.ledger.receipt(&p.envelope.from, &p.envelope.message_id), &p, &digest(v), c)
}

pub fn when_record_delivery(s: &Given, message_id: &str, status: &DeliveryStatus) -> Vec<AccountEvent> {
    record_delivery(s.ledger.send(message_id), message_id, status)
}

// ---- outcomes -----------------------------------------------------------------

#[track_caller]
pub fn then_error<T: Debug>(r: Result<T, RelayError>, code: ErrorCode) -> RelayError {
    match r {
        Ok(v) => panic!("expected {code}, got Ok({v:?})"),
        Err(e) => {
            assert_eq!(e.code, code, "unexpected error: {e}");
            e
        }
    }
}

/// Rejected, whatever the code (where the protocol does not pin one).
#[track_caller]
pub fn then_rejected<T: Debug>(r: Result<T, RelayError>) -> RelayError {
    match r {
        Ok(v) => panic!("expected a rejection, got Ok({v:?})"),
        Err(e) => e,
    }
}

/// A route error (`target_not_local`, or `route_stale` when the relay knows
/// the account's newer route) carrying the current route in `data.route`, so
/// the caller refreshes the route and retries.
#[track_caller]
pub fn then_route_error<T: Debug>(r: Result<T, RelayError>, current_route: &Value) {
    let e = then_rejected(r);
    assert!(matches!(e.code, ErrorCode::TargetNotLocal | ErrorCode::RouteStale), "expected a route error, got {e}");
    assert_eq!(e.data.as_ref().expect("data.route")["route"], *current_route);
}

#[track_caller]
pub fn then_events(r: Result<Vec<AccountEvent>, RelayError>) -> Vec<AccountEvent> {
    r.unwrap_or_else(|e| panic!("expected events, got {e}"))
}

#[track_caller]
pub fn then_no_events(r: Result<Vec<AccountEvent>, RelayError>) {
    let events = then_events(r);
    assert!(events.is_empty(), "expected no events, got {events:?}");
}

pub struct Sent {
    pub event: AccountEvent,
    pub status: DeliveryStatus,
    pub deliver: DeliverParams,
    pub deadline: u64,
}

#[track_caller]
pub fn then_sent(r: Result<SendDecision, RelayError>) -> Sent {
    match r {
        Ok(SendDecision::Sent { event, status, deliver, deadline }) => {
            Sent { event, status, deliver: *deliver, deadline }
        }
        other => panic!("expected Sent, got {other:?}"),
    }
}

#[track_caller]
pub fn then_self_delivered(r: Result<SendDecision, RelayError>) -> (AccountEvent, DeliveryStatus) {
    match r {
        Ok(SendDecision::SelfDelivered { event, status }) => (event, status),
        other => panic!("expected SelfDelivered, got {other:?}"),
    }
}

#[track_caller]
pub fn then_send_duplicate(r: Result<SendDecision, RelayError>) -> DeliveryStatus {
    match r {
        Ok(SendDecision::Duplicate(status)) => status,
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

#[track_caller]
pub fn then_accepted(r: Result<ReceiveDecision, RelayError>) -> (AccountEvent, DeliveryStatus) {
    match r {
        Ok(ReceiveDecision::Accepted { event, status }) => (*event, status),
        other => panic!("expected Accepted, got {other:?}"),
    }
}

#[track_caller]
pub fn then_receive_duplicate(r: Result<ReceiveDecision, RelayError>) -> DeliveryStatus {
    match r {
        Ok(ReceiveDecision::Duplicate(status)) => status,
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

#[track_caller]
pub fn record_of(event: &AccountEvent) -> &Record {
    event.record().unwrap_or_else(|| panic!("expected a record in {event:?}"))
}

pub fn box_ids(r: &Record) -> Vec<String> {
    r.boxes.iter().map(|b| b.device_id.clone()).collect()
}

pub fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

// ---- common messages ----------------------------------------------------------

/// Alice's phone → Bob, with sender boxes for Alice's phone and laptop.
pub fn alice_to_bob(n: u32) -> Value {
    send_value(envelope(&phone(), &alice(), &bob(), n, NOW), &["bob-phone"], Some(&["phone", "laptop"]))
}

/// Alice's phone → Alice (self-delivery).
pub fn alice_to_self(n: u32, recipients: &[&str]) -> Value {
    send_value(envelope(&phone(), &alice(), &alice(), n, NOW), recipients, None)
}

/// Bob's phone → Alice, as `message.deliver` params, with Alice's grant.
pub fn bob_to_alice(n: u32) -> Value {
    with_auth(bob_to_alice_without_auth(n), grant_auth(grant_alice_to_bob()))
}

pub fn bob_to_alice_without_auth(n: u32) -> Value {
    deliver_value(envelope(&bob_phone(), &bob(), &alice(), n, NOW), &["phone", "laptop"], cert(&bob(), &bob_phone()))
}

/// The event of an accepted `message.send` on `s` at `NOW`.
pub fn send_event(s: &Given, v: &Value) -> AccountEvent {
    match when_send(s, "phone", v, at(NOW)).expect("fixture send is accepted") {
        SendDecision::Sent { event, .. } | SendDecision::SelfDelivered { event, .. } => event,
        d => panic!("fixture send was {d:?}"),
    }
}

/// The event of an accepted receipt on `s` at `NOW`.
pub fn receive_event(s: &Given, v: &Value) -> AccountEvent {
    then_accepted(when_receive(s, v, at(NOW))).0
}

// ---- commands through the dispatcher -------------------------------------------

pub type Cmd = AccountCmd<()>;

pub fn when(s: &Given, cmd: Cmd) -> Result<Decision, RelayError> {
    crate::account::command::decide(s, &mut Challenges::default(), &cmd, s, at(NOW))
}

pub fn reply_json(reply: &Reply) -> Value {
    match reply {
        Reply::Json(j) => serde_json::from_str(j).expect("reply is JSON"),
        r => panic!("expected a JSON reply, got {r:?}"),
    }
}

pub fn reply_status(reply: &Reply) -> &DeliveryStatus {
    match reply {
        Reply::Status(s) | Reply::Settled { status: s, .. } => s,
        r => panic!("expected a status, got {r:?}"),
    }
}

pub fn push_params(n: u8) -> relay_schemas::methods::PushSubscribeParams {
    parse(&json!({
        "endpoint": format!("https://push.example/sub/{n}"),
        "keys": {"p256dh": relay_schemas::encoding::b64_encode(&[4u8; 65]), "auth": relay_schemas::encoding::b64_encode(&[n; 16])}
    }))
}

pub fn subscribed(device: &str, n: u8) -> AccountEvent {
    let s = given_alice([]);
    push_subscribe(&s, device, &push_params(n)).unwrap().remove(0)
}

/// A busy account: devices added, revoked and expiring, settings, a revoked
/// contact, sent, self-delivered and received messages, a delivery result and
/// a cursor.
pub fn busy_alice() -> Given {
    given(&alice(), &busy_alice_events())
}

pub fn busy_alice_events() -> Vec<AccountEvent> {
    let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 100));
    let mut events = history([
        device_added_cert(&expiring),
        device_revoked(&alice(), "laptop"),
        public_discovery(true),
        contact_revoked("grant", "grant-old"),
    ]);
    let s = given(&alice(), &events);
    events.push(send_event(&s, &alice_to_bob(1)));
    let s = given(&alice(), &events);
    events.push(send_event(&s, &alice_to_self(2, &["phone", "tablet"])));
    let s = given(&alice(), &events);
    events.push(receive_event(&s, &bob_to_alice(3)));
    let s = given(&alice(), &events);
    events.extend(when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 1)));
    events.push(AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
    events
}

/// The decisions an account makes, rendered for comparison.
pub fn decisions(s: &Given) -> Vec<String> {
    let old_grant = alice().grant("grant-old", &bob().id, ISSUED, None);
    let revoked_grant = with_auth(bob_to_alice_without_auth(20), grant_auth(old_grant));
    vec![
        format!("{:?}", when_send(s, "phone", &alice_to_bob(1), at(NOW + 5))),
        format!("{:?}", when_send(s, "phone", &alice_to_self(2, &["phone", "tablet"]), at(NOW + 5))),
        format!("{:?}", when_receive(s, &bob_to_alice(3), at(NOW + 5))),
        format!("{:?}", when_send(s, "phone", &alice_to_bob(10), at(NOW + 5))),
        format!(
            "{:?}",
            when_send(
                s,
                "tablet",
                &send_value(envelope(&tablet(), &alice(), &bob(), 11, NOW), &["bob-phone"], None),
                at(NOW + 5)
            )
        ),
        format!(
            "{:?}",
            when_send(
                s,
                "tablet",
                &send_value(envelope(&tablet(), &alice(), &bob(), 12, NOW + 100), &["bob-phone"], None),
                at(NOW + 100)
            )
        ),
        format!(
            "{:?}",
            when_send(
                s,
                "laptop",
                &send_value(envelope(&laptop(), &alice(), &bob(), 13, NOW), &["bob-phone"], None),
                at(NOW + 5)
            )
        ),
        format!("{:?}", when_receive(s, &bob_to_alice_without_auth(14), at(NOW + 5))),
        format!("{:?}", when_receive(s, &revoked_grant, at(NOW + 5))),
        format!("{:?}", check_session(s, "phone", at(NOW + 5))),
        format!("{:?}", check_session(s, "laptop", at(NOW + 5))),
        format!("{:?}", check_session(s, "tablet", at(NOW + 5))),
        format!("{:?}", check_session(s, "tablet", at(NOW + 100))),
        format!("{:?}", add_device(s, &wire(&cert(&alice(), &phone())), at(NOW + 5))),
        format!("{:?}", add_device(s, &wire(&cert(&alice(), &laptop())), at(NOW + 5))),
        format!("{:?}", revoke_device(s, &wire(&alice().revocation("tablet", NOW)), at(NOW + 5))),
        format!("{:?}", when_register(s, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW + 5))),
        format!("{:?}", ack(s, "phone", 3)),
        format!("{:?}", ack(s, "phone", 2)),
        format!("{:?}", ack(s, "phone", 4)),
        format!("{:?}", when_record_delivery(s, &mid(1), &DeliveryStatus::delivering(NOW))),
    ]
}
