//! The shared `relay-e2e/v1` test vectors (`web/vectors/relay-e2e-v1.json`):
//! every random input is fixed there, so the Rust implementation here and
//! the browser's (`web/test/vectors.mjs`, run by Node and in Chromium) must
//! produce the same ciphertext, boxes and signatures byte for byte, and
//! open each other's.
//!
//! The file was generated once by this test:
//! `RELAY_E2E_VECTORS=write cargo test -p relay-schemas --test e2e_vectors`.

use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::e2e;
use relay_schemas::encoding::{b64_decode, b64_encode};
use relay_schemas::sign::parse_public_key;
use serde_json::{json, Value};
use std::path::PathBuf;

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../web/vectors/relay-e2e-v1.json")
}

/// Fixed "random" bytes: `blake3(label)` truncated, so the inputs are
/// reproducible without storing a generator.
fn fixed<const N: usize>(label: &str) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&blake3::hash(label.as_bytes()).as_bytes()[..N]);
    out
}

/// `(name, text, recipient device ids)` of each vector.
const CASES: &[(&str, &str, &[&str])] = &[
    ("ascii", "hello, bob", &["laptop"]),
    ("unicode", "привет, Боб ✓✓ — 👋 \"quoted\" \\ \u{7f}", &["phone", "laptop"]),
    ("empty text, three devices", "", &["a", "b-2", "c_3"]),
];

fn vector(name: &str, text: &str, device_ids: &[&str]) -> Value {
    let l = |what: &str| format!("relay-e2e/v1 vectors/{name}/{what}");
    let alice = Account::from_seed(fixed(&l("alice")));
    let sender = Device::with_box_secret("sender", fixed(&l("sender")), fixed(&l("sender box")));
    let bob = Account::from_seed(fixed(&l("bob")));
    let message_id = b64_encode(&fixed::<16>(&l("message_id")));
    let devices: Vec<Device> = device_ids
        .iter()
        .map(|id| Device::with_box_secret(id, fixed(&l(id)), fixed(&l(&format!("{id} box")))))
        .collect();
    let randoms: Vec<([u8; 32], [u8; 24])> = device_ids
        .iter()
        .map(|id| (fixed(&l(&format!("{id} ephemeral"))), fixed(&l(&format!("{id} nonce")))))
        .collect();
    let random = e2e::Randomness { content_key: fixed(&l("content_key")), nonce: fixed(&l("nonce")), boxes: &randoms };
    let plaintext = e2e::text(text);
    let targets: Vec<(&str, [u8; 32])> = devices.iter().map(|d| (d.id.as_str(), d.box_key)).collect();
    let sealed = e2e::encrypt(&message_id, &plaintext, &targets, &random).expect("vectors seal");
    let envelope = sender.envelope(&alice.id, &bob.id, &message_id, 1_764_400_000, &sealed.ciphertext);
    json!({
        "name": name,
        "text": text,
        "plaintext": b64_encode(&plaintext),
        "message_id": message_id,
        "content_key": b64_encode(&random.content_key),
        "nonce": b64_encode(&random.nonce),
        "ciphertext": b64_encode(&sealed.ciphertext),
        "sender": {
            "account_seed": b64_encode(&fixed::<32>(&l("alice"))),
            "account_id": alice.id,
            "device_seed": b64_encode(&fixed::<32>(&l("sender"))),
            "device_key": sender.public_key(),
        },
        "envelope": envelope,
        "devices": devices.iter().zip(&randoms).zip(&sealed.boxes).map(|((d, (e, m)), (_, b))| json!({
            "device_id": d.id,
            "box_secret": b64_encode(&d.box_secret.expect("e2e device")),
            "box_key": b64_encode(&d.box_key),
            "ephemeral_secret": b64_encode(e),
            "box_nonce": b64_encode(m),
            "box": b64_encode(b),
        })).collect::<Vec<_>>(),
    })
}

fn generated() -> Value {
    json!({
        "profile": e2e::PROFILE,
        "about": "Fixed inputs and expected outputs of relay-e2e/v1 (PROTOCOL §8). Binary values are base64url \
                  without padding. Generated once by `RELAY_E2E_VECTORS=write cargo test -p relay-schemas --test \
                  e2e_vectors`; checked by that test and by web/test/vectors.mjs (Node and Chromium).",
        "vectors": CASES.iter().map(|(n, t, d)| vector(n, t, d)).collect::<Vec<_>>(),
    })
}

fn b(v: &Value) -> Vec<u8> {
    b64_decode("vector", v.as_str().expect("a string")).expect("base64url")
}

fn a32(v: &Value) -> [u8; 32] {
    b(v).try_into().expect("32 bytes")
}

#[test]
fn rust_matches_the_shared_vectors() {
    let expected = generated();
    if std::env::var("RELAY_E2E_VECTORS").as_deref() == Ok("write") {
        let text = serde_json::to_string_pretty(&expected).expect("json") + "\n";
        std::fs::write(path(), text).expect("write the vector file");
    }
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path()).expect("the vector file")).expect("json");
    // Sealing with the file's inputs gives the file's outputs.
    assert_eq!(file, expected, "web/vectors/relay-e2e-v1.json differs from what relay-e2e/v1 computes");

    // And every device opens its box from the file, after the signature check.
    for v in file["vectors"].as_array().expect("vectors") {
        let key = parse_public_key("device_key", v["sender"]["device_key"].as_str().unwrap()).unwrap();
        for d in v["devices"].as_array().unwrap() {
            let device_id = d["device_id"].as_str().unwrap();
            let record = json!({"envelope": v["envelope"], "box": key_box(device_id, &b(&d["box"]))});
            let plaintext = e2e::open_record(&record, &key, device_id, &a32(&d["box_secret"])).unwrap();
            assert_eq!(plaintext, b(&v["plaintext"]));
            assert_eq!(e2e::read_text(&plaintext).unwrap().as_deref(), v["text"].as_str());
            // A box does not open for another device id, nor a tampered envelope.
            let other = json!({"envelope": v["envelope"], "box": key_box("other", &b(&d["box"]))});
            assert!(e2e::open_record(&other, &key, "other", &a32(&d["box_secret"])).is_err());
            let mut forged = record.clone();
            forged["envelope"]["created_at"] = json!(1);
            assert!(e2e::open_record(&forged, &key, device_id, &a32(&d["box_secret"])).is_err());
        }
    }
}
