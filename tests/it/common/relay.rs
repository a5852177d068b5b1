//! Real relay processes on loopback ports, for integration tests.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wait::eventually_blocking;

/// A `relay serve` child process with its own data dir.
pub struct RelayProc {
    child: Option<Child>,
    pub id: String,
    pub url: String,
    pub config: PathBuf,
    pub data_dir: PathBuf,
    /// `RUST_LOG` of the process (`warn` unless a test asks for more).
    rust_log: String,
    /// Its stderr lines so far (also echoed to the test's stderr).
    log: Arc<Mutex<VecDeque<String>>>,
}

/// Lines kept per relay process; the oldest go first.
const LOG_LINES: usize = 20_000;

/// More `RUST_LOG` directives for every relay process a test starts (e.g.
/// `relay_actors::delivery=debug`); with it set, every line is echoed.
/// Without it only WARN and ERROR lines reach the test's stderr (all are
/// kept for [`RelayProc::wait_for_log`]), so that a failing test's panic
/// message is not lost among a cluster's INFO lines in a truncated CI log.
const EXTRA_LOG: &str = "RELAY_TEST_LOG";

/// Whether a line of the relay's log (`<time>  INFO <target>: …`) is below
/// WARN; lines that do not start with a level (a panic, say) are not.
fn below_warn(line: &str) -> bool {
    matches!(line.split_whitespace().nth(1), Some("INFO" | "DEBUG" | "TRACE"))
}

/// Writes a config for relay `id` in `dir`; `extra` is appended verbatim
/// (more sections, e.g. a millisecond timetable).
pub fn write_config(dir: &Path, id: &str, extra: &str) -> PathBuf {
    write_config_at(dir, id, "127.0.0.1:0", extra)
}

/// Like [`write_config`], listening on `listen`.
pub fn write_config_at(dir: &Path, id: &str, listen: &str, extra: &str) -> PathBuf {
    let data = dir.join(id);
    std::fs::create_dir_all(&data).unwrap();
    let path = dir.join(format!("{id}.toml"));
    let extra = modest_connections(&unlimited_sessions(extra));
    let body = format!(
        "[relay]\nid = \"{id}\"\npublic_url = \"http://{listen}\"\nlisten = \"{listen}\"\n\
         data_dir = {data:?}\nkey_file = {key:?}\n{extra}\n",
        data = data.display().to_string(),
        key = data.join("relay.key").display().to_string(),
    );
    std::fs::write(&path, body).unwrap();
    path
}

/// Tests send far faster than a person: lift the per-session and
/// per-address rate limits unless the test sets them (tests/it/limits.rs does).
fn unlimited_sessions(extra: &str) -> String {
    let mut lift = String::new();
    for key in ["session_rate", "session_burst", "anonymous_rate", "anonymous_burst"] {
        if !extra.contains(key) {
            lift.push_str(&format!("{key} = 1000000\n"));
        }
    }
    if extra.contains("[limits]\n") {
        extra.replacen("[limits]\n", &format!("[limits]\n{lift}"), 1)
    } else {
        format!("{extra}\n[limits]\n{lift}")
    }
}

/// The relay refuses to start when `http.max_connections × workers` does
/// not fit the open-file limit: tests need few connections, so they fit
/// whatever limit the machine has. Every test client (and every peer)
/// connects from 127.0.0.1: the per-IP cap is lifted. Unless the test sets
/// either itself.
fn modest_connections(extra: &str) -> String {
    let mut lines = String::new();
    if !extra.contains("max_connections =") {
        lines.push_str("max_connections = 512\n");
    }
    if !extra.contains("max_connections_per_ip") {
        lines.push_str("max_connections_per_ip = 100000\n");
    }
    if extra.contains("[http]\n") {
        extra.replacen("[http]\n", &format!("[http]\n{lines}"), 1)
    } else {
        format!("{extra}\n[http]\n{lines}")
    }
}

impl RelayProc {
    pub fn start(dir: &Path, id: &str, extra: &str) -> RelayProc {
        Self::start_logged(dir, id, extra, "warn")
    }

    /// Like [`RelayProc::start`], with `RUST_LOG=rust_log`.
    pub fn start_logged(dir: &Path, id: &str, extra: &str, rust_log: &str) -> RelayProc {
        let config = write_config(dir, id, extra);
        Self::start_config(id, config, dir.join(id), rust_log)
    }

    /// Starts relay `id` listening on a given `listen` address.
    pub fn start_at(dir: &Path, id: &str, listen: &str, extra: &str) -> RelayProc {
        Self::start_at_logged(dir, id, listen, extra, "warn")
    }

    pub fn start_at_logged(dir: &Path, id: &str, listen: &str, extra: &str, rust_log: &str) -> RelayProc {
        let config = write_config_at(dir, id, listen, extra);
        Self::start_config(id, config, dir.join(id), rust_log)
    }

    /// Starts `relay serve --config config` (whose data dir is `data_dir`).
    pub fn start_config(id: &str, config: PathBuf, data_dir: PathBuf, rust_log: &str) -> RelayProc {
        Self::start_config_env(id, config, data_dir, rust_log, &[])
    }

    /// Like [`RelayProc::start_config`], with more environment variables
    /// (this run only: [`RelayProc::restart`] starts without them).
    pub fn start_config_env(
        id: &str,
        config: PathBuf,
        data_dir: PathBuf,
        rust_log: &str,
        env: &[(&str, &str)],
    ) -> RelayProc {
        let extra = std::env::var(EXTRA_LOG).ok().filter(|e| !e.is_empty());
        let filter = match &extra {
            Some(extra) => format!("{rust_log},{extra}"),
            None => rust_log.to_owned(),
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", filter)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn relay");
        let first = first_line(child.stdout.take().unwrap());
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (stderr, keep) = (child.stderr.take().unwrap(), log.clone());
        let who = id.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if extra.is_some() || !below_warn(&line) {
                    eprintln!("[{who}] {line}");
                }
                let mut log = keep.lock().unwrap();
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(line);
            }
        });
        let line = first.recv_timeout(Duration::from_secs(30)).expect("relay did not start within 30 s");
        let url = line.rsplit(' ').next().unwrap().to_string();
        assert!(
            url.starts_with("http://127.0.0.1:") || url.starts_with("https://127.0.0.1:"),
            "unexpected start line {line:?}"
        );
        RelayProc { child: Some(child), id: id.into(), url, config, data_dir, rust_log: rust_log.into(), log }
    }

    /// The stderr lines written so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.log.lock().unwrap().iter().cloned().collect()
    }

    /// The first stderr line containing every one of `needles`, waiting up to
    /// `timeout` for it; panics (showing the lines) if none comes.
    pub fn wait_for_log(&self, needles: &[&str], timeout: Duration) -> String {
        let what = format!("{}: a log line with {needles:?}", self.id);
        eventually_blocking(&what, timeout, || {
            let lines = self.log_lines();
            match lines.iter().find(|l| needles.iter().all(|n| l.contains(n))) {
                Some(l) => Ok(l.clone()),
                None => Err(format!("the lines:\n{}", lines.join("\n"))),
            }
        })
    }

    /// Stderr lines containing every one of `needles`.
    pub fn count_log(&self, needles: &[&str]) -> usize {
        self.log_lines().iter().filter(|l| needles.iter().all(|n| l.contains(n))).count()
    }

    /// The process id (for /proc measurements).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Whether the process was started and not yet killed or reaped.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process ended by itself (it is reaped then).
    pub fn exited(&mut self) -> bool {
        let ended = self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some());
        if ended {
            self.child = None;
        }
        ended
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Waits (bounded) for the process to end by itself; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        exit_of(&mut c, &format!("{} exits", self.id), timeout)
    }

    /// SIGTERM and wait (bounded) for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        exit_of(&mut c, &format!("{} stops after SIGTERM", self.id), Duration::from_secs(30))
    }

    /// Starts the same relay again on its data dir (a new port).
    pub fn restart(&mut self) {
        self.kill9();
        let again = Self::start_config(&self.id, self.config.clone(), self.data_dir.clone(), &self.rust_log);
        *self = again;
    }
}

/// The exit status of `c`, waiting (bounded) for it; a child still
/// running past `limit` is killed before the test fails, so it never
/// outlives the test.
pub fn exit_of(c: &mut Child, what: &str, limit: Duration) -> std::process::ExitStatus {
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        eventually_blocking(what, limit, || c.try_wait().unwrap().ok_or_else(|| "still running".to_string()))
    }));
    waited.unwrap_or_else(|failed| {
        let _ = c.kill();
        let _ = c.wait();
        std::panic::resume_unwind(failed)
    })
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The first line a child prints on `stdout`, when it comes; the rest is
/// read and dropped, so the pipe never fills.
pub fn first_line(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {} // keep the pipe drained
    });
    rx
}

/// Runs `cmd` (a `relay serve` with piped stdout and stderr) until it
/// prints its start line or exits: Ok(the start line; the relay is then
/// stopped) or Err(its stderr, after a failed exit). Bounded by 30 s.
pub fn start_line_or_exit(mut cmd: Command) -> Result<String, String> {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn relay");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(BufReader::new(stdout).lines().next());
    });
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Some(Ok(line))) => {
            let _ = child.kill();
            let _ = child.wait();
            Ok(line)
        }
        _ => {
            let out = child.wait_with_output().unwrap();
            assert!(!out.status.success());
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}

/// Runs `relay audit ARGS…` (on a stopped relay's data); returns (exit
/// code, stdout, stderr).
pub fn audit(args: &[&str]) -> (i32, String, String) {
    relay_cmd(&[&["audit"], args].concat())
}

/// Runs `relay ARGS…` to its end; returns (exit code, stdout, stderr).
pub fn relay_cmd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_relay")).args(args).env("RUST_LOG", "warn").output().expect("run relay");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// Example `name`, built now with the profile of the relay under test
/// (a filtered test run does not build examples, an example that is also
/// a test target is built only as the test, and a stale one would test
/// old code); quick when it is up to date.
pub fn example(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_relay"));
    let profile = match bin.parent().and_then(|d| d.file_name()).and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let built = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--example", name, "--profile", profile, "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .status()
        .unwrap();
    assert!(built.success(), "cargo build --example {name}: {built}");
    bin.parent().unwrap().join("examples").join(name)
}
