//! `relay audit` against the data dirs of real relays (issue #5): verify
//! finds every kind of tampering and names the place, replay reproduces the
//! live state, the story of a message that failed twice then got
//! `target_accepted`, the export schema, refusing a running relay, and an
//! old event version that still replays.
//!
//! The relays are stopped before their store is opened from the test or by
//! `relay audit` (sled holds an exclusive lock while a relay runs).

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::relay::{audit, RelayProc};
use common::schema::assert_valid;
use common::wait::eventually;
use relay_actors::store::{Head, NewEvent, Store};
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::{UnixMillis, UnixSecs};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

fn audit_dir(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--data-dir", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    audit(&all)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs `f` on the (stopped) relay's store, then closes it.
fn with_store<T>(data_dir: &Path, f: impl FnOnce(&Store) -> T) -> T {
    let store = Store::open(&data_dir.join("store")).expect("open store");
    let out = f(&store);
    store.close().unwrap();
    out
}

// ---- one populated relay, shared by the tests that only read or copy it ----

/// A stopped relay's data dir after a mixed workload, and what the running
/// relay answered.
struct Fixture {
    _dir: tempfile::TempDir,
    data_dir: PathBuf,
    config: PathBuf,
    /// alice, bob, carol.
    accounts: Vec<String>,
    /// (from, message_id, `message.delivery.status` while running).
    statuses: Vec<(String, String, Value)>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| actix_rt::System::new().block_on(populate()))
}

async fn populate() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    // Idle account actors passivate after 200 ms, leaving a snapshot at
    // their head: the live state, written by the running relay.
    let mut relay = RelayProc::start(dir.path(), "relay-a", "[actors]\npassivate_after = \"200ms\"\n");
    let c = Client::new(&relay.url);
    let mut alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    // bob's route names a second home (never reachable): messages to him
    // take the delivery stream (acceptance, attempts, end); bob's own to
    // alice, served here alone, end at acceptance without one.
    let two_homes = bob.account.route(2, &[("relay-a", c.base.as_str()), ("relay-z", "http://127.0.0.1:9")], now());
    c.ok("route.update", bob.token(0), &json!({"route": two_homes})).await;
    let carol = User::register(&c, "relay-a", 3, true).await;
    alice.add_device(&c, "laptop", 41).await;
    c.ok("account.settings.update", alice.token(0), &json!({"public_discovery": true})).await;
    let mut sent = vec![];
    for n in 1..=3 {
        c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), true)).await;
        sent.push((alice.id().to_string(), mid(n), alice.token(0).unwrap().to_string()));
    }
    c.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(4), false)).await;
    sent.push((bob.id().to_string(), mid(4), bob.token(0).unwrap().to_string()));
    // A box for a device bob does not have: the delivery fails (device_unknown).
    let bad = carol.params_to(0, bob.id(), &mid(5), now(), &["tablet"], Some(&["phone"]));
    let st = c.ok("message.send", carol.token(0), &bad).await;
    assert_eq!(st["status"], "failed", "{st}");
    sent.push((carol.id().to_string(), mid(5), carol.token(0).unwrap().to_string()));
    // Self-delivery.
    c.ok("message.send", carol.token(0), &carol.self_params(&mid(6), &["phone"])).await;
    // Timeline reads and acks.
    let records = bob.sync_all(&c, 0).await;
    c.ok("message.timeline.ack", bob.token(0), &json!({"through": records.len()})).await;
    c.ok("message.timeline.ack", alice.token(1), &json!({"through": 1})).await;

    let mut statuses = vec![];
    for (from, message_id, token) in &sent {
        let st = c.ok("message.delivery.status", Some(token), &json!({"message_id": message_id})).await;
        assert_ne!(st["status"], "delivering", "{message_id}: {st}");
        statuses.push((from.clone(), message_id.clone(), st));
    }
    // Let every account actor passivate (snapshot at its head), then stop.
    eventually("every account actor passivated", Duration::from_secs(10), || async {
        match c.metric("relay_account_actors_resident").await {
            Some(0.0) => Ok(()),
            n => Err(format!("relay_account_actors_resident {n:?}")),
        }
    })
    .await;
    assert!(relay.terminate().success());
    Fixture {
        data_dir: relay.data_dir.clone(),
        config: relay.config.clone(),
        accounts: vec![alice.id().into(), bob.id().into(), carol.id().into()],
        statuses,
        _dir: dir,
    }
}

fn account_stream(id: &str) -> String {
    format!("account/{id}")
}

/// A copy of the fixture's data dir to tamper with.
fn tamper_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("relay-a");
    copy_dir(&fixture().data_dir, &data);
    (dir, data)
}

/// Runs `relay audit verify` on `data`: it must fail (exit 1); returns the
/// finding lines.
fn findings(data: &Path) -> Vec<String> {
    let (code, out, err) = audit_dir(data, &["verify"]);
    assert_eq!(code, 1, "verify must report findings\nstdout: {out}\nstderr: {err}");
    out.lines().filter(|l| l.starts_with("stream ")).map(str::to_owned).collect()
}

// ---- verify ------------------------------------------------------------------

#[test]
fn an_untouched_log_verifies_clean() {
    let f = fixture();
    let config = f.config.to_str().unwrap();
    let (code, out, err) = audit(&["verify", "--config", config]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("0 findings"), "{out}");
    // Every account has a snapshot (passivation), and each was compared.
    let snapshots: u64 = out.split(" snapshots").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(snapshots >= 3, "{out}");
    // --data-dir finds the same store; --stream checks one stream.
    let (code, out, _) = audit_dir(&f.data_dir, &["verify", "--stream", &account_stream(&f.accounts[0])]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 streams"), "{out}");
}

#[test]
fn verify_finds_one_flipped_byte_and_names_stream_and_seq() {
    let (_dir, data) = tamper_copy();
    let stream = account_stream(&fixture().accounts[0]);
    with_store(&data, |store| {
        let key = Store::raw_event_key(&stream, 2);
        let mut value = store.raw_get(&key).unwrap().unwrap();
        // A letter inside the event's data: still JSON, no longer the hashed bytes.
        let body = &value[32..];
        let at = 32 + body.windows(7).position(|w| w == b"\"data\":").unwrap() + 12;
        assert!(value[at].is_ascii_alphabetic(), "{}", value[at] as char);
        value[at] ^= 0x01;
        store.raw_db().insert(key, value).unwrap();
    });
    let found = findings(&data);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with(&format!("stream {stream:?} seq 2: hash mismatch")), "{found:#?}");
}

#[test]
fn verify_finds_an_event_deleted_in_the_middle_of_a_stream() {
    let (_dir, data) = tamper_copy();
    let stream = account_stream(&fixture().accounts[0]);
    let head = with_store(&data, |store| {
        store.raw_db().remove(Store::raw_event_key(&stream, 3)).unwrap().expect("event 3 exists");
        store.head(&stream).unwrap().seq
    });
    assert!(head > 4);
    let found = findings(&data);
    assert!(
        found.iter().any(|f| f.starts_with(&format!("stream {stream:?} seq 4: sequence gap: expected seq 3"))),
        "{found:#?}"
    );
    assert!(found.iter().all(|f| f.starts_with(&format!("stream {stream:?}"))), "{found:#?}");
}

#[test]
fn verify_finds_two_reordered_events() {
    let (_dir, data) = tamper_copy();
    let stream = account_stream(&fixture().accounts[1]);
    with_store(&data, |store| {
        let db = store.raw_db();
        let (k2, k3) = (Store::raw_event_key(&stream, 2), Store::raw_event_key(&stream, 3));
        let (v2, v3) = (store.raw_get(&k2).unwrap().unwrap(), store.raw_get(&k3).unwrap().unwrap());
        db.insert(k2, v3).unwrap();
        db.insert(k3, v2).unwrap();
    });
    let found = findings(&data);
    for seq in [2, 3] {
        assert!(
            found.iter().any(|f| f.starts_with(&format!("stream {stream:?} seq {seq}: unreadable record"))
                && f.contains("body says")),
            "seq {seq}: {found:#?}"
        );
    }
}

#[test]
fn verify_finds_a_snapshot_that_differs_from_its_events() {
    let (_dir, data) = tamper_copy();
    let stream = account_stream(&fixture().accounts[1]);
    let seq = with_store(&data, |store| {
        let snap = store.load_snapshot(&stream).unwrap().expect("a snapshot from passivation");
        let mut state: Value = serde_json::from_slice(&snap.state).unwrap();
        state["last_sequence"] = json!(state["last_sequence"].as_u64().unwrap() + 7);
        let mut value = snap.seq.to_be_bytes().to_vec();
        value.extend_from_slice(&snap.hash);
        value.extend_from_slice(&serde_json::to_vec(&state).unwrap());
        let mut key = b"s".to_vec();
        key.extend_from_slice(stream.as_bytes());
        store.raw_db().insert(key, value).unwrap();
        snap.seq
    });
    let found = findings(&data);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with(&format!("stream {stream:?} seq {seq}: snapshot: differs")), "{found:#?}");
    assert!(found[0].contains("/last_sequence"), "{found:#?}");
}

// ---- replay --------------------------------------------------------------------

/// An account stream, its head seq, its snapshot's seq and state.
type AccountSnapshot = (String, u64, u64, Value);

/// Streams and each account's snapshot at the stopped relay.
fn streams_and_snapshots(data: &Path) -> (Vec<String>, Vec<AccountSnapshot>) {
    with_store(data, |store| {
        let streams: Vec<String> = store.streams().map(Result::unwrap).collect();
        let snaps = streams
            .iter()
            .filter(|s| s.starts_with("account/"))
            .map(|s| {
                let snap = store.load_snapshot(s).unwrap().unwrap_or_else(|| panic!("{s}: no snapshot"));
                let head = store.head(s).unwrap().seq;
                (s.clone(), head, snap.seq, serde_json::from_slice(&snap.state).unwrap())
            })
            .collect();
        (streams, snaps)
    })
}

fn replay_json(data: &Path, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    let (code, out, err) = audit_dir(data, &all);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    serde_json::Deserializer::from_str(&out).into_iter::<Value>().map(Result::unwrap).collect()
}

/// Replaying every stream from its events alone gives the state the running
/// relay had: for accounts the snapshot each actor wrote at its head when it
/// was passivated; for deliveries the status `message.delivery.status`
/// answered.
#[test]
fn replaying_every_stream_reproduces_the_live_state() {
    let f = fixture();
    let (streams, snaps) = streams_and_snapshots(&f.data_dir);
    assert_eq!(snaps.len(), 3);
    for (stream, head, snap_seq, live) in &snaps {
        assert_eq!(snap_seq, head, "{stream}: the live snapshot is at the head");
        let out = replay_json(&f.data_dir, &["--stream", stream]);
        let replayed = &out[0];
        assert_eq!(replayed["seq"], *head);
        assert_eq!(&replayed["state"], live, "{stream}: replay differs from the live state");
    }
    let deliveries: Vec<&String> = streams.iter().filter(|s| s.starts_with("delivery/")).collect();
    // bob's message to alice was delivered at acceptance: no stream.
    let streamed: Vec<_> = f.statuses.iter().filter(|(from, ..)| from != &f.accounts[1]).collect();
    assert_eq!(deliveries.len(), streamed.len(), "{deliveries:?}");
    for (from, message_id, status) in streamed {
        let stream = format!("delivery/{from}/{message_id}");
        let out = replay_json(&f.data_dir, &["--stream", &stream]);
        assert_eq!(&out[0]["state"]["finished"], status, "{stream}");
    }
}

#[test]
fn replay_prints_each_event_and_stops_at_until() {
    let f = fixture();
    let stream = account_stream(&f.accounts[0]);
    let out = replay_json(&f.data_dir, &["--stream", &stream, "--until", "2", "--events"]);
    assert_eq!(out.len(), 3, "two events then the state: {out:#?}");
    assert_eq!(out[0]["seq"], 1);
    assert_eq!(out[0]["type"], "registered");
    assert!(out[0]["event"]["registered"]["route"].is_object());
    assert_eq!(out[1]["type"], "device_added");
    assert_eq!(out[2]["seq"], 2);
    assert_eq!(out[2]["state"]["devices"].as_object().unwrap().len(), 2);
    // Not a stream of a known kind, or no such stream: exit 2.
    assert_eq!(audit_dir(&f.data_dir, &["replay", "--stream", "nothing/here"]).0, 2);
    assert_eq!(audit_dir(&f.data_dir, &["replay", "--stream", "account/00000000000000000000000000000000"]).0, 2);
}

// ---- export ------------------------------------------------------------------

fn check_export(out: &str) -> usize {
    let mut last: Option<(String, u64, String)> = None;
    let mut n = 0;
    for line in out.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_valid("audit/export-line.schema.json", &v);
        let (stream, seq) = (v["stream"].as_str().unwrap().to_string(), v["seq"].as_u64().unwrap());
        let prev = v["prev"].as_str().unwrap().to_string();
        match &last {
            Some((s, n, h)) if *s == stream => {
                assert_eq!(seq, n + 1);
                assert_eq!(&prev, h, "{stream} seq {seq}: prev links to the line before");
            }
            _ => assert_eq!((seq, prev.as_str()), (1, "0".repeat(64).as_str())),
        }
        // The documented hash: blake3(prev ‖ body), data byte for byte from the line.
        let data_start = line.find(",\"data\":").unwrap() + 8;
        let data = &line[data_start..line.len() - 1];
        let body = format!(
            "{{\"stream\":{},\"seq\":{seq},\"type\":{},\"version\":{},\"at\":{},\"prev\":\"{prev}\",\"data\":{data}}}",
            v["stream"], v["type"], v["version"], v["at"]
        );
        let mut h = blake3::Hasher::new();
        h.update(&hex::decode(&prev).unwrap());
        h.update(body.as_bytes());
        assert_eq!(h.finalize().to_hex().as_str(), v["hash"].as_str().unwrap(), "{stream} seq {seq}");
        last = Some((stream, seq, v["hash"].as_str().unwrap().to_string()));
        n += 1;
    }
    n
}

#[test]
fn export_lines_follow_the_schema_and_carry_the_chain() {
    let f = fixture();
    let (code, out, err) = audit_dir(&f.data_dir, &["export"]);
    assert_eq!(code, 0, "{err}");
    let all = check_export(&out);
    let total: u64 =
        with_store(&f.data_dir, |store| store.streams().map(|s| store.head(&s.unwrap()).unwrap().seq).sum());
    assert_eq!(all as u64, total);
    let types: std::collections::BTreeSet<String> =
        out.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["type"].as_str().unwrap().to_string()).collect();
    for t in [
        "registered",
        "device_added",
        "settings_updated",
        "message_sent",
        "message_received",
        "self_delivered",
        "delivery_updated",
        "cursor_moved",
        "accepted",
        "attempt_started",
        "finished",
    ] {
        assert!(types.contains(t), "no {t} in the export: {types:?}");
    }
    // One stream; and --since in the future exports nothing.
    let stream = account_stream(&f.accounts[2]);
    let (_, one, _) = audit_dir(&f.data_dir, &["export", "--stream", &stream]);
    assert!(check_export(&one) > 0 && one.lines().all(|l| l.contains(&stream)));
    let (code, none, _) = audit_dir(&f.data_dir, &["export", "--since", &(now() + 3600).to_string()]);
    assert_eq!((code, none.as_str()), (0, ""));
}

// ---- refusing a running relay, and a missing store ---------------------------

#[actix_rt::test]
async fn audit_refuses_a_data_dir_in_use_by_a_running_relay() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    for args in [
        vec!["verify", "--config", relay.config.to_str().unwrap()],
        vec!["--data-dir", relay.data_dir.to_str().unwrap(), "export"],
    ] {
        let (code, out, err) = audit(&args);
        assert_eq!(code, 2, "{args:?}: stdout {out} stderr {err}");
        assert!(err.contains("is in use by a running relay; stop it first"), "{err}");
        assert!(err.contains(relay.data_dir.to_str().unwrap()), "names the data dir: {err}");
    }
    assert!(relay.terminate().success());
    let (code, _, err) = audit(&["verify", "--config", relay.config.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = audit(&["verify", "--data-dir", dir.path().join("nowhere").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("no store"), "{err}");
    assert!(!dir.path().join("nowhere").exists(), "audit never creates a store");
}

// ---- the story of a message --------------------------------------------------

/// Attempts at 0 s and 1 s after acceptance (both find the destination
/// down), the third at 6 s: the destination comes back in between. Offsets
/// count from `accepted_at` (whole seconds), so the second attempt is at most
/// 1 s after the send and the third at least 5 s after it.
const TWO_FAILURES: &str = "[delivery]\nretry_timetable = [\"0s\", \"1s\", \"6s\"]\nretry_then_every = \"1s\"\nattempt_timeout = \"1s\"\n[limits]\ndelivery_age_limit = \"20s\"\n";

#[actix_rt::test]
async fn audit_message_tells_two_failed_attempts_then_target_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let mut a = cluster.start("relay-a", TWO_FAILURES);
    let mut b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await; // relay-a learns bob's route
    b.kill9();

    let sent = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    // The second attempt has failed (the third is 5 s later).
    eventually("two failed attempts", Duration::from_secs(10), || async {
        match ca.metric(r#"relay_delivery_attempts_total{outcome="not_attempted"}"#).await.unwrap_or(0.0) {
            n if n >= 2.0 => Ok(()),
            n => Err(format!("{n} failed attempts")),
        }
    })
    .await;
    b.restart();
    let st = eventually("a terminal status", Duration::from_secs(15), || async {
        let st = ca.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await;
        if st["status"] != "delivering" {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    // The account records the status: alice's sent record shows it.
    eventually("the sent record's status", Duration::from_secs(10), || async {
        let sent = alice.sync_all(&ca, 0).await;
        if sent[0]["delivery"]["status"] == "target_accepted" {
            Ok(())
        } else {
            Err(sent[0]["delivery"].to_string())
        }
    })
    .await;
    assert!(a.terminate().success());
    assert!(b.terminate().success());

    // The source relay: acceptance, three attempts, final status, sent record.
    let config = a.config.to_str().unwrap();
    let (code, out, err) = audit(&["message", "--config", config, alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["to"], bob.id());
    let acceptance = &story["acceptance"];
    assert_eq!(acceptance["accepted_at"], sent["accepted_at"]);
    assert!(acceptance["deadline"].as_u64().unwrap() > acceptance["accepted_at"].as_u64().unwrap());
    assert_eq!(acceptance["send_params_digest"].as_str().unwrap().len(), 64);
    let delivery = &story["delivery"];
    assert_eq!(delivery["deliver_params_digest"].as_str().unwrap().len(), 64);
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{out}");
    for (i, at) in attempts.iter().enumerate() {
        assert_eq!(at["attempt"], i + 1);
        assert_eq!(at["targets"], json!(["relay-b"]), "{at}");
        assert_eq!(at["route_revision"], 1);
    }
    for at in &attempts[..2] {
        assert_eq!(at["outcome"]["result"], "failed", "{at}");
        assert_eq!(at["outcome"]["error"]["code"], "temporarily_unavailable", "{at}");
    }
    assert_eq!(attempts[2]["outcome"]["result"], "finished");
    assert_eq!(attempts[2]["outcome"]["status"]["status"], "target_accepted");
    assert!(!delivery["route_refreshes"].as_array().unwrap().is_empty());
    assert_eq!(delivery["finished"]["by_attempt"], 3);
    assert_eq!(story["final_status"], st);
    assert_eq!(story["status_reports"][0]["status"], st);
    let records = story["timeline_records"].as_array().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!((records[0]["account"].as_str(), records[0]["direction"].as_str()), (Some(alice.id()), Some("sent")));
    assert!(story["problems"].as_array().unwrap().is_empty());

    // The same story for people.
    let (code, text, _) = audit(&["message", "--config", config, alice.id(), &mid(1)]);
    assert_eq!(code, 0);
    eprintln!("{text}");
    for needle in [
        "accepted here:",
        "deadline",
        "send params digest",
        "attempts (3)",
        "#1 ",
        "-> relay-b (route revision 1): failed: temporarily_unavailable",
        "#3 ",
        "(route revision 1): target_accepted",
        "by attempt #3: target_accepted",
        "final status: target_accepted",
        "timeline records created here (1)",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
    assert_eq!(text.matches(": failed: ").count(), 2, "{text}");

    // The destination relay: the receipt and bob's record, found without --to.
    let (code, out, err) =
        audit(&["message", "--data-dir", b.data_dir.to_str().unwrap(), alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{err}");
    let there: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(there["receipts"][0]["account"], bob.id());
    assert_eq!(there["timeline_records"][0]["direction"], "received");
    assert!(there["delivery"].is_null() && there["acceptance"].is_null());
    // An unknown message: no trace, exit 1.
    let (code, text, _) = audit(&["message", "--config", config, alice.id(), &mid(99)]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("no event on this relay"), "{text}");

    // The source log verifies clean and its export (attempt_failed,
    // route_refreshed, …) follows the schema.
    let (code, out, _) = audit(&["verify", "--config", config]);
    assert_eq!(code, 0, "{out}");
    let (_, export, _) = audit(&["export", "--config", config]);
    assert!(check_export(&export) > 0);
    assert!(export.contains("\"type\":\"attempt_failed\"") && export.contains("\"type\":\"route_refreshed\""));
}

/// A send whose recipient took it at once is one `message_sent` carrying its
/// outcome: its story tells the acceptance, that outcome as the status
/// report and the final status the relay answered, and no delivery.
#[test]
fn a_send_settled_at_acceptance_tells_its_outcome_from_its_one_event() {
    let f = fixture();
    let (from, message_id, live) = &f.statuses[3];
    assert_eq!(from, &f.accounts[1], "bob's message to alice, served here alone");
    let (code, out, err) = audit_dir(&f.data_dir, &["message", from, message_id, "--json"]);
    assert_eq!(code, 0, "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(live["status"], "target_accepted", "{live}");
    assert_eq!(&story["final_status"], live, "{out}");
    assert_eq!(story["status_reports"].as_array().map(Vec::len), Some(1), "{out}");
    assert_eq!(&story["status_reports"][0]["status"], live, "{out}");
    assert!(story["acceptance"].is_object() && story["delivery"].is_null(), "{out}");
    let events = replay_json(&f.data_dir, &["--stream", &account_stream(from), "--events"]);
    let sent: Vec<&Value> = events.iter().filter_map(|e| e["event"].get("message_sent")).collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(&sent[0]["status"], live, "the acceptance carries the outcome");
    assert!(events.iter().all(|e| e["event"].get("delivery_updated").is_none()), "no second event");
}

// ---- an older event version --------------------------------------------------

/// A delivery log written when `attempt_failed` had no `may_switch` /
/// `refresh_route` (event version 0) verifies, replays through the
/// upcaster and tells its story.
#[test]
fn a_log_written_with_event_version_0_verifies_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("old");
    let (alice, bob) = (Account::from_seed([1; 32]), Account::from_seed([2; 32]));
    let phone = Device::from_seed("phone", [101; 32]);
    let (from, to) = (alice.id.as_str(), bob.id.as_str());
    let message_id = mid(1);
    let stream = format!("delivery/{from}/{message_id}");
    let ev = |t: &str, v: Value| NewEvent {
        event_type: t.into(),
        version: 0,
        at: 1_700_000_000,
        data: serde_json::value::to_raw_value(&v).unwrap(),
    };
    let params = json!({
        "envelope": phone.envelope(from, to, &message_id, 1_700_000_000, b"ciphertext"),
        "recipient_boxes": [key_box("phone", b"box")],
        "sender_device_certificate": alice.certificate(&phone, 1_699_999_000, None),
    });
    with_store(&data, |store| {
        let mut batch = store.batch();
        batch.append(
            &stream,
            Head::default(),
            vec![
                ev("accepted", json!({"accepted": {"from": from, "message_id": message_id,
                    "to": to, "accepted_at": 1_700_000_000, "deadline": 1_700_005_400,
                    "digest": "d".repeat(64), "params": params, "first_due_ms": 1_700_000_000_000u64}})),
                ev("route_refreshed", json!({"route_refreshed": {"revision": 1, "relays": [{"id": "relay-b", "url": "http://127.0.0.1:1"}]}})),
                ev("attempt_started", json!({"attempt_started": {"attempt": 1, "targets": ["relay-b"], "revision": 1}})),
                ev("attempt_failed", json!({"attempt_failed": {"attempt": 1,
                    "error": {"code": "route_stale", "message": "moved"}, "next_due_ms": 1_700_000_030_000u64}})),
            ],
        );
        store.commit_durable_blocking(batch).unwrap();
    });
    let (code, out, err) = audit_dir(&data, &["verify"]);
    assert_eq!(code, 0, "{out}{err}");
    let out = replay_json(&data, &["--stream", &stream, "--events"]);
    assert_eq!(out[3]["version"], 0);
    assert_eq!(out[3]["event"]["attempt_failed"]["may_switch"], true, "upcast: a route error may switch");
    let state = &out[4]["state"];
    assert_eq!((state["attempts"].as_u64(), state["may_switch"].as_bool()), (Some(1), Some(true)));
    assert_eq!(state["refresh_route"], true);
    assert_eq!(state["next_due_ms"], 1_700_000_030_000u64);
    // Its export keeps the stored version 0 and still follows the schema.
    let (_, export, _) = audit_dir(&data, &["export"]);
    assert_eq!(check_export(&export), 4);
    let (code, text, _) = audit_dir(&data, &["message", from, &message_id]);
    assert_eq!(code, 0);
    assert!(text.contains("failed: route_stale: moved"), "{text}");
}

// ---- a large log, for the figures in the closing note ---------------------------

/// Writes a log of at least `AUDIT_BIG_EVENTS` (default 1,000,000) events
/// into `AUDIT_BIG_DIR/store`, through the store API in commit batches of
/// about 2,000 events, with real account and delivery event JSON: 1,000
/// accounts receiving messages from a foreign account, sending to each
/// other (each delivery failing twice, then `target_accepted`), acking and
/// changing settings; every account gets a snapshot at its head. Prints a
/// message to explain. Not a timing assertion: the figures come from
/// timing `relay audit` on the result (see README, Audit).
#[test]
#[ignore = "writes ~3 GB in ~4 min; run with AUDIT_BIG_DIR=/path cargo test --test it audit::generate_a_large_log -- --ignored"]
fn generate_a_large_log() {
    use relay_actors::account::{AccountEvent, AccountState, Record};
    use relay_actors::delivery::DeliveryEvent;
    use relay_schemas::{DeliveryStatus, RelayError, Wire};
    use std::collections::HashMap;

    let Ok(dir) = std::env::var("AUDIT_BIG_DIR") else {
        eprintln!("set AUDIT_BIG_DIR to generate");
        return;
    };
    let target: u64 = std::env::var("AUDIT_BIG_EVENTS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let n = 1000usize;
    let t0 = 1_800_000_000u64;
    let store = Store::open(&PathBuf::from(dir).join("store")).unwrap();
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
