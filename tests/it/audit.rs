//! `relay audit` against the data dirs of real relays (issue #5): verify
//! finds every kind of tampering and names the place, replay reproduces the
//! live state, the story of a message that failed twice then got
//! `target_accepted`, the export schema, refusing a running relay, and an
//! old event version that still replays.
//!
//! The relays are stopped before their store is opened from the test or by
//! `relay audit` (sled holds an exclusive lock while a relay runs).

use crate::common;
use common::{copy_dir, with_store};

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::relay::{audit, RelayProc};
use common::schema::assert_valid;
use common::wait::eventually;
use relay_actors::store::{Head, NewEvent, Store};
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::UnixSecs;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

fn audit_dir(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["--data-dir", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    audit(&all)
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
        if let Some(marker) = v.get("pruned") {
            // A pruned stream's marker comes first: the chain goes on from it.
            assert!(last.as_ref().is_none_or(|(s, ..)| s != v["stream"].as_str().unwrap()), "{line}");
            let hash = marker["hash"].as_str().unwrap().to_string();
            last = Some((v["stream"].as_str().unwrap().to_string(), marker["seq"].as_u64().unwrap(), hash));
            n += 1;
            continue;
        }
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

#[test]
fn export_into_a_closed_pipe_ends_quietly() {
    let f = fixture();
    // `relay audit export | head`: the reader is gone before the export writes.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["audit", "--data-dir"])
        .arg(&f.data_dir)
        .arg("export")
        .env("RUST_LOG", "warn")
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), err.as_ref()), (Some(0), ""));
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

// ---- pruned streams (PROTOCOL §10) ---------------------------------------------

/// Prunes `stream` of the stopped relay's store in `data` through seq
/// `through`, as the retention sweep does: an account's marker keeps the
/// `AccountState` folded through it (its snapshot's encoding) and the
/// ledger entries those events gave are left in their swept form; a
/// delivery stream is deleted whole (through its head, no state, no
/// snapshot). Returns the marker's head.
fn prune(data: &Path, stream: &str, through: u64) -> Head {
    use relay_core::account::ledger::{self, Ledger, ReceiptEntry, SendEntry};
    use relay_core::account::AccountState;
    with_store(data, |store| {
        let pruned: Vec<_> = store.read(stream, 0).take(through as usize).map(Result::unwrap).collect();
        let last = pruned.last().expect("events to prune").head();
        assert_eq!(last.seq, through);
        let mut batch = store.batch();
        match stream.strip_prefix("account/") {
            Some(id) => {
                let (mut state, mut ledger) = (AccountState::new(id), Ledger::default());
                for ev in &pruned {
                    let e = relay_actors::upcast::account_event(ev).unwrap();
                    state.apply(&e);
                    ledger.apply(id, &e);
                }
                for entry in ledger.entries() {
                    let swept = match &entry {
                        ledger::Entry::Send { entry, .. } => {
                            serde_json::to_vec(&SendEntry::swept(entry.retention_until))
                        }
                        ledger::Entry::Receipt { entry, .. } => {
                            serde_json::to_vec(&ReceiptEntry::swept(entry.retention_until))
                        }
                    };
                    batch.blob_put(&entry.key(id), &swept.unwrap());
                }
                batch.prune(stream, 0, last, UnixSecs(now()), serde_json::to_vec(&state).unwrap());
            }
            None => {
                assert_eq!(store.head(stream).unwrap(), last, "a delivery stream is deleted whole");
                batch.prune(stream, 0, last, UnixSecs(now()), Vec::new());
                batch.remove_snapshot(stream);
            }
        }
        store.commit_durable_blocking(batch).unwrap();
        last
    })
}

/// A copy of the fixture with alice's account pruned through all but its
/// last two events: (dir, data dir, stream, marker's seq).
fn pruned_copy() -> (tempfile::TempDir, PathBuf, String, u64) {
    let (dir, data) = tamper_copy();
    let stream = account_stream(&fixture().accounts[0]);
    let head = with_store(&data, |store| store.head(&stream).unwrap().seq);
    assert!(head > 4, "{head}");
    prune(&data, &stream, head - 2);
    (dir, data, stream, head - 2)
}

#[test]
fn a_pruned_stream_verifies() {
    let (_dir, data, stream, through) = pruned_copy();
    let (code, out, err) = audit_dir(&data, &["verify"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("1 from their pruned marker (0 pruned whole); 0 findings"), "{out}");
    let (code, out, _) = audit_dir(&data, &["verify", "--stream", &stream]);
    assert_eq!(code, 0, "{out}");
    // The events before the marker are gone, and it says so.
    let (_, export, _) = audit_dir(&data, &["export", "--stream", &stream]);
    let first: Value = serde_json::from_str(export.lines().next().unwrap()).unwrap();
    assert_eq!(first["pruned"]["seq"], through, "{first}");
    assert_eq!(check_export(&export), 3, "the marker and two events");
}

#[test]
fn a_rewritten_event_after_the_marker_is_caught() {
    let (_dir, data, stream, through) = pruned_copy();
    with_store(&data, |store| {
        let key = Store::raw_event_key(&stream, through + 1);
        let mut value = store.raw_get(&key).unwrap().unwrap();
        let at = 32 + value[32..].windows(7).position(|w| w == b"\"data\":").unwrap() + 12;
        assert!(value[at].is_ascii_alphabetic(), "{}", value[at] as char);
        value[at] ^= 0x01;
        store.raw_db().insert(key, value).unwrap();
    });
    let found = findings(&data);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].starts_with(&format!("stream {stream:?} seq {}: hash mismatch", through + 1)), "{found:#?}");
}

#[test]
fn an_event_whose_prev_does_not_match_the_marker_is_caught() {
    let (_dir, data, stream, through) = pruned_copy();
    // The marker names another chain: the first kept event does not link to it.
    with_store(&data, |store| {
        let marker = store.pruned(&stream).unwrap().unwrap();
        let mut batch = store.batch();
        let other = Head { seq: through, hash: [7; 32] };
        batch.prune(&stream, through - 1, other, UnixSecs(marker.at), marker.state);
        store.commit_durable_blocking(batch).unwrap();
    });
    let found = findings(&data);
    assert_eq!(
        found,
        [format!(
            "stream {stream:?} seq {}: broken link: prev is not the hash the pruned marker keeps (of the last event pruned)",
            through + 1
        )]
    );
    // An event left at or below the marker is out of place.
    let (_dir, data) = tamper_copy();
    let key = Store::raw_event_key(&stream, through);
    let value = with_store(&data, |store| store.raw_get(&key).unwrap().unwrap());
    prune(&data, &stream, through);
    with_store(&data, |store| store.raw_db().insert(&key, value).map(drop).unwrap());
    let found = findings(&data);
    let gap = format!("stream {stream:?} seq {through}: sequence gap: expected seq {}", through + 1);
    assert!(found.iter().any(|f| f.starts_with(&gap)), "{found:#?}");
}

#[test]
fn a_stream_pruned_whole_verifies() {
    let (_dir, data) = tamper_copy();
    let f = fixture();
    let (from, message_id, _) = &f.statuses[0];
    let stream = format!("delivery/{from}/{message_id}");
    let head = with_store(&data, |store| store.head(&stream).unwrap());
    assert_eq!(prune(&data, &stream, head.seq), head);
    let (code, out, err) = audit_dir(&data, &["verify"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("1 from their pruned marker (1 pruned whole); 0 findings"), "{out}");
    let (code, out, _) = audit_dir(&data, &["verify", "--stream", &stream]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 streams, 0 events"), "{out}");
    // Export: its marker alone; the story: deleted whole, still a trace.
    let (code, export, _) = audit_dir(&data, &["export", "--stream", &stream]);
    assert_eq!((code, check_export(&export)), (0, 1));
    let marker: Value = serde_json::from_str(export.trim()).unwrap();
    assert_eq!((marker["pruned"]["seq"].as_u64(), &marker["pruned"]["state"]), (Some(head.seq), &Value::Null));
    let (code, text, _) = audit_dir(&data, &["message", from, message_id]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("{stream} pruned through seq {} at ", head.seq)) && text.contains("(deleted whole)"),
        "{text}"
    );
    // Replay has nothing to rebuild, and says why.
    let out = replay_json(&data, &["--stream", &stream]);
    assert_eq!((out[0]["events"].as_u64(), &out[0]["state"]), (Some(0), &Value::Null));
    assert_eq!(out[0]["pruned"]["seq"], head.seq);
}

#[test]
fn replaying_a_pruned_account_gives_the_state_before_pruning() {
    let f = fixture();
    let stream = account_stream(&f.accounts[0]);
    let before = replay_json(&f.data_dir, &["--stream", &stream]);
    let (_dir, data, _, through) = pruned_copy();
    let after = replay_json(&data, &["--stream", &stream, "--events"]);
    assert_eq!(after.len(), 3, "the two kept events, then the state: {after:#?}");
    assert_eq!(after[0]["seq"], through + 1);
    let (before, after) = (&before[0], &after[2]);
    assert_eq!(after["state"], before["state"], "the state from the marker and the kept events");
    assert_eq!((&after["seq"], &after["hash"]), (&before["seq"], &before["hash"]));
    assert_eq!((after["events"].as_u64(), &after["pruned"]["seq"]), (Some(2), &json!(through)));
    assert!(after["pruned"]["text"].as_str().unwrap().starts_with(&format!("events 1..={through} pruned at ")));
    // A replay cannot stop before the marker.
    let (code, _, err) = audit_dir(&data, &["replay", "--stream", &stream, "--until", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("pruned through seq {through} at")), "{err}");
}

// ---- the fast verify ---------------------------------------------------------------

/// `verify` decodes of a timeline record's envelope and boxes, and of a
/// delivery's params without a snapshot, only what a fold reads: over a
/// real relay's log, every stream's state, ledger and rules come out the
/// same as from decoding every event whole.
#[test]
fn the_fold_that_skips_record_bodies_gives_what_the_full_one_gives() {
    use relay_audit::Folded;
    let f = fixture();
    let folds = with_store(&f.data_dir, |store| {
        let mut folds = 0;
        for stream in store.streams().map(Result::unwrap) {
            let (mut full, mut fold) = (Folded::new(&stream).unwrap(), Folded::new(&stream).unwrap());
            for ev in store.read_raw(&stream, 0).map(Result::unwrap) {
                let text = relay_actors::upcast::Text { stream: &stream, event: &ev };
                let (a, b) = (full.apply(&text).unwrap(), fold.apply_fold(&text, false).unwrap());
                assert_eq!(a, b, "{stream} seq {}: rules", ev.seq);
                folds += 1;
            }
            if stream.starts_with("account/") {
                assert_eq!(full.to_json(), fold.to_json(), "{stream}: state");
            }
            assert_eq!(full.ledger_json(), fold.ledger_json(), "{stream}: ledger");
        }
        folds
    });
    assert!(folds > 30, "{folds}");
    // And both verify the log clean.
    for args in [&["verify"][..], &["verify", "--full"]] {
        let (code, out, err) = audit_dir(&f.data_dir, args);
        assert_eq!(code, 0, "{args:?}: {out}{err}");
    }
}

/// Without `--full`, a record's envelope is covered by the hash chain
/// alone; with it, one that does not decode as an envelope is found.
#[test]
fn verify_full_decodes_every_protocol_object() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("odd");
    let stream = "account/0123456789abcdef0123456789abcdef";
    with_store(&data, |store| {
        let record =
            json!({"sequence": 1, "expires_at": 9, "envelope": {"not": "an envelope"}, "boxes": [], "visible": []});
        let e = json!({"message_received": {"from": "fedcba9876543210fedcba9876543210", "message_id": mid(1),
            "digest": "d", "accepted_at": 1, "retention_until": 9, "record": record}});
        let ev = NewEvent {
            event_type: "message_received".into(),
            version: 3,
            at: 1,
            data: serde_json::value::to_raw_value(&e).unwrap(),
        };
        let mut batch = store.batch();
        batch.append(stream, Head::default(), vec![ev]);
        store.commit_durable_blocking(batch).unwrap();
    });
    assert_eq!(audit_dir(&data, &["verify"]).0, 0);
    let (code, out, _) = audit_dir(&data, &["verify", "--full"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("stream {stream:?} seq 1: undecodable event: event message_received v3")), "{out}");
}
