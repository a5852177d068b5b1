//! Nothing secret and no message content reaches the logs, even at the most
//! verbose level.

use crate::common;

use common::client::{mid, Client, User};
use std::io::Read;
use std::process::{Command, Stdio};

#[actix_rt::test]
async fn tokens_keys_and_message_contents_never_reach_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_owned();
    let mut stderr = child.stderr.take().unwrap();
    let logs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let c = Client::new(&url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let params = alice.send_params(&bob, &mid(1), true);
    c.ok("message.send", alice.token(0), &params).await;
    c.ok("message.timeline.sync", bob.token(0), &serde_json::json!({"after": 0})).await;
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let logs = logs.join().unwrap();

    let relay_key = std::fs::read_to_string(dir.path().join("relay-a/relay.key")).unwrap();
    let secrets = [
        ("session token", alice.tokens[0].clone()),
        ("session token", bob.tokens[0].clone()),
        ("relay private key", relay_key.trim().to_owned()),
        ("ciphertext", params["envelope"]["ciphertext"].as_str().unwrap().to_owned()),
        ("recipient box", params["recipient_boxes"][0]["box"].as_str().unwrap().to_owned()),
        ("sender box", params["sender_boxes"][0]["box"].as_str().unwrap().to_owned()),
    ];
    assert!(logs.len() > 1000, "trace logging produced output to check ({} bytes)", logs.len());
    for (what, secret) in secrets {
        assert!(!logs.contains(&secret), "the {what} appears in the logs");
    }
}

#[test]
fn json_log_format_writes_one_json_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let mut child = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["--log-format", "json", "serve", "--config"])
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let logs = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{:?}: {logs}", out.status);
    let lines: Vec<serde_json::Value> =
        logs.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}"))).collect();
    assert!(lines.iter().any(|l| l["message"] == "relay started" && l["relay"] == "relay-a"), "{logs}");
    assert!(lines.iter().any(|l| l["message"] == "relay stopped"), "{logs}");
}
