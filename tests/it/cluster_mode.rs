//! Cluster mode on loopback (docs/cluster.md):
//! three nats-servers (JetStream, R3) and three relay nodes of one relay.
//! Skipped when no nats-server is installed (`.ci/nats.sh`), except under
//! `CI=true`, where it fails.

use crate::common;

use common::client::{message_ids, mid, Client, User};
use common::cluster::{free_port, write_key};
use common::relay::{audit, exit_of, RelayProc};
use common::wait::eventually;
use common::ws::WsClient;
use relay_actors::nats_server::{self, Member, NatsServer};
use relay_actors::store::{fence_violations, JetStreamConfig};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RELAY: &str = "relay-c";

/// The lease's ttl in these tests: a standby takes over about this long
/// after the owner dies.
const LEASE_TTL: &str = "2s";

/// Fields drop in order: the processes before the folder they use.
struct Cluster {
    nodes: Vec<RelayProc>,
    nats: Vec<NatsServer>,
    /// Each node's `cluster.metrics_listen`.
    metrics: Vec<String>,
    /// Each node's `cluster.internal_listen` port, with one shard (with
    /// several, shard k's is k ports up: they are left to the system).
    internal: Vec<Option<u16>>,
    /// Appended to every node's config.
    extra: String,
    /// `http.max_connections_per_ip` of every node.
    per_ip: usize,
    /// `cluster.shards`.
    shards: u32,
    /// The nodes' configs name `cluster.secret` as `cluster.secret_file`
    /// (the hop between fronts, owners and siblings is then TLS).
    secret: bool,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Three nats-servers in one JetStream cluster, then `nodes` relay
    /// nodes (the first started becomes the owner).
    fn start(bin: &Path, nodes: usize) -> Cluster {
        Cluster::start_with(bin, nodes, "", 100_000)
    }

    /// Like [`Cluster::start`]; `extra` TOML is appended to every node's
    /// config (e.g. `[[peers]]`), and each front takes `per_ip` connections
    /// from one address.
    fn start_with(bin: &Path, nodes: usize, extra: &str, per_ip: usize) -> Cluster {
        Cluster::start_sharded(bin, nodes, extra, per_ip, 1)
    }

    /// With `shards` > 1 the nodes start together (they share the shards
    /// out); with one, node1 serves before the others start.
    fn start_sharded(bin: &Path, nodes: usize, extra: &str, per_ip: usize, shards: u32) -> Cluster {
        Cluster::start_all(bin, nodes, extra, per_ip, shards, true)
    }

    /// Like [`Cluster::start`], its hop plain HTTP (no `cluster.secret_file`):
    /// for a test that talks to an owner's internal address itself.
    fn start_without_secret(bin: &Path, nodes: usize) -> Cluster {
        Cluster::start_all(bin, nodes, "", 100_000, 1, false)
    }

    fn start_all(bin: &Path, nodes: usize, extra: &str, per_ip: usize, shards: u32, secret: bool) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (1..=3)
            .map(|i| Member {
                name: format!("n{i}"),
                port: free_port(),
                http_port: free_port(),
                cluster_port: free_port(),
            })
            .collect();
        let nats: Vec<NatsServer> =
            members.iter().map(|m| NatsServer::member(bin, &dir.path().join(&m.name), m, &members).unwrap()).collect();
        for n in &nats {
            n.wait_jetstream(Duration::from_secs(30)).unwrap();
        }
        write_key(&dir.path().join("relay.key"), [77; 32]);
        write_key(&dir.path().join("cluster.secret"), [78; 32]);
        // Room for three nodes, however many start now.
        let metrics = (0..nodes.max(3)).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let internal = (0..nodes.max(3)).map(|_| (shards == 1).then(free_port)).collect();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            nats,
            metrics,
            internal,
            extra: extra.to_owned(),
            per_ip,
            shards,
            secret,
            dir,
        };
        for i in 1..=nodes {
            let node = cluster.start_node(i);
            if i == 1 && shards == 1 {
                node.wait_for_log(&["serving the shard"], Duration::from_secs(30));
            }
            cluster.nodes.push(node);
        }
        cluster
    }

    fn urls(&self) -> Vec<String> {
        self.nats.iter().map(NatsServer::url).collect()
    }

    fn config(&self, i: usize) -> PathBuf {
        self.config_as(i, &format!("node{i}.toml"), self.shards)
    }

    /// Node `i`'s config, written to `file`, with `shards`.
    fn config_as(&self, i: usize, file: &str, shards: u32) -> PathBuf {
        let dir = self.dir.path();
        let path = dir.join(file);
        let listen = format!("127.0.0.1:{}", free_port());
        let urls: Vec<String> = self.urls().iter().map(|u| format!("{u:?}")).collect();
        let body = format!(
            "[relay]\nid = \"{RELAY}\"\npublic_url = \"http://{listen}\"\nlisten = \"{listen}\"\n\
             data_dir = {data:?}\nkey_file = {key:?}\n\
             [store]\nengine = \"jetstream\"\n\
             [cluster]\nnode = \"node{i}\"\nnats_urls = [{urls}]\nreplicas = 3\nlease_ttl = \"{LEASE_TTL}\"\n\
             metrics_listen = {metrics:?}\nsnapshot_bytes = 200000\nshards = {shards}\ninternal_listen = {internal:?}\n{secret}\
             [limits]\nsession_rate = 1000000\nsession_burst = 1000000\nanonymous_rate = 1000000\nanonymous_burst = 1000000\n\
             [http]\nmax_connections = 512\nmax_connections_per_ip = {per_ip}\n\
             [push]\nvapid_key_file = {vapid:?}\n{extra}\n",
            data = dir.join(format!("node{i}")).display().to_string(),
            key = dir.join("relay.key").display().to_string(),
            vapid = dir.join("vapid.key").display().to_string(),
            urls = urls.join(", "),
            metrics = self.metrics[i - 1],
            internal = format!("127.0.0.1:{}", self.internal[i - 1].unwrap_or(0)),
            extra = self.extra,
            per_ip = self.per_ip,
            secret = match self.secret {
                true => format!("secret_file = {:?}\n", dir.join("cluster.secret").display().to_string()),
                false => String::new(),
            },
        );
        std::fs::write(&path, body).unwrap();
        path
    }

    fn start_node(&self, i: usize) -> RelayProc {
        let config = self.config(i);
        RelayProc::start_config(&format!("node{i}"), config, self.dir.path().join(format!("node{i}")), "info")
    }

    fn shard(&self) -> JetStreamConfig {
        self.shard_k(0)
    }

    fn shard_k(&self, k: u32) -> JetStreamConfig {
        JetStreamConfig::shard(self.urls(), &RELAY.replace('-', "_"), k, 3)
    }

    /// Once every shard has an owner and every node serves one: the owners.
    async fn shared_out(&self, what: &str) -> Vec<Option<usize>> {
        eventually(what, Duration::from_secs(60), || async {
            let owners = self.shard_owners().await;
            let serving: HashSet<_> = owners.iter().flatten().collect();
            let done = owners.iter().all(Option::is_some) && serving.len() == self.nodes.len();
            done.then_some(owners.clone()).ok_or(format!("{owners:?}"))
        })
        .await
    }

    /// Which node serves each shard now, by the nodes' own metrics.
    async fn shard_owners(&self) -> Vec<Option<usize>> {
        let mut owners = vec![None; self.shards as usize];
        for (i, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.is_running()) {
            let Ok((200, text)) = Client::new(&format!("http://{}", self.metrics[i])).try_get("/metrics").await else {
                continue;
            };
            for (k, owner) in owners.iter_mut().enumerate() {
                if text.contains(&format!("relay_cluster_shard_owned{{node=\"{}\",shard=\"{k}\"}} 1", node.id)) {
                    *owner = Some(i);
                }
            }
        }
        owners
    }

    /// The node serving the relay now (by its log), if any.
    fn owner(&self) -> Option<usize> {
        let serving = |n: &RelayProc| {
            n.log_lines().iter().rev().find_map(|l| {
                (l.contains("serving the shard") || l.contains("stopping at once")).then(|| l.contains("serving"))
            })
        };
        self.nodes.iter().position(|n| n.is_running() && serving(n) == Some(true))
    }
}

/// The nats-server leading the shard's stream.
async fn stream_leader(urls: &[String], stream: &str) -> Option<String> {
    let client = async_nats::connect(relay_actors::store::server_addrs(urls).ok()?).await.ok()?;
    let js = async_nats::jetstream::new(client);
    let info = js.get_stream(stream).await.ok()?.get_info().await.ok()?;
    info.cluster?.leader
}

#[actix_rt::test]
async fn every_node_serves_the_one_relay_and_a_standby_cannot_write() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    // Three connections per address at each front: the test's clients fit.
    let cluster = Cluster::start_with(&bin, 3, "", 3);
    let owner = cluster.owner().expect("node1 serves");
    assert_eq!(owner, 0);
    // Register through one standby, open the recipient's session through
    // the other: both reach the owner.
    let (via2, via3) = (Client::new(&cluster.nodes[1].url), Client::new(&cluster.nodes[2].url));
    let alice = User::register(&via2, RELAY, 1, true).await;
    let bob = User::register(&via3, RELAY, 2, true).await;
    // Bob's socket goes through a standby; the send through the other one.
    let mut bob_ws = WsClient::attach(&cluster.nodes[1].url, bob.token(0).unwrap()).await;
    let sent = via3.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(sent["status"], "target_accepted", "{sent}");
    let n = bob_ws.notification(Duration::from_secs(10)).await.expect("a notification through the standby");
    assert_eq!(n, json!({"method": "message.timeline.changed", "params": {"account_id": bob.id(), "sequence": 1}}));
    assert_eq!(message_ids(&bob.sync_all(&via2, 0).await), [mid(1)]);

    // Each node's own metrics say who serves, and under which epoch.
    for (i, node) in cluster.nodes.iter().enumerate() {
        let metrics = Client::new(&format!("http://{}", cluster.metrics[i]));
        let (code, text) = metrics.get("/metrics").await;
        assert_eq!(code, 200);
        let owned = if i == owner { 1 } else { 0 };
        assert!(
            text.contains(&format!("relay_cluster_shard_owned{{node=\"{}\",shard=\"0\"}} {owned}", node.id)),
            "{text}"
        );
    }
    // Standbys hold no store: they never fenced the stream.
    for standby in &cluster.nodes[1..] {
        assert_eq!(standby.count_log(&["took the lease"]), 0);
    }
    assert_eq!(fence_violations(&cluster.shard()).unwrap(), []);

    // A front applies http.max_connections_per_ip (the owner sees only
    // fronts): over the cap, `rate_limited` as from a standalone relay.
    let front = cluster.nodes[1].url.trim_start_matches("http://").to_owned();
    let open: Vec<std::net::TcpStream> = (0..3).map(|_| std::net::TcpStream::connect(&front).unwrap()).collect();
    let over = Client::new(&cluster.nodes[1].url);
    let refused = eventually("the fourth connection is refused", Duration::from_secs(10), || async {
        match over.try_call("route.get", None, &json!({"account_id": bob.id()})).await {
            Ok((429, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(refused["error"]["code"], "rate_limited", "{refused}");
    drop(open);

    // SIGTERM stops a standby cleanly (it has no HTTP server of its own).
    let mut cluster = cluster;
    let status = cluster.nodes[2].terminate();
    assert!(status.success(), "{status}");
}

/// What the load saw: every acknowledged send, and the errors on the way.
#[derive(Default)]
struct Load {
    acked: BTreeMap<String, (usize, Value)>,
    retried: usize,
}

/// Senders sending to bob through the nodes in turn, each send logged
/// when acknowledged; a send without an answer is retried with the same
/// body (the same message id) on the next node until it is acknowledged.
struct Senders {
    clients: Vec<Client>,
    users: Vec<Arc<User>>,
    bob: Arc<User>,
    load: Arc<Mutex<Load>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<actix_rt::task::JoinHandle<()>>,
}

impl Senders {
    async fn start(cluster: &Cluster, senders: usize) -> Senders {
        let clients: Vec<Client> =
            cluster.nodes.iter().map(|n| Client::with_timeout(&n.url, Duration::from_secs(20))).collect();
        let bob = Arc::new(User::register(&clients[0], RELAY, 2, true).await);
        let mut users = Vec::new();
        for s in 0..senders {
            users.push(Arc::new(User::register(&clients[s % clients.len()], RELAY, 10 + s as u8, true).await));
        }
        let load = Arc::new(Mutex::new(Load::default()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (s, user) in users.iter().enumerate() {
            let (user, bob, load, stop, clients) =
                (user.clone(), bob.clone(), load.clone(), stop.clone(), clients.clone());
            tasks.push(actix_rt::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    n += 1;
                    let id = mid(s as u64 * 1_000_000 + n);
                    let params = user.send_params(&bob, &id, false);
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let mut at = n as usize;
                    loop {
                        let c = &clients[at % clients.len()];
                        match c.try_call("message.send", user.token(0), &params).await {
                            Ok((200, v)) => {
                                load.lock().unwrap().acked.insert(id.clone(), (s, v));
                                break;
                            }
                            other => {
                                assert!(Instant::now() < deadline, "{id}: no acknowledgement within 60 s: {other:?}");
                                load.lock().unwrap().retried += 1;
                                at += 1;
                                // A pause between retries (the nodes are sorting out who serves).
                                actix_rt::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                }
            }));
        }
        Senders { clients, users, bob, load, stop, tasks }
    }

    /// `more` acknowledgements, while nodes that stopped by themselves (a
    /// lost lease) are started again, as a service manager would.
    async fn wait_acks(&self, cluster: &mut Cluster, more: usize, what: &str) {
        let target = self.load.lock().unwrap().acked.len() + more;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = self.load.lock().unwrap().acked.len();
            if n >= target {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: {n} of {target} acknowledged within 60 s");
            cluster.revive();
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `kill -9` of the nats-server leading shard `k`'s stream: JetStream
    /// elects another leader and 60 more sends are acknowledged; then the
    /// server is started again.
    async fn kill_stream_leader(&self, cluster: &mut Cluster, k: u32) {
        let stream = cluster.shard_k(k).stream;
        let leader = stream_leader(&cluster.urls(), &stream).await.expect("a stream leader");
        let victim = cluster.nats.iter().position(|n| n.name == leader).unwrap();
        let killed_at = Instant::now();
        cluster.nats[victim].kill();
        self.wait_acks(cluster, 60, "sends after the stream leader was killed").await;
        eprintln!("stream leader {leader} killed: 60 more sends acknowledged {:?} later", killed_at.elapsed());
        cluster.nats[victim].restart().unwrap();
        cluster.nats[victim].wait_jetstream(Duration::from_secs(30)).unwrap();
    }

    /// Stops the senders (each finishes its send) and checks the outcome:
    /// bob's timeline holds exactly the acknowledged sends, each once, each
    /// `target_accepted` for its sender; the stream verifies and no group
    /// follows a newer fence.
    async fn finish_and_verify(self, cluster: &mut Cluster) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        let load = std::mem::take(&mut *self.load.lock().unwrap());
        eprintln!("{} sends acknowledged, {} retries", load.acked.len(), load.retried);
        cluster.revive();
        let bob = &self.bob;
        let via = eventually("a node serves", Duration::from_secs(30), || async {
            for c in &self.clients {
                if let Ok((200, _)) = c.try_call("route.get", None, &json!({"account_id": bob.id()})).await {
                    return Ok(c.clone());
                }
            }
            Err("no node answers".to_string())
        })
        .await;
        // An acknowledged send is accepted (`delivering` at least): one
        // whose shard-to-shard attempt met a takeover is delivered by its
        // retry, which a new owner of the recipient's shard wakes.
        let ids = eventually("every acknowledged send reaches bob", Duration::from_secs(60), || async {
            let ids = message_ids(&bob.sync_all(&via, 0).await);
            let missing = load.acked.keys().filter(|id| !ids.contains(id)).count();
            if missing == 0 {
                Ok(ids)
            } else {
                Err(format!("{missing} of {} acknowledged sends not in the timeline", load.acked.len()))
            }
        })
        .await;
        let unique: HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "a message delivered twice");
        // Every send was retried until acknowledged: nothing else is there.
        let extra: Vec<&&String> = unique.iter().filter(|id| !load.acked.contains_key(**id)).collect();
        assert!(extra.is_empty(), "in the timeline but never acknowledged: {extra:?}");
        for (id, (s, _)) in &load.acked {
            let status = || async {
                let st = via.ok("message.delivery.status", self.users[*s].token(0), &json!({ "message_id": id })).await;
                (st["status"] == "target_accepted").then_some(()).ok_or(format!("{id}: {st}"))
            };
            // An attempt cut short by a kill (the receipt written, its answer
            // lost) is confirmed by the timetable's next attempt, 30 s on.
            eventually("the sender sees target_accepted", Duration::from_secs(40), status).await;
        }
        let config = cluster.nodes[0].config.clone();
        let (code, out, err) = audit(&["verify", "--config", config.to_str().unwrap()]);
        assert_eq!(code, 0, "relay audit verify: {out}{err}");
        for k in 0..cluster.shards {
            assert_eq!(fence_violations(&cluster.shard_k(k)).unwrap(), [], "shard {k}");
        }
    }
}

#[actix_rt::test]
async fn killed_owner_and_killed_stream_leader_lose_and_duplicate_no_acknowledged_send() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let mut cluster = Cluster::start(&bin, 3);
    let senders = Senders::start(&cluster, 4).await;
    senders.wait_acks(&mut cluster, 60, "sends before any kill").await;

    // 1. kill -9 the owner: a standby serves within 5 s.
    let owner = cluster.owner().expect("an owner");
    let killed_at = Instant::now();
    cluster.nodes[owner].kill9();
    let (new_owner, took) = eventually("a standby takes over", Duration::from_secs(10), || async {
        match cluster.owner() {
            Some(n) if n != owner => Ok((n, killed_at.elapsed())),
            seen => Err(format!("owner {seen:?}")),
        }
    })
    .await;
    eprintln!("takeover: node{} serves {took:?} after node{} was killed", new_owner + 1, owner + 1);
    assert!(took < Duration::from_secs(5), "takeover took {took:?}");
    senders.wait_acks(&mut cluster, 60, "sends after the takeover").await;
    eprintln!("sends acknowledged again {:?} after the kill", killed_at.elapsed());
    cluster.nodes[owner].restart();

    // 2. kill -9 the nats-server leading the shard's stream: JetStream
    //    elects another leader and sends go on.
    senders.kill_stream_leader(&mut cluster, 0).await;
    senders.wait_acks(&mut cluster, 30, "sends after the leader came back").await;
    senders.finish_and_verify(&mut cluster).await;
}

/// Several shards (`cluster.shards = 4`): the nodes share them out; sends
/// between accounts of different shards go owner to owner; a device
/// attached through any node gets its pushes; `kill -9` of the owner of
/// the recipient's shard, then of a sender's, then of the nats-server
/// leading the recipient's stream, loses and duplicates nothing
/// acknowledged; each shard is taken over within 5 s, and the restarted
/// nodes get shards handed back.
#[actix_rt::test]
async fn shards_spread_over_nodes_and_cross_shard_sends_survive_killed_shard_owners() {
    const SHARDS: u32 = 4;
    let Some(bin) = nats_server::binary_for_test() else { return };
    let mut cluster = Cluster::start_sharded(&bin, 3, "", 100_000, SHARDS);
    let owners = cluster.shared_out("the nodes share the shards out").await;
    // The count is the cluster's: a node configured with another refuses
    // to start (it would look for accounts in the wrong streams).
    let other = cluster.config_as(1, "other.toml", 2);
    let mut refused = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["serve", "--config"])
        .arg(&other)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_of(&mut refused, "a node with another shard count exits", Duration::from_secs(30));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success() && err.contains("created with 4 shards"), "{err}");

    let senders = Senders::start(&cluster, 6).await;
    let shard = |id: &str| relay_core::shard::of(id, SHARDS);
    let bob_shard = shard(senders.bob.id());
    let crossing = senders.users.iter().filter(|u| shard(u.id()) != bob_shard).count();
    assert!(crossing >= 2, "senders in other shards than the recipient's: {crossing}");
    // Bob's socket goes through a node that does not own his shard.
    let owner_of_bob = owners[bob_shard as usize].unwrap();
    let via = (owner_of_bob + 1) % cluster.nodes.len();
    let mut bob_ws = WsClient::attach(&cluster.nodes[via].url, senders.bob.token(0).unwrap()).await;
    let n = bob_ws.notification(Duration::from_secs(20)).await.expect("a push through another node");
    assert_eq!(n["method"], "message.timeline.changed", "{n}");
    // A session of one shard reads the devices of an account of another.
    let reader = senders.users.iter().position(|u| shard(u.id()) != bob_shard).unwrap();
    let devices = senders.clients[via]
        .ok("account.devices.get", senders.users[reader].token(0), &json!({ "account_id": senders.bob.id() }))
        .await;
    assert_eq!(devices["certificates"].as_array().map(Vec::len), Some(1), "{devices}");
    senders.wait_acks(&mut cluster, 60, "sends before any kill").await;

    // kill -9 the owner of bob's shard, then the owner of a sender's
    // shard: each shard is served again within 5 s.
    let sender_shard = senders.users.iter().map(|u| shard(u.id())).find(|&k| k != bob_shard).unwrap();
    for k in [bob_shard, sender_shard] {
        // The shard may be between two owners (a hand-over to the node
        // restarted in the previous round): its next one is the victim.
        let victim = eventually("the shard has an owner", Duration::from_secs(30), || async {
            cluster.shard_owners().await[k as usize].ok_or_else(|| "no owner".to_string())
        })
        .await;
        let killed_at = Instant::now();
        cluster.nodes[victim].kill9();
        let took = eventually("the shard is taken over", Duration::from_secs(15), || async {
            match cluster.shard_owners().await[k as usize] {
                Some(n) if n != victim => Ok(killed_at.elapsed()),
                seen => Err(format!("owner {seen:?}")),
            }
        })
        .await;
        eprintln!("shard {k}: taken over {took:?} after node{} was killed", victim + 1);
        assert!(took < Duration::from_secs(5), "shard {k} takeover took {took:?}");
        senders.wait_acks(&mut cluster, 60, "sends after the takeover").await;
        cluster.nodes[victim].restart();
        senders.wait_acks(&mut cluster, 20, "sends after the restart").await;
    }
    // kill -9 the nats-server leading the busiest stream (bob's shard's:
    // every send writes his receipt there); JetStream elects another.
    senders.kill_stream_leader(&mut cluster, bob_shard).await;

    // A node started again gets shards handed over to it, under load.
    cluster.shared_out("the restarted nodes get shards again").await;
    senders.wait_acks(&mut cluster, 20, "sends after the hand-overs").await;
    senders.finish_and_verify(&mut cluster).await;
    // SIGTERM stops a node serving shards cleanly (each core gracefully).
    let serving = cluster.shard_owners().await[0].expect("shard 0 has an owner");
    let status = cluster.nodes[serving].terminate();
    assert!(status.success(), "{status}");
}

/// Random faults under load: each round kills (`kill -9`) the owner node, a
/// standby node or one nats-server (never two servers at once: R3 needs a
/// quorum), waits for more acknowledged sends, and starts it again.
/// `RELAY_CLUSTER_SEED` and `RELAY_CLUSTER_FAULTS` choose other schedules,
/// `RELAY_CLUSTER_SHARDS` a relay of several shards (its "owner" and
/// "standby" are then two nodes that may both serve shards).
#[actix_rt::test]
async fn random_kills_of_nodes_and_servers_lose_and_duplicate_no_acknowledged_send() {
    use rand::{RngExt, SeedableRng};
    let Some(bin) = nats_server::binary_for_test() else { return };
    let seed: u64 = std::env::var("RELAY_CLUSTER_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x17c1);
    let faults: usize = std::env::var("RELAY_CLUSTER_FAULTS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let shards: u32 = std::env::var("RELAY_CLUSTER_SHARDS").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut cluster = Cluster::start_sharded(&bin, 3, "", 100_000, shards);
    if shards > 1 {
        cluster.shared_out("the nodes share the shards out").await;
    }
    let senders = Senders::start(&cluster, 4).await;
    senders.wait_acks(&mut cluster, 30, "sends before any kill").await;
    for round in 0..faults {
        match rng.random_range(0..3) {
            0 => {
                let owner = cluster.owner().unwrap_or(0);
                eprintln!("seed {seed:#x} round {round}: kill -9 the owner node{}", owner + 1);
                cluster.nodes[owner].kill9();
                senders.wait_acks(&mut cluster, 30, "sends after the owner was killed").await;
                cluster.nodes[owner].restart();
            }
            1 => {
                let owner = cluster.owner();
                let standby = (0..cluster.nodes.len()).find(|&i| Some(i) != owner).unwrap();
                eprintln!("seed {seed:#x} round {round}: kill -9 the standby node{}", standby + 1);
                cluster.nodes[standby].kill9();
                senders.wait_acks(&mut cluster, 30, "sends after a standby was killed").await;
                cluster.nodes[standby].restart();
            }
            _ => {
                let victim = rng.random_range(0..cluster.nats.len());
                eprintln!("seed {seed:#x} round {round}: kill -9 nats-server {}", cluster.nats[victim].name);
                cluster.nats[victim].kill();
                senders.wait_acks(&mut cluster, 30, "sends after a nats-server was killed").await;
                cluster.nats[victim].restart().unwrap();
                cluster.nats[victim].wait_jetstream(Duration::from_secs(30)).unwrap();
            }
        }
        senders.wait_acks(&mut cluster, 20, "sends after the restart").await;
    }
    senders.finish_and_verify(&mut cluster).await;
}

impl Cluster {
    /// Starts again every node that stopped by itself.
    fn revive(&mut self) {
        for node in &mut self.nodes {
            if node.exited() {
                eprintln!("{} stopped by itself; starting it again", node.id);
                node.restart();
            }
        }
    }
}

#[actix_rt::test]
async fn cluster_up_serves_one_relay_starts_a_killed_node_again_and_stops_everything_on_sigterm() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let dir = tempfile::tempdir().unwrap();
    /// Stops `relay cluster up` (and so its servers and nodes) however the test ends.
    struct Up(std::process::Child);
    impl Drop for Up {
        fn drop(&mut self) {
            // SAFETY: kill(2) on our child.
            unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
            let _ = common::wait::eventually_blocking("cluster up exits", Duration::from_secs(30), || {
                self.0.try_wait().unwrap().ok_or_else(|| "running".to_string())
            });
        }
    }
    let up = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["cluster", "up", "--base-port", "0", "--nodes", "2", "--dir"])
        .arg(dir.path())
        .env("RELAY_NATS_SERVER", &bin)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = Up(up);
    let first = common::relay::first_line(up.0.stdout.take().unwrap());
    let line = first.recv_timeout(Duration::from_secs(60)).expect("cluster up prints its nodes");
    let urls: Vec<&str> = line.split(' ').filter(|w| w.starts_with("http://")).collect();
    assert_eq!(urls.len(), 2, "{line}");
    // Its nats-servers take only the relay's user, whose password it wrote
    // for the nodes (`cluster.nats_password_file`).
    let conf = std::fs::read_to_string(dir.path().join("nats/n1/nats.conf")).unwrap();
    let port = conf.lines().find_map(|l| l.strip_prefix("listen: 127.0.0.1:")).unwrap().trim().to_owned();
    let nats = format!("nats://127.0.0.1:{port}");
    assert!(async_nats::connect(&nats).await.is_err(), "an anonymous client is refused");
    let password = std::fs::read_to_string(dir.path().join("nats.password")).unwrap();
    let node1 = std::fs::read_to_string(dir.path().join("node1.toml")).unwrap();
    assert!(node1.contains("nats_user = \"relay\"") && node1.contains("nats_password_file"), "{node1}");
    let with_user = async_nats::ConnectOptions::new().user_and_password("relay".into(), password.trim().into());
    assert!(with_user.connect(&nats).await.is_ok(), "the relay's user is taken");
    // The nodes share a secret of their own for the hop between them.
    let secret = dir.path().join("cluster.secret");
    assert!(node1.contains(&format!("secret_file = {:?}", secret.display().to_string())), "{node1}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&secret).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "the secret is readable by others");
    assert_eq!(std::fs::read_to_string(&secret).unwrap().trim().len(), 64);
    let (a, b) = (Client::new(urls[0]), Client::new(urls[1]));
    let alice = User::register(&a, "relay-c", 1, true).await;
    let bob = User::register(&b, "relay-c", 2, true).await;
    b.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(message_ids(&bob.sync_all(&a, 0).await), [mid(1)]);

    // A node killed is started again (its config names it), and the relay
    // serves on: node 1 held the lease, node 2 takes it.
    let node1 = dir.path().join("node1.toml");
    let pid_of = |config: &Path| -> Option<u32> {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let ours = args.windows(2).any(|w| w[0] == b"--config" && w[1] == config.as_os_str().as_encoded_bytes());
            ours.then(|| e.file_name().to_str()?.parse().ok()).flatten()
        })
    };
    let first = pid_of(&node1).expect("node 1 runs");
    // SAFETY: kill(2) on a process this test's child started.
    unsafe { libc::kill(first as libc::pid_t, libc::SIGKILL) };
    common::wait::eventually_blocking("node 1 started again", Duration::from_secs(30), || match pid_of(&node1) {
        Some(pid) if pid != first => Ok(()),
        seen => Err(format!("{seen:?}")),
    });
    let (a, b) = (Client::new(urls[0]), Client::new(urls[1]));
    let again = alice.send_params(&bob, &mid(2), false);
    eventually("a send after the takeover", Duration::from_secs(30), || async {
        match b.try_call("message.send", alice.token(0), &again).await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Node 1's process is there again; its front listens a moment later.
    eventually("node 1's front answers again", Duration::from_secs(30), || async {
        match a.try_get("/healthz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(message_ids(&bob.sync_all(&a, 0).await), [mid(1), mid(2)]);

    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(up.0.id() as libc::pid_t, libc::SIGTERM) };
    let status = common::wait::eventually_blocking("cluster up exits", Duration::from_secs(30), || {
        up.0.try_wait().unwrap().ok_or_else(|| "running".to_string())
    });
    assert!(status.success(), "{status}");
    for url in urls {
        assert!(Client::with_timeout(url, Duration::from_secs(1))
            .try_call("route.get", None, &json!({}))
            .await
            .is_err());
    }
}

#[actix_rt::test]
async fn a_peer_relay_sees_one_relay_and_its_deliveries_survive_a_takeover() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    // relay-a: a standalone relay peering with the cluster through node2's front.
    let outside = tempfile::tempdir().unwrap();
    let a_key = write_key(&outside.path().join("relay-a").join("relay.key"), [78; 32]);
    let a_listen = format!("127.0.0.1:{}", free_port());
    let c_key = relay_schemas::encoding::b64_encode(
        ed25519_dalek::SigningKey::from_bytes(&[77; 32]).verifying_key().as_bytes(),
    );
    let to_a = format!("[[peers]]\nid = \"relay-a\"\nurl = \"http://{a_listen}\"\npublic_key = \"{a_key}\"\n");
    let fast = "[delivery]\nretry_timetable = [\"0s\", \"300ms\", \"600ms\"]\nretry_then_every = \"300ms\"\nattempt_timeout = \"2s\"\n";
    let mut cluster = Cluster::start_with(&bin, 3, &format!("{fast}{to_a}"), 100_000);
    let to_c =
        format!("[[peers]]\nid = \"{RELAY}\"\nurl = \"{}\"\npublic_key = \"{c_key}\"\n{fast}", cluster.nodes[1].url);
    let config = common::relay::write_config_at(outside.path(), "relay-a", &a_listen, &to_c);
    let relay_a = RelayProc::start_config("relay-a", config, outside.path().join("relay-a"), "warn");

    let (a, c) = (Client::new(&relay_a.url), Client::new(&cluster.nodes[2].url));
    let alice = User::register(&a, "relay-a", 1, true).await;
    let bob = User::register(&c, RELAY, 2, true).await;
    let send = |n: u64| alice.send_params(&bob, &mid(n), false);
    for n in 1..=10 {
        a.ok("message.send", alice.token(0), &send(n)).await;
    }
    // The owner dies with deliveries in flight; relay-a retries on its timetable.
    let owner = cluster.owner().unwrap();
    cluster.nodes[owner].kill9();
    for n in 11..=20 {
        a.ok("message.send", alice.token(0), &send(n)).await;
    }
    for n in 1..=20 {
        eventually(&format!("{} target_accepted", mid(n)), Duration::from_secs(30), || async {
            let st = a.ok("message.delivery.status", alice.token(0), &json!({ "message_id": mid(n) })).await;
            (st["status"] == "target_accepted").then_some(()).ok_or(st.to_string())
        })
        .await;
    }
    let via = Client::new(&cluster.nodes[2].url);
    let mut ids = message_ids(&bob.sync_all(&via, 0).await);
    let mut want: Vec<String> = (1..=20).map(mid).collect();
    // Deliveries retried after the takeover may land in any order.
    ids.sort();
    want.sort();
    assert_eq!(ids, want, "each message once");

    // And back: the cluster delivers to relay-a as one relay.
    let back = bob.send_params(&alice, &mid(100), false);
    via.ok("message.send", bob.token(0), &back).await;
    eventually("the reply reaches relay-a", Duration::from_secs(30), || async {
        let got = message_ids(&alice.sync_all(&a, 0).await);
        got.contains(&mid(100)).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    assert_eq!(fence_violations(&cluster.shard()).unwrap(), []);
}

/// Whether something listens on 127.0.0.1:`port` (a bound socket that does
/// not listen refuses the connection at once).
fn listens(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).is_ok()
}

/// With `cluster.secret_file`, a front reaches its shard's owner over TLS
/// with the cluster's key (every request below passes that way), and a
/// client at the owner's internal address without the key gets no HTTP
/// answer: whoever reaches that address is not served by it.
#[actix_rt::test]
async fn an_owners_internal_address_answers_only_holders_of_the_cluster_secret() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let cluster = Cluster::start(&bin, 1);
    let via = Client::with_timeout(&cluster.nodes[0].url, Duration::from_secs(20));
    let alice = User::register(&via, RELAY, 1, true).await;
    let bob = User::register(&via, RELAY, 2, true).await;
    via.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(message_ids(&bob.sync_all(&via, 0).await), [mid(1)]);

    use std::io::{Read, Write};
    let internal = ([127, 0, 0, 1], cluster.internal[0].unwrap()).into();
    let mut plain = std::net::TcpStream::connect_timeout(&internal, Duration::from_secs(5)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = json!({"after": 0, "limit": 10}).to_string();
    let request = format!(
        "POST /v1/rpc/message.timeline.sync HTTP/1.1\r\nhost: owner\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        bob.token(0).unwrap(),
        body.len()
    );
    let _ = plain.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    // At most a TLS alert (record type 21), never an HTTP answer.
    assert!(!answer.starts_with(b"HTTP/"), "answered in plain HTTP: {:?}", String::from_utf8_lossy(&answer));
    assert!(answer.len() < 64, "{} bytes came back to a client without the key", answer.len());
}

/// Shard 0's lease bucket of the test relay (a bucket per shard).
async fn lease_bucket(cluster: &Cluster) -> async_nats::jetstream::kv::Store {
    let client = async_nats::connect(relay_actors::store::server_addrs(&cluster.urls()).unwrap()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    js.get_key_value(format!("RELAY_{}_LEASE_S0", RELAY.replace('-', "_"))).await.unwrap()
}

/// A cluster started by the earlier release (every shard's lease in one
/// bucket, `RELAY_<id>_LEASES`, whose revisions its fences carry) starts
/// with this one: its owners' epochs are counted above that bucket's last
/// revision, so the old fences do not refuse them. While that bucket
/// still holds a live lease (a node of the earlier release serving), a
/// node refuses to start.
#[actix_rt::test]
async fn a_cluster_started_by_the_one_bucket_release_starts_with_a_bucket_per_shard() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let mut cluster = Cluster::start(&bin, 0);
    let client = async_nats::connect(relay_actors::store::server_addrs(&cluster.urls()).unwrap()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    // The earlier release's bucket, after 40 writes of shard 0's lease.
    let shared = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: format!("RELAY_{}_LEASES", RELAY.replace('-', "_")),
            history: 1,
            max_age: Duration::from_secs(120),
            num_replicas: 3,
            ..Default::default()
        })
        .await
        .unwrap();
    for _ in 0..40 {
        shared.put("shard-0", "node9 127.0.0.1:9 0".into()).await.unwrap();
    }
    // Its last owner's fence (epoch 40) and one group.
    let old = relay_actors::store::Store::with_engine(std::sync::Arc::new(
        relay_actors::store::JetStreamEngine::open(cluster.shard(), 40).unwrap(),
    ))
    .unwrap();
    old.commit_durable_blocking(old.batch()).unwrap();
    drop(old);

    // That node's lease is live (as if renewed): a node of this release refuses.
    let mut refused = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["serve", "--config"])
        .arg(cluster.config(1))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_of(&mut refused, "a node started beside the earlier release", Duration::from_secs(60));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut refused.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success() && stderr.contains("a node of the earlier release"), "{stderr}");
    shared.delete("shard-0").await.unwrap();

    let node = cluster.start_node(2);
    node.wait_for_log(&["serving the shard"], Duration::from_secs(30));
    cluster.nodes.push(node);
    let via = Client::with_timeout(&cluster.nodes[0].url, Duration::from_secs(20));
    let alice = User::register(&via, RELAY, 1, true).await;
    let bob = User::register(&via, RELAY, 2, true).await;
    via.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(message_ids(&bob.sync_all(&via, 0).await), [mid(1)]);
    assert_eq!(fence_violations(&cluster.shard()).unwrap(), []);
}

/// A shard's internal port listens only while the shard is served: a
/// standby's refuses connections (a front tries again, instead of waiting
/// in an accept queue nobody serves). A lost lease stops serving that
/// shard without exiting the process, which stands by and serves it again.
#[actix_rt::test]
async fn a_lost_lease_gives_the_shard_up_without_exiting_and_only_a_served_shards_port_listens() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let mut cluster = Cluster::start(&bin, 2);
    let (owner_port, standby_port) = (cluster.internal[0].unwrap(), cluster.internal[1].unwrap());
    assert_eq!(cluster.owner(), Some(0));
    assert!(listens(owner_port), "the owner serves on its internal port");
    cluster.nodes[1].wait_for_log(&["standing by for the shard"], Duration::from_secs(10));
    assert!(!listens(standby_port), "a standby's internal port accepts nothing");
    let via2 = Client::with_timeout(&cluster.nodes[1].url, Duration::from_secs(20));
    let alice = User::register(&via2, RELAY, 1, true).await;
    let bob = User::register(&via2, RELAY, 2, true).await;
    via2.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;

    // Someone else writes the lease (as a node that took it over after an
    // expiry would): node1's next renewal is refused.
    let leases = lease_bucket(&cluster).await;
    leases.put("shard-0", "intruder 127.0.0.1:9 0".into()).await.unwrap();
    cluster.nodes[0].wait_for_log(&["gave the shard up"], Duration::from_secs(10));
    assert!(!cluster.nodes[0].exited(), "a lost lease does not end the process");
    assert!(!listens(owner_port), "a shard given up is not listened for");
    // The intruder never renews: its key expires and a node serves again.
    let again = alice.send_params(&bob, &mid(2), false);
    eventually("a send once the shard is served again", Duration::from_secs(30), || async {
        match via2.try_call("message.send", alice.token(0), &again).await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(message_ids(&bob.sync_all(&via2, 0).await), [mid(1), mid(2)]);
    assert!(!cluster.nodes[0].exited(), "node1 still runs");
    let served = [owner_port, standby_port].map(listens);
    assert_eq!(served.iter().filter(|l| **l).count(), 1, "one node serves and listens: {served:?}");
    assert_eq!(fence_violations(&cluster.shard()).unwrap(), []);
}

/// An owner paused (SIGSTOP) past its lease, with reads queued at its
/// internal address, wakes after another node took over and acknowledged
/// a send: it answers none of them from its stale view (each is refused
/// `temporarily_unavailable`, or cut, and the client tries again).
#[actix_rt::test]
async fn an_owner_paused_past_its_lease_answers_no_read_from_its_stale_view_on_waking() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let cluster = Cluster::start_without_secret(&bin, 2);
    assert_eq!(cluster.owner(), Some(0));
    let via2 = Client::with_timeout(&cluster.nodes[1].url, Duration::from_secs(5));
    let alice = User::register(&via2, RELAY, 1, true).await;
    let bob = Arc::new(User::register(&via2, RELAY, 2, true).await);
    via2.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;

    let owner = cluster.nodes[0].pid() as libc::pid_t;
    // SAFETY: kill(2) on a process this test started.
    unsafe { libc::kill(owner, libc::SIGSTOP) };
    let internal = format!("http://127.0.0.1:{}", cluster.internal[0].unwrap());
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let (bob, internal) = (bob.clone(), internal.clone());
            actix_rt::spawn(async move {
                let c = Client::with_timeout(&internal, Duration::from_secs(60));
                c.try_call("message.timeline.sync", bob.token(0), &json!({"after": 0, "limit": 500})).await
            })
        })
        .collect();
    // node2 takes over; a second send is acknowledged.
    let second = alice.send_params(&bob, &mid(2), false);
    eventually("a send acknowledged by the next owner", Duration::from_secs(30), || async {
        match via2.try_call("message.send", alice.token(0), &second).await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // SAFETY: as above.
    unsafe { libc::kill(owner, libc::SIGCONT) };
    let mut refused = 0;
    for read in reads {
        match read.await.unwrap() {
            Ok((200, page)) => {
                let ids = message_ids(page["records"].as_array().unwrap());
                assert!(ids.contains(&mid(2)), "a stale read from the paused owner: {ids:?}");
            }
            Ok((503, e)) => {
                assert_eq!(e["error"]["code"], "temporarily_unavailable", "{e}");
                refused += 1;
            }
            Ok(other) => panic!("{other:?}"),
            // Cut when the woken node stopped serving: tried again elsewhere.
            Err(_) => refused += 1,
        }
    }
    eprintln!("{refused} of 8 reads refused or cut");
    assert_eq!(message_ids(&bob.sync_all(&via2, 0).await), [mid(1), mid(2)]);
}

/// A node started while JetStream has no quorum (a fresh cluster before
/// its leaders are elected answers `503 no responders`) waits for it,
/// then serves.
#[actix_rt::test]
async fn a_node_started_before_jetstream_has_leaders_waits_for_them_and_serves() {
    use std::io::BufRead;
    let Some(bin) = nats_server::binary_for_test() else { return };
    let mut cluster = Cluster::start(&bin, 0);
    cluster.nats[1].kill();
    cluster.nats[2].kill();
    /// Kills the node however the test ends.
    struct Node(std::process::Child);
    impl Drop for Node {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut node = Node(
        std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["serve", "--config"])
            .arg(cluster.config(1))
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let started = common::relay::first_line(node.0.stdout.take().unwrap());
    let (tx, lines) = std::sync::mpsc::channel();
    let stderr = node.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[node1] {line}");
            let _ = tx.send(line);
        }
    });
    let wait_line = |needle: &str, within: Duration| {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(_) => {}
                Err(_) => panic!("no log line with {needle:?} within {within:?} (or the node exited)"),
            }
        }
    };
    wait_line("JetStream does not answer yet", Duration::from_secs(30));
    assert!(node.0.try_wait().unwrap().is_none(), "the node waits for JetStream");
    for n in [1, 2] {
        cluster.nats[n].restart().unwrap();
    }
    wait_line("serving the shard", Duration::from_secs(60));
    let line = started.recv_timeout(Duration::from_secs(10)).expect("the node announces its front");
    let c = Client::with_timeout(line.rsplit(' ').next().unwrap(), Duration::from_secs(20));
    let alice = User::register(&c, RELAY, 1, true).await;
    let bob = User::register(&c, RELAY, 2, true).await;
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
}

/// Every node that may serve a shard keeps a copy following its log, one
/// that never served it too (docs/cluster.md *Standbys follow the stream*):
/// its takeover then catches up the last moments, never lays a whole copy.
/// Each copy's record (`<stream>_COPIES`, key = node) says how far it is.
#[actix_rt::test]
async fn every_standby_keeps_a_copy_that_follows_the_log_even_one_that_never_served() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let mut cluster = Cluster::start(&bin, 3);
    let senders = Senders::start(&cluster, 2).await;
    senders.wait_acks(&mut cluster, 60, "sends for the standbys to follow").await;
    let owner = cluster.owner().expect("an owner");
    let stream = cluster.shard().stream;
    let client = async_nats::connect(relay_actors::store::server_addrs(&cluster.urls()).unwrap()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let last = js.get_stream(&stream).await.unwrap().get_info().await.unwrap().state.last_sequence;
    let standbys: Vec<usize> = (0..cluster.nodes.len()).filter(|&i| i != owner).collect();
    eventually("every standby's copy reaches what the log held", Duration::from_secs(60), || async {
        let records = js.get_key_value(format!("{stream}_COPIES")).await.map_err(|e| e.to_string())?;
        let mut behind = Vec::new();
        for &i in &standbys {
            let node = format!("node{}", i + 1);
            let at = records.get(&node).await.map_err(|e| e.to_string())?;
            let at: u64 = at.and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok()).unwrap_or(0);
            if at < last {
                behind.push(format!("{node} at {at}"));
            }
        }
        behind.is_empty().then_some(()).ok_or(format!("{behind:?} of {last}"))
    })
    .await;
    // Laid without `fdatasync`, each copy names this boot until a clean
    // stop has synced it whole (`store/copy.rs`).
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok().map(|b| b.trim().to_owned());
    let root = cluster.dir.path().to_path_buf();
    let marker = |i: usize| {
        let copy = root.join(format!("node{}", i + 1)).join("shards").join(&stream);
        let generation = std::fs::read_dir(&copy).unwrap().flatten().map(|e| e.path()).find(|p| p.is_dir());
        generation.and_then(|g| std::fs::read_to_string(g.join("unsynced-since-boot")).ok())
    };
    let standby = standbys[0];
    if let Some(boot) = &boot {
        assert_eq!(marker(standby).as_deref().map(str::trim), Some(boot.as_str()), "a following copy names the boot");
    }
    senders.finish_and_verify(&mut cluster).await;
    assert!(cluster.nodes[standby].terminate().success());
    assert_eq!(marker(standby), None, "a copy stopped cleanly is synced whole: no marker");
}

/// A method call at `front`: its status, `content-type`, `vary` and body.
async fn answer_at(front: &str, path: &str, token: Option<&str>, body: &Value) -> (u16, Vec<String>, Value) {
    let http = awc::Client::builder().timeout(Duration::from_secs(20)).finish();
    let mut req = http.post(format!("{front}{path}")).content_type("application/json");
    if let Some(t) = token {
        req = req.insert_header(("Authorization", format!("Bearer {t}")));
    }
    let mut resp = req.send_body(body.to_string()).await.expect("answer");
    let headers = ["content-type", "vary"]
        .iter()
        .map(|h| resp.headers().get(*h).map_or(String::new(), |v| v.to_str().unwrap().to_owned()))
        .collect();
    let bytes = resp.body().await.expect("body");
    (resp.status().as_u16(), headers, serde_json::from_slice(&bytes).expect("JSON"))
}

/// A front whose own node serves a request's shard has that shard's core
/// answer it in process, never sending it to the node's own internal
/// address (`relay_cluster_front_in_process` counts each one), and the
/// answer is the one the owner gives the same request passed on over the
/// hop by the other node's front: successes, errors and calls with a
/// session alike.
#[actix_rt::test]
async fn a_front_answers_in_process_for_the_shards_its_node_serves_and_the_same_as_over_the_hop() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let cluster = Cluster::start_sharded(&bin, 2, "", 100_000, 2);
    let owners = cluster.shared_out("the two shards served, one per node").await;
    let c = Client::with_timeout(&cluster.nodes[0].url, Duration::from_secs(20));
    let (alice, bob) = one_per_shard(&c).await;
    same_in_process_as_over_the_hop(&cluster, &owners, &c, &alice, &bob).await;
}

/// With one shard too (its front was a byte pipe to the owner before): the
/// owner's own front answers in process, the other node's over the hop,
/// the same.
#[actix_rt::test]
async fn a_one_shard_owners_front_answers_in_process_and_the_same_as_over_the_hop() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let cluster = Cluster::start_sharded(&bin, 2, "", 100_000, 1);
    let owners = eventually("the shard served", Duration::from_secs(60), || async {
        let owners = cluster.shard_owners().await;
        owners[0].map(|_| owners.clone()).ok_or("no owner yet".to_owned())
    })
    .await;
    let c = Client::with_timeout(&cluster.nodes[1].url, Duration::from_secs(20));
    let alice = User::register(&c, RELAY, 1, true).await;
    let bob = User::register(&c, RELAY, 2, true).await;
    same_in_process_as_over_the_hop(&cluster, &owners, &c, &alice, &bob).await;
}

/// Alice sends to Bob through `c`; then the same calls, for each of them,
/// at the front of their shard's owner and at the other node's: the same
/// answers, and only the owner's front counts them as in process.
async fn same_in_process_as_over_the_hop(
    cluster: &Cluster,
    owners: &[Option<usize>],
    c: &Client,
    alice: &User,
    bob: &User,
) {
    let fronts: Vec<String> = cluster.nodes.iter().map(|n| n.url.clone()).collect();
    c.ok("message.send", alice.token(0), &alice.send_params(bob, &mid(1), false)).await;
    let node_metrics: Vec<Client> = (0..2).map(|i| Client::new(&format!("http://{}", cluster.metrics[i]))).collect();
    let in_process = |i: usize| {
        let m = &node_metrics[i];
        async move { m.metric("relay_cluster_front_in_process_total").await.unwrap_or(0.0) }
    };
    let before = [in_process(0).await, in_process(1).await];
    let mut expected = [0.0, 0.0];
    for user in [alice, bob] {
        let shard = relay_core::shard::of(user.id(), owners.len() as u32);
        let owner = owners[shard as usize].expect("an owner");
        let unknown = if owners.len() > 1 { format!("s{shard}.not-a-session") } else { "not-a-session".into() };
        let sync = json!({"after": 0, "limit": 10});
        let calls: [(&str, Option<&str>, Value); 4] = [
            ("/v1/rpc/route.get", None, json!({"account_id": user.id()})),
            ("/v1/rpc/message.timeline.sync", user.token(0), sync.clone()),
            ("/v1/rpc/message.timeline.sync", Some(&unknown), sync),
            ("/v1/relay/route.get", None, json!({"account_id": user.id()})),
        ];
        for (path, token, body) in calls {
            let here = answer_at(&fronts[owner], path, token, &body).await;
            let there = answer_at(&fronts[1 - owner], path, token, &body).await;
            assert_eq!(here, there, "{path} in process and over the hop");
            expected[owner] += 1.0;
        }
    }
    let after = [in_process(0).await, in_process(1).await];
    assert_eq!([after[0] - before[0], after[1] - before[1]], expected, "each node's own shard's calls, in process");
    assert_eq!(message_ids(&bob.sync_all(c, 0).await), [mid(1)]);
}

/// Shard `k`'s owner's internal address, as its lease names it.
async fn internal_of(cluster: &Cluster, k: u32) -> String {
    let client = async_nats::connect(relay_actors::store::server_addrs(&cluster.urls()).unwrap()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let leases = js.get_key_value(format!("RELAY_{}_LEASE_S{k}", RELAY.replace('-', "_"))).await.unwrap();
    let value = leases.get(format!("shard-{k}")).await.unwrap().expect("a lease");
    String::from_utf8_lossy(&value).split(' ').nth(1).expect("an address").to_owned()
}

/// The headers of a sibling shard's call: its relay id and the sibling's mark.
const SIBLING: [(&str, &str); 2] = [("Relay-Id", RELAY), (relay::cluster::hop::SIBLING_HEADER, "1")];

/// A client of the cluster's internal hop, holding its key (from the
/// cluster's secret file), as a sibling shard calls over it.
fn over_the_hop(cluster: &Cluster) -> awc::Client {
    let secret = std::fs::read_to_string(cluster.dir.path().join("cluster.secret")).unwrap();
    let hop = relay::cluster::hop::Hop::from_secret(secret.lines().next().unwrap().trim().as_bytes()).unwrap();
    awc::Client::builder()
        .timeout(Duration::from_secs(20))
        .connector(awc::Connector::new().rustls_0_23(hop.client))
        .finish()
}

/// POSTs `body` to `url` with `headers` through `http`: status and JSON.
async fn post_with(http: &awc::Client, url: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let mut req = http.post(url).content_type("application/json");
    for (name, value) in headers {
        req = req.insert_header((*name, *value));
    }
    let mut resp = req.send_body(body.to_owned()).await.expect("answer");
    let bytes = resp.body().await.expect("body");
    (resp.status().as_u16(), serde_json::from_slice(&bytes).expect("JSON"))
}

/// Two accounts of a two-shard cluster, one in each shard.
async fn one_per_shard(c: &Client) -> (User, User) {
    let mut users: Vec<User> = Vec::new();
    for seed in 1..=40 {
        let user = User::register(c, RELAY, seed, true).await;
        if users.iter().all(|u| relay_core::shard::of(u.id(), 2) != relay_core::shard::of(user.id(), 2)) {
            users.push(user);
        }
        if users.len() == 2 {
            break;
        }
    }
    let bob = users.pop().expect("accounts in both shards");
    (users.pop().expect("accounts in both shards"), bob)
}

/// With `cluster.secret_file`, sibling shards call each other without an
/// Ed25519 signature per call: an owner takes a relay call marked as a
/// sibling's (`relay-cluster-sibling`) on a hop connection whose client
/// proved it holds the cluster's key. Without the mark a signature is
/// needed, as from any peer, and the mark sent to the public front is
/// dropped there: refused. Sends between the shards go that way.
#[actix_rt::test]
async fn an_unsigned_sibling_call_is_taken_over_the_hop_with_the_clusters_key_and_refused_elsewhere() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let cluster = Cluster::start_sharded(&bin, 1, "", 100_000, 2);
    cluster.shared_out("both shards served").await;
    let front = &cluster.nodes[0].url;
    let c = Client::with_timeout(front, Duration::from_secs(20));
    let (alice, bob) = one_per_shard(&c).await;
    let at = internal_of(&cluster, relay_core::shard::of(alice.id(), 2)).await;
    let over_hop = over_the_hop(&cluster);
    let params = json!({"account_id": alice.id()}).to_string();
    let internal = format!("https://{at}/v1/relay/route.get");
    let (status, route) = post_with(&over_hop, &internal, &SIBLING, &params).await;
    assert_eq!((status, route["account_id"].as_str()), (200, Some(alice.id())), "{route}");
    let (status, refused) = post_with(&over_hop, &internal, &SIBLING[..1], &params).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (401, Some("unauthorized")), "unmarked, unsigned");
    let plain = awc::Client::builder().timeout(Duration::from_secs(20)).finish();
    let (status, refused) = post_with(&plain, &format!("{front}/v1/relay/route.get"), &SIBLING, &params).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (401, Some("unauthorized")), "marked at the front");
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(message_ids(&bob.sync_all(&c, 0).await), [mid(1)]);
}

/// Without `cluster.secret_file` the internal listener is plain HTTP and
/// proves nobody: a call marked as a sibling's is refused there unless
/// signed, and the siblings sign theirs as before.
#[actix_rt::test]
async fn without_the_cluster_secret_a_sibling_call_needs_its_signature() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let cluster = Cluster::start_all(&bin, 1, "", 100_000, 2, false);
    cluster.shared_out("both shards served").await;
    let c = Client::with_timeout(&cluster.nodes[0].url, Duration::from_secs(20));
    let (alice, bob) = one_per_shard(&c).await;
    let at = internal_of(&cluster, relay_core::shard::of(alice.id(), 2)).await;
    let plain = awc::Client::builder().timeout(Duration::from_secs(20)).finish();
    let params = json!({"account_id": alice.id()}).to_string();
    let (status, refused) = post_with(&plain, &format!("http://{at}/v1/relay/route.get"), &SIBLING, &params).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (401, Some("unauthorized")), "{refused}");
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(message_ids(&bob.sync_all(&c, 0).await), [mid(1)]);
}

/// Receipts between shards are batched as a peer's are: each shard's
/// deliveries to a sibling queue behind the calls in flight to it (one
/// here) and go as one `message.deliver.batch`, unsigned over the hop. The
/// owner answers each item of a sibling's batch as that item alone would
/// be answered (an item for another shard as at the wrong owner, an item
/// sent again with its stored answer, so any item may be retried singly),
/// and a real peer's batch is still `not_found` at a cluster of several
/// shards, which it then sends singly.
#[actix_rt::test]
async fn deliveries_between_shards_go_as_batches_answered_item_by_item_as_single_calls() {
    use relay_schemas::client::{Account, Device};
    use relay_schemas::encoding::b64_encode;
    let Some(bin) = nats_server::binary_for_test() else { return };
    let peer_key = ed25519_dalek::SigningKey::from_bytes(&[42; 32]);
    let extra = format!(
        "[delivery]\nbatches_in_flight = 1\n\
         [[peers]]\nid = \"relay-t\"\nurl = \"http://127.0.0.1:9\"\npublic_key = \"{}\"\n",
        b64_encode(peer_key.verifying_key().as_bytes())
    );
    let cluster = Cluster::start_sharded(&bin, 1, &extra, 100_000, 2);
    cluster.shared_out("both shards served").await;
    let front = &cluster.nodes[0].url;
    let c = Client::with_timeout(front, Duration::from_secs(30));
    let (alice, bob) = one_per_shard(&c).await;
    let at = internal_of(&cluster, relay_core::shard::of(bob.id(), 2)).await;
    let over_hop = over_the_hop(&cluster);
    let batches_at_bob = || async {
        let mut resp = over_hop.get(format!("https://{at}/metrics")).send().await.expect("metrics");
        let text = String::from_utf8(resp.body().limit(16 << 20).await.expect("metrics").to_vec()).unwrap();
        text.lines()
            .filter(|l| l.contains(r#"method="relay/message.deliver.batch""#) && l.contains(r#"code="ok""#))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = batches_at_bob().await;
    let sends = (1..=40).map(|n| {
        let (c, alice, params) = (&c, &alice, alice.send_params(&bob, &mid(n), false));
        async move { c.ok("message.send", alice.token(0), &params).await }
    });
    for status in futures_util::future::join_all(sends).await {
        assert_eq!(status["status"], "target_accepted", "{status}");
    }
    let mut ids = message_ids(&bob.sync_all(&c, 0).await);
    ids.sort();
    assert_eq!(ids, (1..=40).map(mid).collect::<Vec<_>>(), "each message once");
    assert!(batches_at_bob().await > before, "some of the forty receipts went to bob's shard as a batch");

    // A sibling's batch, item by item.
    let (dave, phone) = (Account::from_seed([67; 32]), Device::from_seed("phone", [167; 32]));
    let deliver = |to: &str, n: u64| {
        json!({"envelope": phone.envelope(&dave.id, to, &mid(n), common::client::now(), b"ciphertext"),
               "recipient_boxes": [{"device_id": "phone", "box": b64_encode(b"box")}],
               "sender_device_certificate": dave.certificate(&phone, common::client::now(), None),
               "sender_route": dave.route(1, &[(RELAY, "http://127.0.0.1:9")], common::client::now())})
    };
    let items = [deliver(bob.id(), 101), deliver(alice.id(), 102), json!({"envelope": 5}), deliver(bob.id(), 101)];
    let url = |method: &str| format!("https://{at}/v1/relay/{method}");
    let batch = json!({ "items": items }).to_string();
    let (status, body) = post_with(&over_hop, &url("message.deliver.batch"), &SIBLING, &batch).await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().expect("results");
    assert_eq!(results[0]["status"], "target_accepted", "{body}");
    assert_eq!(results[3], results[0], "an item sent again: its stored answer");
    let codes: Vec<_> = results[1..3].iter().map(|r| r["error"]["code"].as_str().unwrap_or("-")).collect();
    assert_eq!(codes, ["temporarily_unavailable", "invalid_params"], "{body}");
    let (_, single) = post_with(&over_hop, &url("message.deliver"), &SIBLING, &items[0].to_string()).await;
    assert_eq!(&single, &results[0], "the first item retried alone");
    let records = bob.sync_all(&c, 0).await;
    assert_eq!(message_ids(&records).iter().filter(|m| **m == mid(101)).count(), 1, "delivered once");

    // A real peer's batch, at the front.
    let (status, refused) =
        c.relay_call(RELAY, "relay-t", &peer_key, "message.deliver.batch", &json!({"items": [items[0]]})).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (404, Some("not_found")), "{refused}");
}
