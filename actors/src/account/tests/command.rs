//! `command::decide`: the one entry the actor calls. What it answers and
//! which effects it asks of the shell, for the rules that used to live in
//! the shell (replies built after writing, session tokens, a revoked
//! device's sessions, beginning a delivery, the backlog).

use super::*;
use crate::account::command::{decide, AccountCmd, Decision, Effect, Reply};
use crate::account::session::{Challenges, Grant};
use relay_schemas::encoding::b64_encode;
use relay_schemas::methods::{SessionOpenParams, SyncParams};
use relay_schemas::objects::RelayRef;

type Cmd = AccountCmd<()>;

fn when(s: &Given, cmd: Cmd) -> Result<Decision, RelayError> {
    decide(s, &mut Challenges::default(), &cmd, s, at(NOW))
}

fn json(reply: &Reply) -> Value {
    match reply {
        Reply::Json(j) => serde_json::from_str(j).expect("reply is JSON"),
        r => panic!("expected a JSON reply, got {r:?}"),
    }
}

fn status(reply: &Reply) -> &DeliveryStatus {
    match reply {
        Reply::Status(s) | Reply::Settled(s) => s,
        r => panic!("expected a status, got {r:?}"),
    }
}

fn send_cmd(v: &Value, route: Option<Value>) -> Cmd {
    AccountCmd::MessageSend {
        device: "phone".into(),
        params: parse(v),
        digest: digest(v),
        route: route.map(|r| wire(&r)),
    }
}

/// Bob's route naming `relays`.
fn bob_route(relays: &[&str]) -> Value {
    route(&bob(), 1, relays)
}

#[test]
fn register_answers_the_route_it_writes_and_a_repeat_answers_the_route_it_has() {
    let v = register_value(&alice(), &phone(), &[RELAY], None);
    let d = when(
        &Given::new(&alice().id),
        AccountCmd::AccountRegister { params: parse(&v), digest: digest(&v), known: None },
    )
    .unwrap();
    assert_eq!(d.events.len(), 1);
    assert_eq!(json(&d.reply), json!({"account_id": alice().id, "route": route(&alice(), 1, &[RELAY])}));
    let again = given(&alice(), &d.events);
    let d = when(&again, AccountCmd::AccountRegister { params: parse(&v), digest: digest(&v), known: None }).unwrap();
    assert!(d.events.is_empty(), "the same registration again writes nothing");
    assert_eq!(json(&d.reply)["route"], route(&alice(), 1, &[RELAY]));
}

#[test]
fn a_challenge_and_its_session_token_come_from_the_context_randomness() {
    let s = given_alice([]);
    let mut challenges = Challenges::default();
    let ctx = at(NOW).with_random([7; 32]);
    let ask = Cmd::SessionChallenge { device_id: "phone".into() };
    let d = decide(&s, &mut challenges, &ask, &s, ctx).unwrap();
    let challenge = json(&d.reply)["challenge"].as_str().unwrap().to_owned();
    assert_eq!(challenge, b64_encode(&[7; 32]));
    assert!(d.events.is_empty() && d.effects.is_empty(), "a challenge is kept in memory only");

    let params: SessionOpenParams = serde_json::from_value(json!({
        "account_id": alice().id, "device_id": "phone", "challenge": challenge,
        "signature": phone().session_proof(&alice().id, &challenge, RELAY)}))
    .unwrap();
    let ctx = at(NOW).with_random([9; 32]);
    let d = decide(&s, &mut challenges, &Cmd::SessionOpen { params }, &s, ctx).unwrap();
    let token = b64_encode(&[9; 32]);
    let expires_at = NOW + POLICY.session_ttl;
    assert_eq!(json(&d.reply), json!({"token": token, "expires_at": expires_at}));
    let grant = Grant { account_id: alice().id, device_id: "phone".into(), expires_at };
    assert!(matches!(&d.effects[..], [Effect::StoreSession { token: t, grant: g }] if t.0 == token && *g == grant));
    assert!(!format!("{:?}", d.effects).contains(&token), "a token is never printed");
    assert!(d.events.is_empty());
}

#[test]
fn a_session_command_without_randomness_is_refused_and_leaves_the_challenge() {
    let s = given_alice([]);
    let mut challenges = Challenges::default();
    let ask = Cmd::SessionChallenge { device_id: "phone".into() };
    then_error(decide(&s, &mut challenges, &ask, &s, at(NOW)), ErrorCode::InternalError);
    let d = decide(&s, &mut challenges, &ask, &s, at(NOW).with_random([7; 32])).unwrap();
    let challenge = json(&d.reply)["challenge"].as_str().unwrap().to_owned();
    let params: SessionOpenParams = serde_json::from_value(json!({
        "account_id": alice().id, "device_id": "phone", "challenge": challenge,
        "signature": phone().session_proof(&alice().id, &challenge, RELAY)}))
    .unwrap();
    let open = Cmd::SessionOpen { params };
    then_error(decide(&s, &mut challenges, &open, &s, at(NOW)), ErrorCode::InternalError);
    assert!(
        decide(&s, &mut challenges, &open, &s, at(NOW).with_random([9; 32])).is_ok(),
        "the challenge still answers"
    );
}

#[test]
fn a_revoked_device_has_its_sessions_ended_by_the_shell() {
    let s = given_alice([]);
    let params = parse(&json!({ "revocation": alice().revocation("laptop", NOW) }));
    let d = when(&s, Cmd::DeviceRevoke { device: "phone".into(), params }).unwrap();
    assert_eq!(d.events.len(), 1);
    assert!(matches!(&d.effects[..], [Effect::EndDevice { device_id }] if device_id == "laptop"));
}

#[test]
fn a_send_to_an_account_served_here_alone_is_decided_without_writing() {
    let d = when(&given_alice([]), send_cmd(&alice_to_bob(1), Some(bob_route(&[RELAY])))).unwrap();
    assert!(d.events.is_empty() && d.effects.is_empty());
    let Reply::Accept(a) = d.reply else { panic!("expected an acceptance to deliver first, got {:?}", d.reply) };
    assert_eq!(a.status, DeliveryStatus::delivering(NOW));
    assert_eq!(a.deadline, NOW + age_limit());
}

#[test]
fn a_send_elsewhere_writes_its_acceptance_and_begins_its_delivery_in_one_decision() {
    let d = when(&given_alice([]), send_cmd(&alice_to_bob(1), Some(bob_route(&["relay-b"])))).unwrap();
    assert!(matches!(&d.events[..], [AccountEvent::MessageSent { .. }]));
    assert_eq!(*status(&d.reply), DeliveryStatus::delivering(NOW));
    let [Effect::BeginDelivery(begun)] = &d.effects[..] else { panic!("expected one delivery, got {:?}", d.effects) };
    assert_eq!(begun.due_ms.map(|ms| ms.secs()), Some(UnixSecs(NOW)), "its first attempt is due now");
    let target = begun.state.target.as_ref().expect("the route resolved at acceptance is the first target");
    assert_eq!(target.relays, vec![RelayRef { id: "relay-b".into(), url: URL_B.into() }]);
    assert_eq!(begun.state.finished, None);
}

#[test]
fn an_accept_that_lost_the_race_to_a_retry_answers_the_first_result_and_writes_nothing() {
    let s = given_alice([]);
    let Reply::Accept(a) = when(&s, send_cmd(&alice_to_bob(1), Some(bob_route(&[RELAY])))).unwrap().reply else {
        panic!("expected an acceptance")
    };
    let settled = DeliveryStatus::target_accepted(NOW);
    let first = when(&s, Cmd::Settle { acceptance: a.clone(), status: settled.clone() }).unwrap();
    assert!(
        matches!(&first.events[..], [AccountEvent::MessageSent { status: Some(st), .. }] if *st == settled),
        "the acceptance and its final status, one event: {:?}",
        first.events
    );
    assert!(matches!(first.reply, Reply::Settled(_)), "the settling command reports the delivery finished");
    let after = given(&alice(), &[alice_history(), first.events].concat());
    let late = when(&after, Cmd::Accept { acceptance: a, route: None, first: None }).unwrap();
    assert!(late.events.is_empty() && late.effects.is_empty());
    assert!(matches!(&late.reply, Reply::Status(s) if *s == settled), "the first settlement was reported");
}

#[test]
fn record_delivery_answers_the_status_as_recorded_and_a_terminal_one_never_changes() {
    let sent = send_event(&given_alice([]), &alice_to_bob(1));
    let s = given_alice([sent]);
    let record = |s: &Given, st: &DeliveryStatus| {
        when(s, Cmd::RecordDelivery { message_id: mid(1), status: st.clone(), settlement: None }).unwrap()
    };
    // Reported with another accepted_at: recorded with the source's.
    let d = record(&s, &DeliveryStatus::target_accepted(NOW + 9));
    assert_eq!(*status(&d.reply), DeliveryStatus::target_accepted(NOW));
    let s = given(&alice(), &[s.events.clone(), d.events].concat());
    let failed = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::MessageExpired, "expired"));
    let d = record(&s, &failed);
    assert!(d.events.is_empty());
    assert_eq!(*status(&d.reply), DeliveryStatus::target_accepted(NOW));
}

#[test]
fn the_backlog_is_the_latest_record_past_the_cursor_the_device_may_read() {
    let mut s = given_alice([]);
    let backlog = |s: &Given, device: &str| match when(s, Cmd::Backlog { device: device.into() }).unwrap().reply {
        Reply::Backlog(b) => b,
        r => panic!("expected a backlog, got {r:?}"),
    };
    assert_eq!(backlog(&s, "phone"), None);
    s.apply(&receive_event(&s, &bob_to_alice(1)));
    s.apply(&send_event(&s, &alice_to_self(2, &["phone"])));
    assert_eq!(backlog(&s, "phone"), Some(2));
    assert_eq!(backlog(&s, "laptop"), Some(1), "record 2 is not the laptop's");
    let acked = when(&s, Cmd::MessageTimelineAck { device: "phone".into(), params: parse(&json!({"through": 2})) })
        .unwrap()
        .events;
    s.apply(&acked[0]);
    assert_eq!(backlog(&s, "phone"), None);
}

#[test]
fn sync_pages_the_records_the_device_may_read_through_the_reads_view() {
    let mut s = given_alice([]);
    s.apply(&receive_event(&s, &bob_to_alice(1)));
    s.apply(&send_event(&s, &alice_to_self(2, &["phone"])));
    s.apply(&receive_event(&s, &bob_to_alice(3)));
    let sync = |device: &str, after: u64, limit: u32| {
        let params: SyncParams = parse(&json!({"after": after, "limit": limit}));
        json(&when(&s, Cmd::MessageTimelineSync { device: device.into(), params }).unwrap().reply)
    };
    let page = sync("laptop", 0, 10);
    let seqs: Vec<_> = page["records"].as_array().unwrap().iter().map(|r| r["sequence"].clone()).collect();
    assert_eq!(seqs, [json!(1), json!(3)]);
    assert_eq!((page["next"].clone(), page["has_more"].clone()), (json!(3), json!(false)));
    let page = sync("phone", 0, 2);
    assert_eq!(page["records"].as_array().unwrap().len(), 2);
    assert_eq!((page["next"].clone(), page["has_more"].clone()), (json!(2), json!(true)));
}

#[test]
fn a_route_get_for_an_account_without_a_route_is_route_not_found() {
    then_error(when(&Given::new(&alice().id), Cmd::RouteGet), ErrorCode::RouteNotFound);
}
