//! Checks the JSON Schema (draft 2020-12) files in `schemas/json` and the
//! OpenAPI 3.1 document `schemas/openapi.json` against PROTOCOL.md.
//!
//! Everything is resolved offline: the schema files are registered in a
//! `jsonschema::Registry` under their `$id`s, so relative `$ref`s such as
//! `defs.schema.json#/$defs/account_id` resolve without any retrieval.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use jsonschema::{Draft, Registry, Validator};
use serde_json::{json, Map, Value};

const BASE: &str = "https://relay.invalid/schemas/";
const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";
const OPENAPI_URI: &str = "https://relay.invalid/openapi.json";

/// PROTOCOL §4 client methods.
const CLIENT_METHODS: &[&str] = &[
    "account.register",
    "session.challenge",
    "session.open",
    "session.attach",
    "device.add",
    "device.revoke",
    "account.devices.get",
    "account.settings.update",
    "route.get",
    "route.update",
    "contact.revoke",
    "message.send",
    "message.delivery.status",
    "message.timeline.sync",
    "message.timeline.ack",
    // PROTOCOL §9 (Web Push)
    "push.vapid_key",
    "push.subscribe",
    "push.unsubscribe",
];
/// §4 methods that are WebSocket only (no HTTP path).
const WEBSOCKET_ONLY: &[&str] = &["session.attach"];
/// §4 methods that need a session.
const SESSION_METHODS: &[&str] = &[
    "device.add",
    "device.revoke",
    "account.devices.get",
    "account.settings.update",
    "route.update",
    "contact.revoke",
    "message.send",
    "message.delivery.status",
    "message.timeline.sync",
    "message.timeline.ack",
    "push.subscribe",
    "push.unsubscribe",
];
/// PROTOCOL §5 relay methods.
const RELAY_METHODS: &[&str] = &[
    "message.deliver",
    "route.get",
    "account.devices.get",
    "message.delivery.peer_status",
    "timeline.replicate",
    "audit.checkpoint",
    "message.deliver.batch",
];
/// PROTOCOL §2 core objects.
const CORE_OBJECTS: &[&str] = &[
    "DeviceCertificate",
    "DeviceRevocation",
    "Route",
    "RelayRef",
    "MessageEnvelope",
    "KeyBox",
    "ContactGrant",
    "ContactInvite",
    "Registration",
    "Authorization",
    "DeliveryStatus",
    "TimelineRecord",
    "RelayError",
    "ErrorResponse",
];
/// PROTOCOL §2 RelayError table.
const ERROR_CODES: &[(&str, u16)] = &[
    ("invalid_params", 400),
    ("invalid_signature", 400),
    ("unauthorized", 401),
    ("forbidden", 403),
    ("not_found", 404),
    ("route_not_found", 404),
    ("state_conflict", 409),
    ("invalid_state", 409),
    ("route_stale", 421),
    ("target_not_local", 421),
    ("device_unknown", 422),
    ("clock_skew", 422),
    ("message_expired", 422),
    ("payload_too_large", 413),
    ("rate_limited", 429),
    ("internal_error", 500),
    ("bad_gateway", 502),
    ("temporarily_unavailable", 503),
];

fn json_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("json")
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.to_string_lossy().ends_with(".schema.json") {
            out.push(path);
        }
    }
}

/// Every `schemas/json/**/*.schema.json`, keyed by its path relative to `schemas/json`.
fn docs() -> &'static BTreeMap<String, Value> {
    static DOCS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    DOCS.get_or_init(|| {
        let root = json_dir();
        let mut paths = Vec::new();
        collect(&root, &mut paths);
        paths
            .into_iter()
            .map(|path| {
                let rel = path
                    .strip_prefix(&root)
                    .unwrap()
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/");
                let text = std::fs::read_to_string(&path).unwrap();
                let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{rel} is not JSON: {e}"));
                (rel, value)
            })
            .collect()
    })
}

fn openapi() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str(&text).expect("openapi.json is not JSON")
    })
}

/// All schema files registered under their `$id`, plus the OpenAPI document
/// (whose components are 2020-12 schemas) under [`OPENAPI_URI`].
fn registry() -> &'static Registry<'static> {
    static REGISTRY: OnceLock<Registry<'static>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut resources: Vec<(String, Value)> =
            docs().iter().map(|(rel, doc)| (format!("{BASE}{rel}"), doc.clone())).collect();
        resources.push((OPENAPI_URI.to_owned(), openapi().clone()));
        Registry::new()
            .draft(Draft::Draft202012)
            .extend(resources)
            .expect("registering schemas")
            .prepare()
            .expect("preparing the schema registry")
    })
}

fn compile(schema: &Value) -> Result<Validator, String> {
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .with_registry(registry())
        .build(schema)
        .map_err(|e| e.to_string())
}

fn validators() -> &'static BTreeMap<String, Validator> {
    static VALIDATORS: OnceLock<BTreeMap<String, Validator>> = OnceLock::new();
    VALIDATORS.get_or_init(|| {
        docs()
            .iter()
            .map(|(rel, doc)| {
                let v = compile(doc).unwrap_or_else(|e| panic!("{rel} does not compile: {e}"));
                (rel.clone(), v)
            })
            .collect()
    })
}

fn errors(validator: &Validator, instance: &Value) -> Vec<String> {
    validator.iter_errors(instance).map(|e| format!("{} (at {})", e, e.instance_path())).collect()
}

fn check(schema: &str, instance: &Value) -> Vec<String> {
    let validator = validators().get(schema).unwrap_or_else(|| panic!("no schema file {schema}"));
    errors(validator, instance)
}

/// Validates against the same schema as embedded in openapi.json.
fn check_openapi(component: &str, instance: &Value) -> Vec<String> {
    let wrapper = json!({
        "$schema": DIALECT,
        "$ref": format!("{OPENAPI_URI}#/components/schemas/{component}"),
    });
    let validator = compile(&wrapper).unwrap_or_else(|e| panic!("component {component}: {e}"));
    errors(&validator, instance)
}

fn component_of(schema: &str) -> String {
    let base = schema.rsplit('/').next().unwrap();
    base.strip_suffix(".schema.json").unwrap().to_owned()
}

#[track_caller]
fn valid(schema: &str, instance: Value) {
    let errs = check(schema, &instance);
    assert!(errs.is_empty(), "{schema} rejected {instance:#}: {errs:#?}");
    let errs = check_openapi(&component_of(schema), &instance);
    assert!(errs.is_empty(), "openapi {schema} rejected {instance:#}: {errs:#?}");
}

#[track_caller]
fn invalid(schema: &str, instance: Value) {
    assert!(!check(schema, &instance).is_empty(), "{schema} accepted {instance:#}");
    assert!(!check_openapi(&component_of(schema), &instance).is_empty(), "openapi {schema} accepted {instance:#}");
}

fn without(mut value: Value, member: &str) -> Value {
    value.as_object_mut().unwrap().remove(member).expect(member);
    value
}

fn with(mut value: Value, member: &str, new: Value) -> Value {
    value.as_object_mut().unwrap().insert(member.to_owned(), new);
    value
}

// ------------------------------------------------------------------ examples

const ACCOUNT_A: &str = "9188d9a54ad1bf8dad693a41bbc91bff";
const ACCOUNT_B: &str = "8bafd85aabf3bddf6e13a7d3093070e4";
const KEY_1: &str = "bZcmVeRVMGXNpY2Yuz8VLrlzNleL9xGun5LtzQAooa0";
const KEY_2: &str = "_LfYfJKOlfCH5YVk2qWGLRzbmNstciD6xIN311t0PL0";
const KEY_3: &str = "eawbp-y_SwyTxy3IDW_DVIVpk8csb-KSxRUawoLbeM8";
const SIG: &str = "0m9D6P4dX4_7F8SeMSJ9cu4WVkYJ2Odlh-2pdw6GmqjGv_Lq2R2Nao1Lss4PagmQ0DC9ammWE21eKfPXh10DEw";
const MESSAGE_ID: &str = "hluOdv0Y6zHVb1XS6HnRcQ";

fn certificate() -> Value {
    json!({"account_id": ACCOUNT_A, "account_key": KEY_1, "device_id": "phone",
           "device_key": KEY_2, "box_key": KEY_3,
           "issued_at": 1764400000, "expires_at": 1795936000, "signature": SIG})
}

fn revocation() -> Value {
    json!({"account_id": ACCOUNT_A, "device_id": "phone", "revoked_at": 1764400100, "signature": SIG})
}

fn registration() -> Value {
    json!({"account_id": ACCOUNT_A, "relay_id": "relay-a", "public_discovery": false,
           "issued_at": 1764400000, "signature": SIG})
}

fn route() -> Value {
    json!({"account_id": ACCOUNT_A, "account_key": KEY_1, "revision": 3,
           "relays": [{"id": "relay-a", "url": "https://a.example"}],
           "issued_at": 1764400000, "signature": SIG})
}

fn envelope() -> Value {
    json!({"message_id": MESSAGE_ID, "from": ACCOUNT_A, "from_device_id": "phone",
           "to": ACCOUNT_B, "created_at": 1764400000,
           "ciphertext": "eaPu3HZf9qR78POOdlWOWzHf_anwWmm5", "signature": SIG})
}

/// A checkpoint as the relay signs it (`relay_schemas::checkpoint`).
fn checkpoint() -> Value {
    use relay_schemas::checkpoint::{Checkpoint, Leaf};
    let leaves = [Leaf { stream: format!("account/{ACCOUNT_A}"), seq: 4, hash: [7; 32] }];
    let key = ed25519_dalek::SigningKey::from_bytes(&[5; 32]);
    Value::Object(Checkpoint::issue("relay-a", 1764400000, &leaves, 4, &key).unwrap().to_map())
}

fn key_box(device: &str) -> Value {
    json!({"device_id": device, "box": "eaPu3HZf9qR78POOdlWOWzHf_anwWmm5"})
}

fn grant() -> Value {
    json!({"grant_id": "g1", "grantor": ACCOUNT_B, "grantee": ACCOUNT_A,
           "issued_at": 1764400000, "expires_at": 1795936000, "signature": SIG})
}

fn invite() -> Value {
    json!({"invite_id": "i-1", "issuer": ACCOUNT_B, "issued_at": 1764400000,
           "expires_at": 1795936000, "signature": SIG})
}

fn failed() -> Value {
    json!({"status": "failed", "accepted_at": 1764400000,
           "error": {"code": "message_expired", "message": "delivery deadline reached"}})
}

fn record() -> Value {
    json!({"sequence": 42, "direction": "received", "accepted_at": 1764400001,
           "expires_at": 1766992001, "envelope": envelope(), "box": key_box("laptop")})
}

fn send_params() -> Value {
    json!({"envelope": envelope(), "recipient_boxes": [key_box("laptop"), key_box("tablet")],
           "sender_boxes": [key_box("phone")], "authorization": {"contact_grant": grant()}})
}

// ------------------------------------------------------------------ tests

#[test]
fn every_schema_is_a_valid_2020_12_schema_with_its_id() {
    assert!(!docs().is_empty());
    for (rel, doc) in docs() {
        assert_eq!(doc["$schema"], DIALECT, "{rel}: $schema");
        assert_eq!(doc["$id"], format!("{BASE}{rel}"), "{rel}: $id");
        if let Err(e) = jsonschema::meta::validate(doc) {
            panic!("{rel} is not a valid 2020-12 schema: {e}");
        }
    }
}

fn refs<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                match (key.as_str(), item) {
                    ("$ref", Value::String(r)) => out.push(r),
                    _ => refs(item, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| refs(item, out)),
        _ => {}
    }
}

/// Resolves `reference` relative to the file `rel` (both relative to schemas/json).
fn resolve_relative(rel: &str, reference: &str) -> String {
    let mut parts: Vec<&str> = rel.split('/').collect();
    parts.pop();
    for segment in reference.split('/') {
        match segment {
            ".." => {
                parts.pop().expect("ref escapes schemas/json");
            }
            "." => {}
            other => parts.push(other),
        }
    }
    parts.join("/")
}

#[test]
fn every_ref_is_relative_and_resolves_offline() {
    for (rel, doc) in docs() {
        let mut found = Vec::new();
        refs(doc, &mut found);
        for reference in found {
            assert!(!reference.contains("://"), "{rel}: $ref {reference} must be relative");
            let (file, fragment) = reference.split_once('#').unwrap_or((reference, ""));
            let target_rel = if file.is_empty() { rel.clone() } else { resolve_relative(rel, file) };
            let target = docs().get(&target_rel).unwrap_or_else(|| panic!("{rel}: $ref {reference} names no file"));
            assert!(target.pointer(fragment).is_some(), "{rel}: $ref {reference} points nowhere");
        }
    }
    // Compiling resolves every reference through the registry (no retrieval
    // is possible: jsonschema is built without its resolve features).
    assert_eq!(validators().len(), docs().len());
}

#[test]
fn every_protocol_object_and_method_has_schemas() {
    for object in CORE_OBJECTS {
        assert!(docs().contains_key(&format!("{object}.schema.json")), "missing {object}");
    }
    assert!(docs().contains_key("defs.schema.json"));
    assert!(docs().contains_key("methods/healthz.result.schema.json"));
    for method in CLIENT_METHODS.iter().chain(RELAY_METHODS) {
        for kind in ["params", "result"] {
            let rel = format!("methods/{method}.{kind}.schema.json");
            assert!(docs().contains_key(&rel), "missing {rel}");
        }
    }
    let codes: Vec<&str> = ERROR_CODES.iter().map(|(code, _)| *code).collect();
    assert_eq!(docs()["RelayError.schema.json"]["properties"]["code"]["enum"], json!(codes));
}

#[test]
fn defs_match_protocol_identifiers() {
    let s = "defs.schema.json";
    let id = |name: &str, v: &str| {
        let wrapper = json!({"$ref": format!("{BASE}{s}#/$defs/{name}")});
        compile(&wrapper).unwrap().is_valid(&json!(v))
    };
    assert!(id("account_id", ACCOUNT_A));
    assert!(!id("account_id", &ACCOUNT_A.to_uppercase()));
    assert!(!id("account_id", &ACCOUNT_A[1..]));
    assert!(id("device_id", "phone_2-x"));
    assert!(id("device_id", &"a".repeat(64)));
    assert!(!id("device_id", &"a".repeat(65)));
    assert!(!id("device_id", ""));
    assert!(!id("device_id", "ph one"));
    assert!(id("message_id", &"a".repeat(16)));
    assert!(!id("message_id", &"a".repeat(15)));
    assert!(!id("message_id", &"a".repeat(65)));
    assert!(id("relay_id", "relay-a.example"));
    assert!(!id("relay_id", "Relay-A"));
    assert!(id("base64url", "ab-_"));
    assert!(!id("base64url", "ab+/"));
    assert!(!id("base64url", "abc="));
    assert!(id("public_key", KEY_1));
    assert!(!id("public_key", &KEY_1[1..]));
    assert!(id("signature", SIG));
    assert!(!id("signature", KEY_1));
    let unix = compile(&json!({"$ref": format!("{BASE}{s}#/$defs/unix_seconds")})).unwrap();
    assert!(unix.is_valid(&json!(0)));
    assert!(!unix.is_valid(&json!(-1)));
    assert!(!unix.is_valid(&json!("1764400000")));
    assert!(!unix.is_valid(&json!(1.5)));
}

#[test]
fn core_objects_accept_protocol_examples() {
    valid("DeviceCertificate.schema.json", certificate());
    valid("DeviceCertificate.schema.json", without(certificate(), "expires_at"));
    valid("DeviceCertificate.schema.json", with(certificate(), "future_member", json!({"x": 1})));
    valid("DeviceRevocation.schema.json", revocation());
    valid("Route.schema.json", route());
    let two = with(
        route(),
        "relays",
        json!([{"id": "relay-a", "url": "https://a.example"}, {"id": "relay-b", "url": "https://b.example"}]),
    );
    valid("Route.schema.json", two);
    valid("MessageEnvelope.schema.json", envelope());
    valid("MessageEnvelope.schema.json", with(envelope(), "x_unknown", json!("kept")));
    valid("KeyBox.schema.json", key_box("phone"));
    valid("ContactGrant.schema.json", grant());
    valid("ContactGrant.schema.json", without(grant(), "expires_at"));
    valid("ContactInvite.schema.json", invite());
    valid("Authorization.schema.json", json!({"contact_grant": grant()}));
    valid("Authorization.schema.json", json!({"contact_invite": invite()}));
    valid("DeliveryStatus.schema.json", json!({"status": "delivering", "accepted_at": 1764400000}));
    valid("DeliveryStatus.schema.json", json!({"status": "target_accepted", "accepted_at": 1764400000}));
    valid("DeliveryStatus.schema.json", failed());
    valid("TimelineRecord.schema.json", record());
    let sent = with(
        with(record(), "direction", json!("sent")),
        "delivery",
        json!({"status": "delivering", "accepted_at": 1764400001}),
    );
    valid("TimelineRecord.schema.json", sent);
    for (code, _) in ERROR_CODES {
        valid("RelayError.schema.json", json!({"code": code, "message": "human text"}));
    }
    valid(
        "RelayError.schema.json",
        json!({"code": "rate_limited", "message": "slow down", "data": {"retry_after": 30}}),
    );
    valid(
        "ErrorResponse.schema.json",
        json!({"error": {"code": "route_stale", "message": "newer route", "data": {"route": route()}}}),
    );
}

#[test]
fn core_objects_reject_violations() {
    // missing required members
    invalid("DeviceCertificate.schema.json", without(certificate(), "signature"));
    invalid("DeviceCertificate.schema.json", without(certificate(), "box_key"));
    invalid("MessageEnvelope.schema.json", without(envelope(), "ciphertext"));
    invalid("ContactInvite.schema.json", without(invite(), "expires_at"));
    invalid("DeviceRevocation.schema.json", without(revocation(), "revoked_at"));
    invalid("Route.schema.json", without(route(), "revision"));
    // bad identifiers
    invalid(
        "DeviceCertificate.schema.json",
        with(certificate(), "account_id", json!("9188D9A54AD1BF8DAD693A41BBC91BFF")),
    );
    invalid("MessageEnvelope.schema.json", with(envelope(), "to", json!("not-an-account")));
    invalid("MessageEnvelope.schema.json", with(envelope(), "message_id", json!("short_id_15char")));
    invalid("MessageEnvelope.schema.json", with(envelope(), "ciphertext", json!("")));
    invalid("MessageEnvelope.schema.json", with(envelope(), "ciphertext", json!("not base64url!")));
    invalid("MessageEnvelope.schema.json", with(envelope(), "created_at", json!(-5)));
    invalid("Route.schema.json", with(route(), "relays", json!([{"id": "Relay_A", "url": "https://a.example"}])));
    invalid("Route.schema.json", with(route(), "relays", json!([])));
    invalid(
        "Route.schema.json",
        with(
            route(),
            "relays",
            json!([{"id": "a", "url": "https://a"}, {"id": "b", "url": "https://b"}, {"id": "c", "url": "https://c"}]),
        ),
    );
    invalid("KeyBox.schema.json", json!({"device_id": "phone", "box": ""}));
    invalid("KeyBox.schema.json", json!({"device_id": "phone", "box": "A".repeat(1367)}));
    // authorization is exactly one of grant / invite
    invalid("Authorization.schema.json", json!({"contact_grant": grant(), "contact_invite": invite()}));
    invalid("Authorization.schema.json", json!({}));
    invalid("Authorization.schema.json", json!({"contact_grant": invite()}));
    // DeliveryStatus: error iff failed
    invalid("DeliveryStatus.schema.json", without(failed(), "error"));
    invalid("DeliveryStatus.schema.json", with(failed(), "status", json!("target_accepted")));
    invalid("DeliveryStatus.schema.json", with(failed(), "status", json!("delivering")));
    invalid("DeliveryStatus.schema.json", json!({"status": "delivered", "accepted_at": 1}));
    invalid("DeliveryStatus.schema.json", json!({"status": "delivering"}));
    // TimelineRecord
    invalid("TimelineRecord.schema.json", with(record(), "direction", json!("sent")));
    invalid("TimelineRecord.schema.json", without(record(), "box"));
    invalid("TimelineRecord.schema.json", with(record(), "direction", json!("outgoing")));
    // RelayError
    invalid("RelayError.schema.json", json!({"code": "teapot", "message": "x"}));
    invalid("RelayError.schema.json", json!({"code": "forbidden"}));
    invalid("RelayError.schema.json", json!({"code": "forbidden", "message": "x", "data": 5}));
    invalid("ErrorResponse.schema.json", json!({"code": "forbidden", "message": "x"}));
}

#[test]
fn method_schemas_accept_examples() {
    let m = |name: &str| format!("methods/{name}.schema.json");
    valid(
        &m("account.register.params"),
        json!({"route": route(), "device_certificate": certificate(), "registration": registration(),
               "settings": {"public_discovery": true}}),
    );
    valid(
        &m("account.register.params"),
        json!({"route": route(), "device_certificate": certificate(), "registration": registration()}),
    );
    valid("Registration.schema.json", registration());
    valid(&m("account.register.result"), json!({"account_id": ACCOUNT_A, "route": route()}));
    valid(&m("session.challenge.params"), json!({"account_id": ACCOUNT_A, "device_id": "phone"}));
    valid(
        &m("session.challenge.result"),
        json!({"challenge": "eaPu3HZf9qR78POOdlWOWzHf_anwWmm5", "expires_at": 1764400300}),
    );
    valid(
        &m("session.open.params"),
        json!({"account_id": ACCOUNT_A, "device_id": "phone",
               "challenge": "eaPu3HZf9qR78POOdlWOWzHf_anwWmm5", "signature": SIG}),
    );
    valid(&m("session.open.result"), json!({"token": "opaque-token", "expires_at": 1764486400}));
    valid(&m("session.attach.params"), json!({"token": "opaque-token"}));
    for empty in [
        "session.attach",
        "device.add",
        "device.revoke",
        "account.settings.update",
        "contact.revoke",
        "message.timeline.ack",
    ] {
        valid(&m(&format!("{empty}.result")), json!({}));
        invalid(&m(&format!("{empty}.result")), json!({"ok": true}));
    }
    valid(&m("device.add.params"), json!({"device_certificate": certificate()}));
    valid(&m("device.revoke.params"), json!({"revocation": revocation()}));
    valid(&m("account.devices.get.params"), json!({"account_id": ACCOUNT_A}));
    valid(&m("account.devices.get.result"), json!({"certificates": [certificate()], "revocations": [revocation()]}));
    valid(&m("account.settings.update.params"), json!({"public_discovery": false}));
    valid(&m("route.get.params"), json!({"account_id": ACCOUNT_A}));
    valid(&m("route.get.result"), route());
    valid(&m("route.update.params"), json!({"route": route()}));
    valid(&m("route.update.result"), route());
    valid(&m("contact.revoke.params"), json!({"grant_id": "g1"}));
    valid(&m("contact.revoke.params"), json!({"invite_id": "i-1"}));
    valid(&m("message.send.params"), send_params());
    valid(&m("message.send.params"), json!({"envelope": envelope(), "recipient_boxes": [key_box("laptop")]}));
    valid(&m("message.send.result"), json!({"status": "delivering", "accepted_at": 1764400000}));
    valid(&m("message.send.result"), failed());
    valid(&m("message.delivery.status.params"), json!({"message_id": MESSAGE_ID}));
    valid(&m("message.delivery.status.result"), json!({"status": "target_accepted", "accepted_at": 1764400000}));
    valid(&m("message.timeline.sync.params"), json!({"after": 0}));
    valid(&m("message.timeline.sync.params"), json!({"after": 41, "limit": 500}));
    valid(&m("message.timeline.sync.result"), json!({"records": [record()], "next": 42, "has_more": false}));
    valid(&m("message.timeline.sync.result"), json!({"records": [], "next": 0, "has_more": false}));
    valid(&m("message.timeline.ack.params"), json!({"through": 42}));
    // relay methods
    valid(
        &m("message.deliver.params"),
        json!({"envelope": envelope(), "recipient_boxes": [key_box("laptop")],
               "sender_device_certificate": certificate(), "sender_route": route(),
               "authorization": {"contact_invite": invite()}}),
    );
    invalid(
        &m("message.deliver.params"),
        json!({"envelope": envelope(), "recipient_boxes": [key_box("laptop")],
               "sender_device_certificate": certificate()}),
    );
    valid(&m("message.deliver.result"), json!({"status": "target_accepted", "accepted_at": 1764400002}));
    valid(&m("message.delivery.peer_status.params"), json!({"from": ACCOUNT_A, "message_id": MESSAGE_ID}));
    valid(
        &m("message.delivery.peer_status.result"),
        json!({"known": true, "status": {"status": "target_accepted", "accepted_at": 1764400000}}),
    );
    valid(&m("message.delivery.peer_status.result"), json!({"known": false}));
    valid(&m("timeline.replicate.params"), json!({"account_id": ACCOUNT_A, "after": 0, "limit": 100, "ack": 0}));
    valid(&m("timeline.replicate.result"), json!({"items": [], "next": 0, "has_more": false}));
    valid(&m("audit.checkpoint.params"), json!({}));
    valid(&m("audit.checkpoint.result"), checkpoint());
    valid(&m("healthz.result"), json!({"status": "ok"}));
    // notifications
    valid(
        "notifications/message.timeline.changed.params.schema.json",
        json!({"account_id": ACCOUNT_A, "sequence": 42}),
    );
    valid(
        "notifications/message.delivery.changed.params.schema.json",
        json!({"message_id": MESSAGE_ID, "status": "target_accepted"}),
    );
    valid(
        "notifications/message.delivery.changed.params.schema.json",
        json!({"message_id": MESSAGE_ID, "status": "failed",
               "error": {"code": "device_unknown", "message": "no device"}}),
    );
}

#[test]
fn method_schemas_reject_violations() {
    let m = |name: &str| format!("methods/{name}.schema.json");
    invalid(&m("message.send.params"), without(send_params(), "envelope"));
    invalid(&m("message.send.params"), without(send_params(), "recipient_boxes"));
    invalid(&m("message.send.params"), with(send_params(), "recipient_boxes", json!([])));
    let too_many: Vec<Value> = (0..65).map(|i| key_box(&format!("d{i}"))).collect();
    invalid(&m("message.send.params"), with(send_params(), "recipient_boxes", json!(too_many)));
    let max: Vec<Value> = (0..64).map(|i| key_box(&format!("d{i}"))).collect();
    valid(&m("message.send.params"), with(send_params(), "recipient_boxes", json!(max)));
    invalid(&m("message.send.params"), with(send_params(), "sender_boxes", json!([])));
    invalid(
        &m("message.send.params"),
        with(send_params(), "envelope", with(envelope(), "message_id", json!("tooshort"))),
    );
    invalid(
        &m("message.send.params"),
        with(send_params(), "authorization", json!({"contact_grant": grant(), "contact_invite": invite()})),
    );
    invalid(&m("message.send.result"), json!({"status": "failed", "accepted_at": 1764400000}));
    invalid(&m("message.delivery.status.params"), json!({"message_id": "abc"}));
    invalid(&m("account.register.params"), json!({"route": route()}));
    invalid(&m("account.register.params"), json!({"route": route(), "device_certificate": certificate()}));
    invalid("Registration.schema.json", without(registration(), "relay_id"));
    invalid(
        &m("account.register.params"),
        json!({"route": route(), "device_certificate": certificate(), "registration": registration(),
               "settings": {"public_discovery": "yes"}}),
    );
    invalid(&m("account.register.result"), json!({"account_id": "ABC", "route": route()}));
    invalid(
        &m("session.challenge.params"),
        json!({"account_id": "9188d9a54ad1bf8dad693a41bbc91bf", "device_id": "phone"}),
    );
    invalid(&m("session.open.result"), json!({"token": "", "expires_at": 1}));
    invalid(&m("contact.revoke.params"), json!({}));
    invalid(&m("contact.revoke.params"), json!({"grant_id": "g1", "invite_id": "i-1"}));
    invalid(&m("account.settings.update.params"), json!({}));
    invalid(&m("message.timeline.sync.params"), json!({}));
    invalid(&m("message.timeline.sync.params"), json!({"after": 0, "limit": 501}));
    invalid(&m("message.timeline.sync.params"), json!({"after": 0, "limit": 0}));
    invalid(&m("message.timeline.sync.params"), json!({"after": -1}));
    invalid(
        &m("message.timeline.sync.result"),
        json!({"records": [with(record(), "direction", json!("sent"))], "next": 42, "has_more": false}),
    );
    invalid(&m("message.timeline.sync.result"), json!({"records": [], "next": 0}));
    invalid(&m("message.timeline.sync.result"), json!({"records": [], "next": 0, "has_more": false, "extra": 1}));
    invalid(&m("message.timeline.ack.params"), json!({"through": "42"}));
    invalid(&m("message.deliver.params"), json!({"envelope": envelope(), "recipient_boxes": [key_box("laptop")]}));
    invalid(
        &m("message.delivery.peer_status.result"),
        json!({"known": false, "status": {"status": "delivering", "accepted_at": 1}}),
    );
    invalid(&m("message.delivery.peer_status.result"), json!({}));
    invalid(&m("timeline.replicate.params"), json!({"account_id": ACCOUNT_A, "after": 0}));
    for (member, value) in [("root", json!("AB".repeat(32))), ("streams", json!(-1)), ("relay_id", json!("Relay A"))] {
        let mut cp = checkpoint();
        cp[member] = value;
        invalid(&m("audit.checkpoint.result"), cp);
    }
    let mut unsigned = checkpoint();
    unsigned.as_object_mut().unwrap().remove("signature");
    invalid(&m("audit.checkpoint.result"), unsigned);
    invalid(&m("healthz.result"), json!({"status": "degraded"}));
    invalid(
        "notifications/message.delivery.changed.params.schema.json",
        json!({"message_id": MESSAGE_ID, "status": "failed"}),
    );
}

// ------------------------------------------------------------------ OpenAPI

/// Same mapping as `rewrite_ref` in schemas/gen_openapi.py.
fn rewrite_ref(reference: &str, current_file: &str) -> String {
    let (file, fragment) = reference.split_once('#').unwrap_or((reference, ""));
    let file = if file.is_empty() { current_file } else { file };
    let name = component_of(file);
    if name == "defs" {
        let def = fragment.strip_prefix("/$defs/").unwrap_or_else(|| panic!("bad defs ref {reference}"));
        assert!(!def.contains('/'), "bad defs ref {reference}");
        format!("#/components/schemas/{def}")
    } else {
        assert_eq!(fragment, "", "refs must target whole files: {reference}");
        format!("#/components/schemas/{name}")
    }
}

fn rewrite(value: &Value, current_file: &str) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| match (key.as_str(), item) {
                    ("$ref", Value::String(r)) => (key.clone(), json!(rewrite_ref(r, current_file))),
                    _ => (key.clone(), rewrite(item, current_file)),
                })
                .collect::<Map<_, _>>(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|i| rewrite(i, current_file)).collect()),
        other => other.clone(),
    }
}

#[test]
fn openapi_document_describes_every_client_method() {
    let doc = openapi();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["jsonSchemaDialect"], DIALECT);
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"],
        json!({"type": "http", "scheme": "bearer", "description": "Session token from session.open"})
    );
    let paths = doc["paths"].as_object().expect("paths");
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    let error_statuses: BTreeSet<String> = ERROR_CODES.iter().map(|(_, status)| status.to_string()).collect();
    for method in CLIENT_METHODS {
        for kind in ["params", "result"] {
            assert!(schemas.contains_key(&format!("{method}.{kind}")), "component {method}.{kind}");
        }
        let path = format!("/v1/rpc/{method}");
        if WEBSOCKET_ONLY.contains(method) {
            assert!(!paths.contains_key(&path), "{path} is WebSocket only");
            continue;
        }
        let op = &paths.get(&path).unwrap_or_else(|| panic!("openapi.json has no {path}"))["post"];
        assert_eq!(op["operationId"], *method);
        assert_eq!(
            op["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/{method}.params")
        );
        assert_eq!(op["requestBody"]["required"], true);
        let responses = op["responses"].as_object().unwrap();
        assert_eq!(
            responses["200"]["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/{method}.result")
        );
        for status in &error_statuses {
            assert!(responses.contains_key(status), "{path}: no {status} response");
        }
        let expected = if SESSION_METHODS.contains(method) { json!([{"bearerAuth": []}]) } else { json!([]) };
        assert_eq!(op["security"], expected, "{path}: security");
    }
    for method in RELAY_METHODS {
        assert!(schemas.contains_key(&format!("{method}.params")));
        assert!(schemas.contains_key(&format!("{method}.result")));
    }
    let health = &paths["/healthz"]["get"]["responses"]["200"]["content"]["application/json"];
    assert_eq!(health["schema"]["$ref"], "#/components/schemas/healthz.result");
    // error responses carry the codes of their HTTP status
    for (code, status) in ERROR_CODES {
        let schema = &schemas[&format!("ErrorResponse{status}")];
        let codes = &schema["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"];
        assert!(codes.as_array().unwrap().contains(&json!(code)), "{code} not under {status}");
        let response = &doc["components"]["responses"][format!("Error{status}")];
        assert_eq!(
            response["content"]["application/json"]["schema"]["$ref"],
            format!("#/components/schemas/ErrorResponse{status}")
        );
    }
}

#[test]
fn openapi_components_equal_the_schema_files() {
    let schemas = openapi()["components"]["schemas"].as_object().unwrap();
    let mut from_files = BTreeSet::new();
    for (rel, doc) in docs() {
        if rel.starts_with("audit/") {
            continue; // `relay audit` output formats, not part of the HTTP API
        }
        let name = component_of(rel);
        if name == "defs" {
            for (def, body) in doc["$defs"].as_object().unwrap() {
                assert_eq!(schemas.get(def), Some(&rewrite(body, rel)), "component {def}");
                from_files.insert(def.clone());
            }
            continue;
        }
        let mut body = doc.as_object().unwrap().clone();
        body.remove("$id");
        body.remove("$schema");
        let expected = rewrite(&Value::Object(body), rel);
        assert_eq!(
            schemas.get(&name),
            Some(&expected),
            "component {name} differs from {rel}; run python3 schemas/gen_openapi.py"
        );
        from_files.insert(name);
    }
    for name in schemas.keys() {
        assert!(from_files.contains(name) || name.starts_with("ErrorResponse"), "component {name} has no schema file");
    }
}

#[test]
fn openapi_refs_resolve_within_the_document() {
    let doc = openapi();
    let mut found = Vec::new();
    refs(doc, &mut found);
    assert!(!found.is_empty());
    for reference in found {
        let pointer =
            reference.strip_prefix('#').unwrap_or_else(|| panic!("openapi.json $ref {reference} is not local"));
        assert!(doc.pointer(pointer).is_some(), "$ref {reference} points nowhere");
    }
    // every component compiles as a 2020-12 schema inside the document
    for name in doc["components"]["schemas"].as_object().unwrap().keys() {
        let pointer = format!("#/components/schemas/{name}");
        let wrapper = json!({"$schema": DIALECT, "$ref": format!("{OPENAPI_URI}{pointer}")});
        compile(&wrapper).unwrap_or_else(|e| panic!("{pointer}: {e}"));
    }
    check_openapi("ErrorResponse404", &json!({"error": {"code": "route_not_found", "message": "x"}}))
        .is_empty()
        .then_some(())
        .expect("404 route_not_found");
    assert!(!check_openapi("ErrorResponse404", &json!({"error": {"code": "forbidden", "message": "x"}})).is_empty());
}

/// The crate's [`Method`] enum (dispatch, metrics) serves the protocol's
/// methods: this file keeps its own list, written from PROTOCOL §4/§5, so
/// that each checks the other.
#[test]
fn the_method_enum_matches_the_protocol() {
    use relay_schemas::methods::{Caller, Method};
    let names = |relay: bool| -> Vec<&str> {
        Method::ALL.into_iter().filter(|m| (m.caller() == Caller::Relay) == relay).map(Method::as_str).collect()
    };
    assert_eq!(names(false), CLIENT_METHODS);
    assert_eq!(names(true), RELAY_METHODS);
}
