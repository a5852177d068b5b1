//! Real relay processes on loopback ports, for integration tests.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `relay serve` child process with its own data dir.
pub struct RelayProc {
    child: Option<Child>,
    pub id: String,
    pub url: String,
    pub config: PathBuf,
    pub data_dir: PathBuf,
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
    let extra = unlimited_sessions(extra);
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
/// per-address rate limits unless the test sets them (tests/limits.rs does).
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

impl RelayProc {
    pub fn start(dir: &Path, id: &str, extra: &str) -> RelayProc {
        let config = write_config(dir, id, extra);
        Self::start_with(id, config, dir.join(id))
    }

    /// Starts relay `id` listening on a given `listen` address.
    pub fn start_at(dir: &Path, id: &str, listen: &str, extra: &str) -> RelayProc {
        let config = write_config_at(dir, id, listen, extra);
        Self::start_with(id, config, dir.join(id))
    }

    fn start_with(id: &str, config: PathBuf, data_dir: PathBuf) -> RelayProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn relay");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {} // keep the pipe drained
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("relay did not start within 30 s");
        let url = line.rsplit(' ').next().unwrap().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "unexpected start line {line:?}");
        RelayProc { child: Some(child), id: id.into(), url, config, data_dir }
    }

    /// The process id (for /proc measurements).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait (bounded) for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "relay did not stop within 30 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the same relay again on its data dir (a new port).
    pub fn restart(&mut self) {
        self.kill9();
        let again = Self::start_with(&self.id, self.config.clone(), self.data_dir.clone());
        *self = again;
    }
}

impl Drop for RelayProc {
    fn drop(&mut self) {
        self.kill9();
    }
}
