//! Writes a log for timing `relay audit` (docs/audit.md; the figures are
//! in docs/performance-journal.md):
//! at least N events (default 1,000,000) into `DIR/store`, through the
//! store's batches directly (no relay), in commits of about 2,000 events,
//! with real account and delivery event JSON (~0.5–1.5 KB each): 1,000
//! accounts receiving messages from a foreign account, sending to each
//! other (each delivery failing twice, then `target_accepted`), acking and
//! changing settings; every account gets a snapshot at its head, and its
//! idempotency ledger is written with its events as the actor writes it
//! (one blob per send and receipt). Prints two messages to explain.
//!
//! ```text
//! cargo run --release -p relay-actors --example audit_log -- big-log 1000000
//! target/release/relay audit --data-dir big-log verify
//! ```
//!
//! `scripts/audit-bench.sh` does both and times three runs of `verify`.

use relay_actors::store::{Head, NewEvent, Store};
use relay_core::account::ledger::{self, Ledger};
use relay_core::account::{AccountEvent, AccountState, Record};
use relay_core::delivery::aggregate::DeliveryEvent;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::objects::{DeliveryStatus, Wire};
use relay_schemas::{RelayError, UnixMillis, UnixSecs};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;

fn account_stream(id: &str) -> String {
    format!("account/{id}")
}

/// The ledger entry `event` writes, with it, as the account actor does.
fn record_ledger(batch: &mut relay_actors::store::Batch, ledger: &mut Ledger, account_id: &str, event: &AccountEvent) {
    let current = ledger::changes(event).and_then(|m| ledger.send(m));
    if let Some(entry) = ledger::written(account_id, event, current) {
        batch.blob_put(&entry.key(account_id), &entry.value().unwrap());
    }
    ledger.apply(account_id, event);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: audit_log DIR [EVENTS]");
        std::process::exit(2);
    };
    let target: u64 = args.next().map(|s| s.parse().expect("EVENTS: a number")).unwrap_or(1_000_000);
    if dir.join("store").exists() {
        eprintln!("{} already has a store", dir.display());
        std::process::exit(2);
    }
    let n = 1000usize;
    let t0 = 1_800_000_000u64;
    let store = Store::open(&dir.join("store")).unwrap();
    let seed = |tag: u8, i: usize| {
        let mut s = [tag; 32];
        s[..8].copy_from_slice(&(i as u64).to_be_bytes());
        s
    };
    let accounts: Vec<(Account, Device)> =
        (0..n).map(|i| (Account::from_seed(seed(1, i)), Device::from_seed("phone", seed(2, i)))).collect();
    let foreign = (Account::from_seed([250; 32]), Device::from_seed("phone", [251; 32]));
    fn wire<T: serde::de::DeserializeOwned>(v: Value) -> Wire<T> {
        Wire::from_value(&v).unwrap()
    }
    let mut heads: HashMap<String, Head> = HashMap::new();
    let mut ledgers: Vec<Ledger> = vec![Ledger::default(); n];
    let mut states: Vec<AccountState> = accounts.iter().map(|(a, _)| AccountState::new(a.id.clone())).collect();
    let mut sequences = vec![0u64; n];
    let (mut total, mut round, mut explain, mut foreign_explain) = (0u64, 0u64, None, None);
    let started = std::time::Instant::now();
    let new_event = |at: u64, t: &str, version: u32, data: Vec<u8>| NewEvent {
        event_type: t.into(),
        version,
        at,
        data: serde_json::value::RawValue::from_string(String::from_utf8(data).unwrap()).unwrap(),
    };
    while total < target {
        let at = t0 + round;
        let first_half = total < target / 2;
        let mut batch = store.batch();
        let mut append = |batch: &mut relay_actors::store::Batch, stream: String, events: Vec<NewEvent>| {
            total += events.len() as u64;
            let head = heads.get(&stream).copied().unwrap_or_default();
            let next = batch.append(&stream, head, events);
            heads.insert(stream, next);
        };
        for i in 0..n {
            let (account, phone) = &accounts[i];
            let stream = account_stream(&account.id);
            let mut events: Vec<AccountEvent> = vec![];
            let received = |sequences: &mut Vec<u64>, k: usize, from: &str, dev: &Device, message_id: &str| {
                sequences[k] += 1;
                let to = &accounts[k].0.id;
                AccountEvent::MessageReceived {
                    from: from.to_string(),
                    message_id: message_id.to_string(),
                    digest: blake3::hash(message_id.as_bytes()).to_hex().to_string(),
                    accepted_at: at,
                    retention_until: at + 30 * 86400,
                    record: Box::new(Record {
                        sequence: sequences[k],
                        expires_at: at + 30 * 86400,
                        envelope: wire(dev.envelope(from, to, message_id, at, &[7; 200])),
                        boxes: vec![wire(key_box("phone", &[9; 80]))],
                        visible: vec!["phone".into()],
                    }),
                    sender_certificate: None,
                }
            };
            if round == 0 {
                events.push(AccountEvent::Registered {
                    route: wire(account.route(1, &[("relay-a", "http://127.0.0.1:7801")], t0)),
                    device_certificate: wire(account.certificate(phone, t0, None)),
                    public_discovery: true,
                    params_digest: "0".repeat(64),
                    registration: None,
                });
            }
            match round % 8 {
                4 => {
                    let k = (i + 1) % n;
                    let message_id = format!("msg-{i:06}-{round:09}");
                    let to = accounts[k].0.id.clone();
                    // Through text: a Wire keeps its raw bytes.
                    let deliver: relay_schemas::methods::DeliverParams = serde_json::from_str(
                        &json!({
                            "envelope": phone.envelope(&account.id, &to, &message_id, at, &[7; 200]),
                            "recipient_boxes": [key_box("phone", &[9; 80])],
                            "sender_device_certificate": account.certificate(phone, t0, None),
                        })
                        .to_string(),
                    )
                    .unwrap();
                    let digest = blake3::hash(message_id.as_bytes()).to_hex().to_string();
                    sequences[i] += 1;
                    events.push(AccountEvent::MessageSent {
                        message_id: message_id.clone(),
                        to: to.clone(),
                        digest: digest.clone(),
                        accepted_at: at,
                        deadline: at + 5400,
                        retention_until: at + 30 * 86400,
                        record: None,
                        status: None,
                    });
                    let unavailable = || RelayError::unavailable("relay-a: cannot connect");
                    let delivery = [
                        DeliveryEvent::Accepted {
                            from: account.id.clone().into(),
                            message_id: message_id.clone().into(),
                            to: to.clone().into(),
                            accepted_at: UnixSecs(at),
                            deadline: UnixSecs(at + 5400),
                            digest,
                            params: Box::new(deliver),
                            first_due_ms: UnixMillis(at * 1000),
                        },
                        DeliveryEvent::RouteRefreshed {
                            revision: 1,
                            relays: vec![relay_schemas::objects::RelayRef {
                                id: "relay-a".into(),
                                url: "http://127.0.0.1:7801".into(),
                            }],
                        },
                        DeliveryEvent::AttemptStarted { attempt: 1, targets: vec!["relay-a".into()], revision: 1 },
                        DeliveryEvent::AttemptFailed {
                            attempt: 1,
                            error: unavailable(),
                            next_due_ms: UnixMillis(at * 1000 + 30_000),
                            may_switch: true,
                            refresh_route: true,
                        },
                        DeliveryEvent::AttemptStarted { attempt: 2, targets: vec!["relay-a".into()], revision: 1 },
                        DeliveryEvent::AttemptFailed {
                            attempt: 2,
                            error: unavailable(),
                            next_due_ms: UnixMillis(at * 1000 + 300_000),
                            may_switch: true,
                            refresh_route: true,
                        },
                        DeliveryEvent::AttemptStarted { attempt: 3, targets: vec!["relay-a".into()], revision: 1 },
                        DeliveryEvent::Finished { status: DeliveryStatus::target_accepted(at) },
                    ];
                    let delivery = delivery
                        .iter()
                        .map(|e| new_event(at, e.event_type(), DeliveryEvent::VERSION, serde_json::to_vec(e).unwrap()))
                        .collect();
                    append(&mut batch, format!("delivery/{}/{message_id}", account.id), delivery);
                    events.push(AccountEvent::DeliveryUpdated {
                        message_id: message_id.clone(),
                        status: DeliveryStatus::target_accepted(at),
                    });
                    // The recipient's record, in its own stream.
                    let ev = received(&mut sequences, k, &account.id, phone, &message_id);
                    states[k].apply(&ev);
                    record_ledger(&mut batch, &mut ledgers[k], &to, &ev);
                    let data = serde_json::to_vec(&ev).unwrap();
                    append(
                        &mut batch,
                        account_stream(&to),
                        vec![new_event(at, ev.event_type(), AccountEvent::VERSION, data)],
                    );
                    if i == n / 2 && (explain.is_none() || first_half) {
                        explain = Some((account.id.clone(), message_id));
                    }
                }
                5 => events.push(AccountEvent::CursorMoved { device_id: "phone".into(), through: sequences[i] }),
                7 => events.push(AccountEvent::SettingsUpdated { public_discovery: round % 16 == 7, at: None }),
                _ => {
                    let message_id = format!("ext-{i:06}-{round:09}");
                    if i == n / 2 && (foreign_explain.is_none() || first_half) {
                        foreign_explain = Some(message_id.clone());
                    }
                    events.push(received(&mut sequences, i, &foreign.0.id, &foreign.1, &message_id));
                }
            }
            for e in &events {
                states[i].apply(e);
                record_ledger(&mut batch, &mut ledgers[i], &account.id, e);
            }
            let new = events
                .iter()
                .map(|e| new_event(at, e.event_type(), AccountEvent::VERSION, serde_json::to_vec(e).unwrap()))
                .collect();
            append(&mut batch, stream, new);
        }
        store.commit_durable_blocking(batch).unwrap();
        round += 1;
    }
    let mut batch = store.batch();
    for (i, (account, _)) in accounts.iter().enumerate() {
        let stream = account_stream(&account.id);
        let head = heads[&stream];
        let state = serde_json::to_vec(&states[i]).unwrap();
        batch.put_snapshot(&stream, relay_actors::store::Snapshot { seq: head.seq, hash: head.hash, state });
        batch.kv_put(&ledger::version_key(&account.id), ledger::VERSION);
    }
    store.commit_durable_blocking(batch).unwrap();
    store.close().unwrap();
    let (from, message_id) = explain.unwrap();
    eprintln!(
        "wrote {total} events in {} streams ({round} rounds) in {:.1} s; explain: relay audit message {from} {message_id}; \
         received only: relay audit message {} {}",
        heads.len(),
        started.elapsed().as_secs_f64(),
        foreign.0.id,
        foreign_explain.unwrap(),
    );
}
