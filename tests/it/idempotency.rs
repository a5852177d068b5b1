//! Seed "Idempotent Message Retries" and "Delivery Result Retention Rules",
//! against a real relay over HTTP: `(from, message_id)` is the logical key,
//! request content is compared as the JCS of the complete params object,
//! duplicates answer the stored result and add nothing, different content
//! under the same key is `state_conflict`, and a rejection before acceptance
//! leaves no acceptance result behind.

use crate::common;

use common::client::{mid, now, Client, User};
use common::relay::RelayProc;
use common::schema::assert_valid;
use common::wait::eventually;
use relay_schemas::client::key_box;
use relay_schemas::sign::{sign_object, Tag};
use serde_json::{json, Map, Value};
use std::time::Duration;

// ---- helpers ---------------------------------------------------------------

/// A signed envelope from `user`'s device `dev` to `to` with these fields.
fn envelope(user: &User, dev: usize, to: &str, message_id: &str, created_at: u64, ciphertext: &[u8]) -> Value {
    user.devices[dev].envelope(user.id(), to, message_id, created_at, ciphertext)
}

/// An envelope like [`envelope`] with an extra (unknown) member, signed.
fn envelope_with_extra(
    user: &User,
    dev: usize,
    to: &str,
    message_id: &str,
    created_at: u64,
    ciphertext: &[u8],
) -> Value {
    let mut m: Map<String, Value> = match envelope(user, dev, to, message_id, created_at, ciphertext) {
        Value::Object(m) => m,
        _ => unreachable!(),
    };
    m.insert("x_client_hint".into(), json!({"thread": "t-1"}));
    sign_object(Tag::Envelope, &mut m, &user.devices[dev].key);
    Value::Object(m)
}

/// One key box for each of `user`'s devices in `devs`, with `tag` in the box bytes.
fn boxes(user: &User, devs: &[usize], tag: &str) -> Value {
    let v: Vec<Value> = devs
        .iter()
        .map(|&d| key_box(&user.devices[d].id, format!("{tag} for {}", user.devices[d].id).as_bytes()))
        .collect();
    json!(v)
}

/// A send that must succeed; checks the result's schema.
async fn send_ok(c: &Client, user: &User, dev: usize, params: &Value) -> Value {
    let st = c.ok("message.send", user.token(dev), params).await;
    assert_valid("DeliveryStatus.schema.json", &st);
    st
}

async fn status_of(c: &Client, user: &User, dev: usize, message_id: &str) -> Value {
    let st = c.ok("message.delivery.status", user.token(dev), &json!({ "message_id": message_id })).await;
    assert_valid("DeliveryStatus.schema.json", &st);
    st
}

/// Records (as synced by device `dev`) whose envelope has `message_id`.
fn with_mid<'a>(records: &'a [Value], message_id: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["envelope"]["message_id"] == message_id).collect()
}

fn sequences(records: &[Value]) -> Vec<u64> {
    records.iter().map(|r| r["sequence"].as_u64().unwrap()).collect()
}

/// Sends a fresh self-delivery from `user`'s device `dev` (boxed for that
/// device only) and returns the timeline sequence it was given: the probe
/// that no earlier request consumed a sequence.
async fn probe_sequence(c: &Client, user: &User, dev: usize, message_id: &str) -> u64 {
    let env = envelope(user, dev, user.id(), message_id, now(), b"probe");
    let p = json!({"envelope": env, "recipient_boxes": boxes(user, &[dev], "probe")});
    let st = send_ok(c, user, dev, &p).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    let records = user.sync_all(c, dev).await;
    let found = with_mid(&records, message_id);
    assert_eq!(found.len(), 1, "probe {message_id}: {records:?}");
    found[0]["sequence"].as_u64().unwrap()
}

/// `n` copies of `message.send` with exactly these body bytes, all in flight
/// at once (spawned local tasks, each bounded by the client's timeout).
async fn concurrent_sends(c: &Client, token: &str, bodies: Vec<Vec<u8>>) -> Vec<(u16, Value)> {
    let handles: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (c, token) = (c.clone(), token.to_string());
            actix_rt::spawn(async move { c.raw("message.send", Some(&token), body).await })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("send task"));
    }
    out
}

/// `v` serialized with every object's members in reverse order and odd
/// whitespace: the same JSON value, other bytes.
fn scrambled(v: &Value) -> String {
    fn go(v: &Value, depth: usize, out: &mut String) {
        match v {
            Value::Object(m) => {
                out.push_str("{\n");
                let n = m.len();
                for (i, (k, val)) in m.iter().rev().enumerate() {
                    out.push_str(&"\t ".repeat(depth + 1));
                    out.push_str(&serde_json::to_string(k).unwrap());
                    out.push_str(" :\r\n  ");
                    go(val, depth + 1, out);
                    if i + 1 < n {
                        out.push_str(" ,\n");
                    }
                }
                out.push_str("\n }");
            }
            Value::Array(a) => {
                out.push_str("[ ");
                for (i, val) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str("\n,\t");
                    }
                    go(val, depth + 1, out);
                }
                out.push_str(" ]");
            }
            other => out.push_str(&serde_json::to_string(other).unwrap()),
        }
    }
    let mut out = String::from("  \n");
    go(v, 0, &mut out);
    out.push_str("\n\n");
    out
}

/// `v` serialized compactly but with every other ASCII letter of every
/// string and member name written as a `\uXXXX` escape: the same JSON
/// value (and the same JCS), other bytes.
fn escaped(v: &Value) -> String {
    fn s(text: &str, out: &mut String) {
        out.push('"');
        for (i, ch) in text.chars().enumerate() {
            if ch.is_ascii_alphabetic() && i % 2 == 0 {
                out.push_str(&format!("\\u{:04X}", ch as u32));
            } else {
                let enc = serde_json::to_string(&ch.to_string()).unwrap();
                out.push_str(&enc[1..enc.len() - 1]);
            }
        }
        out.push('"');
    }
    fn go(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                out.push('{');
                for (i, (k, val)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    s(k, out);
                    out.push(':');
                    go(val, out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, val) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    go(val, out);
                }
                out.push(']');
            }
            Value::String(t) => s(t, out),
            other => out.push_str(&serde_json::to_string(other).unwrap()),
        }
    }
    let mut out = String::new();
    go(v, &mut out);
    out
}

struct Setup {
    _dir: tempfile::TempDir,
    _relay: RelayProc,
    c: Client,
}

fn start(extra: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", extra);
    let c = Client::new(&relay.url);
    Setup { _dir: dir, _relay: relay, c }
}

// ---- duplicates under concurrency ------------------------------------------

/// Seed: "Concurrent requests ... do not alter these requirements"; the same
/// key with identical content returns the status with unchanged
/// `accepted_at` and MUST NOT add timeline records or sequences.
#[actix_rt::test]
async fn fifty_concurrent_identical_sends_create_one_record_and_one_accepted_at() {
    let s = start("");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;

    // Cross-account, with sender boxes.
    let cross = serde_json::to_vec(&alice.send_params(&bob, &mid(1), true)).unwrap();
    let replies = concurrent_sends(c, alice.token(0).unwrap(), vec![cross.clone(); 50]).await;
    let mut accepted_at = None;
    for (code, v) in &replies {
        assert_eq!(*code, 200, "{v}");
        assert_valid("DeliveryStatus.schema.json", v);
        assert!(v["status"] == "delivering" || v["status"] == "target_accepted", "{v}");
        let at = v["accepted_at"].as_u64().unwrap();
        assert_eq!(*accepted_at.get_or_insert(at), at, "accepted_at differs between duplicates: {replies:?}");
    }
    let accepted_at = accepted_at.unwrap();
    let st = status_of(c, &alice, 0, &mid(1)).await;
    assert_eq!(st, json!({"status": "target_accepted", "accepted_at": accepted_at}));

    // Self-delivery.
    let own = serde_json::to_vec(&alice.send_params(&alice, &mid(2), false)).unwrap();
    let replies = concurrent_sends(c, alice.token(0).unwrap(), vec![own; 50]).await;
    let first = replies[0].1.clone();
    assert_eq!(first["status"], "target_accepted", "{first}");
    for (code, v) in &replies {
        assert_eq!(*code, 200, "{v}");
        assert_eq!(*v, first, "self-delivery duplicates answer differently");
    }
    assert_eq!(status_of(c, &alice, 0, &mid(2)).await, first);

    // One record per account per message, nothing else.
    let a = alice.sync_all(c, 0).await;
    let b = bob.sync_all(c, 0).await;
    assert_eq!(a.len(), 2, "{a:?}");
    assert_eq!(b.len(), 1, "{b:?}");
    let sent = with_mid(&a, &mid(1));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["direction"], "sent");
    assert_eq!(sent[0]["accepted_at"], accepted_at);
    assert_eq!(sent[0]["delivery"]["status"], "target_accepted");
    let own = with_mid(&a, &mid(2));
    assert_eq!(own.len(), 1);
    assert_eq!(own[0]["direction"], "received");
    assert_eq!(own[0]["accepted_at"], first["accepted_at"]);
    let received = with_mid(&b, &mid(1));
    assert_eq!(received.len(), 1);
    assert_eq!(received[0]["direction"], "received");
    assert_eq!(sequences(&a), vec![1, 2]);
    assert_eq!(sequences(&b), vec![1]);

    // Sequences were not consumed by the 98 duplicates.
    assert_eq!(probe_sequence(c, &alice, 0, &mid(100)).await, 3);
    assert_eq!(probe_sequence(c, &bob, 0, &mid(101)).await, 2);

    // And a late identical retry still answers the same.
    let (code, v) = c.raw("message.send", alice.token(0), cross).await;
    assert_eq!((code, v), (200, json!({"status": "target_accepted", "accepted_at": accepted_at})));
}

/// Two different contents raced under one key: exactly one is accepted; every
/// request with its content gets 200 and the same `accepted_at`, every
/// request with the other content `state_conflict`.
#[actix_rt::test]
async fn concurrent_sends_of_two_contents_under_one_message_id_accept_exactly_one() {
    let s = start("");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    let t = now();
    for (n, to) in [(1, &bob), (2, &alice)] {
        let one = json!({"envelope": envelope(&alice, 0, to.id(), &mid(n), t, b"one"),
                         "recipient_boxes": boxes(to, &[0], "rb"), "sender_boxes": boxes(&alice, &[0], "sb")});
        let two = json!({"envelope": envelope(&alice, 0, to.id(), &mid(n), t, b"two"),
                         "recipient_boxes": boxes(to, &[0], "rb"), "sender_boxes": boxes(&alice, &[0], "sb")});
        let bodies: Vec<Vec<u8>> =
            (0..40).map(|i| serde_json::to_vec(if i % 2 == 0 { &one } else { &two }).unwrap()).collect();
        let replies = concurrent_sends(c, alice.token(0).unwrap(), bodies).await;
        let winners: Vec<usize> = (0..40).filter(|i| replies[*i].0 == 200).collect();
        assert!(!winners.is_empty(), "nothing accepted: {replies:?}");
        let parity = winners[0] % 2;
        let at = &replies[winners[0]].1["accepted_at"];
        for (i, (code, v)) in replies.iter().enumerate() {
            if i % 2 == parity {
                assert_eq!(*code, 200, "request {i} has the accepted content: {v}");
                assert_eq!(&v["accepted_at"], at);
            } else {
                assert_eq!(*code, 409, "request {i} has the other content: {v}");
                assert_eq!(v["error"]["code"], "state_conflict");
            }
        }
        let want_ct = relay_schemas::encoding::b64_encode(if parity == 0 { b"one" } else { b"two" });
        let records = to.sync_all(c, 0).await;
        let got = with_mid(&records, &mid(n));
        assert_eq!(got.len(), 1, "{records:?}");
        assert_eq!(got[0]["envelope"]["ciphertext"], want_ct.as_str());
    }
    let a = alice.sync_all(c, 0).await;
    assert_eq!(sequences(&a), vec![1, 2], "{a:?}");
    assert_eq!(probe_sequence(c, &alice, 0, &mid(100)).await, 3);
    assert_eq!(probe_sequence(c, &bob, 0, &mid(101)).await, 2);
}

// ---- different content -----------------------------------------------------

/// Seed: "The same key with different content returns `state_conflict` and
/// MUST NOT overwrite the original request content or result"; content
/// includes "signatures, unknown fields, array order, and optional-field
/// presence".
#[actix_rt::test]
async fn changed_field_under_same_message_id_is_state_conflict_and_leaves_original_untouched() {
    let s = start("");
    let c = &s.c;
    let mut alice = User::register(c, "relay-a", 1, false).await;
    let mut bob = User::register(c, "relay-a", 2, false).await;
    alice.add_device(c, "laptop", 11).await;
    bob.add_device(c, "laptop", 12).await;
    let t = now();
    let grant1 = bob.account.grant("grant-one", alice.id(), t, None);
    let grant2 = bob.account.grant("grant-two", alice.id(), t, None);
    let invite = bob.account.invite("invite-one", t, t + 3600);

    // A: cross-account with sender boxes and a grant.
    let a = json!({
        "envelope": envelope(&alice, 0, bob.id(), &mid(1), t, b"original"),
        "recipient_boxes": boxes(&bob, &[0, 1], "rb"),
        "sender_boxes": boxes(&alice, &[0, 1], "sb"),
        "authorization": {"contact_grant": grant1},
    });
    // B: cross-account without sender boxes.
    let b = json!({
        "envelope": envelope(&alice, 0, bob.id(), &mid(2), t, b"original"),
        "recipient_boxes": boxes(&bob, &[0, 1], "rb"),
        "authorization": {"contact_grant": grant1},
    });
    // C: self-delivery.
    let own = json!({
        "envelope": envelope(&alice, 0, alice.id(), &mid(3), t, b"original"),
        "recipient_boxes": boxes(&alice, &[0, 1], "rb"),
    });
    let st_a = send_ok(c, &alice, 0, &a).await;
    let st_b = send_ok(c, &alice, 0, &b).await;
    let st_own = send_ok(c, &alice, 0, &own).await;
    for st in [&st_a, &st_b, &st_own] {
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    let alice_before = [alice.sync_all(c, 0).await, alice.sync_all(c, 1).await];
    let bob_before = [bob.sync_all(c, 0).await, bob.sync_all(c, 1).await];
    assert_eq!(alice_before[0].len(), 2);
    assert_eq!(bob_before[0].len(), 2);

    let mut variants: Vec<(&str, Value)> = vec![];
    let mut v = a.clone();
    v["envelope"] = envelope(&alice, 0, bob.id(), &mid(1), t, b"changed");
    variants.push(("A: other ciphertext, re-signed", v));
    let mut v = a.clone();
    v["envelope"] = envelope(&alice, 0, bob.id(), &mid(1), t - 1, b"original");
    variants.push(("A: other created_at, re-signed", v));
    let mut v = a.clone();
    v["envelope"] = envelope_with_extra(&alice, 0, bob.id(), &mid(1), t, b"original");
    variants.push(("A: unknown member in the envelope, re-signed", v));
    let mut v = a.clone();
    v["x_unknown"] = json!(true);
    variants.push(("A: unknown member in params", v));
    let mut v = a.clone();
    v["x_unknown"] = Value::Null;
    variants.push(("A: unknown null member in params", v));
    let mut v = a.clone();
    v["recipient_boxes"].as_array_mut().unwrap().reverse();
    variants.push(("A: recipient_boxes reordered", v));
    let mut v = a.clone();
    v["recipient_boxes"].as_array_mut().unwrap().pop();
    variants.push(("A: a recipient box dropped", v));
    let mut v = a.clone();
    v["recipient_boxes"][0]["box"] = json!(relay_schemas::encoding::b64_encode(b"other box"));
    variants.push(("A: a recipient box changed", v));
    let mut v = a.clone();
    v["sender_boxes"].as_array_mut().unwrap().reverse();
    variants.push(("A: sender_boxes reordered", v));
    let mut v = a.clone();
    v.as_object_mut().unwrap().remove("sender_boxes");
    variants.push(("A: sender_boxes removed", v));
    let mut v = a.clone();
    v["authorization"] = json!({"contact_grant": grant2});
    variants.push(("A: another valid grant", v));
    let mut v = a.clone();
    v["authorization"] = json!({"contact_invite": invite});
    variants.push(("A: an invite instead of the grant", v));
    let mut v = a.clone();
    v.as_object_mut().unwrap().remove("authorization");
    variants.push(("A: authorization removed", v));
    let mut v = b.clone();
    v["sender_boxes"] = boxes(&alice, &[0, 1], "sb");
    variants.push(("B: sender_boxes added", v));
    let mut v = b.clone();
    v["authorization"] = json!({"contact_grant": grant2});
    variants.push(("B: another valid grant", v));
    let mut v = own.clone();
    v["envelope"] = envelope(&alice, 0, alice.id(), &mid(3), t, b"changed");
    variants.push(("C: other ciphertext, re-signed", v));
    let mut v = own.clone();
    v["x_unknown"] = json!({"a": 1});
    variants.push(("C: unknown member in params", v));
    let mut v = own.clone();
    v["recipient_boxes"].as_array_mut().unwrap().reverse();
    variants.push(("C: recipient_boxes reordered", v));
    let mut v = own.clone();
    v["sender_boxes"] = boxes(&alice, &[0], "sb");
    variants.push(("C: sender_boxes added", v));

    for (what, v) in &variants {
        assert_ne!(v, &a);
        let code = c.err("message.send", alice.token(0), v).await;
        assert_eq!(code, "state_conflict", "{what}");
    }

    // The originals are untouched: result, records, boxes, sequences.
    assert_eq!(status_of(c, &alice, 0, &mid(1)).await, st_a);
    assert_eq!(status_of(c, &alice, 0, &mid(2)).await, st_b);
    assert_eq!(status_of(c, &alice, 0, &mid(3)).await, st_own);
    assert_eq!(send_ok(c, &alice, 0, &a).await, st_a);
    assert_eq!(send_ok(c, &alice, 0, &b).await, st_b);
    assert_eq!(send_ok(c, &alice, 0, &own).await, st_own);
    assert_eq!([alice.sync_all(c, 0).await, alice.sync_all(c, 1).await], alice_before);
    assert_eq!([bob.sync_all(c, 0).await, bob.sync_all(c, 1).await], bob_before);
    let r = with_mid(&bob_before[0], &mid(1));
    assert_eq!(r[0]["envelope"], a["envelope"], "stored envelope is the original");
    assert_eq!(r[0]["box"], a["recipient_boxes"][0]);
    let r = with_mid(&alice_before[1], &mid(1));
    assert_eq!(r[0]["box"], a["sender_boxes"][1]);
    assert_eq!(probe_sequence(c, &alice, 0, &mid(100)).await, 3);
    assert_eq!(probe_sequence(c, &bob, 0, &mid(101)).await, 3);
}

// ---- duplicates after state changes -----------------------------------------

/// Seed: "Expiry of the delivery age limit, business authorization
/// invalidation, or device-state changes do not retroactively negate
/// acceptance"; a duplicate returns the stored status and adds nothing.
#[actix_rt::test]
async fn duplicate_after_device_and_grant_revocation_returns_stored_status_and_adds_nothing() {
    let s = start("");
    let c = &s.c;
    let mut alice = User::register(c, "relay-a", 1, false).await;
    let mut bob = User::register(c, "relay-a", 2, false).await;
    alice.add_device(c, "laptop", 11).await;
    bob.add_device(c, "laptop", 12).await;
    let t = now();
    let grant = bob.account.grant("grant-one", alice.id(), t, None);

    // To bob's phone only, sent from alice's phone with a box for her laptop.
    let cross = json!({
        "envelope": envelope(&alice, 0, bob.id(), &mid(1), t, b"hello"),
        "recipient_boxes": boxes(&bob, &[0], "rb"),
        "sender_boxes": boxes(&alice, &[0, 1], "sb"),
        "authorization": {"contact_grant": grant},
    });
    let own = json!({
        "envelope": envelope(&alice, 0, alice.id(), &mid(2), t, b"note"),
        "recipient_boxes": boxes(&alice, &[1], "rb"),
    });
    let st_cross = send_ok(c, &alice, 0, &cross).await;
    let st_own = send_ok(c, &alice, 0, &own).await;
    assert_eq!(st_cross["status"], "target_accepted", "{st_cross}");
    assert_eq!(st_own["status"], "target_accepted", "{st_own}");
    let bob_phone = bob.sync_all(c, 0).await;
    assert_eq!(with_mid(&bob_phone, &mid(1)).len(), 1);

    // The recipient revokes the grant and the device the message went to;
    // the sender revokes the only device the self-delivery was boxed for.
    c.ok("contact.revoke", bob.token(1), &json!({"grant_id": "grant-one"})).await;
    let rev = bob.account.revocation("phone", now());
    c.ok("device.revoke", bob.token(1), &json!({"revocation": rev})).await;
    let rev = alice.account.revocation("laptop", now());
    c.ok("device.revoke", alice.token(0), &json!({"revocation": rev})).await;
    let alice_before = alice.sync_all(c, 0).await;
    let bob_laptop_before = bob.sync_all(c, 1).await;

    // Controls: the same state now rejects such messages.
    let fresh_env = envelope(&alice, 0, bob.id(), &mid(3), now(), b"hello again");
    let fresh = json!({"envelope": fresh_env, "recipient_boxes": boxes(&bob, &[1], "rb"), "authorization": {"contact_grant": grant}});
    let st = send_ok(c, &alice, 0, &fresh).await;
    assert_eq!(st["status"], "failed", "a revoked grant must not authorize new messages: {st}");
    assert_eq!(st["error"]["code"], "forbidden", "{st}");
    let fresh_own = json!({"envelope": envelope(&alice, 0, alice.id(), &mid(4), now(), b"n"), "recipient_boxes": boxes(&alice, &[1], "rb")});
    assert_eq!(c.err("message.send", alice.token(0), &fresh_own).await, "device_unknown");

    // The duplicates still answer the stored status, unchanged accepted_at.
    for _ in 0..3 {
        assert_eq!(send_ok(c, &alice, 0, &cross).await, st_cross);
        assert_eq!(send_ok(c, &alice, 0, &own).await, st_own);
    }
    assert_eq!(status_of(c, &alice, 0, &mid(1)).await, st_cross);
    assert_eq!(status_of(c, &alice, 0, &mid(2)).await, st_own);
    assert_eq!(alice.sync_all(c, 0).await, alice_before);
    assert_eq!(bob.sync_all(c, 1).await, bob_laptop_before);
    // alice: sent(1), self(2); the failed fresh message has no sent record.
    assert_eq!(probe_sequence(c, &alice, 0, &mid(100)).await, 3);
    // bob: received(1) only.
    assert_eq!(probe_sequence(c, &bob, 1, &mid(101)).await, 2);
}

/// Seed: a duplicate MUST NOT "restart finished delivery"; the terminal
/// `failed` state and its reason "remain unchanged during result
/// retention", and "Delivery failure after acceptance does not remove the
/// sent record".
#[actix_rt::test]
async fn duplicate_of_failed_delivery_answers_failed_and_does_not_restart_delivery() {
    let s = start("");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, false).await;
    // No authorization and bob does not allow public discovery: the source
    // accepts, the destination refuses with `forbidden`.
    let p = alice.send_params(&bob, &mid(1), true);
    let st = send_ok(c, &alice, 0, &p).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["code"], "forbidden", "{st}");
    let final_st = status_of(c, &alice, 0, &mid(1)).await;
    assert_eq!(final_st, st);

    c.ok("account.settings.update", bob.token(0), &json!({"public_discovery": true})).await;
    for _ in 0..3 {
        assert_eq!(send_ok(c, &alice, 0, &p).await, st, "a duplicate must answer the stored terminal status");
    }
    // A new message now gets through: the duplicate did not.
    let st2 = send_ok(c, &alice, 0, &alice.send_params(&bob, &mid(2), false)).await;
    assert_eq!(st2["status"], "target_accepted", "{st2}");
    // No delivery is armed that could still bring mid(1) (not vacuous: the
    // gauge counts every accepted delivery until it ends).
    assert_eq!(c.metric("relay_deliveries_in_flight").await, Some(0.0), "a delivery is armed");
    let b = bob.sync_all(c, 0).await;
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0]["envelope"]["message_id"], mid(2).as_str());
    assert_eq!(b[0]["sequence"], 1);
    assert_eq!(status_of(c, &alice, 0, &mid(1)).await, st);
    let a = alice.sync_all(c, 0).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["direction"], "sent");
    assert_eq!(a[0]["delivery"], st);
}

/// Seed: "Expiry of the delivery age limit ... do[es] not retroactively
/// negate acceptance"; results stay available for `message_retention`.
#[actix_rt::test]
async fn duplicate_after_delivery_age_limit_passed_returns_stored_status() {
    let s = start("[limits]\ndelivery_age_limit = \"3s\"\n");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    let created_at = now() - 1;
    let cross = json!({"envelope": envelope(&alice, 0, bob.id(), &mid(1), created_at, b"x"),
                       "recipient_boxes": boxes(&bob, &[0], "rb"), "sender_boxes": boxes(&alice, &[0], "sb")});
    let own = json!({"envelope": envelope(&alice, 0, alice.id(), &mid(2), created_at, b"y"),
                     "recipient_boxes": boxes(&alice, &[0], "rb")});
    let st_cross = send_ok(c, &alice, 0, &cross).await;
    let st_own = send_ok(c, &alice, 0, &own).await;
    assert_eq!(st_cross["status"], "target_accepted", "{st_cross}");
    assert_eq!(st_own["status"], "target_accepted", "{st_own}");
    let a_before = alice.sync_all(c, 0).await;
    let b_before = bob.sync_all(c, 0).await;

    // Wait (bounded) until the age limit has passed for these envelopes.
    wait_until(created_at + 3).await;
    // Control: a new message with that created_at is now too old.
    let old = json!({"envelope": envelope(&alice, 0, alice.id(), &mid(3), created_at, b"z"),
                     "recipient_boxes": boxes(&alice, &[0], "rb")});
    assert_eq!(c.err("message.send", alice.token(0), &old).await, "message_expired");

    assert_eq!(send_ok(c, &alice, 0, &cross).await, st_cross);
    assert_eq!(send_ok(c, &alice, 0, &own).await, st_own);
    assert_eq!(status_of(c, &alice, 0, &mid(1)).await, st_cross);
    assert_eq!(status_of(c, &alice, 0, &mid(2)).await, st_own);
    assert_eq!(alice.sync_all(c, 0).await, a_before);
    assert_eq!(bob.sync_all(c, 0).await, b_before);
}

// ---- canonical JSON comparison ---------------------------------------------

/// PROTOCOL §1 / seed: content is identical when the Canonical JSON (JCS) of
/// the params is identical; member order, whitespace and string escapes in
/// the HTTP body do not make a different request.
#[actix_rt::test]
async fn same_params_with_other_member_order_whitespace_and_escapes_are_a_duplicate() {
    let s = start("");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    for (n, to, sender_boxes) in [(1u64, &bob, true), (2, &alice, false)] {
        let p = alice.send_params(to, &mid(n), sender_boxes);
        let bodies =
            [scrambled(&p), serde_json::to_string(&p).unwrap(), serde_json::to_string_pretty(&p).unwrap(), escaped(&p)];
        for b in &bodies {
            let back: Value = serde_json::from_str(b).unwrap();
            assert_eq!(back, p, "test bug: body is not the same value");
        }
        let mut first: Option<Value> = None;
        for (i, body) in bodies.iter().enumerate() {
            let (code, v) = c.raw("message.send", alice.token(0), body.clone().into_bytes()).await;
            assert_eq!(code, 200, "body #{i} of message {n} was not a duplicate: {v}\nbody: {body}");
            assert_valid("DeliveryStatus.schema.json", &v);
            assert_eq!(&v, first.get_or_insert(v.clone()), "body #{i} of message {n}");
        }
        assert_eq!(first.unwrap()["status"], "target_accepted");
        // The stored envelope is the original object.
        let records = to.sync_all(c, 0).await;
        let got = with_mid(&records, &mid(n));
        assert_eq!(got.len(), 1, "{records:?}");
        assert_eq!(got[0]["envelope"], p["envelope"]);
    }
    // Numbers and strings in another textual form with the same JCS
    // (RFC 8785 serializes numbers as ECMAScript does, strings as UTF-8).
    let mut p = alice.send_params(&bob, &mid(4), false);
    p["x_meta"] = json!({"n": 100, "f": 0.5, "s": "caf\u{e9}", "z": 0});
    let compact = serde_json::to_string(&p).unwrap();
    let mut other = compact.clone();
    for (from, to) in [
        ("\"n\":100", "\"n\":1.0E2"),
        ("\"f\":0.5", "\"f\":5e-1"),
        ("caf\u{e9}", "caf\\u00e9"),
        ("\"z\":0", "\"z\":-0.0"),
    ] {
        assert!(other.contains(from), "test bug: {from} not in {other}");
        other = other.replace(from, to);
    }
    let (code, v) = c.raw("message.send", alice.token(0), compact.into_bytes()).await;
    assert_eq!(code, 200, "{v}");
    let (code, v2) = c.raw("message.send", alice.token(0), other.clone().into_bytes()).await;
    assert_eq!((code, &v2), (200, &v), "same JCS, other number/string forms: {other}");

    // A message first accepted from escaped, scrambled bytes is a duplicate of its compact form.
    let p = alice.send_params(&bob, &mid(3), true);
    let (code, v) = c.raw("message.send", alice.token(0), escaped(&p).into_bytes()).await;
    assert_eq!(code, 200, "{v}");
    let (code, v2) = c.raw("message.send", alice.token(0), scrambled(&p).into_bytes()).await;
    assert_eq!((code, &v2), (200, &v));
    assert_eq!(send_ok(c, &alice, 0, &p).await, v);
    let b = bob.sync_all(c, 0).await;
    let got = with_mid(&b, &mid(3));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["envelope"], p["envelope"], "stored envelope (sent with escapes) differs");

    let a = alice.sync_all(c, 0).await;
    assert_eq!(sequences(&a), vec![1, 2, 3], "{a:?}");
    assert_eq!(sequences(&b), vec![1, 2, 3], "{b:?}");
    assert_eq!(probe_sequence(c, &alice, 0, &mid(100)).await, 4);
    assert_eq!(probe_sequence(c, &bob, 0, &mid(101)).await, 4);
}

// ---- rejection before acceptance -------------------------------------------

/// Seed: "An explicit rejection before acceptance creates no acceptance
/// result. The caller may correct and resubmit the request".
#[actix_rt::test]
async fn rejected_send_creates_no_acceptance_result_and_corrected_resend_is_accepted() {
    let s = start("");
    let c = &s.c;
    let mut alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    alice.add_device(c, "laptop", 11).await;
    let t = now();

    struct Case {
        what: &'static str,
        n: u64,
        to_self: bool,
        dev: usize,
        bad: Value,
        code: &'static str,
    }
    let good = |n: u64, to_self: bool| {
        let to = if to_self { alice.id() } else { bob.id() };
        let rb = if to_self { boxes(&alice, &[0, 1], "rb") } else { boxes(&bob, &[0], "rb") };
        json!({"envelope": envelope(&alice, 0, to, &mid(n), t, b"text"), "recipient_boxes": rb,
               "sender_boxes": boxes(&alice, &[0, 1], "sb")})
    };
    let forged = |n: u64, to_self: bool| {
        let mut p = good(n, to_self);
        p["envelope"]["ciphertext"] = json!(relay_schemas::encoding::b64_encode(b"tampered"));
        p
    };
    let mut cases = vec![
        Case {
            what: "forged envelope signature (cross)",
            n: 1,
            to_self: false,
            dev: 0,
            bad: forged(1, false),
            code: "invalid_signature",
        },
        Case {
            what: "forged envelope signature (self)",
            n: 2,
            to_self: true,
            dev: 0,
            bad: forged(2, true),
            code: "invalid_signature",
        },
        Case {
            what: "signed by another device's key",
            n: 3,
            to_self: false,
            dev: 0,
            bad: {
                let mut p = good(3, false);
                let mut m = p["envelope"].as_object().unwrap().clone();
                sign_object(Tag::Envelope, &mut m, &alice.devices[1].key);
                p["envelope"] = Value::Object(m);
                p
            },
            code: "invalid_signature",
        },
        Case {
            what: "created_at beyond clock tolerance",
            n: 4,
            to_self: false,
            dev: 0,
            bad: {
                let mut p = good(4, false);
                p["envelope"] = envelope(&alice, 0, bob.id(), &mid(4), t + 3600, b"text");
                p
            },
            code: "clock_skew",
        },
        Case {
            what: "sent on another device's session",
            n: 5,
            to_self: false,
            dev: 1,
            bad: good(5, false),
            code: "forbidden",
        },
        Case {
            what: "self-delivery boxed only for unknown devices",
            n: 6,
            to_self: true,
            dev: 0,
            bad: {
                let mut p = good(6, true);
                p["recipient_boxes"] = json!([key_box("tablet", b"rb")]);
                p
            },
            code: "device_unknown",
        },
    ];
    for case in &mut cases {
        for _ in 0..2 {
            let code = c.err("message.send", alice.token(case.dev), &case.bad).await;
            assert_eq!(code, case.code, "{}", case.what);
        }
        let code = c.err("message.delivery.status", alice.token(0), &json!({"message_id": mid(case.n)})).await;
        assert_eq!(code, "not_found", "{}: a rejection left an acceptance result", case.what);
    }
    assert!(alice.sync_all(c, 0).await.is_empty());
    assert!(bob.sync_all(c, 0).await.is_empty());

    for case in &cases {
        let st = send_ok(c, &alice, 0, &good(case.n, case.to_self)).await;
        assert_eq!(st["status"], "target_accepted", "{}: {st}", case.what);
        assert_eq!(status_of(c, &alice, 0, &mid(case.n)).await, st, "{}", case.what);
        assert_eq!(send_ok(c, &alice, 0, &good(case.n, case.to_self)).await, st, "{}", case.what);
    }
    let a = alice.sync_all(c, 0).await;
    let b = bob.sync_all(c, 0).await;
    // Self-deliveries (2, 6) have one record; cross (1, 3, 4, 5) a sent record.
    assert_eq!(a.len(), 6, "{a:?}");
    assert_eq!(b.len(), 4, "{b:?}");
    for case in &cases {
        assert_eq!(with_mid(&a, &mid(case.n)).len(), 1, "{}", case.what);
        let r = with_mid(&a, &mid(case.n))[0];
        assert_eq!(r["envelope"]["ciphertext"], relay_schemas::encoding::b64_encode(b"text").as_str());
    }
    assert_eq!(sequences(&a), (1..=6).collect::<Vec<_>>());
    assert_eq!(sequences(&b), (1..=4).collect::<Vec<_>>());
}

// ---- sessions and transport ------------------------------------------------

/// Seed: "Transport correlation IDs, connections, and sessions ... do not
/// participate in logical keys or request-content comparison"; a request
/// must still meet the invocation requirements (the session's device is the
/// envelope's `from_device_id`).
#[actix_rt::test]
async fn duplicate_over_a_new_session_of_the_same_device_is_the_same_request() {
    let s = start("");
    let c = &s.c;
    let mut alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    alice.add_device(c, "laptop", 11).await;
    let cross = alice.send_params(&bob, &mid(1), true);
    let own = alice.send_params(&alice, &mid(2), false);
    let st_cross = send_ok(c, &alice, 0, &cross).await;
    let st_own = send_ok(c, &alice, 0, &own).await;
    let a_before = alice.sync_all(c, 0).await;
    let b_before = bob.sync_all(c, 0).await;

    let second = alice.open_session(c, 0).await;
    assert_ne!(Some(second.as_str()), alice.token(0));
    assert_eq!(c.ok("message.send", Some(&second), &cross).await, st_cross);
    assert_eq!(c.ok("message.send", Some(&second), &own).await, st_own);
    assert_eq!(c.ok("message.delivery.status", Some(&second), &json!({"message_id": mid(1)})).await, st_cross);
    // Another device of the account may not submit this device's envelope,
    // duplicate or not.
    assert_eq!(c.err("message.send", alice.token(1), &cross).await, "forbidden");
    assert_eq!(c.err("message.send", alice.token(1), &own).await, "forbidden");
    // No session at all is refused before any comparison.
    assert_eq!(c.err("message.send", None, &cross).await, "unauthorized");
    assert_eq!(alice.sync_all(c, 0).await, a_before);
    assert_eq!(bob.sync_all(c, 0).await, b_before);
    assert_eq!(probe_sequence(c, &alice, 0, &mid(100)).await, 3);
    assert_eq!(probe_sequence(c, &bob, 0, &mid(101)).await, 2);
}

// ---- result retention ------------------------------------------------------

/// Waits (bounded) until the wall clock reaches `t` (Unix seconds).
async fn wait_until(t: u64) {
    let limit = Duration::from_secs(t.saturating_sub(now()) + 5);
    eventually(&format!("the wall clock reaches {t}"), limit, || {
        std::future::ready(if now() >= t { Ok(()) } else { Err(format!("now {}", now())) })
    })
    .await
}

/// Seed "Delivery Result Retention Rules": "Later configuration changes MUST
/// NOT shorten an already promised retention period".
#[actix_rt::test]
async fn shortened_retention_config_does_not_shorten_promised_retention() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let cross = alice.send_params(&bob, &mid(1), true);
    let own = alice.send_params(&alice, &mid(2), false);
    let st_cross = send_ok(&c, &alice, 0, &cross).await;
    let st_own = send_ok(&c, &alice, 0, &own).await;
    let a_before = alice.sync_all(&c, 0).await;
    let b_before = bob.sync_all(&c, 0).await;
    let at = st_cross["accepted_at"].as_u64().unwrap().max(st_own["accepted_at"].as_u64().unwrap());

    assert!(relay.terminate().success());
    common::relay::write_config(dir.path(), "relay-a", "[limits]\nmessage_retention = \"1s\"\n");
    relay.restart();
    let c = Client::new(&relay.url);
    // Control: the new setting is in force for new acceptances.
    let fresh = send_ok(&c, &alice, 0, &alice.send_params(&alice, &mid(3), false)).await;
    let records = alice.sync_all(&c, 0).await;
    let r = with_mid(&records, &mid(3));
    assert_eq!(r[0]["expires_at"].as_u64(), Some(fresh["accepted_at"].as_u64().unwrap() + 1), "{:?}", r[0]);

    wait_until(at + 3).await;
    assert_eq!(send_ok(&c, &alice, 0, &cross).await, st_cross);
    assert_eq!(send_ok(&c, &alice, 0, &own).await, st_own);
    assert_eq!(status_of(&c, &alice, 0, &mid(1)).await, st_cross);
    assert_eq!(status_of(&c, &alice, 0, &mid(2)).await, st_own);
    let mut after = alice.sync_all(&c, 0).await;
    after.retain(|r| r["envelope"]["message_id"] != mid(3).as_str());
    assert_eq!(after, a_before);
    assert_eq!(bob.sync_all(&c, 0).await, b_before);
}

/// Seed: after retention ends a relay "returning an existing result must
/// still follow the rules above" or may answer `message_expired`; a relay
/// that still recognizes the request must not accept it as new.
#[actix_rt::test]
async fn duplicate_after_retention_ended_is_expired_or_the_unchanged_result() {
    let s = start("[limits]\nmessage_retention = \"2s\"\n");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    let cross = alice.send_params(&bob, &mid(1), true);
    let own = alice.send_params(&alice, &mid(2), false);
    let st_cross = send_ok(c, &alice, 0, &cross).await;
    let st_own = send_ok(c, &alice, 0, &own).await;
    assert_eq!(st_cross["status"], "target_accepted", "{st_cross}");
    let a_count = alice.sync_all(c, 0).await.len();
    let b_count = bob.sync_all(c, 0).await.len();
    // Within retention, repeated requests answer the result ...
    assert_eq!(send_ok(c, &alice, 0, &cross).await, st_cross);
    let at = st_cross["accepted_at"].as_u64().unwrap().max(st_own["accepted_at"].as_u64().unwrap());
    wait_until(at + 2).await;
    // ... and after it, either the unchanged result or message_expired.
    for (p, st, n) in [(&cross, &st_cross, 1), (&own, &st_own, 2)] {
        let (code, v) = c.call("message.send", alice.token(0), p).await;
        match code {
            200 => assert_eq!(&v, st, "message {n}"),
            _ => assert_eq!(v["error"]["code"], "message_expired", "message {n}: {code} {v}"),
        }
        let (code, v) = c.call("message.delivery.status", alice.token(0), &json!({"message_id": mid(n)})).await;
        match code {
            200 => assert_eq!(&v, st, "message {n}"),
            _ => assert!(
                v["error"]["code"] == "message_expired" || v["error"]["code"] == "not_found",
                "message {n}: {code} {v}"
            ),
        }
    }
    assert!(alice.sync_all(c, 0).await.len() <= a_count);
    assert!(bob.sync_all(c, 0).await.len() <= b_count);
}

// ---- the logical key and fixed visibility ----------------------------------

/// Seed: the logical message key is `(from, message_id)`: the same
/// `message_id` from another sender is another message.
#[actix_rt::test]
async fn same_message_id_from_different_senders_are_different_messages() {
    let s = start("");
    let c = &s.c;
    let alice = User::register(c, "relay-a", 1, true).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    let carol = User::register(c, "relay-a", 3, true).await;
    let id = mid(7);
    let a_to_c = alice.send_params(&carol, &id, true);
    let b_to_c = bob.send_params(&carol, &id, true);
    let b_to_b = bob.send_params(&bob, &mid(8), false);
    let c_to_a = carol.send_params(&alice, &id, false);
    let st1 = send_ok(c, &alice, 0, &a_to_c).await;
    let st2 = send_ok(c, &bob, 0, &b_to_c).await;
    let st3 = send_ok(c, &bob, 0, &b_to_b).await;
    let st4 = send_ok(c, &carol, 0, &c_to_a).await;
    for st in [&st1, &st2, &st3, &st4] {
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    // Each sender's result is its own.
    assert_eq!(send_ok(c, &alice, 0, &a_to_c).await, st1);
    assert_eq!(send_ok(c, &bob, 0, &b_to_c).await, st2);
    assert_eq!(status_of(c, &carol, 0, &id).await, st4);
    let records = carol.sync_all(c, 0).await;
    let got = with_mid(&records, &id);
    assert_eq!(got.len(), 2, "{records:?}");
    let mut senders: Vec<&str> = got.iter().map(|r| r["envelope"]["from"].as_str().unwrap()).collect();
    senders.sort();
    let mut want = vec![alice.id(), bob.id()];
    want.sort();
    assert_eq!(senders, want);
    assert_eq!(sequences(&records), vec![1, 2]);
    let a = alice.sync_all(c, 0).await;
    assert_eq!(a.len(), 2, "alice: sent + received under one message_id: {a:?}");
}

/// Seed: duplicates MUST NOT "modify the original record's key boxes or
/// device visibility"; the visible set is fixed at acceptance, so a device
/// added afterwards does not see the record, even when the original boxes
/// named it and the request is repeated.
#[actix_rt::test]
async fn duplicate_after_a_boxed_device_is_added_does_not_extend_visibility() {
    let s = start("");
    let c = &s.c;
    let mut alice = User::register(c, "relay-a", 1, false).await;
    let mut bob = User::register(c, "relay-a", 2, true).await;
    let t = now();
    // Boxes for the phone and for a "tablet" that is not a device yet.
    let rb = json!([key_box("phone", b"rb phone"), key_box("tablet", b"rb tablet")]);
    let cross = json!({"envelope": envelope(&alice, 0, bob.id(), &mid(1), t, b"x"), "recipient_boxes": rb,
                       "sender_boxes": [key_box("phone", b"sb phone"), key_box("tablet", b"sb tablet")]});
    let own = json!({"envelope": envelope(&alice, 0, alice.id(), &mid(2), t, b"y"),
                     "recipient_boxes": [key_box("phone", b"rb phone"), key_box("tablet", b"rb tablet")]});
    let st_cross = send_ok(c, &alice, 0, &cross).await;
    let st_own = send_ok(c, &alice, 0, &own).await;
    assert_eq!(st_cross["status"], "target_accepted", "{st_cross}");
    assert_eq!(st_own["status"], "target_accepted", "{st_own}");
    let a_phone = alice.sync_all(c, 0).await;
    let b_phone = bob.sync_all(c, 0).await;

    let ta = alice.add_device(c, "tablet", 21).await;
    let tb = bob.add_device(c, "tablet", 22).await;
    assert_eq!(send_ok(c, &alice, 0, &cross).await, st_cross);
    assert_eq!(send_ok(c, &alice, 0, &own).await, st_own);
    let a_tab = alice.sync_all(c, ta).await;
    let b_tab = bob.sync_all(c, tb).await;
    assert!(a_tab.is_empty(), "a device added after acceptance sees: {a_tab:?}");
    assert!(b_tab.is_empty(), "a device added after acceptance sees: {b_tab:?}");
    assert_eq!(alice.sync_all(c, 0).await, a_phone);
    assert_eq!(bob.sync_all(c, 0).await, b_phone);
    assert_eq!(probe_sequence(c, &alice, ta, &mid(100)).await, 3);
    assert_eq!(probe_sequence(c, &bob, tb, &mid(101)).await, 2);
}
