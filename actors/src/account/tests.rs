//! Rules of the account core, given(events) / when(command) / then(events or error).
//!
//! Every test is named after the rule it checks (the seed "Message Delivery"
//! chapter and PROTOCOL.md §1, §2, §4). Past events are data: `Registered`
//! is produced by `decide::register` on an empty state (so the fixture itself
//! passes the rules); message events are produced by `decide::send` /
//! `decide::receive` on the state they are decided against.

use super::decide::{self, Ctx, ReceiveDecision, SendDecision};
use super::events::{AccountEvent, Record};
use super::ledger::{Ledger, SendEntry};
use super::state::AccountState;
use crate::policy::Policy;
use ed25519_dalek::SigningKey;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::encoding::jcs_digest;
use relay_schemas::methods::{ContactRevokeParams, DeliverParams, RegisterParams, SendParams};
use relay_schemas::objects::{DeviceCertificate, DeviceRevocation, Route};
use relay_schemas::sign::{sign_object, Tag};
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, Status, Wire};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::fmt::Debug;
use std::ops::Deref;
use std::sync::LazyLock;

// ---- fixture ------------------------------------------------------------------

const NOW: u64 = 1_764_400_000;
/// When the fixture's routes and certificates were issued.
const ISSUED: u64 = NOW - 86_400;
const RELAY: &str = "relay-a";
const URL_A: &str = "https://a.example";
const URL_B: &str = "https://b.example";

static POLICY: LazyLock<Policy> = LazyLock::new(|| Policy::with_relay_id(RELAY));

/// Decisions at `now` under this relay's default policy.
fn at(now: u64) -> Ctx<'static> {
    Ctx { now, policy: &POLICY }
}

/// Decisions at `now` under another policy of this relay.
fn under(policy: &Policy, now: u64) -> Ctx<'_> {
    Ctx { now, policy }
}

fn age_limit() -> u64 {
    POLICY.delivery_age_limit
}

fn retention() -> u64 {
    POLICY.message_retention
}

fn alice() -> Account {
    Account::from_seed([1; 32])
}
fn bob() -> Account {
    Account::from_seed([2; 32])
}
fn carol() -> Account {
    Account::from_seed([3; 32])
}

// Alice's devices.
fn phone() -> Device {
    Device::from_seed("phone", [11; 32])
}
fn laptop() -> Device {
    Device::from_seed("laptop", [12; 32])
}
fn tablet() -> Device {
    Device::from_seed("tablet", [13; 32])
}
// Other accounts' devices.
fn bob_phone() -> Device {
    Device::from_seed("bob-phone", [21; 32])
}
fn bob_laptop() -> Device {
    Device::from_seed("bob-laptop", [22; 32])
}
fn carol_phone() -> Device {
    Device::from_seed("carol-phone", [31; 32])
}

/// A message id (16–64 chars).
fn mid(n: u32) -> String {
    format!("message-{n:012}")
}

fn parse<T: DeserializeOwned>(v: &Value) -> T {
    // `Wire<T>` deserializes through RawValue: go through the text.
    serde_json::from_str(&v.to_string()).expect("fixture params parse")
}

fn wire<T: DeserializeOwned>(v: &Value) -> Wire<T> {
    Wire::from_value(v).expect("fixture object parses")
}

/// blake3(JCS(params)), hex: what the transport hands the core.
fn digest(v: &Value) -> String {
    hex::encode(jcs_digest(v).expect("canonical"))
}

/// Signs `v` under `tag` with `key` (for hand-made or re-signed objects).
fn signed(tag: Tag, v: Value, key: &SigningKey) -> Value {
    let mut m = v.as_object().expect("object").clone();
    sign_object(tag, &mut m, key);
    Value::Object(m)
}

/// `v` with `field` set to `value`, signature left as it was.
fn tampered(mut v: Value, field: &str, value: Value) -> Value {
    v[field] = value;
    v
}

fn route(acct: &Account, revision: u64, relays: &[&str]) -> Value {
    let relays: Vec<(&str, &str)> = relays.iter().map(|r| (*r, if *r == RELAY { URL_A } else { URL_B })).collect();
    acct.route(revision, &relays, ISSUED)
}

fn cert(acct: &Account, dev: &Device) -> Value {
    acct.certificate(dev, ISSUED, None)
}

/// The account key's Registration asking this relay to serve `acct`.
fn registration(acct: &Account, public_discovery: bool) -> Value {
    acct.registration(RELAY, public_discovery, NOW)
}

/// `account.register` params; the registration's `public_discovery` is the
/// one `settings` names (the earlier form, kept only where a test sets it).
fn register_value(acct: &Account, dev: &Device, relays: &[&str], settings: Option<Value>) -> Value {
    let public = settings.as_ref().and_then(|s| s["public_discovery"].as_bool()).unwrap_or(false);
    let mut v = json!({"route": route(acct, 1, relays), "device_certificate": cert(acct, dev),
                       "registration": registration(acct, public)});
    if let Some(s) = settings {
        v["settings"] = s;
    }
    v
}

fn boxes(ids: &[&str]) -> Value {
    Value::Array(ids.iter().map(|d| key_box(d, format!("box-for-{d}").as_bytes())).collect())
}

fn envelope(dev: &Device, from: &Account, to: &Account, n: u32, created_at: u64) -> Value {
    dev.envelope(&from.id, &to.id, &mid(n), created_at, b"opaque ciphertext")
}

fn send_value(env: Value, recipients: &[&str], senders: Option<&[&str]>) -> Value {
    let mut v = json!({"envelope": env, "recipient_boxes": boxes(recipients)});
    if let Some(s) = senders {
        v["sender_boxes"] = boxes(s);
    }
    v
}

fn deliver_value(env: Value, recipients: &[&str], sender_cert: Value) -> Value {
    json!({"envelope": env, "recipient_boxes": boxes(recipients), "sender_device_certificate": sender_cert})
}

fn with_auth(mut v: Value, auth: Value) -> Value {
    v["authorization"] = auth;
    v
}

fn grant_auth(g: Value) -> Value {
    json!({ "contact_grant": g })
}

fn invite_auth(i: Value) -> Value {
    json!({ "contact_invite": i })
}

/// Alice's grant letting Bob deliver to her.
fn grant_alice_to_bob() -> Value {
    alice().grant("grant-bob", &bob().id, ISSUED, Some(NOW + 86_400))
}

// ---- events -------------------------------------------------------------------

fn registered_with(acct: &Account, params: &Value) -> AccountEvent {
    let p: RegisterParams = parse(params);
    let mut events = decide::register(&AccountState::new(&acct.id), &p, &digest(params), None, at(NOW))
        .expect("fixture registration is valid");
    assert_eq!(events.len(), 1);
    events.remove(0)
}

fn registered(acct: &Account, dev: &Device) -> AccountEvent {
    registered_with(acct, &register_value(acct, dev, &[RELAY], None))
}

fn device_added(acct: &Account, dev: &Device) -> AccountEvent {
    AccountEvent::DeviceAdded { device_certificate: wire(&cert(acct, dev)) }
}

fn device_added_cert(c: &Value) -> AccountEvent {
    AccountEvent::DeviceAdded { device_certificate: wire(c) }
}

fn device_revoked(acct: &Account, device_id: &str) -> AccountEvent {
    AccountEvent::DeviceRevoked { revocation: wire(&acct.revocation(device_id, NOW - 10)) }
}

fn route_updated(v: &Value) -> AccountEvent {
    AccountEvent::RouteUpdated { route: wire(v) }
}

fn public_discovery(on: bool) -> AccountEvent {
    AccountEvent::SettingsUpdated { public_discovery: on }
}

fn contact_revoked(kind: &str, id: &str) -> AccountEvent {
    AccountEvent::ContactRevoked { kind: kind.into(), id: id.into() }
}

/// Alice on this relay with her phone (registration) and laptop.
fn alice_history() -> Vec<AccountEvent> {
    vec![registered(&alice(), &phone()), device_added(&alice(), &laptop())]
}

fn history(extra: impl IntoIterator<Item = AccountEvent>) -> Vec<AccountEvent> {
    let mut h = alice_history();
    h.extend(extra);
    h
}

/// An account as its actor has it: the state its events fold to, and its
/// ledger (which the actor keeps in the store, not in the state).
#[derive(Clone, Debug)]
struct Given {
    state: AccountState,
    ledger: Ledger,
}

impl Deref for Given {
    type Target = AccountState;
    fn deref(&self) -> &AccountState {
        &self.state
    }
}

impl Given {
    fn new(account_id: &str) -> Self {
        Given { state: AccountState::new(account_id), ledger: Ledger::default() }
    }

    fn apply(&mut self, e: &AccountEvent) {
        self.state.apply(e);
        self.ledger.apply(&self.state.account_id, e);
    }

    fn sent(&self, message_id: &str) -> &SendEntry {
        self.ledger.send(message_id).unwrap_or_else(|| panic!("no ledger entry for {message_id}"))
    }
}

/// The account an account's past events fold to.
fn given(acct: &Account, events: &[AccountEvent]) -> Given {
    let mut s = Given::new(&acct.id);
    for e in events {
        s.apply(e);
    }
    s
}

fn given_alice(extra: impl IntoIterator<Item = AccountEvent>) -> Given {
    given(&alice(), &history(extra))
}

// ---- commands -----------------------------------------------------------------

fn when_register(s: &AccountState, v: &Value, c: Ctx) -> Result<Vec<AccountEvent>, RelayError> {
    decide::register(s, &parse(v), &digest(v), None, c)
}

/// `account.register` when this relay (or a peer) knows `known` as the
/// account's highest route.
fn when_register_knowing(s: &AccountState, v: &Value, known: &Value, c: Ctx) -> Result<Vec<AccountEvent>, RelayError> {
    decide::register(s, &parse(v), &digest(v), Some(&wire(known)), c)
}

/// `message.send`, with the ledger's entry for its message id as the
/// actor reads it.
fn when_send(s: &Given, device: &str, v: &Value, c: Ctx) -> Result<SendDecision, RelayError> {
    let p: SendParams = parse(v);
    decide::send(s, s.ledger.send(&p.envelope.message_id), device, &p, &digest(v), c)
}

fn when_receive(s: &Given, v: &Value, c: Ctx) -> Result<ReceiveDecision, RelayError> {
    let p: DeliverParams = parse(v);
    decide::receive(s, s.ledger.receipt(&p.envelope.from, &p.envelope.message_id), &p, &digest(v), c)
}

fn record_delivery(s: &Given, message_id: &str, status: &DeliveryStatus) -> Vec<AccountEvent> {
    decide::record_delivery(s.ledger.send(message_id), message_id, status)
}

// ---- outcomes -----------------------------------------------------------------

#[track_caller]
fn then_error<T: Debug>(r: Result<T, RelayError>, code: ErrorCode) -> RelayError {
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
fn then_rejected<T: Debug>(r: Result<T, RelayError>) -> RelayError {
    match r {
        Ok(v) => panic!("expected a rejection, got Ok({v:?})"),
        Err(e) => e,
    }
}

/// A route error (`target_not_local`, or `route_stale` when the relay knows
/// the account's newer route) carrying the current route in `data.route`, so
/// the caller refreshes the route and retries.
#[track_caller]
fn then_route_error<T: Debug>(r: Result<T, RelayError>, current_route: &Value) {
    let e = then_rejected(r);
    assert!(matches!(e.code, ErrorCode::TargetNotLocal | ErrorCode::RouteStale), "expected a route error, got {e}");
    assert_eq!(e.data.as_ref().expect("data.route")["route"], *current_route);
}

#[track_caller]
fn then_events(r: Result<Vec<AccountEvent>, RelayError>) -> Vec<AccountEvent> {
    r.unwrap_or_else(|e| panic!("expected events, got {e}"))
}

#[track_caller]
fn then_no_events(r: Result<Vec<AccountEvent>, RelayError>) {
    let events = then_events(r);
    assert!(events.is_empty(), "expected no events, got {events:?}");
}

struct Sent {
    event: AccountEvent,
    status: DeliveryStatus,
    deliver: DeliverParams,
    deadline: u64,
}

#[track_caller]
fn then_sent(r: Result<SendDecision, RelayError>) -> Sent {
    match r {
        Ok(SendDecision::Sent { event, status, deliver, deadline }) => {
            Sent { event, status, deliver: *deliver, deadline }
        }
        other => panic!("expected Sent, got {other:?}"),
    }
}

#[track_caller]
fn then_self_delivered(r: Result<SendDecision, RelayError>) -> (AccountEvent, DeliveryStatus) {
    match r {
        Ok(SendDecision::SelfDelivered { event, status }) => (event, status),
        other => panic!("expected SelfDelivered, got {other:?}"),
    }
}

#[track_caller]
fn then_send_duplicate(r: Result<SendDecision, RelayError>) -> DeliveryStatus {
    match r {
        Ok(SendDecision::Duplicate(status)) => status,
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

#[track_caller]
fn then_accepted(r: Result<ReceiveDecision, RelayError>) -> (AccountEvent, DeliveryStatus) {
    match r {
        Ok(ReceiveDecision::Accepted { event, status }) => (*event, status),
        other => panic!("expected Accepted, got {other:?}"),
    }
}

#[track_caller]
fn then_receive_duplicate(r: Result<ReceiveDecision, RelayError>) -> DeliveryStatus {
    match r {
        Ok(ReceiveDecision::Duplicate(status)) => status,
        other => panic!("expected Duplicate, got {other:?}"),
    }
}

#[track_caller]
fn record_of(event: &AccountEvent) -> &Record {
    event.record().unwrap_or_else(|| panic!("expected a record in {event:?}"))
}

fn box_ids(r: &Record) -> Vec<String> {
    r.boxes.iter().map(|b| b.device_id.clone()).collect()
}

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

// ---- common messages ----------------------------------------------------------

/// Alice's phone → Bob, with sender boxes for Alice's phone and laptop.
fn alice_to_bob(n: u32) -> Value {
    send_value(envelope(&phone(), &alice(), &bob(), n, NOW), &["bob-phone"], Some(&["phone", "laptop"]))
}

/// Alice's phone → Alice (self-delivery).
fn alice_to_self(n: u32, recipients: &[&str]) -> Value {
    send_value(envelope(&phone(), &alice(), &alice(), n, NOW), recipients, None)
}

/// Bob's phone → Alice, as `message.deliver` params, with Alice's grant.
fn bob_to_alice(n: u32) -> Value {
    with_auth(bob_to_alice_without_auth(n), grant_auth(grant_alice_to_bob()))
}

fn bob_to_alice_without_auth(n: u32) -> Value {
    deliver_value(envelope(&bob_phone(), &bob(), &alice(), n, NOW), &["phone", "laptop"], cert(&bob(), &bob_phone()))
}

/// The event of an accepted `message.send` on `s` at `NOW`.
fn send_event(s: &Given, v: &Value) -> AccountEvent {
    match when_send(s, "phone", v, at(NOW)).expect("fixture send is accepted") {
        SendDecision::Sent { event, .. } | SendDecision::SelfDelivered { event, .. } => event,
        d => panic!("fixture send was {d:?}"),
    }
}

/// The event of an accepted receipt on `s` at `NOW`.
fn receive_event(s: &Given, v: &Value) -> AccountEvent {
    then_accepted(when_receive(s, v, at(NOW))).0
}

// =============================================================================
// account.register
// =============================================================================

#[test]
fn register_accepts_a_route_listing_this_relay_and_records_the_first_device() {
    let s = AccountState::new(&alice().id);
    let events = then_events(when_register(&s, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW)));
    assert_eq!(events.len(), 1);
    assert!(matches!(&events[0], AccountEvent::Registered { public_discovery: false, .. }));
    let s = given(&alice(), &events);
    assert!(s.is_registered());
    assert!(s.device_valid("phone", NOW));
    assert!(!s.public_discovery, "public discovery defaults to off");
}

#[test]
fn register_requires_the_route_to_list_this_relay() {
    let s = AccountState::new(&alice().id);
    let v = register_value(&alice(), &phone(), &["relay-b"], None);
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn register_accepts_this_relay_as_the_second_home_relay_of_the_route() {
    let s = AccountState::new(&alice().id);
    let v = register_value(&alice(), &phone(), &["relay-b", RELAY], None);
    assert_eq!(then_events(when_register(&s, &v, at(NOW))).len(), 1);
}

#[test]
fn register_requires_the_route_account_id_to_derive_from_the_account_key() {
    // Bob's id with Alice's key, properly signed by Alice's key.
    let forged = signed(
        Tag::Route,
        json!({"account_id": bob().id, "account_key": alice().public_key(), "revision": 1,
               "relays": [{"id": RELAY, "url": URL_A}], "issued_at": ISSUED}),
        &alice().key,
    );
    let v = json!({"route": forged, "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
    let s = AccountState::new(&bob().id);
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn register_requires_the_certificate_account_id_to_derive_from_its_account_key() {
    let forged =
        signed(Tag::DeviceCertificate, tampered(cert(&alice(), &phone()), "account_id", json!(bob().id)), &alice().key);
    let v = json!({"route": route(&alice(), 1, &[RELAY]), "device_certificate": forged, "registration": registration(&alice(), false)});
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn register_requires_the_route_to_be_for_the_account_being_registered() {
    let v = register_value(&alice(), &phone(), &[RELAY], None);
    then_error(when_register(&AccountState::new(&bob().id), &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn register_requires_the_certificate_to_name_the_same_account_as_the_route() {
    // A valid certificate, but of Bob's account.
    let v = json!({"route": route(&alice(), 1, &[RELAY]), "device_certificate": cert(&bob(), &bob_phone()), "registration": registration(&alice(), false)});
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn register_rejects_a_route_with_a_bad_signature() {
    let s = AccountState::new(&alice().id);
    let v = json!({"route": tampered(route(&alice(), 1, &[RELAY]), "revision", json!(2)),
                   "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    // Signed by another account's key.
    let by_bob = signed(Tag::Route, route(&alice(), 1, &[RELAY]), &bob().key);
    let v = json!({"route": by_bob, "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn register_rejects_a_route_signed_under_another_domain_tag() {
    let s = AccountState::new(&alice().id);
    let wrong_tag = signed(Tag::DeviceCertificate, route(&alice(), 1, &[RELAY]), &alice().key);
    let v = json!({"route": wrong_tag, "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn register_rejects_a_certificate_with_a_bad_signature() {
    let s = AccountState::new(&alice().id);
    let v = json!({"route": route(&alice(), 1, &[RELAY]),
                   "device_certificate": tampered(cert(&alice(), &phone()), "device_id", json!("other")),
                   "registration": registration(&alice(), false)});
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    let by_bob = signed(Tag::DeviceCertificate, cert(&alice(), &phone()), &bob().key);
    let v = json!({"route": route(&alice(), 1, &[RELAY]), "device_certificate": by_bob, "registration": registration(&alice(), false)});
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn identical_re_register_is_a_no_op() {
    let v = register_value(&alice(), &phone(), &[RELAY], Some(json!({"public_discovery": true})));
    let s = given(&alice(), &[registered_with(&alice(), &v)]);
    then_no_events(when_register(&s, &v, at(NOW + 60)));
}

#[test]
fn re_register_with_different_content_is_state_conflict() {
    let original = register_value(&alice(), &phone(), &[RELAY], None);
    let s = given(&alice(), &[registered_with(&alice(), &original)]);
    // Only optional-field presence differs.
    let with_settings = register_value(&alice(), &phone(), &[RELAY], Some(json!({"public_discovery": false})));
    then_error(when_register(&s, &with_settings, at(NOW)), ErrorCode::StateConflict);
    let other_device = register_value(&alice(), &laptop(), &[RELAY], None);
    then_error(when_register(&s, &other_device, at(NOW)), ErrorCode::StateConflict);
    // The original registration is untouched.
    then_no_events(when_register(&s, &original, at(NOW)));
}

#[test]
fn register_takes_public_discovery_from_the_signed_registration() {
    let v = register_value(&alice(), &phone(), &[RELAY], Some(json!({"public_discovery": true})));
    let s = given(&alice(), &[registered_with(&alice(), &v)]);
    assert!(s.public_discovery);
    let v = register_value(&alice(), &phone(), &[RELAY], None);
    let v = json!({"route": v["route"], "device_certificate": v["device_certificate"],
                   "registration": registration(&alice(), true)});
    assert!(given(&alice(), &[registered_with(&alice(), &v)]).public_discovery);
}

#[test]
fn register_refuses_unsigned_settings_that_disagree_with_the_registration() {
    let mut v = register_value(&alice(), &phone(), &[RELAY], None);
    v["settings"] = json!({"public_discovery": true});
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn register_requires_a_registration() {
    let mut v = register_value(&alice(), &phone(), &[RELAY], None);
    v.as_object_mut().unwrap().remove("registration");
    assert!(serde_json::from_str::<RegisterParams>(&v.to_string()).is_err());
}

#[test]
fn register_requires_the_registration_to_be_signed_by_the_account_key() {
    let mut v = register_value(&alice(), &phone(), &[RELAY], None);
    v["registration"] = signed(Tag::Registration, registration(&alice(), false), &bob().key);
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidSignature);
    // Public objects alone (a route and a certificate) are no registration,
    // whatever their tag says.
    v["registration"] = signed(Tag::Route, registration(&alice(), false), &alice().key);
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn register_requires_the_registration_to_name_this_relay_and_account() {
    let mut v = register_value(&alice(), &phone(), &[RELAY], None);
    v["registration"] = alice().registration("relay-b", false, NOW);
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
    v["registration"] =
        signed(Tag::Registration, tampered(registration(&alice(), false), "account_id", json!(bob().id)), &alice().key);
    then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn register_requires_a_registration_issued_within_the_clock_tolerance_both_ways() {
    let tolerance = POLICY.clock_tolerance;
    for issued in [NOW - tolerance - 1, NOW + tolerance + 1] {
        let mut v = register_value(&alice(), &phone(), &[RELAY], None);
        v["registration"] = alice().registration(RELAY, false, issued);
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
    }
    for issued in [NOW - tolerance, NOW + tolerance] {
        let mut v = register_value(&alice(), &phone(), &[RELAY], None);
        v["registration"] = alice().registration(RELAY, false, issued);
        assert_eq!(then_events(when_register(&AccountState::new(&alice().id), &v, at(NOW))).len(), 1);
    }
}

#[test]
fn register_refuses_a_route_older_than_the_highest_revision_known_here_or_at_peers() {
    let v = register_value(&alice(), &phone(), &[RELAY], None);
    let newer = route(&alice(), 2, &["relay-b"]);
    let e = when_register_knowing(&AccountState::new(&alice().id), &v, &newer, at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::RouteStale);
    assert_eq!(e.data.unwrap()["route"], newer);
    // Known at the same revision and equal: fine.
    let same = route(&alice(), 1, &[RELAY]);
    assert_eq!(then_events(when_register_knowing(&AccountState::new(&alice().id), &v, &same, at(NOW))).len(), 1);
}

#[test]
fn register_refuses_a_certificate_revoked_in_the_account_state() {
    let v = register_value(&alice(), &phone(), &[RELAY], None);
    let s = given(&alice(), &[registered_with(&alice(), &v), device_revoked(&alice(), "phone")]);
    then_error(when_register(&s, &v, at(NOW)), ErrorCode::DeviceUnknown);
}

// =============================================================================
// devices
// =============================================================================

#[test]
fn add_device_appends_device_added_for_a_new_certificate() {
    let s = given(&alice(), &[registered(&alice(), &phone())]);
    let events = then_events(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)));
    assert!(matches!(events.as_slice(), [AccountEvent::DeviceAdded { .. }]));
    let s = given(&alice(), &history([]));
    assert!(s.device_valid("laptop", NOW));
}

#[test]
fn add_device_with_the_identical_certificate_is_a_no_op() {
    let s = given_alice([]);
    then_no_events(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)));
}

#[test]
fn add_device_with_another_certificate_for_a_known_device_id_is_state_conflict() {
    let s = given_alice([]);
    // Same id "laptop", another key.
    let other = Device::from_seed("laptop", [99; 32]);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &other)), at(NOW)), ErrorCode::StateConflict);
    // Same key, other validity window.
    let reissued = alice().certificate(&laptop(), ISSUED + 1, None);
    then_error(decide::add_device(&s, &wire(&reissued), at(NOW)), ErrorCode::StateConflict);
}

#[test]
fn a_revoked_device_id_cannot_be_added_again() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)), ErrorCode::InvalidState);
    let fresh = Device::from_seed("laptop", [98; 32]);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &fresh)), at(NOW)), ErrorCode::InvalidState);
}

#[test]
fn add_device_refuses_a_certificate_of_another_account() {
    let s = given_alice([]);
    then_error(decide::add_device(&s, &wire(&cert(&bob(), &bob_phone())), at(NOW)), ErrorCode::Forbidden);
}

#[test]
fn add_device_rejects_a_certificate_not_signed_by_the_account_key() {
    let s = given_alice([]);
    let by_device = signed(Tag::DeviceCertificate, cert(&alice(), &tablet()), &tablet().key);
    then_error(decide::add_device(&s, &wire(&by_device), at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn add_device_on_an_unregistered_account_is_not_found() {
    let s = AccountState::new(&alice().id);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)), ErrorCode::NotFound);
}

#[test]
fn revoke_device_signed_by_the_account_key_appends_device_revoked() {
    let s = given_alice([]);
    let rev: Wire<DeviceRevocation> = wire(&alice().revocation("laptop", NOW));
    let events = then_events(decide::revoke_device(&s, &rev, at(NOW)));
    assert!(matches!(events.as_slice(), [AccountEvent::DeviceRevoked { .. }]));
    let s = given_alice(events);
    assert!(!s.device_valid("laptop", NOW));
    assert!(s.device_valid("phone", NOW));
}

#[test]
fn revoke_device_refuses_a_revocation_not_signed_by_the_account_key() {
    let s = given_alice([]);
    let by_device = signed(Tag::DeviceRevocation, alice().revocation("laptop", NOW), &phone().key);
    then_error(decide::revoke_device(&s, &wire(&by_device), at(NOW)), ErrorCode::InvalidSignature);
    let by_bob = signed(Tag::DeviceRevocation, alice().revocation("laptop", NOW), &bob().key);
    then_error(decide::revoke_device(&s, &wire(&by_bob), at(NOW)), ErrorCode::InvalidSignature);
    let wrong_tag = signed(Tag::DeviceCertificate, alice().revocation("laptop", NOW), &alice().key);
    then_error(decide::revoke_device(&s, &wire(&wrong_tag), at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn revoke_device_refuses_a_revocation_naming_another_account() {
    let s = given_alice([]);
    let other = signed(
        Tag::DeviceRevocation,
        json!({"account_id": bob().id, "device_id": "laptop", "revoked_at": NOW}),
        &alice().key,
    );
    then_error(decide::revoke_device(&s, &wire(&other), at(NOW)), ErrorCode::Forbidden);
}

#[test]
fn revoke_device_of_an_unknown_device_is_not_found() {
    let s = given_alice([]);
    then_error(decide::revoke_device(&s, &wire(&alice().revocation("tablet", NOW)), at(NOW)), ErrorCode::NotFound);
}

#[test]
fn revoking_an_already_revoked_device_is_a_no_op() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    then_no_events(decide::revoke_device(&s, &wire(&alice().revocation("laptop", NOW)), at(NOW)));
}

#[test]
fn a_revoked_devices_session_is_refused() {
    let s = given_alice([]);
    decide::check_session(&s, "laptop", at(NOW)).expect("laptop valid before revocation");
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    then_error(decide::check_session(&s, "laptop", at(NOW)), ErrorCode::Unauthorized);
    decide::check_session(&s, "phone", at(NOW)).expect("other devices keep their sessions");
}

#[test]
fn a_session_of_an_unknown_device_or_account_is_refused() {
    let s = given_alice([]);
    then_error(decide::check_session(&s, "tablet", at(NOW)), ErrorCode::Unauthorized);
    let unregistered = AccountState::new(&alice().id);
    then_error(decide::check_session(&unregistered, "phone", at(NOW)), ErrorCode::Unauthorized);
}

#[test]
fn an_expired_certificate_makes_the_device_invalid() {
    let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 100));
    let s = given_alice([device_added_cert(&expiring)]);
    assert!(s.device_valid("tablet", NOW + 99));
    decide::check_session(&s, "tablet", at(NOW + 99)).unwrap();
    assert!(!s.device_valid("tablet", NOW + 100));
    then_error(decide::check_session(&s, "tablet", at(NOW + 100)), ErrorCode::Unauthorized);
    // It can no longer send ...
    let v = send_value(envelope(&tablet(), &alice(), &bob(), 1, NOW + 100), &["bob-phone"], None);
    then_error(when_send(&s, "tablet", &v, at(NOW + 100)), ErrorCode::DeviceUnknown);
    // ... nor be the only reader of a record.
    let v = send_value(envelope(&phone(), &alice(), &alice(), 2, NOW + 100), &["tablet"], None);
    then_error(when_send(&s, "phone", &v, at(NOW + 100)), ErrorCode::DeviceUnknown);
}

#[test]
fn add_device_refuses_an_already_expired_certificate() {
    let s = given_alice([]);
    let expired = alice().certificate(&tablet(), ISSUED, Some(NOW));
    then_rejected(decide::add_device(&s, &wire(&expired), at(NOW)));
}

// =============================================================================
// route.update, settings and contacts
// =============================================================================

#[test]
fn route_update_with_a_higher_revision_replaces_the_route() {
    let s = given_alice([]);
    let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
    let events = then_events(decide::update_route(&s, &wire(&r2), at(NOW)));
    assert!(matches!(events.as_slice(), [AccountEvent::RouteUpdated { .. }]));
    let s = given_alice(events);
    assert_eq!(s.route().unwrap().revision, 2);
}

#[test]
fn route_update_with_an_equal_revision_is_a_no_op_when_identical_and_state_conflict_otherwise() {
    let s = given_alice([]);
    then_no_events(decide::update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)));
    let other = route(&alice(), 1, &[RELAY, "relay-b"]);
    then_error(decide::update_route(&s, &wire(&other), at(NOW)), ErrorCode::StateConflict);
}

#[test]
fn route_update_with_a_lower_revision_is_route_stale_carrying_the_newer_route() {
    let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
    let s = given_alice([route_updated(&r2)]);
    let e = then_error(decide::update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)), ErrorCode::RouteStale);
    assert_eq!(e.data.unwrap()["route"], r2);
}

#[test]
fn settings_update_is_a_no_op_when_unchanged() {
    let s = given_alice([]);
    then_no_events(decide::update_settings(&s, false));
    let events = then_events(decide::update_settings(&s, true));
    assert!(given_alice(events).public_discovery);
}

#[test]
fn contact_revoke_is_idempotent_and_keyed_by_kind_and_id() {
    let s = given_alice([]);
    let p = ContactRevokeParams { grant_id: Some("grant-bob".into()), invite_id: None };
    let events = then_events(decide::revoke_contact(&s, &p));
    assert_eq!(events.len(), 1);
    let s = given_alice(events);
    then_no_events(decide::revoke_contact(&s, &p));
    // An invite with the same id is another credential.
    let invite = ContactRevokeParams { grant_id: None, invite_id: Some("grant-bob".into()) };
    assert_eq!(then_events(decide::revoke_contact(&s, &invite)).len(), 1);
    let both = ContactRevokeParams { grant_id: Some("a".into()), invite_id: Some("b".into()) };
    then_error(decide::revoke_contact(&s, &both), ErrorCode::InvalidParams);
}

// =============================================================================
// message.send at the source
// =============================================================================

#[test]
fn send_requires_the_session_account_to_be_the_envelope_sender() {
    let s = given_alice([]);
    // Bob's envelope, properly signed by Bob's device, submitted on Alice's account.
    let v = send_value(envelope(&bob_phone(), &bob(), &alice(), 1, NOW), &["phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::Forbidden);
    then_error(when_send(&s, "bob-phone", &v, at(NOW)), ErrorCode::Forbidden);
}

#[test]
fn send_requires_the_session_device_to_be_the_envelope_sending_device() {
    let s = given_alice([]);
    let v = send_value(envelope(&laptop(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::Forbidden);
    then_sent(when_send(&s, "laptop", &v, at(NOW)));
}

#[test]
fn send_rejects_a_forged_envelope_signature() {
    let s = given_alice([]);
    // Claims to be from the phone, signed by a key that is not the phone's.
    let forged = signed(Tag::Envelope, envelope(&phone(), &alice(), &bob(), 1, NOW), &tablet().key);
    let v = send_value(forged, &["bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidSignature);
    // The phone's signature over other content.
    let altered = tampered(envelope(&phone(), &alice(), &bob(), 1, NOW), "created_at", json!(NOW - 1));
    let v = send_value(altered, &["bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn send_rejects_an_envelope_signed_under_another_domain_tag() {
    let s = given_alice([]);
    let wrong_tag = signed(Tag::Route, envelope(&phone(), &alice(), &bob(), 1, NOW), &phone().key);
    let v = send_value(wrong_tag, &["bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn send_rejects_ciphertext_over_the_size_limit() {
    let s = given_alice([]);
    let max = POLICY.max_ciphertext_bytes;
    let over = phone().envelope(&alice().id, &bob().id, &mid(1), NOW, &vec![7u8; max + 1]);
    then_error(when_send(&s, "phone", &send_value(over, &["bob-phone"], None), at(NOW)), ErrorCode::PayloadTooLarge);
    let at_limit = phone().envelope(&alice().id, &bob().id, &mid(2), NOW, &vec![7u8; max]);
    then_sent(when_send(&s, "phone", &send_value(at_limit, &["bob-phone"], None), at(NOW)));
}

#[test]
fn send_rejects_ciphertext_that_is_not_base64url_without_padding() {
    let s = given_alice([]);
    for bad in ["AQ==", "a+b/", "AQID!"] {
        let env = signed(
            Tag::Envelope,
            tampered(envelope(&phone(), &alice(), &bob(), 1, NOW), "ciphertext", json!(bad)),
            &phone().key,
        );
        let v = send_value(env, &["bob-phone"], None);
        then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
    }
}

#[test]
fn send_rejects_an_empty_ciphertext() {
    let s = given_alice([]);
    let env = phone().envelope(&alice().id, &bob().id, &mid(1), NOW, b"");
    then_error(when_send(&s, "phone", &send_value(env, &["bob-phone"], None), at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn send_requires_key_boxes_with_distinct_device_ids() {
    let s = given_alice([]);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone", "bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone"], Some(&["phone", "phone"]));
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &[], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn send_rejects_created_at_beyond_the_clock_tolerance() {
    let s = given_alice([]);
    let tol = POLICY.clock_tolerance;
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW + tol + 1), &["bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::ClockSkew);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 2, NOW + tol), &["bob-phone"], None);
    then_sent(when_send(&s, "phone", &v, at(NOW)));
}

#[test]
fn send_rejects_created_at_older_than_the_delivery_age_limit() {
    let s = given_alice([]);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW - age_limit() - 1), &["bob-phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::MessageExpired);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 2, NOW - age_limit() + 1), &["bob-phone"], None);
    then_sent(when_send(&s, "phone", &v, at(NOW)));
}

#[test]
fn send_from_a_revoked_or_unknown_device_is_device_unknown() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    let v = send_value(envelope(&laptop(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
    then_error(when_send(&s, "laptop", &v, at(NOW)), ErrorCode::DeviceUnknown);
    let v = send_value(envelope(&tablet(), &alice(), &bob(), 2, NOW), &["bob-phone"], None);
    then_error(when_send(&s, "tablet", &v, at(NOW)), ErrorCode::DeviceUnknown);
}

#[test]
fn send_is_refused_when_this_relay_no_longer_serves_the_sender() {
    let moved = route(&alice(), 2, &["relay-b"]);
    let s = given_alice([route_updated(&moved)]);
    then_route_error(when_send(&s, "phone", &alice_to_bob(1), at(NOW)), &moved);
}

#[test]
fn send_accepts_with_status_delivering_at_the_source_acceptance_time() {
    let s = given_alice([]);
    let sent = then_sent(when_send(&s, "phone", &alice_to_bob(1), at(NOW + 7)));
    assert_eq!(sent.status, DeliveryStatus::delivering(NOW + 7));
    match &sent.event {
        AccountEvent::MessageSent { message_id, to, accepted_at, retention_until, .. } => {
            assert_eq!(message_id, &mid(1));
            assert_eq!(to, &bob().id);
            assert_eq!(*accepted_at, NOW + 7);
            assert_eq!(*retention_until, NOW + 7 + retention());
        }
        e => panic!("expected MessageSent, got {e:?}"),
    }
}

#[test]
fn send_forwards_the_original_envelope_recipient_boxes_certificate_on_file_and_authorization() {
    let s = given_alice([]);
    let auth = grant_auth(bob().grant("grant-alice", &alice().id, ISSUED, None));
    let v = with_auth(alice_to_bob(1), auth.clone());
    let sent = then_sent(when_send(&s, "phone", &v, at(NOW)));
    let forwarded = serde_json::to_value(&sent.deliver).unwrap();
    assert_eq!(sent.deliver.envelope.raw().get(), v["envelope"].to_string());
    assert_eq!(forwarded["envelope"], v["envelope"]);
    assert_eq!(forwarded["recipient_boxes"], v["recipient_boxes"]);
    assert_eq!(forwarded["sender_device_certificate"], cert(&alice(), &phone()));
    assert_eq!(forwarded["authorization"], auth);
    // Sender key boxes remain at the source.
    assert!(forwarded.get("sender_boxes").is_none());
}

#[test]
fn send_retry_with_identical_content_returns_the_original_status_and_appends_nothing() {
    let s = given_alice([]);
    let v = alice_to_bob(1);
    let s = given_alice([send_event(&s, &v)]);
    let status = then_send_duplicate(when_send(&s, "phone", &v, at(NOW + 60)));
    assert_eq!(status, DeliveryStatus::delivering(NOW));
    // The latest known status, still with the original accepted_at.
    let done = record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 5));
    let s2 = {
        let mut s2 = s.clone();
        done.iter().for_each(|e| s2.apply(e));
        s2
    };
    let status = then_send_duplicate(when_send(&s2, "phone", &v, at(NOW + 120)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
}

#[test]
fn send_retry_with_different_content_is_state_conflict_and_leaves_the_original_untouched() {
    let s = given_alice([]);
    let original = alice_to_bob(1);
    let s = given_alice([send_event(&s, &original)]);
    let entry_before = s.sent(&mid(1)).clone();
    // Other ciphertext under the same message id.
    let other_env = phone().envelope(&alice().id, &bob().id, &mid(1), NOW, b"other ciphertext");
    let other = send_value(other_env, &["bob-phone"], Some(&["phone", "laptop"]));
    then_error(when_send(&s, "phone", &other, at(NOW + 1)), ErrorCode::StateConflict);
    // Only optional-field presence differs.
    let without_sender_boxes = send_value(original["envelope"].clone(), &["bob-phone"], None);
    then_error(when_send(&s, "phone", &without_sender_boxes, at(NOW + 1)), ErrorCode::StateConflict);
    // Only array order differs.
    let reordered = send_value(original["envelope"].clone(), &["bob-phone"], Some(&["laptop", "phone"]));
    then_error(when_send(&s, "phone", &reordered, at(NOW + 1)), ErrorCode::StateConflict);
    assert_eq!(*s.sent(&mid(1)), entry_before);
    then_send_duplicate(when_send(&s, "phone", &original, at(NOW + 2)));
}

#[test]
fn send_retry_after_result_retention_is_message_expired() {
    // Retention shorter than the age limit, so only the retention rule can
    // reject the retry.
    let mut short = Policy::with_relay_id(RELAY);
    short.message_retention = 600;
    let s = given_alice([]);
    let v = alice_to_bob(1);
    let event = then_sent(when_send(&s, "phone", &v, under(&short, NOW))).event;
    let s = given_alice([event]);
    then_send_duplicate(when_send(&s, "phone", &v, under(&short, NOW + 599)));
    then_error(when_send(&s, "phone", &v, under(&short, NOW + 601)), ErrorCode::MessageExpired);
}

#[test]
fn result_retention_promised_at_acceptance_is_not_shortened_by_a_later_policy() {
    let s = given_alice([]);
    let v = alice_to_bob(1);
    let s = given_alice([send_event(&s, &v)]);
    let mut shorter = Policy::with_relay_id(RELAY);
    shorter.message_retention = 3600;
    let status = then_send_duplicate(when_send(&s, "phone", &v, under(&shorter, NOW + 2 * 86_400)));
    assert_eq!(status.accepted_at, NOW);
}

#[test]
fn send_deadline_is_created_at_plus_the_age_limit_when_that_is_earlier() {
    let s = given_alice([]);
    let created_at = NOW - 600;
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, created_at), &["bob-phone"], None);
    let sent = then_sent(when_send(&s, "phone", &v, at(NOW)));
    assert_eq!(sent.deadline, created_at + age_limit());
    assert!(matches!(sent.event, AccountEvent::MessageSent { deadline, .. } if deadline == created_at + age_limit()));
    let s = given_alice([sent.event]);
    assert_eq!(s.sent(&mid(1)).deadline, created_at + age_limit());
}

#[test]
fn send_deadline_is_accepted_at_plus_retention_when_that_is_earlier() {
    let mut short = Policy::with_relay_id(RELAY);
    short.message_retention = 1800;
    let s = given_alice([]);
    let v = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
    let sent = then_sent(when_send(&s, "phone", &v, under(&short, NOW + 10)));
    assert_eq!(sent.deadline, NOW + 10 + 1800);
    assert!(matches!(sent.event, AccountEvent::MessageSent { deadline, retention_until, .. }
        if deadline == NOW + 10 + 1800 && retention_until == NOW + 10 + 1800));
}

#[test]
fn send_appends_a_sent_record_only_when_sender_boxes_are_given() {
    let s = given_alice([]);
    let without = send_value(envelope(&phone(), &alice(), &bob(), 1, NOW), &["bob-phone"], None);
    let sent = then_sent(when_send(&s, "phone", &without, at(NOW)));
    assert!(sent.event.record().is_none());
    let s = given_alice([sent.event]);
    assert_eq!(s.last_sequence, 0, "no sequence is used without a record");
    assert_eq!(s.sent(&mid(1)).sequence, None);

    let with = alice_to_bob(2);
    let sent = then_sent(when_send(&s, "phone", &with, at(NOW)));
    let r = record_of(&sent.event);
    assert_eq!(r.sequence, 1);
    assert_eq!(box_ids(r), strings(&["phone", "laptop"]));
    assert_eq!(r.envelope.raw().get(), with["envelope"].to_string());
    assert_eq!(r.expires_at, NOW + retention());
    let s = given_alice([sent.event]);
    assert_eq!(s.last_sequence, 1);
}

#[test]
fn sent_record_is_visible_only_to_devices_valid_at_acceptance_among_sender_boxes() {
    let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 10));
    let s = given_alice([device_revoked(&alice(), "laptop"), device_added_cert(&expiring)]);
    let v = send_value(
        envelope(&phone(), &alice(), &bob(), 1, NOW + 10),
        &["bob-phone"],
        Some(&["phone", "laptop", "tablet", "unknown-device"]),
    );
    let sent = then_sent(when_send(&s, "phone", &v, at(NOW + 10)));
    let r = record_of(&sent.event);
    assert_eq!(r.visible, strings(&["phone"]));
    // The record keeps every box as submitted.
    assert_eq!(box_ids(r), strings(&["phone", "laptop", "tablet", "unknown-device"]));
}

// =============================================================================
// account self-delivery
// =============================================================================

#[test]
fn self_delivery_appends_exactly_one_record_and_returns_target_accepted() {
    let s = given_alice([]);
    // Sender boxes, if any, are not used for self-delivery.
    let mut v = alice_to_self(1, &["phone", "laptop"]);
    v["sender_boxes"] = boxes(&["phone"]);
    let (event, status) = then_self_delivered(when_send(&s, "phone", &v, at(NOW)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    assert!(matches!(event, AccountEvent::SelfDelivered { .. }));
    let r = record_of(&event);
    assert_eq!(r.sequence, 1);
    assert_eq!(box_ids(r), strings(&["phone", "laptop"]));
    let s = given_alice([event]);
    assert_eq!(s.last_sequence, 1);
    assert_eq!(s.sent(&mid(1)).status, DeliveryStatus::target_accepted(NOW));
}

#[test]
fn self_delivery_needs_no_contact_authorization() {
    let s = given_alice([]);
    assert!(!s.public_discovery);
    then_self_delivered(when_send(&s, "phone", &alice_to_self(1, &["laptop"]), at(NOW)));
}

#[test]
fn self_delivery_stores_the_complete_recipient_boxes_but_only_valid_devices_may_read() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    let v = alice_to_self(1, &["phone", "laptop", "tablet"]);
    let (event, _) = then_self_delivered(when_send(&s, "phone", &v, at(NOW)));
    let r = record_of(&event);
    assert_eq!(box_ids(r), strings(&["phone", "laptop", "tablet"]));
    assert_eq!(r.visible, strings(&["phone"]));
}

#[test]
fn self_delivery_device_visibility_is_fixed_at_acceptance() {
    let s = given_alice([]);
    // The tablet has a box but is not a device yet.
    let v = alice_to_self(1, &["phone", "tablet"]);
    let event = send_event(&s, &v);
    assert_eq!(record_of(&event).visible, strings(&["phone"]));
    // Adding the tablet later neither re-decides nor appends anything.
    let s = given_alice([event.clone(), device_added(&alice(), &tablet())]);
    assert!(s.device_valid("tablet", NOW));
    let status = then_send_duplicate(when_send(&s, "phone", &v, at(NOW + 5)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    assert_eq!(s.last_sequence, 1);
    assert_eq!(record_of(&event).visible, strings(&["phone"]));
}

#[test]
fn self_delivery_with_every_recipient_box_naming_an_unavailable_device_is_device_unknown() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    let v = alice_to_self(1, &["laptop", "tablet"]);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::DeviceUnknown);
}

#[test]
fn self_delivery_retry_returns_target_accepted_with_the_original_accepted_at() {
    let s = given_alice([]);
    let v = alice_to_self(1, &["phone", "laptop"]);
    let s = given_alice([send_event(&s, &v)]);
    let status = then_send_duplicate(when_send(&s, "phone", &v, at(NOW + 30)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    let other = alice_to_self(1, &["phone"]);
    then_error(when_send(&s, "phone", &other, at(NOW + 30)), ErrorCode::StateConflict);
}

#[test]
fn self_delivery_still_meets_the_clock_rules() {
    let s = given_alice([]);
    let v = send_value(envelope(&phone(), &alice(), &alice(), 1, NOW + POLICY.clock_tolerance + 1), &["phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::ClockSkew);
    let v = send_value(envelope(&phone(), &alice(), &alice(), 2, NOW - age_limit() - 1), &["phone"], None);
    then_error(when_send(&s, "phone", &v, at(NOW)), ErrorCode::MessageExpired);
}

// =============================================================================
// receiving validation rules (decide::receive at the destination)
// =============================================================================

#[test]
fn receive_accepts_a_valid_delivery_with_target_accepted_at_the_destination_time() {
    let s = given_alice([]);
    let (event, status) = then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW + 3)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW + 3));
    match &event {
        AccountEvent::MessageReceived { from, message_id, accepted_at, retention_until, record, .. } => {
            assert_eq!(from, &bob().id);
            assert_eq!(message_id, &mid(1));
            assert_eq!(*accepted_at, NOW + 3);
            assert_eq!(*retention_until, NOW + 3 + retention());
            assert_eq!(record.sequence, 1);
            assert_eq!(record.visible, strings(&["phone", "laptop"]));
            assert_eq!(record.envelope.raw().get(), bob_to_alice(1)["envelope"].to_string());
        }
        e => panic!("expected MessageReceived, got {e:?}"),
    }
}

// Rule 1.

#[test]
fn receive_requires_the_recipients_current_route_to_designate_this_relay() {
    let moved = route(&alice(), 2, &["relay-b"]);
    let s = given_alice([route_updated(&moved)]);
    then_route_error(when_receive(&s, &bob_to_alice(1), at(NOW)), &moved);
}

#[test]
fn receive_accepts_at_either_home_relay_of_the_route() {
    let s = given_alice([route_updated(&route(&alice(), 2, &["relay-b", RELAY]))]);
    then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW)));
}

#[test]
fn receive_for_an_unregistered_account_is_not_found() {
    let s = Given::new(&alice().id);
    then_error(when_receive(&s, &bob_to_alice(1), at(NOW)), ErrorCode::NotFound);
}

#[test]
fn receive_requires_the_envelope_to_be_addressed_to_this_account() {
    let s = given_alice([]);
    let to_carol = envelope(&bob_phone(), &bob(), &carol(), 1, NOW);
    let v =
        with_auth(deliver_value(to_carol, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidParams);
}

// Rule 2.

#[test]
fn receive_requires_the_envelope_and_boxes_to_meet_the_object_constraints() {
    let s = given_alice([]);
    let big = bob_phone().envelope(&bob().id, &alice().id, &mid(1), NOW, &vec![0u8; POLICY.max_ciphertext_bytes + 1]);
    let v = with_auth(deliver_value(big, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::PayloadTooLarge);
    let mut v = bob_to_alice(2);
    v["recipient_boxes"] = json!([{"device_id": "phone", "box": "AQ=="}]);
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidParams);
}

#[test]
fn receive_rejects_a_sender_certificate_with_a_bad_signature() {
    let s = given_alice([]);
    let mut v = bob_to_alice(1);
    v["sender_device_certificate"] = tampered(cert(&bob(), &bob_phone()), "issued_at", json!(ISSUED - 1));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    // Signed by the device instead of the account.
    v["sender_device_certificate"] = signed(Tag::DeviceCertificate, cert(&bob(), &bob_phone()), &bob_phone().key);
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    // Signed under another tag.
    v["sender_device_certificate"] = signed(Tag::Route, cert(&bob(), &bob_phone()), &bob().key);
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn receive_rejects_a_sender_certificate_whose_account_id_does_not_derive_from_its_key() {
    let s = given_alice([]);
    // Carol's key certifying a device under Bob's id, so that it "matches" the envelope.
    let forged = signed(
        Tag::DeviceCertificate,
        tampered(
            tampered(cert(&bob(), &bob_phone()), "account_key", json!(carol().public_key())),
            "account_id",
            json!(bob().id),
        ),
        &carol().key,
    );
    let mut v = bob_to_alice(1);
    v["sender_device_certificate"] = forged;
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn receive_requires_the_certificate_to_match_envelope_from_and_from_device_id() {
    let s = given_alice([]);
    // In each case the envelope signature verifies under the certificate's
    // device key, so only the match rule can reject it.
    let bob_phone_key = [21; 32];
    // A valid certificate of another account (Carol certifies Bob's phone key).
    let mut v = bob_to_alice(1);
    v["sender_device_certificate"] = cert(&carol(), &Device::from_seed("bob-phone", bob_phone_key));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    // A valid certificate of the sender for another device id with the same key.
    let mut v = bob_to_alice(2);
    v["sender_device_certificate"] = cert(&bob(), &Device::from_seed("bob-laptop", bob_phone_key));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    // A valid certificate of another device of the sender, envelope signed by the named device.
    let env = envelope(&bob_laptop(), &bob(), &alice(), 3, NOW);
    let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn receive_requires_the_envelope_to_be_signed_by_the_certified_device() {
    let s = given_alice([]);
    let by_other_device = signed(Tag::Envelope, envelope(&bob_phone(), &bob(), &alice(), 1, NOW), &bob_laptop().key);
    let v = with_auth(
        deliver_value(by_other_device, &["phone"], cert(&bob(), &bob_phone())),
        grant_auth(grant_alice_to_bob()),
    );
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    let altered = tampered(envelope(&bob_phone(), &bob(), &alice(), 2, NOW), "ciphertext", json!("AQID"));
    let v = with_auth(deliver_value(altered, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn receive_rejects_an_envelope_signed_under_another_domain_tag() {
    let s = given_alice([]);
    let wrong_tag = signed(Tag::Session, envelope(&bob_phone(), &bob(), &alice(), 1, NOW), &bob_phone().key);
    let v =
        with_auth(deliver_value(wrong_tag, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn receive_rejects_an_expired_or_not_yet_valid_sender_certificate() {
    let s = given_alice([]);
    let mut v = bob_to_alice(1);
    v["sender_device_certificate"] = bob().certificate(&bob_phone(), ISSUED, Some(NOW));
    then_rejected(when_receive(&s, &v, at(NOW)));
    v["sender_device_certificate"] = bob().certificate(&bob_phone(), NOW + POLICY.clock_tolerance + 1, None);
    then_rejected(when_receive(&s, &v, at(NOW)));
}

// Rule 3.

#[test]
fn receive_applies_the_destinations_own_clock_tolerance() {
    let s = given_alice([]);
    let mut strict = Policy::with_relay_id(RELAY);
    strict.clock_tolerance = 60;
    // Within the default (source) tolerance, beyond the destination's.
    let env = envelope(&bob_phone(), &bob(), &alice(), 1, NOW + 120);
    let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_accepted(when_receive(&s, &v, at(NOW)));
    then_error(when_receive(&s, &v, under(&strict, NOW)), ErrorCode::ClockSkew);
}

#[test]
fn receive_applies_the_destinations_own_delivery_age_limit() {
    let s = given_alice([]);
    let mut strict = Policy::with_relay_id(RELAY);
    strict.delivery_age_limit = 600;
    let env = envelope(&bob_phone(), &bob(), &alice(), 1, NOW - 1200);
    let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_accepted(when_receive(&s, &v, at(NOW)));
    then_error(when_receive(&s, &v, under(&strict, NOW)), ErrorCode::MessageExpired);
    let env = envelope(&bob_phone(), &bob(), &alice(), 2, NOW - age_limit() - 1);
    let v = with_auth(deliver_value(env, &["phone"], cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::MessageExpired);
}

// Rule 4.

#[test]
fn receive_without_authorization_requires_public_discovery() {
    let s = given_alice([]);
    then_error(when_receive(&s, &bob_to_alice_without_auth(1), at(NOW)), ErrorCode::Forbidden);
    let s = given_alice([public_discovery(true)]);
    then_accepted(when_receive(&s, &bob_to_alice_without_auth(1), at(NOW)));
}

#[test]
fn receive_accepts_a_valid_contact_grant_from_the_recipient_to_the_sender() {
    let s = given_alice([]);
    assert!(!s.public_discovery);
    then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW)));
    // Grants without expiry are valid too.
    let open_ended = alice().grant("grant-open", &bob().id, ISSUED, None);
    let v = with_auth(bob_to_alice_without_auth(2), grant_auth(open_ended));
    then_accepted(when_receive(&s, &v, at(NOW)));
}

#[test]
fn receive_accepts_a_contact_invite_issued_by_the_recipient() {
    let s = given_alice([]);
    let invite = alice().invite("invite-1", ISSUED, NOW + 3600);
    let v = with_auth(bob_to_alice_without_auth(1), invite_auth(invite));
    then_accepted(when_receive(&s, &v, at(NOW)));
}

/// Every invalid credential is `forbidden`, with or without public discovery.
#[track_caller]
fn then_forbidden_without_fallback(extra: Vec<AccountEvent>, auth: Value) {
    for discovery in [false, true] {
        let mut events = extra.clone();
        events.push(public_discovery(discovery));
        let s = given_alice(events);
        let v = with_auth(bob_to_alice_without_auth(1), auth.clone());
        then_error(when_receive(&s, &v, at(NOW)), ErrorCode::Forbidden);
        // The same message without credentials is accepted under public discovery.
        if discovery {
            then_accepted(when_receive(&s, &bob_to_alice_without_auth(1), at(NOW)));
        }
    }
}

#[test]
fn receive_refuses_a_grant_to_another_account_without_falling_back_to_public_discovery() {
    let to_carol = alice().grant("grant-carol", &carol().id, ISSUED, None);
    then_forbidden_without_fallback(vec![], grant_auth(to_carol));
}

#[test]
fn receive_refuses_a_grant_from_another_account_without_falling_back_to_public_discovery() {
    let from_carol = carol().grant("grant-bob", &bob().id, ISSUED, None);
    then_forbidden_without_fallback(vec![], grant_auth(from_carol));
}

#[test]
fn receive_refuses_an_expired_grant_without_falling_back_to_public_discovery() {
    let expired = alice().grant("grant-bob", &bob().id, ISSUED, Some(NOW));
    then_forbidden_without_fallback(vec![], grant_auth(expired));
    let future = alice().grant("grant-bob", &bob().id, NOW + POLICY.clock_tolerance + 1, None);
    then_forbidden_without_fallback(vec![], grant_auth(future));
}

#[test]
fn receive_refuses_a_grant_with_a_bad_signature_without_falling_back_to_public_discovery() {
    let altered = tampered(grant_alice_to_bob(), "expires_at", json!(NOW + 10 * 86_400));
    then_forbidden_without_fallback(vec![], grant_auth(altered));
    // Alice's grant signed by someone else's key.
    let by_bob = signed(Tag::ContactGrant, grant_alice_to_bob(), &bob().key);
    then_forbidden_without_fallback(vec![], grant_auth(by_bob));
    // Alice's key, another object's tag.
    let wrong_tag = signed(Tag::ContactInvite, grant_alice_to_bob(), &alice().key);
    then_forbidden_without_fallback(vec![], grant_auth(wrong_tag));
}

#[test]
fn receive_refuses_a_revoked_grant_without_falling_back_to_public_discovery() {
    then_forbidden_without_fallback(vec![contact_revoked("grant", "grant-bob")], grant_auth(grant_alice_to_bob()));
}

#[test]
fn receive_refuses_an_invalid_invite_without_falling_back_to_public_discovery() {
    let expired = alice().invite("invite-1", ISSUED, NOW);
    then_forbidden_without_fallback(vec![], invite_auth(expired));
    let foreign = carol().invite("invite-1", ISSUED, NOW + 3600);
    then_forbidden_without_fallback(vec![], invite_auth(foreign));
    let altered = tampered(alice().invite("invite-1", ISSUED, NOW + 3600), "expires_at", json!(NOW + 7200));
    then_forbidden_without_fallback(vec![], invite_auth(altered));
    then_forbidden_without_fallback(
        vec![contact_revoked("invite", "invite-1")],
        invite_auth(alice().invite("invite-1", ISSUED, NOW + 3600)),
    );
}

#[test]
fn revoking_an_invite_does_not_revoke_a_grant_with_the_same_id() {
    let s = given_alice([contact_revoked("invite", "grant-bob")]);
    then_accepted(when_receive(&s, &bob_to_alice(1), at(NOW)));
}

// Rule 5.

#[test]
fn receive_requires_at_least_one_recipient_device_valid_now() {
    let expired = alice().certificate(&tablet(), ISSUED, Some(NOW));
    let s = given_alice([device_revoked(&alice(), "laptop"), device_added_cert(&expired)]);
    let mut v = bob_to_alice(1);
    v["recipient_boxes"] = boxes(&["laptop", "tablet", "unknown-device"]);
    then_error(when_receive(&s, &v, at(NOW)), ErrorCode::DeviceUnknown);
}

#[test]
fn receive_accepts_when_some_recipient_devices_are_unavailable_and_they_cannot_read_the_record() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    let mut v = bob_to_alice(1);
    v["recipient_boxes"] = boxes(&["laptop", "phone", "tablet"]);
    let (event, _) = then_accepted(when_receive(&s, &v, at(NOW)));
    let r = record_of(&event);
    assert_eq!(r.visible, strings(&["phone"]));
    assert_eq!(box_ids(r), strings(&["laptop", "phone", "tablet"]));
}

#[test]
fn receive_accepts_boxes_that_do_not_cover_every_current_device() {
    let s = given_alice([]);
    let mut v = bob_to_alice(1);
    v["recipient_boxes"] = boxes(&["laptop"]);
    let (event, _) = then_accepted(when_receive(&s, &v, at(NOW)));
    assert_eq!(record_of(&event).visible, strings(&["laptop"]));
}

// Idempotency at the destination.

#[test]
fn receive_retry_with_identical_content_returns_target_accepted_with_the_original_accepted_at() {
    let s = given_alice([]);
    let v = bob_to_alice(1);
    let s = given_alice([receive_event(&s, &v)]);
    let status = then_receive_duplicate(when_receive(&s, &v, at(NOW + 60)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
    assert_eq!(s.last_sequence, 1);
}

#[test]
fn receive_retry_is_not_negated_by_later_device_authorization_or_age_changes() {
    let s = given_alice([]);
    let v = bob_to_alice(1);
    let accepted = receive_event(&s, &v);
    let s = given_alice([
        accepted,
        device_revoked(&alice(), "phone"),
        device_revoked(&alice(), "laptop"),
        contact_revoked("grant", "grant-bob"),
    ]);
    // Every recipient device gone, the grant revoked, and past the age limit.
    let later = NOW + age_limit() + 60;
    let status = then_receive_duplicate(when_receive(&s, &v, at(later)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
}

#[test]
fn receive_retry_with_different_content_is_state_conflict() {
    let s = given_alice([]);
    let v = bob_to_alice(1);
    let s = given_alice([receive_event(&s, &v)]);
    let mut other_boxes = v.clone();
    other_boxes["recipient_boxes"] = boxes(&["phone"]);
    then_error(when_receive(&s, &other_boxes, at(NOW + 1)), ErrorCode::StateConflict);
    let without_auth = bob_to_alice_without_auth(1);
    then_error(when_receive(&s, &without_auth, at(NOW + 1)), ErrorCode::StateConflict);
    // The original result is untouched.
    assert_eq!(then_receive_duplicate(when_receive(&s, &v, at(NOW + 2))), DeliveryStatus::target_accepted(NOW));
}

#[test]
fn receive_idempotency_key_is_the_sender_and_the_message_id() {
    let s = given_alice([]);
    let s = given_alice([receive_event(&s, &bob_to_alice(1))]);
    // The same message id from another account is another message.
    let env = envelope(&carol_phone(), &carol(), &alice(), 1, NOW);
    let grant = alice().grant("grant-carol", &carol().id, ISSUED, None);
    let v = with_auth(deliver_value(env, &["phone"], cert(&carol(), &carol_phone())), grant_auth(grant));
    let (event, _) = then_accepted(when_receive(&s, &v, at(NOW)));
    assert_eq!(record_of(&event).sequence, 2);
}

#[test]
fn receive_retry_after_result_retention_is_message_expired() {
    let mut short = Policy::with_relay_id(RELAY);
    short.message_retention = 600;
    let s = given_alice([]);
    let v = bob_to_alice(1);
    let event = then_accepted(when_receive(&s, &v, under(&short, NOW))).0;
    let s = given_alice([event]);
    then_receive_duplicate(when_receive(&s, &v, under(&short, NOW + 599)));
    then_error(when_receive(&s, &v, under(&short, NOW + 601)), ErrorCode::MessageExpired);
}

#[test]
fn receive_retry_of_an_accepted_message_answers_the_original_result_after_the_route_moves() {
    let s = given_alice([]);
    let v = bob_to_alice(1);
    let s = given_alice([receive_event(&s, &v), route_updated(&route(&alice(), 2, &["relay-b"]))]);
    let status = then_receive_duplicate(when_receive(&s, &v, at(NOW + 60)));
    assert_eq!(status, DeliveryStatus::target_accepted(NOW));
}

#[test]
fn receive_refuses_inter_relay_delivery_of_a_self_delivery() {
    let s = given_alice([]);
    let env = envelope(&phone(), &alice(), &alice(), 1, NOW);
    let v = deliver_value(env, &["laptop"], cert(&alice(), &phone()));
    let r = when_receive(&s, &v, at(NOW));
    assert!(r.is_err(), "self-delivery must not be accepted through message.deliver, got {r:?}");
}

// =============================================================================
// who may deliver (PROTOCOL §5): message.deliver from another relay
// =============================================================================

fn bob_env(created_at: u64) -> Wire<relay_schemas::objects::MessageEnvelope> {
    wire(&envelope(&bob_phone(), &bob(), &alice(), 1, created_at))
}

/// Bob's route at `revision` naming `relays`, issued at `issued_at`.
fn bob_route(revision: u64, relays: &[&str], issued_at: u64) -> Wire<Route> {
    let relays: Vec<(&str, &str)> = relays.iter().map(|r| (*r, URL_B)).collect();
    wire(&bob().route(revision, &relays, issued_at))
}

#[test]
fn who_may_deliver_requires_the_senders_route() {
    let e = decide::may_deliver(None, None, "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Forbidden);
}

#[test]
fn who_may_deliver_requires_the_caller_to_be_listed_in_the_senders_route() {
    let route = bob_route(1, &["relay-b"], ISSUED);
    decide::may_deliver(Some(&route), None, "relay-b", &bob_env(NOW), at(NOW)).unwrap();
    let e = decide::may_deliver(Some(&route), None, "relay-c", &bob_env(NOW), at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Forbidden);
}

#[test]
fn who_may_deliver_requires_a_valid_route_of_the_sender() {
    // Alice's route listing the caller does not let it deliver as Bob.
    let alices = wire(&alice().route(1, &[("relay-b", URL_B)], ISSUED));
    let e = decide::may_deliver(Some(&alices), None, "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Forbidden);
    // A tampered route (relay swapped in after signing).
    let forged: Wire<Route> = wire(&tampered(
        bob().route(1, &[("relay-x", URL_B)], ISSUED),
        "relays",
        json!([{"id": "relay-b", "url": URL_B}]),
    ));
    let e = decide::may_deliver(Some(&forged), None, "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Forbidden);
}

#[test]
fn who_may_deliver_accepts_the_highest_known_revision() {
    let route = bob_route(2, &["relay-b"], ISSUED);
    let known = bob_route(1, &["relay-c"], ISSUED - 100);
    decide::may_deliver(Some(&route), Some(&known), "relay-b", &bob_env(NOW), at(NOW)).unwrap();
    decide::may_deliver(Some(&route), Some(&route), "relay-b", &bob_env(NOW), at(NOW)).unwrap();
}

#[test]
fn who_may_deliver_refuses_a_route_superseded_before_the_message_was_created() {
    let old = bob_route(1, &["relay-b"], ISSUED - 100);
    let moved = bob_route(2, &["relay-c"], ISSUED);
    let e = decide::may_deliver(Some(&old), Some(&moved), "relay-b", &bob_env(ISSUED + 10), at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Forbidden);
}

#[test]
fn who_may_deliver_accepts_a_route_superseded_after_the_message_was_created() {
    // Accepted under revision 1 before the sender moved: its source still
    // delivers it.
    let old = bob_route(1, &["relay-b"], ISSUED - 100);
    let moved = bob_route(2, &["relay-c"], NOW - 10);
    decide::may_deliver(Some(&old), Some(&moved), "relay-b", &bob_env(NOW - 60), at(NOW)).unwrap();
}

#[test]
fn who_may_deliver_refuses_a_route_that_differs_from_the_known_one_of_its_revision() {
    let known = bob_route(1, &["relay-c"], ISSUED);
    let other = bob_route(1, &["relay-b"], ISSUED);
    let e = decide::may_deliver(Some(&other), Some(&known), "relay-b", &bob_env(NOW), at(NOW)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Forbidden);
}

#[test]
fn who_may_deliver_requires_a_sending_device_valid_where_the_callee_serves_the_sender() {
    decide::check_sender(&given_alice([]), "laptop", at(NOW)).unwrap();
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    assert_eq!(decide::check_sender(&s, "laptop", at(NOW)).unwrap_err().code, ErrorCode::Forbidden);
    assert_eq!(decide::check_sender(&s, "unknown-device", at(NOW)).unwrap_err().code, ErrorCode::Forbidden);
}

// =============================================================================
// timeline sequences
// =============================================================================

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

// =============================================================================
// message.timeline.ack
// =============================================================================

fn alice_with_two_records() -> Given {
    let s = given_alice([]);
    let first = send_event(&s, &alice_to_self(1, &["phone", "laptop"]));
    let s = given_alice([first.clone()]);
    let second = send_event(&s, &alice_to_self(2, &["phone", "laptop"]));
    given_alice([first, second])
}

#[test]
fn ack_moves_the_devices_cursor_forward() {
    let s = alice_with_two_records();
    let events = then_events(decide::ack(&s, "phone", 1));
    assert!(matches!(events.as_slice(), [AccountEvent::CursorMoved { device_id, through: 1 }] if device_id == "phone"));
    let mut s = s;
    events.iter().for_each(|e| s.apply(e));
    assert_eq!(s.cursors["phone"], 1);
    assert_eq!(then_events(decide::ack(&s, "phone", 2)).len(), 1);
    // Cursors are per device.
    assert_eq!(then_events(decide::ack(&s, "laptop", 1)).len(), 1);
}

#[test]
fn ack_beyond_the_last_sequence_is_invalid_params() {
    let s = alice_with_two_records();
    then_error(decide::ack(&s, "phone", 3), ErrorCode::InvalidParams);
    let empty = given_alice([]);
    then_error(decide::ack(&empty, "phone", 1), ErrorCode::InvalidParams);
}

#[test]
fn ack_at_or_behind_the_cursor_is_a_no_op() {
    let mut s = alice_with_two_records();
    s.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
    then_no_events(decide::ack(&s, "phone", 2));
    then_no_events(decide::ack(&s, "phone", 1));
    then_no_events(decide::ack(&s, "phone", 0));
}

// =============================================================================
// delivery results at the source
// =============================================================================

fn alice_sent_one() -> Given {
    let s = given_alice([]);
    given_alice([send_event(&s, &alice_to_bob(1))])
}

fn applied(mut s: Given, events: &[AccountEvent]) -> Given {
    events.iter().for_each(|e| s.apply(e));
    s
}

#[test]
fn record_delivery_moves_delivering_to_a_terminal_state() {
    let s = alice_sent_one();
    let events = record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW));
    assert!(matches!(events.as_slice(), [AccountEvent::DeliveryUpdated { .. }]));
    let s = applied(s, &events);
    assert_eq!(s.sent(&mid(1)).status.status, Status::TargetAccepted);
}

#[test]
fn record_delivery_keeps_the_source_accepted_at() {
    let s = alice_sent_one();
    // The destination's accepted_at is later than the source's.
    let events = record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 42));
    match events.as_slice() {
        [AccountEvent::DeliveryUpdated { status, .. }] => assert_eq!(status, &DeliveryStatus::target_accepted(NOW)),
        e => panic!("expected DeliveryUpdated, got {e:?}"),
    }
    let s = applied(s, &events);
    assert_eq!(s.sent(&mid(1)).status, DeliveryStatus::target_accepted(NOW));
}

#[test]
fn terminal_delivery_states_never_change() {
    let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
    // target_accepted stays.
    let s = alice_sent_one();
    let s = applied(s.clone(), &record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)));
    assert!(record_delivery(&s, &mid(1), &failed).is_empty());
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 9)).is_empty());
    // failed stays, with its reason.
    let s = alice_sent_one();
    let s = applied(s.clone(), &record_delivery(&s, &mid(1), &failed));
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)).is_empty());
    let other_failure = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::ClockSkew, "late"));
    assert!(record_delivery(&s, &mid(1), &other_failure).is_empty());
    let status = then_send_duplicate(when_send(&s, "phone", &alice_to_bob(1), at(NOW + 1)));
    assert_eq!(status, failed);
}

#[test]
fn record_delivery_of_an_unchanged_status_or_unknown_message_is_a_no_op() {
    let s = alice_sent_one();
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
    assert!(record_delivery(&s, &mid(9), &DeliveryStatus::target_accepted(NOW)).is_empty());
}

#[test]
fn record_delivery_never_changes_a_self_delivery() {
    let s = given_alice([]);
    let s = given_alice([send_event(&s, &alice_to_self(1, &["phone"]))]);
    let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
    assert!(record_delivery(&s, &mid(1), &failed).is_empty());
}

// =============================================================================
// apply and snapshots
// =============================================================================

/// What a relay restoring from a snapshot does: serde round trip of the
/// state, then the derived caches. The ledger stays in the store.
fn snapshot_round_trip(s: &Given) -> Given {
    let bytes = serde_json::to_vec(&s.state).expect("snapshot serializes");
    let mut restored: AccountState = serde_json::from_slice(&bytes).expect("snapshot deserializes");
    restored.rebuild_caches();
    Given { state: restored, ledger: s.ledger.clone() }
}

/// A busy account: devices added, revoked and expiring, settings, a revoked
/// contact, sent, self-delivered and received messages, a delivery result and
/// a cursor.
fn busy_alice() -> Given {
    given(&alice(), &busy_alice_events())
}

fn busy_alice_events() -> Vec<AccountEvent> {
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
    events.extend(record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 1)));
    events.push(AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
    events
}

/// The decisions an account makes, rendered for comparison.
fn decisions(s: &Given) -> Vec<String> {
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
        format!("{:?}", decide::check_session(s, "phone", at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "laptop", at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "tablet", at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "tablet", at(NOW + 100))),
        format!("{:?}", decide::add_device(s, &wire(&cert(&alice(), &phone())), at(NOW + 5))),
        format!("{:?}", decide::add_device(s, &wire(&cert(&alice(), &laptop())), at(NOW + 5))),
        format!("{:?}", decide::revoke_device(s, &wire(&alice().revocation("tablet", NOW)), at(NOW + 5))),
        format!("{:?}", when_register(s, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW + 5))),
        format!("{:?}", decide::ack(s, "phone", 3)),
        format!("{:?}", decide::ack(s, "phone", 2)),
        format!("{:?}", decide::ack(s, "phone", 4)),
        format!("{:?}", record_delivery(s, &mid(1), &DeliveryStatus::delivering(NOW))),
    ]
}

#[test]
fn a_snapshot_decides_exactly_like_the_state_it_was_taken_from() {
    let original = busy_alice();
    let restored = snapshot_round_trip(&original);
    let (before, after) = (decisions(&original), decisions(&restored));
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b, a, "decision {i} differs after the snapshot");
    }
    // And the decisions compared are the interesting ones.
    then_send_duplicate(when_send(&restored, "phone", &alice_to_bob(1), at(NOW + 5)));
    then_receive_duplicate(when_receive(&restored, &bob_to_alice(3), at(NOW + 5)));
    assert!(restored.device_valid("phone", NOW + 5));
    assert!(!restored.device_valid("laptop", NOW + 5));
    assert!(restored.device_valid("tablet", NOW + 5));
    assert!(!restored.device_valid("tablet", NOW + 100));
    then_no_events(decide::add_device(&restored, &wire(&cert(&alice(), &phone())), at(NOW + 5)));
    then_no_events(when_register(&restored, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW + 5)));
    assert_eq!(
        then_events(decide::revoke_device(&restored, &wire(&alice().revocation("tablet", NOW)), at(NOW + 5))).len(),
        1
    );
    let (event, _) = then_accepted(when_receive(&restored, &bob_to_alice_without_auth(14), at(NOW + 5)));
    assert_eq!(record_of(&event).sequence, 4);
    assert_eq!(record_of(&event).visible, strings(&["phone"]));
}

#[test]
fn a_snapshot_keeps_signed_objects_byte_for_byte() {
    // A certificate with an unknown member, covered by its signature.
    let mut with_extra = cert(&alice(), &tablet());
    with_extra["x-future"] = json!({"b": 1, "a": [2, 1]});
    let with_extra = signed(Tag::DeviceCertificate, with_extra, &alice().key);
    let s = given_alice([]);
    assert_eq!(then_events(decide::add_device(&s, &wire(&with_extra), at(NOW))).len(), 1);
    let s = given_alice([device_added_cert(&with_extra)]);
    let restored = snapshot_round_trip(&s);
    assert_eq!(restored.devices["tablet"].certificate.raw().get(), s.devices["tablet"].certificate.raw().get());
    then_no_events(decide::add_device(&restored, &wire(&with_extra), at(NOW)));
    assert!(restored.device_valid("tablet", NOW));
}

#[test]
fn apply_folds_registration_into_a_usable_account() {
    let s = given(&alice(), &[registered(&alice(), &phone())]);
    assert_eq!(s.route().map(|r| r.revision), Some(1));
    assert!(s.account_key().is_some());
    assert!(s.devices.contains_key("phone"));
    let _: &Wire<Route> = s.route().unwrap();
    let _: &Wire<DeviceCertificate> = &s.devices["phone"].certificate;
}

#[test]
fn a_snapshot_holds_no_idempotency_results() {
    let s = busy_alice();
    assert!(!s.ledger.sends.is_empty() && !s.ledger.receipts.is_empty());
    let snapshot = serde_json::to_value(&s.state).unwrap();
    assert!(snapshot.get("sends").is_none() && snapshot.get("receipts").is_none(), "{snapshot}");
}

// =============================================================================
// the ledger of data written before it left the state
// =============================================================================

mod upgrade {
    use super::*;
    use crate::account::actor::AccountActor;
    use crate::account::{ledger, stream_id};
    use crate::delivery::NoPeers;
    use crate::store::{Head, NewEvent, Snapshot, Store};
    use crate::{ManualClock, Supervisor};
    use std::sync::Arc;

    /// A store holding Alice's busy history as the previous version wrote
    /// it: events only (no ledger entries, no ledger version), and, with
    /// `snapshot_at`, a snapshot there that still holds `sends`/`receipts`.
    fn old_store(events: &[AccountEvent], snapshot_at: Option<usize>) -> Store {
        let store = Store::temporary().unwrap();
        let stream = stream_id(&alice().id);
        let new: Vec<NewEvent> =
            events.iter().map(|e| NewEvent::new(e.event_type(), AccountEvent::VERSION, NOW, e).unwrap()).collect();
        let mut b = store.batch();
        b.append(&stream, Head::default(), new);
        store.commit_durable_blocking(b).unwrap();
        if let Some(k) = snapshot_at {
            let then = given(&alice(), &events[..k]);
            let mut old = serde_json::to_value(&then.state).unwrap();
            old["sends"] = serde_json::to_value(&then.ledger.sends).unwrap();
            old["receipts"] = serde_json::to_value(&then.ledger.receipts).unwrap();
            let at = store.read(&stream, k as u64 - 1).next().unwrap().unwrap().head();
            let mut b = store.batch();
            b.put_snapshot(&stream, Snapshot { seq: at.seq, hash: at.hash, state: serde_json::to_vec(&old).unwrap() });
            store.commit_durable_blocking(b).unwrap();
        }
        store
    }

    fn supervisor(store: &Store) -> Supervisor {
        Supervisor::new(store.clone(), POLICY.clone(), ManualClock::at_ms(NOW * 1000), Arc::new(NoPeers))
    }

    /// The ledger entries the kv space holds for Alice.
    fn stored_ledger(store: &Store) -> Vec<(Vec<u8>, Vec<u8>)> {
        let prefix = format!("i/{}/", alice().id);
        store.kv_scan_prefix(prefix.as_bytes()).map(Result::unwrap).collect()
    }

    fn expected_ledger(events: &[AccountEvent]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let id = alice().id;
        let mut kv: Vec<(Vec<u8>, Vec<u8>)> = given(&alice(), events)
            .ledger
            .entries()
            .map(|e| (e.key(&id), e.value().unwrap()))
            .chain([(ledger::version_key(&id), ledger::VERSION.to_vec())])
            .collect();
        kv.sort();
        kv
    }

    #[test]
    fn an_old_log_without_a_snapshot_gets_its_ledger_from_all_its_events_at_load() {
        let events = busy_alice_events();
        let store = old_store(&events, None);
        assert!(stored_ledger(&store).is_empty());
        let actor = AccountActor::load(supervisor(&store), &alice().id).unwrap();
        assert_eq!(stored_ledger(&store), expected_ledger(&events));
        assert_eq!(actor.state().last_sequence, busy_alice().last_sequence);
    }

    #[test]
    fn an_old_snapshot_with_idempotency_results_still_loads_and_fills_the_ledger() {
        let events = busy_alice_events();
        // After the first send, before the delivery result and the receipt.
        let k = events.iter().position(|e| matches!(e, AccountEvent::MessageSent { .. })).unwrap() + 1;
        assert!(k < events.len() - 2);
        let store = old_store(&events, Some(k));
        let actor = AccountActor::load(supervisor(&store), &alice().id).unwrap();
        assert_eq!(stored_ledger(&store), expected_ledger(&events));
        // The state decides as the state folded from every event does.
        let loaded = Given { state: actor.state().clone(), ledger: busy_alice().ledger };
        assert_eq!(decisions(&loaded), decisions(&busy_alice()));
    }

    #[test]
    fn an_upgraded_ledger_is_not_rewritten_at_the_next_load() {
        let events = busy_alice_events();
        let store = old_store(&events, None);
        AccountActor::load(supervisor(&store), &alice().id).unwrap();
        // Were it rebuilt from the events, this entry would come back.
        let mut b = store.batch();
        b.kv_remove(&ledger::send_key(&alice().id, &mid(1)));
        store.commit_durable_blocking(b).unwrap();
        AccountActor::load(supervisor(&store), &alice().id).unwrap();
        assert_eq!(stored_ledger(&store).len(), expected_ledger(&events).len() - 1);
    }
}

#[test]
fn a_small_map_reads_and_writes_as_the_btree_map_it_replaces() {
    use super::state::SmallMap;
    let json = r#"{"tablet":3,"laptop":1,"phone":2,"laptop":4}"#;
    let small: SmallMap<u64> = serde_json::from_str(json).unwrap();
    let btree: std::collections::BTreeMap<String, u64> = serde_json::from_str(json).unwrap();
    assert_eq!(serde_json::to_string(&small).unwrap(), serde_json::to_string(&btree).unwrap());
    let mut m = SmallMap::default();
    for (k, v) in [("phone", 1), ("laptop", 2), ("phone", 3)] {
        m.insert(k.to_string(), v);
    }
    assert_eq!(m.iter().collect::<Vec<_>>(), [("laptop", &2), ("phone", &3)]);
    assert_eq!((m["phone"], m.get("tablet"), m.len()), (3, None, 2));
}

// ---- message.delivery.peer_status ------------------------------------------------

#[test]
fn peer_status_is_answered_only_to_a_relay_the_accounts_route_names() {
    let two_homes = registered_with(&alice(), &register_value(&alice(), &phone(), &[RELAY, "relay-b"], None));
    let s = given(&alice(), &[two_homes]);
    assert!(decide::may_ask_peer_status(&s, "relay-b").is_ok());
    then_error(decide::may_ask_peer_status(&s, "relay-c"), ErrorCode::Forbidden);
    then_error(decide::may_ask_peer_status(&AccountState::new(&alice().id), "relay-b"), ErrorCode::NotFound);
}

// ---- Web Push (PROTOCOL §9) -------------------------------------------------------

fn push_params(n: u8) -> relay_schemas::methods::PushSubscribeParams {
    parse(&json!({
        "endpoint": format!("https://push.example/sub/{n}"),
        "keys": {"p256dh": relay_schemas::encoding::b64_encode(&[4u8; 65]), "auth": relay_schemas::encoding::b64_encode(&[n; 16])}
    }))
}

fn subscribed(device: &str, n: u8) -> AccountEvent {
    let s = given_alice([]);
    decide::push_subscribe(&s, device, &push_params(n)).unwrap().remove(0)
}

#[test]
fn push_subscribe_binds_to_the_session_device_and_a_new_one_replaces_it() {
    let s = given_alice([subscribed("phone", 1)]);
    assert_eq!(s.push["phone"].endpoint, "https://push.example/sub/1");
    assert!(decide::push_subscribe(&s, "phone", &push_params(1)).unwrap().is_empty(), "same subscription: no-op");
    let s = given_alice([subscribed("phone", 1), subscribed("phone", 2)]);
    assert_eq!(s.push["phone"].endpoint, "https://push.example/sub/2");
    assert_eq!(s.push.len(), 1);
}

#[test]
fn push_unsubscribe_removes_it_and_revoking_the_device_does_too() {
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2)]);
    let events = decide::push_unsubscribe(&s, "phone");
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2), events[0].clone()]);
    assert!(!s.push.contains_key("phone"));
    assert!(decide::push_unsubscribe(&s, "phone").is_empty(), "nothing left to remove");
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2), device_revoked(&alice(), "laptop")]);
    assert!(!s.push.contains_key("laptop"), "a revoked device's subscription leaves with it");
    assert!(s.push.contains_key("phone"));
}

#[test]
fn a_gone_endpoint_drops_only_the_subscription_it_belongs_to() {
    let s = given_alice([subscribed("phone", 1), subscribed("phone", 2)]);
    assert!(decide::push_gone(&s, "phone", "https://push.example/sub/1").is_empty(), "resubscribed since");
    let events = decide::push_gone(&s, "phone", "https://push.example/sub/2");
    assert!(matches!(&events[..], [AccountEvent::PushUnsubscribed { reason, .. }] if reason == "gone"));
}

#[test]
fn push_goes_only_to_subscribed_visible_devices_without_a_websocket() {
    let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2)]);
    let targets = |visible: &[&str], sender: Option<&str>, connected: &[&str]| -> Vec<String> {
        let visible: Vec<String> = visible.iter().map(|v| v.to_string()).collect();
        decide::push_targets(&s, &visible, sender, |d| connected.contains(&d), NOW)
            .into_iter()
            .map(|(d, _)| d.to_owned())
            .collect()
    };
    assert_eq!(targets(&["phone", "laptop"], None, &[]), ["laptop", "phone"]);
    assert_eq!(targets(&["phone"], None, &[]), ["phone"], "laptop may not read the record");
    assert_eq!(targets(&["phone", "laptop"], None, &["phone"]), ["laptop"], "phone has a socket open");
    assert_eq!(targets(&["phone", "laptop"], Some("laptop"), &[]), ["phone"], "the sending device knows");
    assert!(targets(&["tablet"], None, &[]).is_empty(), "no subscription");
    let s = given_alice([subscribed("phone", 1), device_revoked(&alice(), "laptop"), subscribed("laptop", 2)]);
    let visible = vec!["laptop".to_string()];
    assert!(decide::push_targets(&s, &visible, None, |_| false, NOW).is_empty(), "revoked devices get nothing");
}
