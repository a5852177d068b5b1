//! The `relay` binary's command line: key generation and config errors.

use crate::common;

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

fn run(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn key_show_prints_the_public_key_of_an_existing_key_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relay.key");
    let (ok, generated, _) = run(relay().args(["key", "generate", "--out"]).arg(&path));
    assert!(ok);
    let (ok, shown, err) = run(relay().args(["key", "show", "--key-file"]).arg(&path));
    assert!(ok, "{err}");
    assert_eq!(shown, generated);
    let (ok, _, err) = run(relay().args(["key", "show", "--key-file"]).arg(dir.path().join("missing.key")));
    assert!(!ok && err.contains("missing.key"), "{err}");
}

#[test]
fn config_check_validates_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let (ok, out, err) = run(relay().args(["config", "check", "--config"]).arg(&cfg));
    assert!(ok, "{err}");
    assert_eq!(out, "ok\n");
    assert!(!dir.path().join("relay-a/store").exists(), "check opened no store");
    assert!(!dir.path().join("relay-a/relay.key").exists(), "check made no key");

    let bad = common::relay::write_config(dir.path(), "relay-b", "[delivery]\nretry_timetable = [\"1h\", \"1s\"]\n");
    let (ok, out, err) = run(relay().args(["config", "check", "--config"]).arg(&bad));
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("relay-b.toml") && err.contains("delivery.retry_timetable"), "{err}");
    // The shipped configs pass.
    for shipped in ["config/default.toml", "config/relay-b.toml"] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(shipped);
        let (ok, out, err) = run(relay().args(["config", "check", "--config"]).arg(&path));
        assert!(ok && out == "ok\n", "{shipped}: {err}");
    }
}

#[test]
fn relative_paths_in_a_config_are_found_next_to_it_from_any_working_directory() {
    let (etc, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let body = "[relay]\nid = \"relay-a\"\npublic_url = \"http://127.0.0.1:0\"\nlisten = \"127.0.0.1:0\"\n\
                data_dir = \"data\"\nkey_file = \"keys/relay.key\"\n[http]\nmax_connections = 64\n";
    let cfg = etc.path().join("relay.toml");
    std::fs::write(&cfg, body).unwrap();
    let serve = |cwd: &std::path::Path, env: &[(&str, &str)]| {
        let mut cmd = relay();
        cmd.args(["serve", "--config"]).arg(&cfg).current_dir(cwd).env("RUST_LOG", "warn").envs(env.iter().copied());
        common::relay::start_line_or_exit(cmd).expect("the relay starts")
    };
    serve(elsewhere.path(), &[]);
    assert!(etc.path().join("data/store").is_dir(), "the store is next to the config");
    assert!(etc.path().join("keys/relay.key").is_file(), "the key is next to the config");
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing in the working directory");
    let shown =
        |cwd: &std::path::Path| run(relay().args(["key", "show", "--key-file"]).arg(cwd.join("keys/relay.key")));
    // Started again from another folder, it uses the same key (and store).
    let before = shown(etc.path());
    serve(std::path::Path::new("/"), &[]);
    assert_eq!(shown(etc.path()), before);

    // A path from the environment is relative to the working directory.
    serve(elsewhere.path(), &[("RELAY__RELAY__DATA_DIR", "env-data")]);
    assert!(elsewhere.path().join("env-data/store").is_dir());
    assert!(!etc.path().join("env-data").exists());
}

#[test]
fn serve_on_a_data_dir_held_by_a_running_relay_says_it_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let first = common::relay::RelayProc::start(dir.path(), "relay-a", "");
    let (ok, _, err) = run(relay().args(["serve", "--config"]).arg(&first.config).env("RUST_LOG", "warn"));
    assert!(!ok);
    assert!(err.contains("relay.data_dir") && err.contains("in use by a running relay"), "{err}");
    assert!(!err.contains("WouldBlock"), "{err}");
}

#[test]
fn serve_names_relay_data_dir_when_it_cannot_use_it() {
    let dir = tempfile::tempdir().unwrap();
    // A data dir under a regular file cannot be created (even by root).
    std::fs::write(dir.path().join("file"), b"").unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let (ok, _, err) = run(relay()
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("RELAY__RELAY__DATA_DIR", dir.path().join("file/data"))
        .env("RELAY__RELAY__KEY_FILE", dir.path().join("relay.key")));
    assert!(!ok);
    assert!(err.contains("relay.data_dir") && err.contains("file/data"), "{err}");
}

#[test]
fn bad_operator_input_is_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let peer = |url: &str, key: &str| format!("[[peers]]\nid = \"relay-b\"\nurl = \"{url}\"\npublic_key = \"{key}\"\n");
    let key = "_XqsWUNkxUk0Q-1UclRxmiDk_gSE-6Kg1R3iQK_NGdE";
    let cases = [
        (peer("http://127.0.0.1:7802", "AAAA"), "peer \"relay-b\": public_key"),
        (peer("not a url", key), "peer \"relay-b\": url \"not a url\""),
    ];
    for (extra, needle) in cases {
        let cfg = common::relay::write_config(dir.path(), "relay-a", &extra);
        for cmd in [["serve", "--config"], ["config", "check"]] {
            let mut c = relay();
            c.args(cmd);
            if cmd[0] == "config" {
                c.arg("--config");
            }
            let (ok, _, err) = run(c.arg(&cfg));
            assert!(!ok && err.contains(needle), "{cmd:?}: {err:?} should say {needle:?}");
        }
    }
    // A bad value from the environment is blamed on the variable.
    let cfg = common::relay::write_config(dir.path(), "relay-a", "");
    let (ok, _, err) = run(relay().args(["serve", "--config"]).arg(&cfg).env("RELAY__LIMITS__MAX_BOXES", "lots"));
    assert!(!ok);
    assert!(err.contains("environment variable RELAY__LIMITS__MAX_BOXES") && !err.contains("relay-a.toml"), "{err}");
}

#[test]
fn version_names_the_package_version_and_the_git_revision() {
    let (ok, out, err) = run(relay().arg("--version"));
    assert!(ok, "{err}");
    // The revision the binary was built from: this checkout's, or "unknown" outside one.
    let head = Command::new("git")
        .args(["rev-parse", "--short=9", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".to_owned(), |o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    assert_eq!(out, format!("relay {} ({head})\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn help_texts_describe_every_option() {
    let help = |args: &[&str]| {
        let (ok, out, err) = run(relay().args(args).arg("--help"));
        assert!(ok, "{err}");
        out
    };
    assert!(help(&["key", "generate"]).contains("never overwritten"));
    assert!(help(&["key", "show"]).contains("--key-file"));
    assert!(help(&["audit", "replay"]).contains("account/<id> or delivery/<from>/<message_id>"));
    assert!(help(&["audit", "export"]).contains("Only this stream"));
    let message = help(&["audit", "message"]);
    assert!(message.contains("The message id") && message.contains("sender's account id"), "{message}");
    let bench = help(&["bench"]);
    assert!(bench.contains("[default: relay-a,relay-b]"), "{bench}");
    assert!(bench.contains("one thread drives them all") && !bench.contains("one thread each"), "{bench}");
    let top = help(&[]);
    assert!(top.contains("RUST_LOG") && top.contains("--log-format"), "{top}");
    assert!(help(&["config", "check"]).contains("without starting"));

    for share in ["2", "-0.5", "x"] {
        let (ok, _, err) = run(relay().args(["bench", &format!("--cross-share={share}")]));
        assert!(!ok && err.contains("--cross-share"), "{share}: {err}");
    }
}
