//! Old data opens (docs/operate/backup-and-upgrade.md): the data dirs in
//! `tests/fixtures/data-v1/`, written by the first release with a data
//! format version, are opened by every later test run, audited, served
//! and read. A release that can no longer open them fails here.
//!
//! The fixture is written once by the ignored test below
//! (`cargo nextest run --test it --run-ignored only write_the_data_v1_fixture`)
//! and committed; it is never rewritten. A format bump adds a fixture of
//! the new version beside it (and a test like this one for it):
//! `data-v2/` is the same relays after a rewrite of sled (their sled in
//! `store/tree.1/`), written once by `write_the_data_v2_fixture`; `data-v3/`
//! those served by the release of format 3 (retention runs) with two more
//! sends, written once by `write_the_data_v3_fixture`.

use crate::common;
use common::client::{message_ids, mid, now, Client, User};
use common::cluster::Cluster;
use common::copy_dir;
use common::relay::audit;
use serde_json::json;
use std::path::{Path, PathBuf};

const RELAYS: [&str; 2] = ["relay-a", "relay-b"];

fn fixture(version: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/data-v{version}"))
}

/// What the fixture holds, on relay-a: alice (seed 1: phone, and a laptop
/// revoked last) and carol (seed 3); on relay-b: bob (seed 2). All allow
/// public discovery. mid(1): alice → carol (local); mid(2): alice → bob
/// and mid(3): bob → alice (across relays, each delivery finished at
/// `target_accepted`).
#[actix_rt::test]
#[ignore = "writes tests/fixtures/data-v1 (once, by the release that introduced the format)"]
async fn write_the_data_v1_fixture() {
    let out = fixture(1);
    assert!(!out.exists(), "{} exists: a fixture is never rewritten", out.display());
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &RELAYS);
    let (mut a, mut b) = (cluster.start("relay-a", ""), cluster.start("relay-b", ""));
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let mut alice = User::register(&ca, "relay-a", 1, true).await;
    alice.add_device(&ca, "laptop", 41).await;
    let carol = User::register(&ca, "relay-a", 3, true).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    for (c, from, to, n) in [(&ca, &alice, &carol, 1), (&ca, &alice, &bob, 2), (&cb, &bob, &alice, 3)] {
        let st = c.ok("message.send", from.token(0), &from.send_params(to, &mid(n), true)).await;
        assert_eq!(st["status"], "target_accepted", "{}: {st}", mid(n));
    }
    ca.ok("device.revoke", alice.token(0), &json!({"revocation": alice.account.revocation("laptop", now())})).await;
    a.terminate();
    b.terminate();
    // Both shapes a stopped relay leaves: relay-b's data only in its log
    // (sled flushes at checkpoints), relay-a's also in sled's own files
    // (the audit's open ends in a checkpoint), as pointers into a closed
    // segment.
    let (code, report, err) = audit(&["verify", "--data-dir", dir.path().join("relay-a").to_str().unwrap()]);
    assert_eq!(code, 0, "{report}{err}");
    for id in RELAYS {
        copy_dir(&dir.path().join(id), &out.join(id));
        // git keeps no empty directory: the fixture is what a checkout has.
        remove_empty_dirs(&out.join(id));
        // Nor a file's 0600: the keys are not kept; `Cluster::plan` writes
        // the same ones from their seeds where the fixture is used.
        for key in ["relay.key", "vapid.key"] {
            std::fs::remove_file(out.join(id).join(key)).unwrap();
        }
    }
}

/// The data-v1 fixture with each relay's sled rewritten (format 2). Its
/// records are the same, so the test below reads both the same way.
#[test]
#[ignore = "writes tests/fixtures/data-v2 (once, by the release that introduced the format)"]
fn write_the_data_v2_fixture() {
    let out = fixture(2);
    assert!(!out.exists(), "{} exists: a fixture is never rewritten", out.display());
    for id in RELAYS {
        copy_dir(&fixture(1).join(id), &out.join(id));
        let engine = relay_actors::store::SledEngine::open(&out.join(id).join("store"), None).unwrap();
        engine.rewrite_now().unwrap();
        relay_actors::store::Engine::close(&engine).unwrap();
        drop(engine);
        assert_eq!(std::fs::read_to_string(out.join(id).join("store/FORMAT")).unwrap(), "2\n");
        remove_empty_dirs(&out.join(id));
    }
}

/// The data-v2 fixture served by the release of format 3, which marks it
/// 3 and takes two more local sends, alice → carol: mid(4) starts the
/// account's retention run, mid(5) joins it (no index entry of its own).
#[actix_rt::test]
#[ignore = "writes tests/fixtures/data-v3 (once, by the release that introduced the format)"]
async fn write_the_data_v3_fixture() {
    let out = fixture(3);
    assert!(!out.exists(), "{} exists: a fixture is never rewritten", out.display());
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &RELAYS);
    for id in RELAYS {
        copy_dir(&fixture(2).join(id), &dir.path().join(id));
    }
    let (mut a, mut b) = (cluster.start("relay-a", ""), cluster.start("relay-b", ""));
    let ca = Client::new(&a.url);
    let alice = session(&ca, 1, "relay-a", true).await;
    let carol = session(&ca, 3, "relay-a", false).await;
    for n in [4, 5] {
        let st = ca.ok("message.send", alice.token(0), &alice.send_params(&carol, &mid(n), true)).await;
        assert_eq!(st["status"], "target_accepted", "{}: {st}", mid(n));
    }
    a.terminate();
    b.terminate();
    for id in RELAYS {
        assert_eq!(std::fs::read_to_string(dir.path().join(id).join("store/FORMAT")).unwrap(), "3\n");
        copy_dir(&dir.path().join(id), &out.join(id));
        remove_empty_dirs(&out.join(id));
        for key in ["relay.key", "vapid.key"] {
            std::fs::remove_file(out.join(id).join(key)).unwrap();
        }
    }
}

/// A session of the fixture's user of `seed` (alice also has her revoked
/// laptop).
async fn session(c: &Client, seed: u8, relay: &str, laptop: bool) -> User {
    let mut user = User {
        account: relay_schemas::client::Account::from_seed([seed; 32]),
        devices: vec![relay_schemas::client::Device::from_seed("phone", [seed + 100; 32])],
        tokens: vec![],
        relay_id: relay.to_owned(),
    };
    if laptop {
        user.devices.push(relay_schemas::client::Device::from_seed("laptop", [41; 32]));
    }
    let token = user.open_session(c, 0).await;
    user.tokens.push(token);
    user
}

fn remove_empty_dirs(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            remove_empty_dirs(&entry.path());
            let _ = std::fs::remove_dir(entry.path()); // only if empty
        }
    }
}

/// Every run: the fixture, copied, passes `relay audit verify`, is served
/// by this release, and its records read back.
#[actix_rt::test]
async fn the_data_v1_fixture_opens_passes_the_audit_and_serves_its_records() {
    a_fixture_opens_passes_the_audit_and_serves_its_records(1).await;
}

/// The same for version 2 (sled in `store/tree.1/`).
#[actix_rt::test]
async fn the_data_v2_fixture_opens_passes_the_audit_and_serves_its_records() {
    a_fixture_opens_passes_the_audit_and_serves_its_records(2).await;
}

/// The same for version 3 (retention runs), with its two more sends.
#[actix_rt::test]
async fn the_data_v3_fixture_opens_passes_the_audit_and_serves_its_records() {
    a_fixture_opens_passes_the_audit_and_serves_its_records(3).await;
}

async fn a_fixture_opens_passes_the_audit_and_serves_its_records(version: u32) {
    let dir = tempfile::tempdir().unwrap();
    // The relays' keys come from the same seeds as the fixture's (which
    // holds none: git would check them out readable by all, and the relay
    // refuses such a key); the Web Push key is made on first start.
    let cluster = Cluster::plan(dir.path(), &RELAYS);
    for id in RELAYS {
        copy_dir(&fixture(version).join(id), &dir.path().join(id));
        let (code, out, err) = audit(&["verify", "--data-dir", dir.path().join(id).to_str().unwrap()]);
        assert_eq!(code, 0, "relay audit verify of the data-v{version} fixture's {id}: {out}{err}");
    }
    let (a, b) = (cluster.start("relay-a", ""), cluster.start("relay-b", ""));
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = session(&ca, 1, "relay-a", true).await;
    let carol = session(&ca, 3, "relay-a", false).await;
    let bob = session(&cb, 2, "relay-b", false).await;
    // Version 3 has two more local sends, alice → carol.
    let later: Vec<String> = if version >= 3 { vec![mid(4), mid(5)] } else { vec![] };
    let carols: Vec<String> = [mid(1)].into_iter().chain(later.iter().cloned()).collect();
    assert_eq!(message_ids(&carol.sync_all(&ca, 0).await), carols);
    assert_eq!(message_ids(&bob.sync_all(&cb, 0).await), [mid(2), mid(3)], "one received, his one sent");
    let alices = alice.sync_all(&ca, 0).await;
    let expected: Vec<String> = [mid(1), mid(2), mid(3)].into_iter().chain(later).collect();
    assert_eq!(message_ids(&alices), expected, "her sent, one received");
    let received = alices.iter().find(|r| r["envelope"]["message_id"] == mid(3)).unwrap();
    assert_eq!(received["envelope"]["from"], bob.id(), "{received}");
    let st = ca.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(2)})).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    // The revoked laptop stays revoked.
    let e = alice.try_open_session(&ca, 1).await.unwrap_err();
    assert!(e.contains("revoked"), "{e}");
}

/// A data dir of a newer format than this release opens: `relay serve`
/// and `relay audit` refuse it, naming both versions, and leave it as it
/// is (what the upgrade path's "it refuses" step reads).
#[test]
fn a_data_dir_of_a_newer_format_is_refused_by_serve_and_audit_naming_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::relay::write_config(dir.path(), "relay-b", "");
    let data_dir = dir.path().join("relay-b");
    copy_dir(&fixture(1).join("relay-b"), &data_dir);
    let current = relay_actors::store::FORMAT_VERSION;
    let newer = current + 1;
    std::fs::write(data_dir.join("store/FORMAT"), format!("{newer}\n")).unwrap();
    let log = std::fs::read(data_dir.join("store/log/0000000000000001")).unwrap();
    let mut serve = std::process::Command::new(env!("CARGO_BIN_EXE_relay"));
    serve.args(["serve", "--config"]).arg(&config);
    let err = common::relay::start_line_or_exit(serve).expect_err("a relay started on a newer format");
    let (code, _, audit_err) = audit(&["verify", "--config", config.to_str().unwrap()]);
    assert_ne!(code, 0);
    for text in [&err, &audit_err] {
        assert!(
            text.contains(&format!("data format version {newer}")) && text.contains(&format!("opens 1 to {current}")),
            "{text}"
        );
    }
    assert_eq!(std::fs::read(data_dir.join("store/log/0000000000000001")).unwrap(), log, "left as it was");
}
