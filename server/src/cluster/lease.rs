//! The lease task: the shell around `relay_core::lease`. It runs on a
//! thread of its own, with its own runtime and NATS connection, so a busy
//! or blocked relay (restoring deliveries, a slow store) never delays a
//! renewal into a lost lease.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use relay_actors::store::server_addrs;
use relay_core::lease::{self, Answer, Role, Step, Timing};
use tokio::sync::oneshot;

use crate::config::ClusterSection;

/// After a request that got no answer, before the next one.
const UNREACHABLE_PAUSE: Duration = Duration::from_millis(200);

/// Milliseconds on the process's monotonic clock (it runs on while the
/// process is paused, so a paused owner wakes past its lease): the lease
/// tasks and the cores' [`Serving`] checks read the same one.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Whether this node may answer a shard's requests now: its lease task
/// keeps `relay_core::lease::answers_until` here, the shard's core checks
/// it around every request (`app::App::under_lease`), so an owner paused past its
/// lease answers nothing stale on waking.
#[derive(Clone, Default)]
pub struct Serving(Arc<AtomicU64>);

impl Serving {
    pub fn live(&self) -> bool {
        lease::may_answer(self.0.load(Relaxed), now_ms())
    }

    fn set(&self, role: Role, timing: Timing) {
        self.0.store(lease::answers_until(role, timing), Relaxed);
    }
}

/// One node's tries to take free leases, one at a time: each waits
/// `patience(held)` first and sees the leases the node took before it (so
/// a node starting among others does not take every free shard at once).
pub struct Claims {
    turn: tokio::sync::Mutex<()>,
    /// The leases this node holds: counted here when taken, given back by
    /// the node when it stops serving one.
    pub held: AtomicUsize,
    patience: Box<dyn Fn(usize) -> Duration + Send + Sync>,
}

impl Claims {
    pub fn new(patience: impl Fn(usize) -> Duration + Send + Sync + 'static) -> Self {
        Claims { turn: Default::default(), held: AtomicUsize::new(0), patience: Box::new(patience) }
    }

    /// Waits out the patience for the shards held now, then takes the
    /// turn, unless a lease taken meanwhile asks for more patience. The
    /// wait is outside the turn, so one lease's wait holds up no other.
    async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        loop {
            let waited = (self.patience)(self.held.load(Relaxed));
            tokio::time::sleep(waited).await;
            let turn = self.turn.lock().await;
            if (self.patience)(self.held.load(Relaxed)) <= waited {
                return turn;
            }
        }
    }
}

/// What the lease task tells the node.
pub struct Lease {
    /// The epoch, once this node holds the lease (or why it cannot).
    pub owner: oneshot::Receiver<Result<u64, String>>,
    /// Why the node must stop serving, once it must.
    pub lost: oneshot::Receiver<String>,
    /// Sent by the node once it stopped serving the shard to hand it over:
    /// the task deletes the key, so that another node may take it at once,
    /// and ends.
    pub release: oneshot::Sender<()>,
    /// Until when the lease lets this node answer.
    pub serving: Serving,
}

/// Starts the task: it acquires lease `key` of `bucket` (as long as it
/// takes), then keeps it until it is lost. `value` names this node and this
/// process. Its tries to take the lease take turns with the node's other
/// leases (`claims`). The epoch it reports is counted above `base`
/// (`relay_core::lease::epoch`).
pub fn start(
    c: &ClusterSection,
    bucket: String,
    key: String,
    value: String,
    claims: Arc<Claims>,
    base: u64,
) -> Result<Lease, String> {
    let (owner_tx, owner) = oneshot::channel();
    let (lost_tx, lost) = oneshot::channel();
    let (release, mut released) = oneshot::channel();
    let serving = Serving::default();
    let for_task = serving.clone();
    let (c, timing) = (c.clone(), Timing { ttl: c.lease_ttl.as_millis() as u64, poll: 200 });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name(format!("lease-{key}"))
        .spawn(move || {
            rt.block_on(async move {
                let opened = async { lease_bucket(&connect(&c).await?, &c, &bucket).await };
                let leases = match opened.await {
                    Ok(leases) => leases,
                    Err(e) => return drop(owner_tx.send(Err(e))),
                };
                let lease = Key { leases: &leases, key: &key, value: &value };
                let role = acquire(lease, timing, now_ms, &claims).await;
                if let Role::Owner { epoch, .. } = role {
                    for_task.set(role, timing);
                    if owner_tx.send(Ok(lease::epoch(base, epoch))).is_ok() {
                        let why = keep(lease, role, timing, now_ms, &mut released, &for_task).await;
                        let _ = lost_tx.send(why);
                    }
                }
                for_task.set(Role::Lost, timing);
            })
        })
        .map_err(|e| e.to_string())?;
    Ok(Lease { owner, lost, release, serving })
}

/// A JetStream context on a connection of its own to `cluster.nats_urls`.
pub async fn connect(c: &ClusterSection) -> Result<jetstream::Context, String> {
    let client = c
        .nats_auth()
        .options()
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .connect(server_addrs(&c.nats_urls)?)
        .await
        .map_err(|e| format!("cluster.nats_urls: {e}"))?;
    Ok(jetstream::new(client))
}

/// The lease bucket, created on first use.
pub async fn lease_bucket(js: &jetstream::Context, c: &ClusterSection, name: &str) -> Result<kv::Store, String> {
    bucket(js, c, name, c.lease_ttl).await
}

/// How long a node waits for JetStream to answer about a bucket: a fresh
/// cluster elects its meta leader, then each bucket's stream its own, and
/// answers `503 no responders` until then.
pub const JETSTREAM_WAIT: Duration = Duration::from_secs(60);

/// Between two tries while JetStream has no leader to answer.
const LEADER_POLL: Duration = Duration::from_millis(250);

/// Calls `f` until it succeeds or [`JETSTREAM_WAIT`] is over (then its
/// last error): every failure here is JetStream not answering yet, or an
/// error that waiting does not make worse.
pub async fn patiently<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> Result<T, String> {
    let deadline = Instant::now() + JETSTREAM_WAIT;
    let mut warned = false;
    loop {
        match f().await {
            Ok(done) => return Ok(done),
            Err(e) if Instant::now() < deadline => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %e, "{what}: JetStream does not answer yet; waiting for it");
                }
                tokio::time::sleep(LEADER_POLL).await;
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

/// KV bucket `name` (created on first use), whose entries expire `max_age`
/// after their last write (never when zero).
pub async fn bucket(
    js: &jetstream::Context,
    c: &ClusterSection,
    name: &str,
    max_age: Duration,
) -> Result<kv::Store, String> {
    patiently(&format!("bucket {name}"), || async {
        if let Ok(store) = js.get_key_value(name).await {
            return Ok(store);
        }
        js.create_key_value(kv::Config {
            bucket: name.to_owned(),
            history: 1,
            max_age,
            storage: jetstream::stream::StorageType::File,
            num_replicas: c.replicas,
            ..Default::default()
        })
        .await
    })
    .await
}

/// One lease: its bucket, its key and the value this node writes there.
#[derive(Clone, Copy)]
struct Key<'a> {
    leases: &'a kv::Store,
    key: &'a str,
    value: &'a str,
}

/// The lease's current revision if it holds our value (a write of ours
/// whose answer was lost) and is past `than`.
async fn ours(l: Key<'_>, than: u64) -> Option<u64> {
    let entry = l.leases.entry(l.key).await.ok()??;
    (entry.operation == kv::Operation::Put && entry.value == l.value.as_bytes() && entry.revision > than)
        .then_some(entry.revision)
}

/// Until this node owns the lease.
async fn acquire(l: Key<'_>, timing: Timing, ms: impl Fn() -> u64, claims: &Claims) -> Role {
    let (mut role, mut last_try) = (Role::Standby, None);
    loop {
        match lease::next(role, ms(), last_try, timing) {
            Step::Acquire => {
                let _turn = claims.turn().await;
                let sent = ms();
                last_try = Some(sent);
                let answer = match l.leases.create(l.key, l.value.to_owned().into()).await {
                    Ok(revision) => Answer::Written { revision },
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => match ours(l, 0).await {
                        Some(revision) => Answer::Written { revision },
                        None => Answer::Refused,
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "lease: could not reach the bucket");
                        Answer::Unreachable
                    }
                };
                role = lease::observe(role, Step::Acquire, answer, sent);
                if matches!(role, Role::Owner { .. }) {
                    // Counted before the turn passes: the next try sees it.
                    claims.held.fetch_add(1, Relaxed);
                    return role;
                }
            }
            Step::WaitUntil { at } => tokio::time::sleep(Duration::from_millis(at.saturating_sub(ms()))).await,
            Step::Renew { .. } | Step::Stop => unreachable!("a standby only acquires or waits"),
        }
    }
}

/// Renews the lease until it is lost or released; returns why.
async fn keep(
    l: Key<'_>,
    mut role: Role,
    timing: Timing,
    ms: impl Fn() -> u64,
    released: &mut oneshot::Receiver<()>,
    serving: &Serving,
) -> String {
    loop {
        let step = lease::next(role, ms(), None, timing);
        match step {
            Step::WaitUntil { at } => {
                let wait = tokio::time::sleep(Duration::from_millis(at.saturating_sub(ms())));
                tokio::select! {
                    _ = wait => {}
                    // Dropped without a send (the node is exiting): keep
                    // renewing until the process ends.
                    Ok(()) = &mut *released, if !released.is_terminated() => {
                        serving.set(Role::Lost, timing);
                        if let Role::Owner { revision, .. } = role {
                            // Expecting our revision: never deletes a successor's key.
                            if let Err(e) = l.leases.delete_expect_revision(l.key, Some(revision)).await {
                                tracing::warn!(key = l.key, error = %e, "lease: could not release (it expires)");
                            }
                        }
                        return format!("released the lease {}", l.key);
                    }
                }
            }
            Step::Renew { revision } => {
                let sent = ms();
                let asked = l.leases.update(l.key, l.value.to_owned().into(), revision);
                let answer = match tokio::time::timeout(Duration::from_millis(timing.renew_every()), asked).await {
                    Ok(Ok(revision)) => Answer::Written { revision },
                    Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => match ours(l, revision).await {
                        Some(revision) => Answer::Written { revision },
                        None => Answer::Refused,
                    },
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "lease renewal failed");
                        Answer::Unreachable
                    }
                    Err(_) => Answer::Unreachable,
                };
                if answer == Answer::Unreachable {
                    tokio::time::sleep(UNREACHABLE_PAUSE).await;
                }
                role = lease::observe(role, step, answer, sent);
                serving.set(role, timing);
            }
            Step::Stop | Step::Acquire => {
                serving.set(Role::Lost, timing);
                return format!("cluster: lost the lease {} (another node may own the shard now)", l.key);
            }
        }
    }
}
