//! The `relay` binary's command line: key generation and config errors.

mod common;

use std::process::Command;

fn relay() -> Command {
    Command::new(env!("CARGO_BIN_EXE_relay"))
}

#[test]
fn key_generate_writes_a_private_key_and_prints_its_public_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys/relay.key");
    let out = relay().args(["key", "generate", "--out"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let public = String::from_utf8(out.stdout).unwrap();
    relay_schemas::sign::parse_public_key("printed", public.trim()).expect("a base64url Ed25519 public key");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }
    // Never overwrites an existing key.
    let again = relay().args(["key", "generate", "--out"]).arg(&path).output().unwrap();
    assert!(!again.status.success());
}

#[test]
fn serve_with_a_bad_config_exits_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "[limits]\nclock_tolerance = \"whenever\"\n");
    let out = relay().args(["serve", "--config"]).arg(&cfg).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("relay-a.toml") && err.contains("whenever"), "{err}");
}

#[test]
fn serve_refuses_a_world_readable_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let key = dir.path().join("relay-a/relay.key");
    assert!(relay().args(["key", "generate", "--out"]).arg(&key).output().unwrap().status.success());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = relay().args(["serve", "--config"]).arg(&cfg).output().unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("readable by others"));
    }
}

#[test]
fn environment_overrides_reach_the_running_relay() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let mut child = relay()
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("RELAY__RELAY__ID", "relay-env")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(line.starts_with("relay relay-env listening on http://127.0.0.1:"), "{line}");
}
