//! Bad input gets the right `RelayError` and changes nothing; none of it
//! panics the relay.
//!
//! Each test starts one relay with Alice (private) and Bob (public) who have
//! already exchanged one message, snapshots both timelines, sends bad
//! requests, and then proves nothing changed: both `sync_all` results are
//! identical to before, `message.delivery.status` of the attempted
//! message_id is `not_found`, the corrected request with the same
//! message_id is accepted (so the rejection stored no idempotency result),
//! and `/healthz` still answers.

use crate::common;

use common::client::{mid, now, resign, Client, User};
use common::relay::RelayProc;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::encoding::b64_encode;
use relay_schemas::sign::Tag;
use serde_json::{json, Value};

const RELAY: &str = "relay-a";

struct Fx {
    _dir: tempfile::TempDir,
    _relay: RelayProc,
    c: Client,
    alice: User,
    bob: User,
    before: (Vec<Value>, Vec<Value>),
}

/// The message id the bad requests of a test try to use.
fn attempted() -> String {
    mid(2)
}

async fn fixture() -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), RELAY, "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, RELAY, 1, false).await;
    let bob = User::register(&c, RELAY, 2, true).await;
    let st = c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(st["status"], "target_accepted");
    let before = (alice.sync_all(&c, 0).await, bob.sync_all(&c, 0).await);
    assert_eq!(before.0.len(), 1);
    assert_eq!(before.1.len(), 1);
    Fx { _dir: dir, _relay: relay, c, alice, bob, before }
}

impl Fx {
    /// Valid params for the attempted message (Alice to Bob, with sender boxes).
    fn valid(&self) -> Value {
        self.alice.send_params(&self.bob, &attempted(), true)
    }

    /// `message.send` by Alice of raw bytes: must fail with `code`.
    async fn send_raw_fails(&self, body: Vec<u8>, code: &str) {
        let shown = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
        let v = self.c.raw_err_body("message.send", self.alice.token(0), body).await;
        assert_eq!(v["error"]["code"], code, "body {shown}: {v}");
    }

    /// `message.send` by Alice: must fail with `code`.
    async fn send_fails(&self, params: &Value, code: &str) {
        self.send_raw_fails(serde_json::to_vec(params).unwrap(), code).await;
    }

    /// Both timelines are as before and the attempted message is unknown.
    async fn assert_unchanged(&self) {
        assert_eq!(self.alice.sync_all(&self.c, 0).await, self.before.0, "Alice's timeline changed");
        assert_eq!(self.bob.sync_all(&self.c, 0).await, self.before.1, "Bob's timeline changed");
        let code =
            self.c.err("message.delivery.status", self.alice.token(0), &json!({"message_id": attempted()})).await;
        assert_eq!(code, "not_found", "a delivery status exists for the rejected message");
    }

    /// Nothing changed; the corrected request with the same message id is
    /// accepted; the relay is alive.
    async fn finish(&self) {
        self.assert_unchanged().await;
        let st = self.c.ok("message.send", self.alice.token(0), &self.valid()).await;
        assert_eq!(st["status"], "target_accepted", "{st}");
        assert_eq!(self.bob.sync_all(&self.c, 0).await.len(), self.before.1.len() + 1);
        self.c.assert_healthy().await;
    }

    /// Nothing changed and the relay is alive (for requests that are not sends).
    async fn finish_without_resend(&self) {
        self.assert_unchanged().await;
        self.c.assert_healthy().await;
    }

    /// A properly signed envelope of the attempted message after `edit`.
    fn envelope_with(&self, edit: impl FnOnce(&mut Value)) -> Value {
        let mut env = self.valid()["envelope"].clone();
        edit(&mut env);
        resign(Tag::Envelope, &env, &self.alice.devices[0].key)
    }

    /// Valid params with the envelope edited (and re-signed).
    fn with_envelope(&self, edit: impl FnOnce(&mut Value)) -> Value {
        let mut p = self.valid();
        p["envelope"] = self.envelope_with(edit);
        p
    }
}

/// Every client method with a token to use and well-formed params.
fn all_methods(fx: &Fx) -> Vec<(&'static str, Option<String>, Value)> {
    let a = &fx.alice;
    let t = a.tokens[0].clone();
    let laptop = Device::from_seed("laptop", [201; 32]);
    vec![
        (
            "account.register",
            None,
            a.account.register_params(
                &a.account.route(1, &[(RELAY, fx.c.base.as_str())], now()),
                &a.account.certificate(&a.devices[0], now(), None),
                RELAY,
                false,
                now(),
            ),
        ),
        ("session.challenge", None, json!({"account_id": a.id(), "device_id": "phone"})),
        (
            "session.open",
            None,
            json!({"account_id": a.id(), "device_id": "phone", "challenge": "AAAA",
                                     "signature": b64_encode(&[0u8; 64])}),
        ),
        ("session.attach", None, json!({"token": t})),
        ("device.add", Some(t.clone()), json!({"device_certificate": a.account.certificate(&laptop, now(), None)})),
        ("device.revoke", Some(t.clone()), json!({"revocation": a.account.revocation("phone", now())})),
        ("account.devices.get", Some(t.clone()), json!({"account_id": a.id()})),
        ("account.settings.update", Some(t.clone()), json!({"public_discovery": true})),
        ("route.get", None, json!({"account_id": a.id()})),
        ("route.update", Some(t.clone()), json!({"route": a.account.route(2, &[(RELAY, fx.c.base.as_str())], now())})),
        ("contact.revoke", Some(t.clone()), json!({"grant_id": "grant-1"})),
        ("message.send", Some(t.clone()), fx.valid()),
        ("message.delivery.status", Some(t.clone()), json!({"message_id": attempted()})),
        ("message.timeline.sync", Some(t.clone()), json!({"after": 0, "limit": 10})),
        ("message.timeline.ack", Some(t), json!({"through": 1})),
    ]
}

/// `params` as a positional JSON array of its values, in the order the
/// protocol lists the members.
fn positional(method: &str, params: &Value) -> Value {
    let m = params.as_object().unwrap();
    let order: Vec<&str> = match method {
        "account.register" => vec!["route", "device_certificate", "registration"],
        "session.challenge" => vec!["account_id", "device_id"],
        "session.open" => vec!["account_id", "device_id", "challenge", "signature"],
        "message.send" => vec!["envelope", "recipient_boxes", "sender_boxes", "authorization"],
        "message.timeline.sync" => vec!["after", "limit"],
        _ => m.keys().map(String::as_str).collect(),
    };
    Value::Array(order.iter().filter_map(|k| m.get(*k).cloned()).collect())
}

/// Alice is still private: Bob's grantless send fails with `forbidden`.
async fn assert_alice_still_private(fx: &Fx) {
    let st = fx.c.ok("message.send", fx.bob.token(0), &fx.bob.send_params(&fx.alice, &mid(900), false)).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["code"], "forbidden", "{st}");
}

// ---- not JSON, not an object --------------------------------------------------------

#[actix_rt::test]
async fn malformed_json_is_invalid_params() {
    let fx = fixture().await;
    let valid = serde_json::to_string(&fx.valid()).unwrap();
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{".to_vec(),
        b"not json".to_vec(),
        b"{\"envelope\":".to_vec(),
        b"{\"after\":0,}".to_vec(),
        b"{'after':0}".to_vec(),
        b"{\"after\":NaN}".to_vec(),
        b"\xff\xfe{}".to_vec(),
        valid.as_bytes()[..valid.len() - 1].to_vec(),
        format!("{valid}{valid}").into_bytes(),
        format!("{valid} x").into_bytes(),
        // A lone surrogate in an unknown envelope member.
        valid.replacen("{\"envelope\":{", "{\"envelope\":{\"x\":\"\\ud800\",", 1).into_bytes(),
        // Nesting far beyond any parser's recursion limit.
        format!("{{\"envelope\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
    ];
    for body in &bodies {
        fx.send_raw_fails(body.clone(), "invalid_params").await;
    }
    // The same for methods without a session and other session methods.
    for body in &bodies {
        for (method, token) in
            [("route.get", None), ("account.register", None), ("message.timeline.sync", fx.alice.token(0))]
        {
            let code = fx.c.raw_err(method, token, body.clone()).await;
            assert_eq!(code, "invalid_params", "{method} {:?}", String::from_utf8_lossy(&body[..body.len().min(80)]));
        }
    }
    fx.finish().await;
}

#[actix_rt::test]
async fn a_json_array_number_string_or_null_instead_of_an_object_is_invalid_params() {
    let fx = fixture().await;
    for (method, token, _) in all_methods(&fx) {
        for body in ["[]", "[[]]", "42", "-1", "\"params\"", "null", "true"] {
            let code = fx.c.raw_err(method, token.as_deref(), body.as_bytes().to_vec()).await;
            assert_eq!(code, "invalid_params", "{method} with body {body}");
        }
    }
    assert_alice_still_private(&fx).await;
    fx.finish().await;
}

#[actix_rt::test]
async fn positional_json_array_params_of_read_methods_are_invalid_params() {
    let fx = fixture().await;
    let mut accepted = vec![];
    for (method, token, params) in all_methods(&fx) {
        if ![
            "session.challenge",
            "account.devices.get",
            "route.get",
            "message.delivery.status",
            "message.timeline.sync",
        ]
        .contains(&method)
        {
            continue;
        }
        let mut body = positional(method, &params);
        if method == "message.delivery.status" {
            body = json!([mid(1)]); // a message that exists
        }
        let (status, v) = fx.c.call(method, token.as_deref(), &body).await;
        if status != 400 || v["error"]["code"] != "invalid_params" {
            accepted.push(format!("{method} {body} -> {status} {v}"));
        }
    }
    assert!(accepted.is_empty(), "positional arrays not rejected:\n{}", accepted.join("\n"));
    fx.finish().await;
}

#[actix_rt::test]
async fn positional_json_array_params_of_state_changing_methods_are_invalid_params_and_change_nothing() {
    let fx = fixture().await;
    let a = &fx.alice;
    let t = a.tokens[0].clone();
    let carol = Account::from_seed([3; 32]);
    let carol_phone = Device::from_seed("phone", [103; 32]);
    let laptop = Device::from_seed("laptop", [201; 32]);
    let valid = fx.valid();
    // Positional arrays of well-formed params, in the protocol's member order.
    // device.revoke comes last and revokes the laptop (not the phone whose
    // session makes these calls).
    let calls: Vec<(&str, Option<String>, Value)> = vec![
        (
            "account.register",
            None,
            json!([
                carol.route(1, &[(RELAY, fx.c.base.as_str())], now()),
                carol.certificate(&carol_phone, now(), None)
            ]),
        ),
        ("message.send", Some(t.clone()), json!([valid["envelope"], valid["recipient_boxes"], valid["sender_boxes"]])),
        ("device.add", Some(t.clone()), json!([a.account.certificate(&laptop, now(), None)])),
        ("account.settings.update", Some(t.clone()), json!([true])),
        ("route.update", Some(t.clone()), json!([a.account.route(2, &[(RELAY, fx.c.base.as_str())], now())])),
        ("contact.revoke", Some(t.clone()), json!(["grant-1"])),
        ("message.timeline.ack", Some(t.clone()), json!([1])),
        ("device.revoke", Some(t), json!([a.account.revocation("laptop", now())])),
    ];
    let mut accepted = vec![];
    for (method, token, body) in &calls {
        let (status, v) = fx.c.call(method, token.as_deref(), body).await;
        if status != 400 || v["error"]["code"] != "invalid_params" {
            accepted.push(format!("{method} {body} -> {status} {v}"));
        }
    }
    // Alice still private, one device and no revocation, route revision 1.
    let devices = fx.c.ok("account.devices.get", fx.alice.token(0), &json!({"account_id": fx.alice.id()})).await;
    let route = fx.c.ok("route.get", None, &json!({"account_id": fx.alice.id()})).await;
    let grantless = fx.c.ok("message.send", fx.bob.token(0), &fx.bob.send_params(&fx.alice, &mid(900), false)).await;
    assert!(
        accepted.is_empty(),
        "positional arrays not rejected:\n{}\nafterwards: devices {devices}\nroute revision {}\nBob's grantless send to private Alice: {grantless}",
        accepted.join("\n"),
        route["revision"]
    );
    assert_eq!(devices["certificates"].as_array().unwrap().len(), 1, "{devices}");
    assert_eq!(devices["revocations"], json!([]), "{devices}");
    assert_eq!(route["revision"], 1);
    assert_eq!(grantless["error"]["code"], "forbidden", "{grantless}");
    assert_eq!(fx.c.err("route.get", None, &json!({"account_id": carol.id})).await, "route_not_found");
    fx.finish().await;
}

// ---- wrong types, missing members --------------------------------------------------------

#[actix_rt::test]
async fn wrong_member_types_are_invalid_params() {
    let fx = fixture().await;
    let envelope_edits: Vec<(&str, Value)> = vec![
        ("created_at", json!(now().to_string())),
        ("created_at", json!(-1)),
        ("created_at", json!(now() as f64 + 0.5)),
        ("created_at", json!(1e300)),
        ("created_at", json!(null)),
        ("message_id", json!(12345678901234567u64)),
        ("from", json!(null)),
        ("to", json!([fx.bob.id()])),
        ("ciphertext", json!({"b64": "AQID"})),
    ];
    for (member, value) in envelope_edits {
        let p = fx.with_envelope(|e| e[member] = value.clone());
        fx.send_fails(&p, "invalid_params").await;
    }
    // created_at one past u64::MAX, spelled out (serde_json::Value cannot hold it).
    let valid = serde_json::to_string(&fx.valid()).unwrap();
    let created = format!("\"created_at\":{}", fx.valid()["envelope"]["created_at"]);
    assert!(valid.contains(&created));
    let body = valid.replace(&created, "\"created_at\":18446744073709551616");
    fx.send_raw_fails(body.into_bytes(), "invalid_params").await;
    let params_edits: Vec<(&str, Value)> = vec![
        ("envelope", json!("envelope")),
        ("recipient_boxes", json!({"device_id": "phone", "box": "AQID"})),
        ("recipient_boxes", json!(["AQID"])),
        ("recipient_boxes", json!([{"device_id": 7, "box": "AQID"}])),
        ("recipient_boxes", json!([{"device_id": "phone", "box": 7}])),
        ("sender_boxes", json!("phone")),
        ("authorization", json!("grant-1")),
        ("authorization", json!({"contact_grant": "grant-1"})),
    ];
    for (member, value) in params_edits {
        let mut p = fx.valid();
        p[member] = value;
        fx.send_fails(&p, "invalid_params").await;
    }
    // Other methods.
    let t = fx.alice.token(0);
    for (method, params) in [
        ("message.timeline.sync", json!({"after": 0, "limit": -1})),
        ("message.timeline.sync", json!({"after": "0"})),
        ("message.timeline.sync", json!({"after": -1})),
        ("message.timeline.ack", json!({"through": "1"})),
        ("message.timeline.ack", json!({"through": 1.5})),
        ("account.settings.update", json!({"public_discovery": "true"})),
        ("account.settings.update", json!({"public_discovery": 1})),
        ("message.delivery.status", json!({"message_id": 12345678901234567u64})),
        ("contact.revoke", json!({"grant_id": 1})),
        ("account.devices.get", json!({"account_id": 1})),
    ] {
        assert_eq!(fx.c.err(method, t, &params).await, "invalid_params", "{method} {params}");
    }
    for (method, params) in [
        ("route.get", json!({"account_id": null})),
        ("session.challenge", json!({"account_id": fx.alice.id(), "device_id": 1})),
    ] {
        assert_eq!(fx.c.err(method, None, &params).await, "invalid_params", "{method} {params}");
    }
    assert_alice_still_private(&fx).await;
    fx.finish().await;
}

#[actix_rt::test]
async fn null_for_an_optional_member_is_invalid_params() {
    let fx = fixture().await;
    for member in ["sender_boxes", "authorization"] {
        let mut p = fx.valid();
        p[member] = Value::Null;
        fx.send_fails(&p, "invalid_params").await;
    }
    fx.finish().await;
}

#[actix_rt::test]
async fn missing_required_members_are_invalid_params() {
    let fx = fixture().await;
    for member in ["envelope", "recipient_boxes"] {
        let mut p = fx.valid();
        p.as_object_mut().unwrap().remove(member);
        fx.send_fails(&p, "invalid_params").await;
    }
    for member in ["message_id", "from", "from_device_id", "to", "created_at", "ciphertext"] {
        let p = fx.with_envelope(|e| {
            e.as_object_mut().unwrap().remove(member);
        });
        fx.send_fails(&p, "invalid_params").await;
    }
    // Unsigned envelope.
    let mut p = fx.valid();
    p["envelope"].as_object_mut().unwrap().remove("signature");
    fx.send_fails(&p, "invalid_params").await;
    for member in ["device_id", "box"] {
        let mut p = fx.valid();
        p["recipient_boxes"][0].as_object_mut().unwrap().remove(member);
        fx.send_fails(&p, "invalid_params").await;
        let mut p = fx.valid();
        p["sender_boxes"][0].as_object_mut().unwrap().remove(member);
        fx.send_fails(&p, "invalid_params").await;
    }
    // A grant without its grantee.
    let mut p = fx.valid();
    let mut grant = fx.bob.account.grant("grant-1", fx.alice.id(), now(), None);
    grant.as_object_mut().unwrap().remove("grantee");
    p["authorization"] = json!({"contact_grant": resign(Tag::ContactGrant, &grant, &fx.bob.account.key)});
    fx.send_fails(&p, "invalid_params").await;
    // Other methods.
    let t = fx.alice.token(0);
    for (method, params) in [
        ("message.timeline.sync", json!({"limit": 10})),
        ("message.timeline.ack", json!({})),
        ("message.delivery.status", json!({})),
        ("account.settings.update", json!({})),
        ("account.devices.get", json!({})),
        ("device.add", json!({})),
        ("device.revoke", json!({})),
        ("route.update", json!({})),
    ] {
        assert_eq!(fx.c.err(method, t, &params).await, "invalid_params", "{method} {params}");
    }
    let carol = Account::from_seed([3; 32]);
    let phone = Device::from_seed("phone", [103; 32]);
    for (method, params) in [
        ("route.get", json!({})),
        ("session.challenge", json!({"account_id": fx.alice.id()})),
        ("session.open", json!({"account_id": fx.alice.id(), "device_id": "phone"})),
        ("account.register", json!({"route": carol.route(1, &[(RELAY, fx.c.base.as_str())], now())})),
        ("account.register", json!({"device_certificate": carol.certificate(&phone, now(), None)})),
    ] {
        assert_eq!(fx.c.err(method, None, &params).await, "invalid_params", "{method} {params}");
    }
    assert_eq!(fx.c.err("route.get", None, &json!({"account_id": carol.id})).await, "route_not_found");
    fx.finish().await;
}

#[actix_rt::test]
async fn a_member_repeated_inside_the_envelope_is_invalid_params() {
    // Two `to` members: whichever one a parser keeps, the request is ambiguous.
    let fx = fixture().await;
    let valid = serde_json::to_string(&fx.valid()).unwrap();
    let to = format!("\"to\":\"{}\"", fx.bob.id());
    assert!(valid.contains(&to));
    let body = valid.replacen(&to, &format!("{to},\"to\":\"{}\"", fx.alice.id()), 1);
    fx.send_raw_fails(body.into_bytes(), "invalid_params").await;
    fx.finish().await;
}

// ---- sizes -------------------------------------------------------------------------------

#[actix_rt::test]
async fn ciphertext_over_65536_decoded_bytes_is_payload_too_large() {
    let fx = fixture().await;
    for n in [65537, 100_000] {
        let p = fx.with_envelope(|e| e["ciphertext"] = json!(b64_encode(&vec![1u8; n])));
        fx.send_fails(&p, "payload_too_large").await;
    }
    // A key box over 1024 bytes.
    let mut p = fx.valid();
    p["recipient_boxes"][0]["box"] = json!(b64_encode(&[1u8; 1025]));
    fx.send_fails(&p, "payload_too_large").await;
    fx.finish().await;
}

#[actix_rt::test]
async fn body_over_one_mebibyte_is_payload_too_large() {
    let fx = fixture().await;
    let mut p = fx.valid();
    p["x-pad"] = json!("x".repeat(1 << 20));
    fx.send_fails(&p, "payload_too_large").await;
    let code = fx.c.err("route.get", None, &json!({"account_id": fx.alice.id(), "x-pad": "x".repeat(3 << 20)})).await;
    assert_eq!(code, "payload_too_large");
    fx.finish().await;
}

#[actix_rt::test]
async fn more_than_64_boxes_is_payload_too_large() {
    // limits.max_boxes is a size limit: the relay answers payload_too_large.
    let fx = fixture().await;
    let many = |n: usize| -> Value { (0..n).map(|i| key_box(&format!("dev-{i}"), b"k")).collect::<Vec<_>>().into() };
    let mut p = fx.valid();
    p["recipient_boxes"] = many(65);
    p["recipient_boxes"][0]["device_id"] = json!("phone");
    fx.send_fails(&p, "payload_too_large").await;
    let mut p = fx.valid();
    p["sender_boxes"] = many(65);
    p["sender_boxes"][0]["device_id"] = json!("phone");
    fx.send_fails(&p, "payload_too_large").await;
    fx.assert_unchanged().await;
    // 64 recipient boxes are fine (one names a valid device).
    let mut p = fx.valid();
    p["recipient_boxes"] = many(64);
    p["recipient_boxes"][0]["device_id"] = json!("phone");
    assert_eq!(fx.c.ok("message.send", fx.alice.token(0), &p).await["status"], "target_accepted");
    fx.c.assert_healthy().await;
}

// ---- encodings and identifiers --------------------------------------------------------------

#[actix_rt::test]
async fn base64_with_padding_or_the_standard_alphabet_is_invalid_params() {
    let fx = fixture().await;
    // "AQ==" is padded, "a+b/" and "ab/c" use the standard alphabet, "AB" has
    // non-zero trailing bits, "AQID\n" has whitespace.
    for bad in ["AQ==", "AQI=", "a+b/", "ab/c", "AB", "AQID\n", "A"] {
        let p = fx.with_envelope(|e| e["ciphertext"] = json!(bad));
        fx.send_fails(&p, "invalid_params").await;
        let mut p = fx.valid();
        p["recipient_boxes"][0]["box"] = json!(bad);
        fx.send_fails(&p, "invalid_params").await;
        let mut p = fx.valid();
        p["sender_boxes"][0]["box"] = json!(bad);
        fx.send_fails(&p, "invalid_params").await;
    }
    // A padded signature, and one in the standard alphabet.
    let mut p = fx.valid();
    let sig = p["envelope"]["signature"].as_str().unwrap().to_string();
    p["envelope"]["signature"] = json!(format!("{sig}=="));
    fx.send_fails(&p, "invalid_params").await;
    let mut p = fx.valid();
    p["envelope"]["signature"] = json!(sig.replace('-', "+").replace('_', "/"));
    if p["envelope"]["signature"] != json!(sig) {
        fx.send_fails(&p, "invalid_params").await;
    }
    fx.finish().await;
}

#[actix_rt::test]
async fn message_id_too_short_too_long_or_with_bad_characters_is_invalid_params() {
    let fx = fixture().await;
    for bad in [
        "msg-00000000001".to_string(),
        "m".repeat(65),
        "msg.000000000000002".to_string(),
        "msg 000000000000002".to_string(),
        String::new(),
    ] {
        let p = fx.with_envelope(|e| e["message_id"] = json!(bad));
        fx.send_fails(&p, "invalid_params").await;
        // The id itself is invalid, so its status query is invalid_params too.
        assert_eq!(
            fx.c.err("message.delivery.status", fx.alice.token(0), &json!({"message_id": bad})).await,
            "invalid_params"
        );
    }
    fx.finish().await;
}

#[actix_rt::test]
async fn bad_account_and_device_ids_are_invalid_params() {
    let fx = fixture().await;
    let upper = fx.bob.id().to_uppercase();
    let short = fx.bob.id()[..31].to_string();
    for to in [upper.as_str(), short.as_str(), "not-an-account"] {
        let p = fx.with_envelope(|e| e["to"] = json!(to));
        fx.send_fails(&p, "invalid_params").await;
    }
    let mut p = fx.valid();
    p["recipient_boxes"][0]["device_id"] = json!("pho ne");
    fx.send_fails(&p, "invalid_params").await;
    let mut p = fx.valid();
    p["recipient_boxes"][0]["device_id"] = json!("d".repeat(65));
    fx.send_fails(&p, "invalid_params").await;
    fx.finish().await;
}

// ---- boxes ---------------------------------------------------------------------------------------

#[actix_rt::test]
async fn boxes_with_duplicate_device_ids_are_invalid_params() {
    let fx = fixture().await;
    let mut p = fx.valid();
    p["recipient_boxes"] = json!([key_box("phone", b"one"), key_box("phone", b"two")]);
    fx.send_fails(&p, "invalid_params").await;
    let mut p = fx.valid();
    p["recipient_boxes"] = json!([key_box("phone", b"same"), key_box("phone", b"same")]);
    fx.send_fails(&p, "invalid_params").await;
    let mut p = fx.valid();
    p["sender_boxes"] = json!([key_box("phone", b"one"), key_box("phone", b"two")]);
    fx.send_fails(&p, "invalid_params").await;
    // Self-delivery too.
    let mut p = fx.alice.self_params(&attempted(), &["phone"]);
    p["recipient_boxes"] = json!([key_box("phone", b"one"), key_box("phone", b"two")]);
    fx.send_fails(&p, "invalid_params").await;
    fx.finish().await;
}

#[actix_rt::test]
async fn empty_boxes_are_invalid_params() {
    let fx = fixture().await;
    let mut p = fx.valid();
    p["recipient_boxes"] = json!([]);
    fx.send_fails(&p, "invalid_params").await;
    let mut p = fx.valid();
    p["sender_boxes"] = json!([]);
    fx.send_fails(&p, "invalid_params").await;
    // An empty box.
    let mut p = fx.valid();
    p["recipient_boxes"][0]["box"] = json!("");
    fx.send_fails(&p, "invalid_params").await;
    // An empty ciphertext.
    let p = fx.with_envelope(|e| e["ciphertext"] = json!(""));
    fx.send_fails(&p, "invalid_params").await;
    let mut p = fx.alice.self_params(&attempted(), &["phone"]);
    p["recipient_boxes"] = json!([]);
    fx.send_fails(&p, "invalid_params").await;
    fx.finish().await;
}

// ---- signatures -------------------------------------------------------------------------------------

#[actix_rt::test]
async fn forged_envelope_signature_is_invalid_signature() {
    let fx = fixture().await;
    // Signed by another device's key.
    let mut p = fx.valid();
    p["envelope"] = resign(Tag::Envelope, &p["envelope"], &fx.bob.devices[0].key);
    fx.send_fails(&p, "invalid_signature").await;
    // Changed after signing: ciphertext, created_at, an unknown member added.
    let mut p = fx.valid();
    p["envelope"]["ciphertext"] = json!(b64_encode(b"other ciphertext"));
    fx.send_fails(&p, "invalid_signature").await;
    let mut p = fx.valid();
    p["envelope"]["created_at"] = json!(now() - 1);
    fx.send_fails(&p, "invalid_signature").await;
    let mut p = fx.valid();
    p["envelope"]["x-extra"] = json!("added later");
    fx.send_fails(&p, "invalid_signature").await;
    // A well-formed signature of zeros.
    let mut p = fx.valid();
    p["envelope"]["signature"] = json!(b64_encode(&[0u8; 64]));
    fx.send_fails(&p, "invalid_signature").await;
    // Self-delivery too.
    let mut p = fx.alice.self_params(&attempted(), &["phone"]);
    p["envelope"] = resign(Tag::Envelope, &p["envelope"], &fx.bob.devices[0].key);
    fx.send_fails(&p, "invalid_signature").await;
    fx.finish().await;
}

#[actix_rt::test]
async fn envelope_signed_with_the_wrong_domain_tag_is_invalid_signature() {
    let fx = fixture().await;
    for tag in [Tag::Route, Tag::Session, Tag::DeviceCertificate] {
        let mut p = fx.valid();
        p["envelope"] = resign(tag, &p["envelope"], &fx.alice.devices[0].key);
        fx.send_fails(&p, "invalid_signature").await;
    }
    fx.finish().await;
}

#[actix_rt::test]
async fn certificate_with_a_forged_signature_at_register_is_invalid_signature() {
    let fx = fixture().await;
    let carol = Account::from_seed([3; 32]);
    let phone = Device::from_seed("phone", [103; 32]);
    let route = carol.route(1, &[(RELAY, fx.c.base.as_str())], now());
    let good = carol.certificate(&phone, now(), None);
    let forged: Vec<Value> = vec![
        resign(Tag::DeviceCertificate, &good, &phone.key),
        resign(Tag::Route, &good, &carol.key),
        {
            let mut c = good.clone();
            c["device_key"] = json!(Device::from_seed("phone", [104; 32]).public_key());
            c
        },
        {
            let mut c = good.clone();
            c["signature"] = json!(b64_encode(&[0u8; 64]));
            c
        },
    ];
    for cert in forged {
        let params = carol.register_params(&route, &cert, RELAY, false, now());
        assert_eq!(fx.c.err("account.register", None, &params).await, "invalid_signature", "{cert}");
    }
    // A forged route signature at register too.
    let params = carol.register_params(&resign(Tag::Route, &route, &phone.key), &good, RELAY, false, now());
    assert_eq!(fx.c.err("account.register", None, &params).await, "invalid_signature");
    // Carol does not exist.
    assert_eq!(fx.c.err("route.get", None, &json!({"account_id": carol.id})).await, "route_not_found");
    assert_eq!(
        fx.c.err("session.challenge", None, &json!({"account_id": carol.id, "device_id": "phone"})).await,
        "not_found"
    );
    assert_eq!(fx.c.err("account.devices.get", fx.alice.token(0), &json!({"account_id": carol.id})).await, "not_found");
    fx.finish_without_resend().await;
    // And she can still register properly afterwards.
    let res = fx.c.ok("account.register", None, &carol.register_params(&route, &good, RELAY, false, now())).await;
    assert_eq!(res["account_id"], carol.id);
    fx.c.assert_healthy().await;
}

#[actix_rt::test]
async fn sending_to_an_account_whose_register_was_rejected_is_route_not_found() {
    let fx = fixture().await;
    let carol = Account::from_seed([3; 32]);
    let phone = Device::from_seed("phone", [103; 32]);
    let route = carol.route(1, &[(RELAY, fx.c.base.as_str())], now());
    let forged = resign(Tag::DeviceCertificate, &carol.certificate(&phone, now(), None), &phone.key);
    let params = carol.register_params(&route, &forged, RELAY, false, now());
    assert_eq!(fx.c.err("account.register", None, &params).await, "invalid_signature");
    let p = fx.alice.params_to(0, &carol.id, &attempted(), now(), &["phone"], Some(&["phone"]));
    let (status, v) = fx.c.call("message.send", fx.alice.token(0), &p).await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("route_not_found")), "{v}");
    fx.finish().await;
}

// ---- methods and authorization shapes ----------------------------------------------------------------

#[actix_rt::test]
async fn unknown_method_is_not_found() {
    let fx = fixture().await;
    for method in
        ["message.sendx", "message", "MESSAGE.SEND", "message.deliver", "timeline.replicate", "x".repeat(300).as_str()]
    {
        assert_eq!(
            fx.c.raw_err(method, fx.alice.token(0), serde_json::to_vec(&fx.valid()).unwrap()).await,
            "not_found",
            "{method}"
        );
        assert_eq!(fx.c.raw_err(method, None, b"{}".to_vec()).await, "not_found", "{method}");
    }
    // Unknown paths answer a JSON not_found too.
    let (status, body) = fx.c.get("/v1/rpc/message.send").await;
    assert_eq!(status, 404, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "not_found");
    let (status, _) = fx.c.get("/nowhere").await;
    assert_eq!(status, 404);
    fx.finish().await;
}

#[actix_rt::test]
async fn authorization_of_an_unknown_kind_or_both_kinds_is_invalid_params() {
    let fx = fixture().await;
    let grant = fx.bob.account.grant("grant-1", fx.alice.id(), now(), None);
    let invite = fx.bob.account.invite("invite-1", now(), now() + 3600);
    for auth in [
        json!({"contact_token": grant}),
        json!({"contact_grant": grant, "contact_invite": invite}),
        json!({}),
        json!([grant]),
    ] {
        let mut p = fx.valid();
        p["authorization"] = auth;
        fx.send_fails(&p, "invalid_params").await;
    }
    fx.finish().await;
}
