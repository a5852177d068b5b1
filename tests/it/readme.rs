//! The README's "Two relays" steps, then its "One account, two home
//! relays" steps, run as written: the `sh` blocks of those sections go to
//! bash in a temp dir holding copies of `config/`, with
//! `target/release/relay` linked to the relay under test and `cargo` a
//! shell function that runs the already built `hello` example. Only the
//! ports differ (free loopback ports instead of 7801 and 7802, in the steps
//! and the configs alike), so the test can run beside anything else.

use crate::common;

use common::cluster::free_port;
use common::relay::example;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The first ```sh block after the heading `heading` in README.md.
fn readme_block(heading: &str) -> String {
    sh_block("README.md", heading)
}

/// The first ```sh block after the heading `heading` in `file` (a path in
/// the repository).
pub fn sh_block(file: &str, heading: &str) -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let section = &readme[readme.find(heading).unwrap_or_else(|| panic!("{file} has no {heading:?}"))..];
    let start = section.find("```sh\n").expect("an sh block") + "```sh\n".len();
    let len = section[start..].find("```").expect("the block's end");
    section[start..start + len].to_owned()
}

/// The `hello` example, built now with the profile of the relay under test:
/// a filtered test run (`--test it readme::`) does not build examples, and a
/// stale one would test old code. Quick when it is up to date.
fn hello_example() -> PathBuf {
    example("hello")
}

#[test]
fn two_relays_and_two_homes_steps_in_the_readme_run_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (free_port().to_string(), free_port().to_string());
    let ports = |s: &str| s.replace("7801", &a).replace("7802", &b);
    std::fs::create_dir_all(dir.path().join("config")).unwrap();
    for name in ["default.toml", "relay-b.toml"] {
        let shipped = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name)).unwrap();
        std::fs::write(dir.path().join("config").join(name), ports(&shipped)).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("target/release")).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_relay"), dir.path().join("target/release/relay")).unwrap();

    let steps = readme_block("## Two relays\n") + &readme_block("## One account, two home relays\n");
    assert!(steps.contains("key show") && steps.contains("--example hello"), "{steps}");
    assert!(steps.contains("--example two_homes") && steps.contains("replication reset"), "{steps}");
    let script = format!(
        r#"set -e
cargo() {{
  case "$*" in
    "build --release") ;;
    "run --release --example hello -- "*) shift 5; "$HELLO" "$@" ;;
    "run --release --example two_homes -- "*) shift 5; "$TWO_HOMES" "$@" ;;
    *) echo "unexpected: cargo $*" >&2; return 1 ;;
  esac
}}
# Relays the steps left running if they stop early.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
{}
"#,
        ports(&steps)
    );
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(dir.path())
        .env("HELLO", hello_example())
        .env("TWO_HOMES", example("two_homes"))
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).unwrap();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).unwrap();
        s
    });
    let status = common::relay::exit_of(&mut child, "the README steps finish", Duration::from_secs(120));
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let log_a = std::fs::read_to_string(dir.path().join("data/relay-a.log")).unwrap_or_default();
    let log_b = std::fs::read_to_string(dir.path().join("data/relay-b.log")).unwrap_or_default();
    let all = format!("stdout:\n{out}\nstderr:\n{err}\nrelay-a:\n{log_a}\nrelay-b:\n{log_b}");
    assert!(status.success(), "{status}\n{all}");

    // hello sent across and Bob's timeline at relay-b has the message.
    assert!(
        out.contains(r#"message.send -> {"accepted_at":"#) && out.contains(r#""status":"target_accepted""#),
        "{all}"
    );
    assert!(out.contains(r#""direction": "received""#), "{all}");
    assert!(out.matches("ok\n").count() >= 2, "config check prints ok: {all}");
    // relay-a's log at the default level tells who it is, not who wrote to whom.
    assert!(log_a.contains("relay started") && !log_a.contains("delivery finished"), "{all}");
    assert!(!log_a.contains('\x1b') && !log_b.contains('\x1b'), "no ANSI codes in a log file: {all}");
    assert!(log_b.contains("relay stopped"), "relay-b stopped on SIGTERM: {all}");

    // two_homes: the account at both homes, the same records at each.
    assert!(out.contains("alice has a session at relay-b too"), "{all}");
    assert!(out.contains("the same records at both homes"), "{all}");
    assert!(out.contains("reset 1 account(s)"), "{all}");
}
