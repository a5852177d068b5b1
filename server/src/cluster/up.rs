//! `relay cluster up`: a whole cluster on loopback for trying cluster mode:
//! three nats-servers in one JetStream cluster (R3) and `--nodes` relay
//! nodes of one relay, each a `relay serve` child with its config written
//! under `--dir`. A node that exits is started again (as a service manager
//! would: one killed to try a takeover, or stopped by an error no shard
//! serves through). Stops everything on SIGINT
//! or SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use relay_actors::nats_server::{self, Member, NatsServer};

#[derive(clap::Args)]
pub struct UpArgs {
    /// Where the configs, the relay key and all data go (kept across runs).
    #[arg(long, default_value = "data/cluster")]
    pub dir: PathBuf,
    /// Relay nodes to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=9))]
    pub nodes: u8,
    /// The first port: nats-servers on BASE.., their routes on BASE+10..,
    /// monitoring on BASE+20.., relay nodes on BASE+30... 0 picks free ports.
    #[arg(long, default_value_t = 7820)]
    pub base_port: u16,
    /// The relay's id.
    #[arg(long, default_value = "relay-c")]
    pub id: String,
    /// Shards the accounts are hashed into (`cluster.shards`): with more
    /// than one, the nodes share the work. Fixed for the cluster's life:
    /// on the same `--dir`, nodes given another count refuse to start.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=crate::config::MAX_SHARDS as i64))]
    pub shards: u32,
}

/// How often `cluster up` looks for nodes that exited.
const RESTART_CHECK: Duration = Duration::from_millis(500);

/// A relay node process; killed on drop.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        // SIGTERM first, so the node stops serving and flushes.
        // SAFETY: a plain kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM);
        }
        for _ in 0..50 {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn port(base: u16, offset: u16) -> Result<u16, String> {
    if base == 0 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        return Ok(l.local_addr().map_err(|e| e.to_string())?.port());
    }
    base.checked_add(offset).ok_or_else(|| format!("--base-port {base}: ports past 65535"))
}

/// Runs `relay cluster up`; returns when stopped by a signal.
pub fn run(args: UpArgs) -> Result<(), String> {
    let bin = nats_server::binary()
        .ok_or("no nats-server: run .ci/nats.sh (installs it under target/nats) or set RELAY_NATS_SERVER")?;
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("--dir {}: {e}", args.dir.display()))?;
    let dir = args.dir.canonicalize().map_err(|e| e.to_string())?;
    let members = (0..3u16)
        .map(|i| {
            Ok(Member {
                name: format!("n{}", i + 1),
                port: port(args.base_port, i)?,
                cluster_port: port(args.base_port, 10 + i)?,
                http_port: port(args.base_port, 20 + i)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    // The nats-servers take only the relay's user: an anonymous client
    // could read every event stream and write leases and fences.
    let password = secret_in(&dir.join(NATS_PASSWORD_FILE))?;
    // The fronts, owners and sibling shards authenticate each other with it.
    secret_in(&dir.join(CLUSTER_SECRET_FILE))?;
    let mut servers = Vec::new();
    for m in &members {
        let user = (NATS_USER, password.as_str());
        let server = NatsServer::member_with_user(&bin, &dir.join("nats").join(&m.name), m, &members, user)
            .map_err(|e| format!("start nats-server {}: {e}", m.name))?;
        servers.push(server);
    }
    for s in &servers {
        s.wait_jetstream(Duration::from_secs(30)).map_err(|e| e.to_string())?;
    }
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    crate::keys::load_or_generate(&dir.join("relay.key"))?;

    let mut nodes = Vec::new();
    let mut fronts = Vec::new();
    for i in 1..=args.nodes as u16 {
        let listen = format!("127.0.0.1:{}", port(args.base_port, 29 + i)?);
        let config = write_node_config(&dir, &args, i, &listen, &urls)?;
        let (node, url) = start_node(&config)?;
        nodes.push((node, config));
        fronts.push(url);
    }
    println!("cluster {} up: relay nodes {}", args.id, fronts.join(" "));
    println!("nats-servers {}", urls.join(" "));
    println!("configs and data under {}; Ctrl-C stops everything", dir.display());
    use std::io::Write;
    let _ = std::io::stdout().flush();

    // Until a signal: like a service manager, start again a node that
    // exited (one killed to try a takeover, say).
    actix_web::rt::System::new().block_on(async {
        use actix_web::rt::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let mut tick = actix_web::rt::time::interval(RESTART_CHECK);
        loop {
            tokio::select! {
                _ = term.recv() => return Ok::<(), String>(()),
                _ = int.recv() => return Ok(()),
                _ = tick.tick() => {}
            }
            for (i, (node, config)) in nodes.iter_mut().enumerate() {
                if let Ok(Some(status)) = node.0.try_wait() {
                    eprintln!("relay node {} exited ({status}); starting it again", i + 1);
                    match start_node(config) {
                        Ok((again, _)) => *node = again,
                        Err(e) => eprintln!("relay node {}: {e}", i + 1),
                    }
                }
            }
        }
    })?;
    eprintln!("stopping the cluster");
    drop(nodes);
    drop(servers);
    Ok(())
}

/// The user the nodes connect to the nats-servers as, and the file (in
/// `--dir`) holding its password.
const NATS_USER: &str = "relay";
const NATS_PASSWORD_FILE: &str = "nats.password";
/// The file (in `--dir`) holding the cluster's secret (`cluster.secret_file`).
const CLUSTER_SECRET_FILE: &str = "cluster.secret";

/// The secret in `path`, made on the first run: 256 random bits in hex,
/// readable by this user only.
fn secret_in(path: &Path) -> Result<String, String> {
    if let Ok(text) = std::fs::read_to_string(path) {
        if let Some(password) = text.lines().next().map(str::trim).filter(|p| !p.is_empty()) {
            return Ok(password.to_owned());
        }
    }
    let password = format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    std::io::Write::write_all(&mut file, format!("{password}\n").as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(password)
}

fn write_node_config(dir: &Path, args: &UpArgs, i: u16, listen: &str, urls: &[String]) -> Result<PathBuf, String> {
    let (id, shards) = (&args.id, args.shards);
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    let body = format!(
        "# Written by `relay cluster up`: node {i} of relay {id}.\n\
         [relay]\nid = {id:?}\npublic_url = \"http://{listen}\"\nlisten = {listen:?}\n\
         data_dir = {data:?}\nkey_file = {key:?}\n\n\
         [store]\nengine = \"jetstream\"\n\n\
         [cluster]\nnode = \"node{i}\"\nnats_urls = [{urls}]\nreplicas = 3\nlease_ttl = \"3s\"\nshards = {shards}\n\
         nats_user = {NATS_USER:?}\nnats_password_file = {password:?}\nsecret_file = {secret:?}\n\n\
         # The cluster's, like relay.key: push subscriptions outlive a takeover.\n\
         [push]\nvapid_key_file = {vapid:?}\n",
        data = dir.join(format!("node{i}")).display().to_string(),
        key = dir.join("relay.key").display().to_string(),
        vapid = dir.join("vapid.key").display().to_string(),
        password = dir.join(NATS_PASSWORD_FILE).display().to_string(),
        secret = dir.join(CLUSTER_SECRET_FILE).display().to_string(),
        urls = urls.join(", "),
    );
    let path = dir.join(format!("node{i}.toml"));
    std::fs::write(&path, body).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// Starts `relay serve --config` and waits for its `listening on` line.
fn start_node(config: &Path) -> Result<(Node, String), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["serve", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start a relay node: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        if let Some(Ok(line)) = lines.next() {
            let _ = tx.send(line);
        }
        for _ in lines {}
    });
    let node = Node(child);
    let line = rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| format!("relay node {} did not start", config.display()))?;
    let url = line.rsplit(' ').next().unwrap_or_default().to_owned();
    Ok((node, url))
}
