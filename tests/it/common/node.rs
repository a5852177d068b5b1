//! Node and headless Chromium for the tests that drive them
//! (`web/test/*.mjs`): whether they can run here, and running a script
//! with a bound in time.
//!
//! Needs `node`, `web/node_modules` (`npm ci` in `web/`) and Chromium.
//! `.ci/run` installs them; elsewhere a missing one skips with a message,
//! except under `CI=true`, where it fails.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/chromium".into())
}

/// What is missing to run a browser test, if anything.
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
pub fn can_run(test: &str) -> bool {
    super::can_run(test, missing())
}

/// Runs `node` with `args` in `web/`, failing past `limit`. Node runs in a
/// process group of its own, so that on a timeout the relays it started go
/// too; SIGTERM first lets puppeteer close Chromium (its own group).
pub fn node(args: &[&std::ffi::OsStr], limit: Duration) {
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
