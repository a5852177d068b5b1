//! `relay backup` and `relay restore` (docs/operate/backup-and-upgrade.md):
//! a backup of a relay under load restores into a relay that holds every
//! send acknowledged before the backup started, passes `relay audit
//! verify` and serves; the admin socket is the relay user's only; restore
//! never overwrites.

use crate::common;
use common::client::{message_ids, mid, Client, User};
use common::relay::{audit, relay_cmd, write_config, RelayProc};
use common::wait::eventually;
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Sends in the load, and how many at a time.
const SENDS: u64 = 400;
const PARALLEL: usize = 4;
const LIMIT: Duration = Duration::from_secs(60);

/// [`relay_cmd`] on a blocking thread, bounded: the test's runtime goes
/// on (the load keeps sending meanwhile).
async fn relay_cmd_beside(args: &[&str]) -> (i32, String, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let run = actix_rt::task::spawn_blocking(move || relay_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    actix_rt::time::timeout(LIMIT, run).await.expect("relay command within the limit").expect("command thread")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[actix_rt::test]
async fn a_backup_under_load_restores_every_send_acknowledged_before_it_and_passes_the_audit() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start_logged(dir.path(), "relay-a", "", "info");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let socket = relay.data_dir.join("admin.sock");
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600, "the relay user's only");

    // The load: alice sends to bob, PARALLEL at a time; each acknowledged
    // id is noted as its answer arrives (`target_accepted`: bob's receipt
    // is durable too, in the group of alice's acceptance).
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let bodies: Vec<(String, Value)> = (1..=SENDS).map(|n| (mid(n), alice.send_params(&bob, &mid(n), false))).collect();
    let load = {
        let (c, token, acked) = (c.clone(), alice.tokens[0].clone(), acked.clone());
        actix_rt::spawn(async move {
            for chunk in bodies.chunks(PARALLEL) {
                let sends: Vec<_> = chunk
                    .iter()
                    .map(|(id, body)| {
                        let (c, token, body, id) = (c.clone(), token.clone(), body.clone(), id.clone());
                        actix_rt::spawn(async move { (id, c.call("message.send", Some(&token), &body).await) })
                    })
                    .collect();
                for send in sends {
                    let (id, (code, v)) = send.await.expect("send task");
                    assert_eq!((code, &v["status"]), (200, &Value::from("target_accepted")), "{id}: {v}");
                    acked.lock().unwrap().push(id);
                }
            }
        })
    };
    eventually("100 sends acknowledged", LIMIT, || {
        let n = acked.lock().unwrap().len();
        async move {
            if n >= 100 {
                Ok(())
            } else {
                Err(format!("{n}"))
            }
        }
    })
    .await;
    // Acknowledged before the backup command starts: each must be in it.
    let before = acked.lock().unwrap().clone();
    assert!((before.len() as u64) < SENDS, "the backup starts while sends go on");
    let out = dir.path().join("backup");
    let (code, stdout, err) = relay_cmd_beside(&["backup", "--config", path(&relay.config), "--out", path(&out)]).await;
    assert_eq!(code, 0, "relay backup: {err}");
    assert!(stdout.starts_with("backup of relay-a at log "), "{stdout}");
    actix_rt::time::timeout(LIMIT, load).await.expect("the load ends").expect("every send answered 200");
    relay.wait_for_log(&["backup written", "took_ms"], LIMIT);
    relay.terminate();
    assert!(!socket.exists(), "the admin socket goes with the relay");

    let manifest: Value = serde_json::from_slice(&std::fs::read(out.join("backup.json")).unwrap()).unwrap();
    assert_eq!(
        (manifest["relay_id"].as_str(), manifest["format"].as_u64()),
        (Some("relay-a"), Some(u64::from(relay_actors::store::FORMAT_VERSION))),
        "{manifest}"
    );
    assert_eq!(manifest["keys"], serde_json::json!(["relay.key", "vapid.key"]));
    for key in ["relay.key", "vapid.key"] {
        let mode = std::fs::metadata(out.join(key)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{key}");
    }

    // Restored into a new data dir (the same relay, a new place and port).
    let restored_dir = tempfile::tempdir().unwrap();
    let config = write_config(restored_dir.path(), "relay-a", "");
    let (code, _, err) = relay_cmd(&["restore", "--from", path(&out), "--config", path(&config)]);
    assert_eq!(code, 0, "relay restore: {err}");
    let (code, report, err) = audit(&["verify", "--config", path(&config)]);
    assert_eq!(code, 0, "relay audit verify of the restored data dir: {report}{err}");
    let restored = RelayProc::start_config("relay-a", config, restored_dir.path().join("relay-a"), "warn");
    let c = Client::new(&restored.url);
    let bob = User { tokens: vec![], ..bob };
    let token = bob.open_session(&c, 0).await;
    let bob = User { tokens: vec![token], ..bob };
    let ids = message_ids(&bob.sync_all(&c, 0).await);
    let missing: Vec<&String> = before.iter().filter(|id| !ids.contains(id)).collect();
    assert!(missing.is_empty(), "acknowledged before the backup, not restored: {missing:?}");
    assert!(ids.len() <= SENDS as usize, "nothing else: {}", ids.len());
}

#[actix_rt::test]
async fn a_stopped_relay_is_backed_up_by_the_command_and_restore_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    c.ok("message.send", alice.token(0), &alice.self_params(&mid(1), &["phone"])).await;
    let config = relay.config.clone();

    // A request the admin socket does not know: an error, nothing written.
    let mut conn = std::os::unix::net::UnixStream::connect(relay.data_dir.join("admin.sock")).unwrap();
    conn.set_read_timeout(Some(LIMIT)).unwrap();
    std::io::Write::write_all(&mut conn, b"{\"restore\":{\"from\":\"/\"}}\n").unwrap();
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(conn), &mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["error"]["code"], "invalid_params", "{answer}");
    // Into a directory that is not empty: refused by the running relay.
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("file"), b"x").unwrap();
    let (code, _, err) = relay_cmd(&["backup", "--config", path(&config), "--out", path(&taken)]);
    assert_eq!((code, err.contains("is not empty")), (1, true), "{err}");
    relay.terminate();

    // Stopped: the command opens the store itself.
    let out = dir.path().join("backup");
    let (code, _, err) = relay_cmd(&["backup", "--config", path(&config), "--out", path(&out)]);
    assert_eq!(code, 0, "{err}");
    // Not over a data dir that holds anything, not over a key.
    let (code, _, err) = relay_cmd(&["restore", "--from", path(&out), "--config", path(&config)]);
    assert_eq!((code, err.contains("is not empty")), (1, true), "{err}");
    let fresh = dir.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    std::fs::write(fresh.join("relay.key"), b"someone's key").unwrap();
    let (code, _, err) = relay_cmd(&["restore", "--from", path(&out), "--data-dir", path(&fresh)]);
    assert_eq!((code, err.contains("is not empty")), (1, true), "{err}");
    assert_eq!(std::fs::read(fresh.join("relay.key")).unwrap(), b"someone's key");
    // Not of a newer data format than this release opens.
    let manifest = std::fs::read_to_string(out.join("backup.json")).unwrap();
    let newer = relay_actors::store::FORMAT_VERSION + 1;
    let current = format!("\"format\": {}", relay_actors::store::FORMAT_VERSION);
    assert!(manifest.contains(&current), "{manifest}");
    std::fs::write(out.join("backup.json"), manifest.replace(&current, &format!("\"format\": {newer}"))).unwrap();
    let (code, _, err) = relay_cmd(&["restore", "--from", path(&out), "--data-dir", path(&dir.path().join("new"))]);
    assert_eq!((code, err.contains(&format!("data format version {newer}"))), (1, true), "{err}");
    // Not a finished backup (no manifest).
    std::fs::remove_file(out.join("backup.json")).unwrap();
    let (code, _, err) = relay_cmd(&["restore", "--from", path(&out), "--data-dir", path(&dir.path().join("new"))]);
    assert_eq!((code, err.contains("not a finished backup")), (1, true), "{err}");
    assert!(!dir.path().join("new").exists());
}

/// A data dir whose path is too long for a socket's address: the relay
/// serves without an admin socket (and says so), and `relay backup` then
/// says the relay must be stopped.
#[actix_rt::test]
async fn a_relay_whose_data_dir_has_no_room_for_the_socket_serves_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let deep = dir.path().join("d".repeat(110));
    std::fs::create_dir(&deep).unwrap();
    let relay = RelayProc::start(&deep, "relay-a", "");
    relay.wait_for_log(&["no admin socket", "works only on the stopped relay"], LIMIT);
    let c = Client::new(&relay.url);
    User::register(&c, "relay-a", 1, false).await;
    let out = dir.path().join("backup");
    let (code, _, err) = relay_cmd(&["backup", "--config", path(&relay.config), "--out", path(&out)]);
    assert_eq!((code, err.contains("in use by a running relay; stop it first")), (1, true), "{err}");
}
