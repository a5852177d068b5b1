//! The web client in a real browser: `web/test/browser.mjs` drives headless
//! Chromium (Debian's `chromium`, through `puppeteer-core`) against two
//! relays on loopback that it starts from this build's binary, with the
//! Rust CLI chat (`examples/chat.rs`) as a third party; and
//! `web/test/vectors.mjs` checks the JS implementation of `relay-e2e/v1`
//! against the shared vectors in Node.
//!
//! Needs `node`, `web/node_modules` (`npm ci` in `web/`) and Chromium.
//! `.ci/run` installs them; elsewhere a missing one skips with a message,
//! except under `CI=true`, where it fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into())
}

/// What is missing to run the browser test, if anything.
fn missing() -> Option<String> {
    if Command::new("node").arg("--version").stdout(Stdio::null()).status().is_err() {
        return Some("node is not installed".into());
    }
    if !root().join("web/node_modules/puppeteer-core").is_dir() {
        return Some("web/node_modules is missing (run `npm ci` in web/)".into());
    }
    if !chromium().exists() {
        return Some(format!("{} is missing (apt-get install -y chromium)", chromium().display()));
    }
    None
}

/// True when the test may run; panics under CI when it cannot.
fn can_run(test: &str) -> bool {
    crate::common::tools_present(test, missing())
}

/// Runs `node` with `args` in `web/`, failing past `limit`. Node runs in a
/// process group of its own, so that on a timeout the relays it started go
/// too; SIGTERM first lets puppeteer close Chromium (its own group).
fn node(args: &[&std::ffi::OsStr], limit: Duration) {
    use std::os::unix::process::CommandExt;
    let mut child =
        Command::new("node").args(args).current_dir(root().join("web")).process_group(0).spawn().expect("spawn node");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            assert!(status.success(), "node {args:?} failed: {status}");
            return;
        }
        if Instant::now() > deadline {
            let group = -(child.id() as i32);
            unsafe { libc::kill(group, libc::SIGTERM) };
            // Waits for node (an external process) to end after SIGTERM before SIGKILL: its own shutdown.
            std::thread::sleep(Duration::from_secs(5));
            unsafe { libc::kill(group, libc::SIGKILL) };
            let _ = child.wait();
            panic!("node {args:?} did not finish within {limit:?}");
        }
        // Waits for node (an external process) to exit: the poll interval of try_wait.
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn js_matches_the_shared_vectors() {
    if !can_run("js_matches_the_shared_vectors") {
        return;
    }
    node(&["test/vectors.mjs".as_ref()], Duration::from_secs(60));
}

#[test]
fn two_browsers_and_a_terminal_chat_across_two_relays() {
    if !can_run("two_browsers_and_a_terminal_chat_across_two_relays") {
        return;
    }
    let relay = PathBuf::from(env!("CARGO_BIN_EXE_relay"));
    // `cargo test` and nextest build the examples next to the binaries.
    let chat = relay.parent().expect("bin dir").join("examples/chat");
    assert!(chat.exists(), "{} is not built (cargo build --examples)", chat.display());
    let dir = tempfile::tempdir().expect("tempdir");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser");
    node(
        &[
            "test/browser.mjs".as_ref(),
            "--relay".as_ref(),
            relay.as_os_str(),
            "--chat".as_ref(),
            chat.as_os_str(),
            "--dir".as_ref(),
            dir.path().as_os_str(),
            "--out".as_ref(),
            shots.as_os_str(),
        ],
        Duration::from_secs(300),
    );
    eprintln!("screenshots in {}", shots.display());
}

/// Web Push in the web client (`web/test/push.mjs`): the service worker
/// registers, the client subscribes with the relay's VAPID key and hands
/// the relay the subscription; with the page closed a message becomes a
/// push the stand-in push service decrypts; the service worker shows "New
/// message"; reopening decrypts the message; sign-out unsubscribes.
/// `PushManager.subscribe` is stubbed (headless Chromium reaches no push
/// service): see the header of push.mjs for what runs for real.
#[test]
fn the_service_worker_registers_and_hands_the_relay_a_subscription() {
    if !can_run("the_service_worker_registers_and_hands_the_relay_a_subscription") {
        return;
    }
    let relay = PathBuf::from(env!("CARGO_BIN_EXE_relay"));
    let dir = tempfile::tempdir().expect("tempdir");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser-push");
    node(
        &[
            "test/push.mjs".as_ref(),
            "--relay".as_ref(),
            relay.as_os_str(),
            "--dir".as_ref(),
            dir.path().as_os_str(),
            "--out".as_ref(),
            shots.as_os_str(),
        ],
        Duration::from_secs(180),
    );
    eprintln!("screenshots in {}", shots.display());
}
