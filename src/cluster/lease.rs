//! The lease task: the shell around `relay_core::lease`. It runs on a
//! thread of its own, with its own runtime and NATS connection, so a busy
//! or blocked relay (restoring deliveries, a slow store) never delays a
//! renewal into a lost lease.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv};
use relay_actors::store::server_addrs;
use relay_core::lease::{self, Answer, Role, Step, Timing};
use tokio::sync::oneshot;

use super::LEASE_KEY;
use crate::config::ClusterSection;

/// After a request that got no answer, before the next one.
const UNREACHABLE_PAUSE: Duration = Duration::from_millis(200);

/// What the lease task tells the node.
pub struct Lease {
    /// The epoch, once this node holds the lease (or why it cannot).
    pub owner: oneshot::Receiver<Result<u64, String>>,
    /// Why the node must stop serving, once it must.
    pub lost: oneshot::Receiver<String>,
}

/// Starts the task: it acquires the lease (as long as it takes), then keeps
/// it until it is lost. `value` names this node and this process.
pub fn start(c: &ClusterSection, bucket: String, value: String) -> Result<Lease, String> {
    let (owner_tx, owner) = oneshot::channel();
    let (lost_tx, lost) = oneshot::channel();
    let (c, timing) = (c.clone(), Timing { ttl: c.lease_ttl.as_millis() as u64, poll: 200 });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    std::thread::Builder::new()
        .name("cluster-lease".into())
        .spawn(move || {
            rt.block_on(async move {
                let leases = match lease_bucket(&c, &bucket).await {
                    Ok(leases) => leases,
                    Err(e) => return drop(owner_tx.send(Err(e))),
                };
                let start = Instant::now();
                let ms = move || start.elapsed().as_millis() as u64;
                let role = acquire(&leases, &value, timing, ms).await;
                if let Role::Owner { epoch, .. } = role {
                    if owner_tx.send(Ok(epoch)).is_ok() {
                        let why = keep(&leases, &value, role, timing, ms).await;
                        let _ = lost_tx.send(why);
                    }
                }
            })
        })
        .map_err(|e| e.to_string())?;
    Ok(Lease { owner, lost })
}

/// The lease bucket, created on first use.
pub async fn lease_bucket(c: &ClusterSection, name: &str) -> Result<kv::Store, String> {
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connection_timeout(Duration::from_secs(5))
        .connect(server_addrs(&c.nats_urls)?)
        .await
        .map_err(|e| format!("cluster.nats_urls: {e}"))?;
    let js = jetstream::new(client);
    if let Ok(store) = js.get_key_value(name).await {
        return Ok(store);
    }
    js.create_key_value(kv::Config {
        bucket: name.to_owned(),
        history: 1,
        max_age: c.lease_ttl,
        storage: jetstream::stream::StorageType::File,
        num_replicas: c.replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| format!("lease bucket {name}: {e}"))
}

/// The lease's current revision if it holds `value` (ours: a write of ours
/// whose answer was lost) and is past `than`.
async fn ours(leases: &kv::Store, value: &str, than: u64) -> Option<u64> {
    let entry = leases.entry(LEASE_KEY).await.ok()??;
    (entry.operation == kv::Operation::Put && entry.value == value.as_bytes() && entry.revision > than)
        .then_some(entry.revision)
}

/// Until this node owns the lease.
async fn acquire(leases: &kv::Store, value: &str, timing: Timing, ms: impl Fn() -> u64) -> Role {
    let (mut role, mut last_try) = (Role::Standby, None);
    loop {
        match lease::next(role, ms(), last_try, timing) {
            Step::Acquire => {
                let sent = ms();
                last_try = Some(sent);
                let answer = match leases.create(LEASE_KEY, value.to_owned().into()).await {
                    Ok(revision) => Answer::Written { revision },
                    Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => match ours(leases, value, 0).await {
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
                    return role;
                }
            }
            Step::WaitUntil { at } => tokio::time::sleep(Duration::from_millis(at.saturating_sub(ms()))).await,
            Step::Renew { .. } | Step::Stop => unreachable!("a standby only acquires or waits"),
        }
    }
}

/// Renews the lease until it is lost; returns why.
async fn keep(leases: &kv::Store, value: &str, mut role: Role, timing: Timing, ms: impl Fn() -> u64) -> String {
    loop {
        let step = lease::next(role, ms(), None, timing);
        match step {
            Step::WaitUntil { at } => tokio::time::sleep(Duration::from_millis(at.saturating_sub(ms()))).await,
            Step::Renew { revision } => {
                let sent = ms();
                let asked = leases.update(LEASE_KEY, value.to_owned().into(), revision);
                let answer = match tokio::time::timeout(Duration::from_millis(timing.renew_every()), asked).await {
                    Ok(Ok(revision)) => Answer::Written { revision },
                    Ok(Err(e)) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                        match ours(leases, value, revision).await {
                            Some(revision) => Answer::Written { revision },
                            None => Answer::Refused,
                        }
                    }
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
            }
            Step::Stop | Step::Acquire => return "cluster: lost the lease (another node may own the relay now)".into(),
        }
    }
}
