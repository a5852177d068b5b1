//! Signed checkpoints and witnesses (PROTOCOL §10) between real relays on
//! loopback: each relay writes checkpoints of its store and its peers
//! witness them (`audit.checkpoint`, the witness log); a relay whose
//! history was rewritten, or rolled back, after a peer witnessed it is
//! caught by `relay audit verify --checkpoint` with the witnessed
//! checkpoint, even where `relay audit verify` alone finds nothing.

use crate::common;
use common::{copy_dir, with_store};

use common::client::{mid, relay_post, Client, User};
use common::cluster::Cluster;
use common::relay::{audit, RelayProc};
use common::schema::assert_valid;
use common::wait::eventually;
use relay_actors::store::Store;
use relay_schemas::checkpoint::{verify, Checkpoint, Leaf};
use relay_schemas::sign::parse_public_key;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Checkpoints and witness rounds every 200 ms (PROTOCOL's default is 1h).
const FAST: &str = "[audit]\ncheckpoint_interval = \"200ms\"\nwitness_interval = \"200ms\"\n";

fn audit_dir(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--data-dir", dir.to_str().unwrap()]);
    audit(&all)
}

/// The latest checkpoint of `peer` in the witness log of the relay whose
/// data dir is `witness` (read beside the running relay), if any.
fn witnessed(witness: &Path, peer: &str) -> Option<Map<String, Value>> {
    let (code, out, _) = audit_dir(witness, &["witnesses", "--peer", peer, "--latest"]);
    (code == 0).then(|| serde_json::from_str(out.trim()).expect("a checkpoint object"))
}

/// The relay's own latest checkpoint (`relay audit checkpoint`).
fn own_latest(data_dir: &Path) -> Option<Map<String, Value>> {
    let (code, out, _) = audit_dir(data_dir, &["checkpoint"]);
    (code == 0).then(|| serde_json::from_str(out.trim()).expect("a checkpoint object"))
}

/// Waits until `witness` has witnessed `peer`'s latest checkpoint, one
/// whose leaves (kept by `peer`) satisfy `covers`.
async fn wait_witnessed(witness: &Path, peer: &RelayProc, covers: impl Fn(&[Leaf]) -> bool) -> Map<String, Value> {
    let what = format!("{} witnessed {}'s latest checkpoint", witness.display(), peer.id);
    eventually(&what, Duration::from_secs(30), || async {
        let (seen, own) = (witnessed(witness, &peer.id), own_latest(&peer.data_dir));
        match (&seen, &own) {
            (Some(s), Some(o)) if s == o && covers(&kept_leaves_of(&peer.data_dir, s)) => Ok(s.clone()),
            _ => Err(format!("witnessed {seen:?}, own {own:?}")),
        }
    })
    .await
}

/// The leaves `data_dir` kept for checkpoint `cp`.
fn kept_leaves_of(data_dir: &Path, cp: &Map<String, Value>) -> Vec<Leaf> {
    let text = std::fs::read_to_string(kept_file_of(data_dir, cp)).unwrap();
    text.lines().skip(1).map(|l| Leaf::parse(l.as_bytes()).unwrap()).collect()
}

/// Whether `leaves` have `stream` at `seq` or later.
fn has(leaves: &[Leaf], stream: &str, seq: u64) -> bool {
    leaves.iter().any(|l| l.stream == stream && l.seq >= seq)
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[actix_rt::test]
async fn peers_witness_each_others_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", FAST);
    let b = cluster.start("relay-b", FAST);
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;

    // Each witnesses the other's checkpoint of what it holds now, signed by
    // the key its [[peers]] entry names.
    let (alice_stream, bob_stream) = (format!("account/{}", alice.id()), format!("account/{}", bob.id()));
    for (witness, peer, member, stream) in [(&b, &a, 0, &alice_stream), (&a, &b, 1, &bob_stream)] {
        // Registered and sent or received: at least two events.
        let cp = wait_witnessed(&witness.data_dir, peer, |leaves| has(leaves, stream, 2)).await;
        let key = parse_public_key("k", &cluster.members[member].public_key).unwrap();
        let cp = verify(&cp, &key, &peer.id).unwrap();
        assert!(cp.streams >= 1 && cp.events >= cp.streams, "{cp:?}");
    }
    let log = std::fs::read_to_string(b.data_dir.join("witness/relay-a.jsonl")).unwrap();
    assert!(log.lines().count() >= 1);

    // A peer gets the latest checkpoint by `audit.checkpoint`, as the schema says.
    let b_key = ed25519_dalek::SigningKey::from_bytes(&[201; 32]);
    let (status, answer) = ca.relay_call("relay-a", "relay-b", &b_key, "audit.checkpoint", &json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert_valid("methods/audit.checkpoint.result.schema.json", &answer);
    assert_eq!(answer["relay_id"], "relay-a");
    // Clients are not given checkpoints, nor is an unauthenticated caller.
    let (status, e) = ca.call("audit.checkpoint", alice.token(0), &json!({})).await;
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("not_found")), "{e}");
    let (status, e) = relay_post(&a.url, "audit.checkpoint", &[], b"{}").await;
    assert_eq!((status, e["error"]["code"].as_str()), (401, Some("unauthorized")), "{e}");

    // Checkpoints and witness logs are the relay's user's only.
    for d in [&a.data_dir, &b.data_dir] {
        for sub in ["checkpoints", "witness"] {
            let sub = d.join(sub);
            assert_eq!(mode(&sub), 0o700, "{}", sub.display());
            for f in std::fs::read_dir(&sub).unwrap() {
                let f = f.unwrap().path();
                assert_eq!(mode(&f), 0o600, "{}", f.display());
            }
        }
    }
}

/// Rewrites event `seq` of `stream` with `edit` applied to its data, and
/// every event after it with the chain recomputed from the new hash, so
/// the stream is a sound chain again (the snapshot, if any, follows the new
/// hash). Values go into sled inline through the test hook (`raw_db`): a
/// value other than a 20-byte pointer reads as the value itself.
fn rewrite_and_rechain(store: &Store, stream: &str, seq: u64, edit: impl FnOnce(&mut Value)) {
    let events: Vec<_> = store.read(stream, 0).map(Result::unwrap).collect();
    let mut edit = Some(edit);
    let mut prev = events[seq as usize - 2].hash;
    let mut new_hashes = std::collections::HashMap::new();
    for ev in events.iter().filter(|e| e.seq >= seq) {
        let mut data: Value = serde_json::from_str(ev.data.get()).unwrap();
        if ev.seq == seq {
            (edit.take().unwrap())(&mut data);
        }
        let data = serde_json::value::to_raw_value(&data).unwrap();
        let rewritten = relay_actors::store::StoredEvent { data, prev, ..ev.clone() };
        let value = rewritten.encoded().unwrap();
        let hash: [u8; 32] = value[..32].try_into().unwrap();
        store.raw_db().insert(Store::raw_event_key(stream, ev.seq), value).unwrap();
        new_hashes.insert(ev.seq, hash);
        prev = hash;
    }
    assert_ne!(new_hashes[&seq], events[seq as usize - 1].hash, "the edit changed the event");
    if let Some(snap) = store.load_snapshot(stream).unwrap().filter(|s| s.seq >= seq) {
        let value = [&snap.seq.to_be_bytes()[..], &new_hashes[&snap.seq], &snap.state].concat();
        store.raw_db().insert(Store::raw_snapshot_key(stream), value).unwrap();
    }
}

/// The first string member named `name` in `v`, changed (one letter).
fn change_first(v: &mut Value, name: &str) -> bool {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(s)) = m.get_mut(name) {
                let first = if s.starts_with('A') { "B" } else { "A" };
                s.replace_range(..1, first);
                return true;
            }
            m.values_mut().any(|x| change_first(x, name))
        }
        Value::Array(items) => items.iter_mut().any(|x| change_first(x, name)),
        _ => false,
    }
}

/// `relay audit verify --checkpoint FILE` on `data_dir`: (exit code, stdout).
fn verify_against(data_dir: &Path, file: &Path, config: Option<&Path>) -> (i32, String) {
    let file = file.to_str().unwrap();
    let (code, out, err) = match config {
        Some(c) => audit(&["verify", "--checkpoint", file, "--config", c.to_str().unwrap()]),
        None => audit_dir(data_dir, &["verify", "--checkpoint", file]),
    };
    (code, format!("{out}{err}"))
}

#[actix_rt::test]
async fn a_rewritten_event_is_caught_against_a_witnessed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let mut a = cluster.start("relay-a", FAST);
    let b = cluster.start("relay-b", FAST);
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let mut alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    // A copy of relay-a's data dir from before the checkpoint the test holds it to.
    assert!(a.terminate().success());
    let before = dir.path().join("relay-a-before");
    copy_dir(&a.data_dir, &before);
    let stream = format!("account/{}", alice.id());
    let head_before = with_store(&before, |store| store.head(&stream).unwrap().seq);
    a = cluster.start("relay-a", FAST);
    let ca = Client::new(&a.url);
    alice.tokens[0] = alice.open_session(&ca, 0).await;
    for n in 2..=4 {
        ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), true)).await;
    }
    // Witnessed after the three sends (each one event of alice's at least).
    let seen = wait_witnessed(&b.data_dir, &a, |leaves| has(leaves, &stream, head_before + 3)).await;
    assert!(a.terminate().success());
    let file = dir.path().join("relay-a-witnessed-by-relay-b.json");
    std::fs::write(&file, serde_json::to_string(&seen).unwrap()).unwrap();
    let cp = Checkpoint::from_map(&seen).unwrap();

    // The untampered store extends it (and with the config, its signature
    // is checked against relay-a's key).
    let (code, out) = verify_against(&a.data_dir, &file, None);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("the store extends the checkpoint of relay-a"), "{out}");
    let (code, out) = verify_against(&a.data_dir, &file, Some(&a.config));
    assert_eq!(code, 0, "{out}");
    assert!(!out.contains("signature not checked"), "{out}");

    // Rewritten: an event of alice's stream with its chain recomputed after
    // it. `relay audit verify` finds nothing; the witnessed checkpoint does.
    let rewritten = dir.path().join("relay-a-rewritten");
    copy_dir(&a.data_dir, &rewritten);
    let seq = with_store(&rewritten, |store| {
        let events: Vec<_> = store.read(&stream, 0).map(Result::unwrap).collect();
        let sent = events.iter().find(|e| e.seq > 1 && e.data.get().contains("\"ciphertext\"")).expect("a sent record");
        rewrite_and_rechain(store, &stream, sent.seq, |data| assert!(change_first(data, "ciphertext")));
        sent.seq
    });
    let (code, out, err) = audit_dir(&rewritten, &["verify"]);
    assert_eq!(code, 0, "the rewritten chain is sound by itself\n{out}{err}");
    let (code, out) = verify_against(&rewritten, &file, None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("stream {stream:?}: the event at seq")), "{out}");
    assert!(out.contains("rewritten") && out.contains("does not extend"), "{out}");
    assert!(seq < cp.events, "event {seq} of a checkpoint of {} events", cp.events);

    // Rolled back: the copy from before is a sound older store, which kept
    // no leaves for a checkpoint written after it.
    let (code, out, err) = audit_dir(&before, &["verify"]);
    assert_eq!(code, 0, "an older store is sound by itself\n{out}{err}");
    let (code, out) = verify_against(&before, &file, None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no leaves kept for it") && out.contains("cannot show"), "{out}");
    // With today's kept leaves beside the old store, the stream is named.
    std::fs::remove_dir_all(before.join("checkpoints")).unwrap();
    copy_dir(&a.data_dir.join("checkpoints"), &before.join("checkpoints"));
    let (code, out) = verify_against(&before, &file, None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("stream {stream:?}:")) && out.contains("rolled back"), "{out}");

    // Kept leaves that were edited no longer hash to the witnessed root.
    let edited = dir.path().join("relay-a-edited-leaves");
    copy_dir(&rewritten, &edited);
    let kept = kept_file_of(&edited, &seen);
    let text = std::fs::read_to_string(&kept).unwrap();
    let new_hash = with_store(&edited, |store| hex::encode(store.head(&stream).unwrap().hash));
    let line = text.lines().find(|l| l.contains(&stream)).unwrap().to_owned();
    let forged = format!("[{:?},{},{:?}]", stream, line.split(',').nth(1).unwrap(), new_hash);
    std::fs::write(&kept, text.replace(&line, &forged)).unwrap();
    let (code, out) = verify_against(&edited, &file, None);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("do not hash to the signed root"), "{out}");
}

/// The file in a data dir's `checkpoints/` that keeps the leaves of `cp`.
fn kept_file_of(data_dir: &Path, cp: &Map<String, Value>) -> PathBuf {
    let files = std::fs::read_dir(data_dir.join("checkpoints")).unwrap().map(|e| e.unwrap().path());
    files
        .into_iter()
        .find(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            serde_json::from_str::<Map<String, Value>>(text.lines().next().unwrap()).ok().as_ref() == Some(cp)
        })
        .expect("relay-a kept the leaves of the witnessed checkpoint")
}
