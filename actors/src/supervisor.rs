//! The supervisor: creates account actors on demand (passivated ones
//! rehydrate from snapshot + tail), carries out the process manager of
//! `message.send`, owns the retry timetable's timers and restores them on
//! start from the due-time index of in-flight deliveries.
//!
//! `message.send` ([`Supervisor::message_send`]): the order of its commits
//! and the rules between them are
//! `relay_core::account::method::message_send::SendProcess`; this carries
//! out each step with the actors, the route lookup and the store.
//!
//! **Recipient served by this relay alone** (two commits): the sender's
//! account decides and writes nothing; the recipient's account takes the
//! receipt (commit 1); the sender's account writes the acceptance and its
//! final status together (commit 2), and the client is answered once
//! commit 2 is durable, which covers commit 1 (one writer, groups durable
//! in commit order). No delivery stream, due entry or delivery actor. A
//! crash between the two leaves a receipt without an acceptance: the
//! client, never answered, retries with the same params; the recipient
//! answers the duplicate with its original result and the sender settles
//! then. If the local attempt does not end at once (the recipient's actor
//! busy, a retryable or route error), the acceptance is written with a
//! delivery stream and the timetable takes over, as for any other relay.
//!
//! **Recipient elsewhere** (two commits when the first attempt ends it):
//! the acceptance carries the delivery stream, its due entry and, when the
//! route is known, the first attempt; the delivery actor starts from it in
//! memory, sends once it is durable, and writes the outcome, the sender's
//! status and ledger entry and the due-index removal as one commit.

use crate::account::{self, actor::Answer, AccountActor, AccountCmd, Reply};
use crate::delivery::{self, actor::DeliveryActor, LocalFuture, Recorded, ReportOutcome, Transport};
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::routes::RouteBook;
use crate::sessions::Sessions;
use crate::store::Store;
use actix::prelude::*;
use dashmap::DashMap;
use relay_core::account::method::message_deliver::checks_sender_here;
use relay_core::account::method::message_send::{Input, Next, SendProcess};
use relay_core::clock::SharedClock;
use relay_core::delivery::due::{DueQueue, Starts};
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::route_lookup::{self, RouteLookup};
use relay_core::policy::Policy;
use relay_schemas::methods::SendParams;
use relay_schemas::objects::{DeliveryStatus, RelayRef, Route, Wire};
use relay_schemas::{RelayError, UnixMillis};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;
use tokio::sync::oneshot;

use crate::shell::internal;

/// A resident account actor and its last use (a stamp of `Inner::uses`).
struct Resident {
    addr: Addr<AccountActor>,
    used: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Inner {
    store: Store,
    policy: Arc<Policy>,
    clock: SharedClock,
    sessions: Sessions,
    notifier: Notifier,
    metrics: Arc<Metrics>,
    /// Attempt slots per destination relay.
    destinations: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    routes: RouteBook,
    transport: Arc<dyn Transport>,
    /// Resident account actors. Sharded (dashmap): every request looks its
    /// account up here, and loading one actor locks only its shard.
    accounts: DashMap<String, Resident>,
    /// The last stamp handed out: a request stamps its account with the
    /// next one, so residents are ordered by last use (`relay_core::resident`).
    uses: AtomicU64,
    /// Arbiters new account actors are spread over by account, so accounts
    /// use every core (the HTTP workers register theirs); none registered:
    /// the caller's arbiter.
    arbiters: std::sync::RwLock<Vec<ArbiterHandle>>,
    deliveries: Mutex<HashMap<String, Addr<DeliveryActor>>>,
    scheduler: OnceLock<Addr<Scheduler>>,
    /// The Web Push sender, when push is on.
    push: Arc<OnceLock<Arc<dyn relay_core::push::PushSink>>>,
    /// The replicator between an account's two home relays, when running.
    replica: Arc<OnceLock<Arc<dyn account::ReplicaSink>>>,
    /// Who writes a signed checkpoint before the sweep prunes (none: the
    /// sweep prunes without one, as in tests of the store alone).
    checkpointer: OnceLock<Arc<dyn Checkpointer>>,
    /// Route lookups at the peers in progress, with who waits for each:
    /// one fetch per account however many ask (single flight).
    lookups: Mutex<HashMap<String, Vec<oneshot::Sender<RouteLookup>>>>,
    /// Recent lookups that found no route (account → (until ms, result)),
    /// so a flood of unknown ids costs the peers one question per id
    /// (`route_lookup::MISS_TTL_MS`).
    misses: quick_cache::sync::Cache<String, (UnixMillis, RouteLookup)>,
    /// What every account actor shares ([`Supervisor::account_env`]).
    account_env: OnceLock<Arc<account::Env>>,
    /// The one `Ports` every account actor shares ([`AccountPorts`]).
    account_ports: OnceLock<Arc<dyn account::Ports>>,
}

/// Remembered misses at most; past this the least used leave.
const MISS_ENTRIES: usize = 65_536;

fn miss_cache() -> quick_cache::sync::Cache<String, (UnixMillis, RouteLookup)> {
    quick_cache::sync::Cache::new(MISS_ENTRIES)
}

/// Writes a signed checkpoint of the whole store (PROTOCOL §10): the sweep
/// asks for one before it prunes anything, so every pruned event was
/// covered by a checkpoint its peers could witness. Blocking: the sweep
/// calls it off the event loop.
pub trait Checkpointer: Send + Sync + 'static {
    fn checkpoint(&self) -> Result<(), String>;
}

/// Cheap to clone; shared by the transport and every actor.
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

impl Supervisor {
    pub fn new(store: Store, policy: Policy, clock: SharedClock, transport: Arc<dyn Transport>) -> Self {
        Supervisor {
            inner: Arc::new(Inner {
                sessions: Sessions::with_cache_entries(store.clone(), policy.session_cache_entries),
                notifier: Notifier::new(policy.notify_queue),
                metrics: Arc::new(Metrics::default()),
                destinations: Mutex::default(),
                routes: RouteBook::new(store.clone()),
                transport,
                store,
                policy: Arc::new(policy),
                clock,
                accounts: DashMap::new(),
                uses: AtomicU64::new(0),
                arbiters: Default::default(),
                deliveries: Mutex::default(),
                scheduler: OnceLock::new(),
                push: Arc::default(),
                replica: Arc::default(),
                checkpointer: OnceLock::new(),
                lookups: Mutex::default(),
                misses: miss_cache(),
                account_env: OnceLock::new(),
                account_ports: OnceLock::new(),
            }),
        }
    }

    /// Installs the checkpoint writer the sweep calls before pruning.
    /// Later calls are ignored.
    pub fn set_checkpointer(&self, checkpointer: Arc<dyn Checkpointer>) {
        let _ = self.inner.checkpointer.set(checkpointer);
    }

    /// Starts the timer actor on the current arbiter and restores the timers
    /// of every in-flight delivery. Call once, inside an actix system.
    pub fn start(&self) -> Result<usize, RelayError> {
        // Counted here; the scheduler reads back what its bound holds.
        let mut n = 0;
        for kv in self.store().kv_scan_prefix(delivery::DUE_PREFIX) {
            let (key, _) = kv.map_err(|e| internal(&e))?;
            n += usize::from(delivery::parse_due_key(&key).is_some());
        }
        self.metrics().deliveries_in_flight.set(n as i64);
        let metrics = self.metrics().clone();
        self.store().set_group_observer(move |group| {
            metrics.flush_batch.observe(group.commits as f64);
            metrics.flush_seconds.observe(group.took.as_secs_f64());
            metrics.store_commits.inc_by(group.commits);
            metrics.store_groups.inc();
            metrics.store_barriers.inc_by(group.barriers);
            metrics.store_bytes_written.inc_by(group.bytes);
        });
        let addr = Scheduler::new(self.clone()).start();
        let _ = self.inner.scheduler.set(addr);
        Ok(n)
    }

    pub fn store(&self) -> Store {
        self.inner.store.clone()
    }
    pub fn policy(&self) -> Arc<Policy> {
        self.inner.policy.clone()
    }
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }
    pub fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }
    pub fn notifier(&self) -> &Notifier {
        &self.inner.notifier
    }
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// Sets the Web Push sender accounts hand their wake-ups to (once).
    pub fn set_push_sink(&self, sink: Arc<dyn relay_core::push::PushSink>) {
        let _ = self.inner.push.set(sink);
    }

    /// Sets the replicator accounts tell of news for their other home (once).
    pub fn set_replica_sink(&self, sink: Arc<dyn account::ReplicaSink>) {
        let _ = self.inner.replica.set(sink);
    }

    pub fn routes(&self) -> &RouteBook {
        &self.inner.routes
    }
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.inner.transport
    }

    /// The best route this relay knows for `account_id`; with `fresh` (after
    /// a route error, or when none is known) it first asks the peers,
    /// bypassing the cache. A newer valid route from a peer is kept.
    pub async fn resolve_route(&self, account_id: &str, fresh: bool) -> Option<Wire<Route>> {
        self.lookup_route(account_id, fresh).await.route()
    }

    /// Like [`Supervisor::resolve_route`], telling also whether the peers'
    /// answers prove that no relay serves the account. Concurrent lookups
    /// of one account share one fetch; a miss is remembered for a while
    /// (`fresh` lookups, after route errors, bypass that memory).
    pub async fn lookup_route(&self, account_id: &str, fresh: bool) -> RouteLookup {
        let known = self.routes().get(account_id).ok().flatten();
        if !fresh {
            if let Some(route) = known {
                return RouteLookup::Found(route);
            }
            let now = self.clock().now_ms();
            if let Some(miss) = self.inner.misses.get(account_id).filter(|m| route_lookup::miss_remembered(m.0, now)) {
                return miss.1;
            }
        }
        let waiting = {
            let mut lookups = lock(&self.inner.lookups);
            match lookups.get_mut(account_id) {
                Some(waiters) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    Some(rx)
                }
                None => {
                    lookups.insert(account_id.to_owned(), Vec::new());
                    None
                }
            }
        };
        if let Some(rx) = waiting {
            return rx.await.unwrap_or_else(|_| RouteLookup::Unknown("the route lookup was abandoned".into()));
        }
        // This caller fetches for everyone; the guard hands the result to
        // the waiters, or drops them (`Unknown`) if this future is dropped.
        let mut guard = LookupGuard { sup: self, account_id, result: None };
        let result = match self.transport().fetch_route(account_id).await {
            RouteLookup::Found(route) => {
                if let Err(e) = self.routes().offer(&route) {
                    tracing::warn!(account = account_id, error = %e, "cannot keep fetched route");
                }
                RouteLookup::Found(self.routes().get(account_id).ok().flatten().unwrap_or(route))
            }
            miss => match self.routes().get(account_id).ok().flatten() {
                Some(route) => RouteLookup::Found(route),
                None => {
                    let until = route_lookup::miss_remembered_until(self.clock().now_ms());
                    self.inner.misses.insert(account_id.to_owned(), (until, miss.clone()));
                    miss
                }
            },
        };
        guard.result = Some(result.clone());
        result
    }

    /// Number of account actors resident in memory.
    pub fn resident_accounts(&self) -> usize {
        self.inner.accounts.len()
    }

    /// Whether an account is registered on this relay (it has events).
    pub fn account_exists(&self, account_id: &str) -> Result<bool, RelayError> {
        self.store().has_events(&account::stream_id(account_id)).map_err(|e| internal(&e))
    }

    /// PROTOCOL §5 *Who may deliver*: asks the sender's account here to
    /// check the sending device when the core's [`checks_sender_here`] says
    /// so (by `known`, the sender's newest route this relay knows) and the
    /// account is here.
    pub async fn check_sending_device(
        &self,
        envelope: &relay_schemas::objects::MessageEnvelope,
        known: Option<&relay_schemas::objects::Wire<relay_schemas::objects::Route>>,
    ) -> Result<(), RelayError> {
        let checks = checks_sender_here(known, &self.policy().relay_id);
        if checks && self.account_exists(&envelope.from)? {
            let device_id = envelope.from_device_id.clone();
            self.ask(&envelope.from, AccountCmd::CheckSender { device_id }).await?;
        }
        Ok(())
    }

    /// Adds an arbiter (thread) that account actors may live on. Each HTTP
    /// worker registers its own: a request then often finds its account on
    /// the thread that parsed it, and accounts spread over all workers.
    pub fn add_arbiter(&self, arbiter: ArbiterHandle) {
        self.inner.arbiters.write().unwrap_or_else(|e| e.into_inner()).push(arbiter);
    }

    /// The arbiter an account's actor is started on: fixed per account (by
    /// hash) while the set of arbiters is unchanged.
    fn arbiter_for(&self, account_id: &str) -> Option<ArbiterHandle> {
        use std::hash::{Hash, Hasher};
        let arbiters = self.inner.arbiters.read().unwrap_or_else(|e| e.into_inner());
        if arbiters.is_empty() {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        account_id.hash(&mut h);
        Some(arbiters[h.finish() as usize % arbiters.len()].clone())
    }

    /// The resident actor of `account_id`, loaded if it is not. `used`: the
    /// request counts as a use (a retention sweep does not).
    fn account_addr(&self, account_id: &str, used: bool) -> Result<Addr<AccountActor>, RelayError> {
        use dashmap::mapref::entry::Entry;
        let stamp = || self.inner.uses.fetch_add(1, Relaxed) + 1;
        if let Some(r) = self.inner.accounts.get(account_id) {
            if r.addr.connected() {
                if used {
                    r.used.store(stamp(), Relaxed);
                }
                return Ok(r.addr.clone());
            }
        }
        // Not resident: loaded under its shard's lock, so two requests never
        // start two actors for one account.
        let addr = match self.inner.accounts.entry(account_id.to_owned()) {
            Entry::Occupied(o) if o.get().addr.connected() => return Ok(o.get().addr.clone()),
            Entry::Occupied(mut o) => {
                let addr = self.start_account(account_id)?;
                o.insert(Resident { addr: addr.clone(), used: AtomicU64::new(stamp()) });
                addr
            }
            Entry::Vacant(v) => {
                let addr = self.start_account(account_id)?;
                v.insert(Resident { addr: addr.clone(), used: AtomicU64::new(stamp()) });
                addr
            }
        };
        let resident = self.inner.accounts.len();
        self.metrics().actors_resident.set(resident as i64);
        let n = relay_core::resident::to_evict(resident, self.inner.policy.max_resident_accounts);
        if n > 0 {
            self.evict(n, account_id);
        }
        Ok(addr)
    }

    /// Over the cap of resident actors: asks the `n` least recently used
    /// (never `keep`, just loaded) to leave memory now. Each leaves unless
    /// it still owes a reply. Two passes over the residents, no key copied.
    fn evict(&self, n: usize, keep: &str) {
        let mut stamps: Vec<u64> =
            self.inner.accounts.iter().filter(|e| e.key() != keep).map(|e| e.used.load(Relaxed)).collect();
        let Some(cutoff) = relay_core::resident::lru_cutoff(&mut stamps, n) else { return };
        drop(stamps);
        let leaving = self.inner.accounts.iter().filter(|e| e.key() != keep && e.used.load(Relaxed) <= cutoff);
        for entry in leaving.take(n) {
            entry.addr.do_send(account::actor::Evict);
        }
    }

    /// Asks every resident account actor whether it has been idle long
    /// enough to leave memory ([`account::actor::IdleCheck`]).
    fn check_idle(&self) {
        for entry in self.inner.accounts.iter() {
            entry.addr.do_send(account::actor::IdleCheck);
        }
    }

    /// Whether `account_id`'s actor is resident (tests).
    pub fn is_resident(&self, account_id: &str) -> bool {
        self.inner.accounts.get(account_id).is_some_and(|r| r.addr.connected())
    }

    /// The ports every account actor shares ([`AccountPorts`]).
    pub(crate) fn account_ports(&self) -> Arc<dyn account::Ports> {
        self.inner.account_ports.get_or_init(|| Arc::new(AccountPorts(Arc::downgrade(&self.inner)))).clone()
    }

    /// The handles an account actor works with: one `Env` shared by all.
    pub(crate) fn account_env(&self) -> Arc<account::Env> {
        self.inner.account_env.get_or_init(|| Arc::new(self.new_account_env())).clone()
    }

    fn new_account_env(&self) -> account::Env {
        account::Env {
            store: self.store(),
            clock: self.clock().clone(),
            policy: self.policy(),
            routes: self.routes().clone(),
            sessions: self.sessions().clone(),
            notifier: self.notifier().clone(),
            push: self.inner.push.clone(),
            replica: self.inner.replica.clone(),
            metrics: self.metrics().clone(),
        }
    }

    fn start_account(&self, account_id: &str) -> Result<Addr<AccountActor>, RelayError> {
        let ports = self.account_ports();
        let actor = AccountActor::load(self.account_env(), ports, account_id).map_err(|e| internal(&e))?;
        Ok(match self.arbiter_for(account_id) {
            Some(arbiter) => AccountActor::start_in_arbiter(&arbiter, move |_| actor),
            None => actor.start(),
        })
    }

    /// Sends a command to an account's actor, creating it on demand. A
    /// command that raced with passivation is sent again to a fresh actor.
    pub async fn ask(&self, account_id: &str, cmd: AccountCmd) -> Result<Reply, RelayError> {
        self.ask_with(account_id, cmd, Answer::WhenDurable).await
    }

    /// [`Supervisor::ask`] answered at once, before durability: for callers
    /// in this process that answer onwards only after a later durable
    /// write (see [`Answer::AtOnce`]).
    pub(crate) async fn ask_at_once(&self, account_id: &str, cmd: AccountCmd) -> Result<Reply, RelayError> {
        self.ask_with(account_id, cmd, Answer::AtOnce).await
    }

    async fn ask_with(&self, account_id: &str, cmd: AccountCmd, answer: Answer) -> Result<Reply, RelayError> {
        let cmd = Arc::new(cmd);
        for _ in 0..3 {
            let addr = self.account_addr(account_id, true)?;
            self.metrics().actor_messages.inc();
            match addr.send(account::actor::Ask(cmd.clone(), answer)).await {
                Ok(Ok(reply)) => return reply,
                // Raced with passivation: a fresh actor takes it.
                Ok(Err(account::actor::Passivated)) | Err(MailboxError::Closed) => continue,
                Err(MailboxError::Timeout) => return Err(RelayError::unavailable("account busy")),
            }
        }
        Err(RelayError::unavailable("account actor unavailable"))
    }

    /// Hands an account its due retention index entries and waits until
    /// their deletion is durable (`retention::pass`).
    pub(crate) async fn sweep_account(
        &self,
        account_id: &str,
        due: Vec<(relay_core::retention::IndexEntry, Vec<u8>)>,
    ) -> Result<account::sweep::Swept, RelayError> {
        for _ in 0..3 {
            let addr = self.account_addr(account_id, false)?;
            match addr.send(account::actor::Sweep(due.clone())).await {
                Ok(Ok(swept)) => return swept,
                Ok(Err(account::actor::Passivated)) | Err(MailboxError::Closed) => continue,
                Err(MailboxError::Timeout) => return Err(RelayError::unavailable("account busy")),
            }
        }
        Err(RelayError::unavailable("account actor unavailable"))
    }

    pub(crate) fn checkpointer(&self) -> Option<Arc<dyn Checkpointer>> {
        self.inner.checkpointer.get().cloned()
    }

    /// Starts (or joins) the delivery actor of `stream` for an attempt now;
    /// `watch` gets the status after that attempt.
    pub fn start_delivery(&self, stream: &str, watch: Option<oneshot::Sender<DeliveryStatus>>) {
        self.start_delivery_with(stream, watch, false)
    }

    /// `woken`: its destination came back, so the attempt is made now even
    /// though the timetable has it due later (the deadline is unchanged).
    fn start_delivery_with(&self, stream: &str, watch: Option<oneshot::Sender<DeliveryStatus>>, woken: bool) {
        let mut running = lock(&self.inner.deliveries);
        if let Some(addr) = running.get(stream) {
            if addr.connected() {
                if let Some(w) = watch {
                    addr.do_send(delivery::actor::Watch(w));
                }
                return;
            }
        }
        self.metrics().actor_messages.inc();
        match DeliveryActor::load(self.delivery_env(), Arc::new(self.clone()), stream, watch, woken) {
            Ok(actor) => {
                running.insert(stream.to_owned(), actor.start());
            }
            Err(e) => tracing::error!(%stream, error = %e, "cannot load delivery"),
        }
    }

    /// Starts the actor of a delivery just accepted, from the state its
    /// acceptance wrote; `watch` gets the status after its first attempt.
    pub(crate) fn resume_delivery(&self, start: delivery::actor::Start, watch: oneshot::Sender<DeliveryStatus>) {
        let mut running = lock(&self.inner.deliveries);
        let stream = start.stream.clone();
        self.metrics().actor_messages.inc();
        let actor = DeliveryActor::resume(self.delivery_env(), Arc::new(self.clone()), start, Some(watch));
        running.insert(stream, actor.start());
    }

    /// The shared handles a delivery actor reads.
    fn delivery_env(&self) -> delivery::Env {
        delivery::Env {
            store: self.store(),
            clock: self.clock().clone(),
            policy: self.policy(),
            routes: self.routes().clone(),
            transport: self.transport().clone(),
            metrics: self.metrics().clone(),
        }
    }

    /// Arms the timer of `stream`'s next attempt.
    pub fn schedule(&self, stream: String, due_ms: UnixMillis) {
        delivery::Ports::schedule_to(self, stream, due_ms, Vec::new())
    }

    /// Peer `relay_id` is up: it made an authenticated request here, or
    /// answered an attempt. Its deliveries waiting for a later slot (and
    /// those with no route known yet) are started now, at most once per
    /// `wake_min_interval`, through the scheduler's bounded start queue.
    pub fn peer_seen(&self, relay_id: &str) {
        if let Some(s) = self.inner.scheduler.get() {
            s.do_send(PeerSeen { relay: relay_id.to_owned() });
        }
    }

    /// Delivery timers the scheduler holds in memory (at most
    /// `delivery.timers_in_memory`, plus retries set without a write).
    pub async fn timers_in_memory(&self) -> usize {
        match self.inner.scheduler.get() {
            Some(s) => s.send(TimersHeld).await.unwrap_or(0),
            None => 0,
        }
    }

    /// Stops the timer actor: no delivery starts from here again. For tests
    /// that restart a relay in one process over the same store, where the
    /// old relay's timers would otherwise run beside the new one's (a
    /// relay's process ends with its timers).
    pub async fn stop_timers(&self) {
        if let Some(s) = self.inner.scheduler.get() {
            let _ = s.send(StopTimers).await;
        }
    }

    /// Resolves once the timer actor has handled every [`Supervisor::schedule`]
    /// made before this call and every timer [`Supervisor::start`] restored
    /// (its mailbox is first in, first out): those timers are all armed. At
    /// once before `start`. For tests and benchmarks.
    pub async fn timers_armed(&self) {
        if let Some(s) = self.inner.scheduler.get() {
            let _ = s.send(TimersArmed).await;
        }
    }
}

/// A `message.send` answered by the sender's account.
#[derive(Debug)]
pub struct Sent {
    /// The status as written.
    pub status: DeliveryStatus,
    /// For a delivery left running: its status after its first attempt.
    pub first_attempt: Option<oneshot::Receiver<DeliveryStatus>>,
}

impl Supervisor {
    /// `message.send` by `device` of `account` (from the session). Refused
    /// only when the peers' answers prove that no relay serves the
    /// recipient; when some peer could not be asked, the message is
    /// accepted and its route resolved at every attempt (PROTOCOL §4).
    pub async fn message_send(
        &self,
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<Sent, RelayError> {
        // Detached from the caller: a caller that goes away (a closed
        // socket, a timeout) must neither stop the send between its commits
        // nor leave an accepted delivery unstarted.
        let (sup, account) = (self.clone(), account.to_owned());
        let (tx, rx) = oneshot::channel();
        actix::spawn(async move {
            let _ = tx.send(sup.run_send(&account, device, params, digest).await);
        });
        rx.await.unwrap_or_else(|_| Err(RelayError::unavailable("message.send interrupted")))
    }

    /// Carries out each step [`SendProcess`] decides and feeds back what
    /// came of it.
    async fn run_send(
        &self,
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<Sent, RelayError> {
        let (mut process, mut next) = SendProcess::start(account, device, params, digest)?;
        loop {
            let input = match next {
                Next::LookupRoute => {
                    let lookup = self.lookup_route(process.to(), false).await;
                    lookup.check_send(process.to())?;
                    Input::Routed(lookup.route())
                }
                Next::AskSender(cmd) => Input::Replied(self.ask(account, cmd).await?),
                Next::Receive(receipt) => {
                    let outcome = self.receive(process.to(), receipt).await;
                    crate::crash::point("send.after_receipt", || self.store().durable(self.store().committed())).await;
                    delivery::count_attempt(self.metrics(), &outcome);
                    Input::Received(outcome)
                }
                Next::RefuseWhenDurable(e) => {
                    let store = self.store();
                    store.durable(store.committed()).await.map_err(|e| crate::shell::internal(&e))?;
                    return Err(e);
                }
                Next::Answer { reply, finished } => {
                    if let (Some(f), Reply::Settled { status, .. }) = (finished, &reply) {
                        let ids = delivery::Ids { from: &f.from, message_id: &f.message_id, to: &f.to };
                        let elapsed_s = self.clock().now().since(f.accepted_at);
                        delivery::finished(self.metrics(), ids, &self.policy().relay_id, 1, elapsed_s, status);
                    }
                    return self.sent(reply);
                }
            };
            next = process.on(input)?;
        }
    }

    /// The recipient's receipt of a message this relay serves it: its
    /// account's actor, or, for an account of another shard of this relay,
    /// that shard's owner (the receipt is then its own commit, in its own
    /// stream, made before the acceptance here, as locally).
    pub(crate) async fn receive(&self, to: &str, receipt: AccountCmd) -> AttemptOutcome {
        if self.transport().in_sibling_shard(to) {
            let AccountCmd::MessageDeliver { params, .. } = receipt else {
                return AttemptOutcome::NotAttempted(RelayError::internal("a receipt must be a delivery"));
            };
            let own = RelayRef { id: self.policy().relay_id.to_string(), url: String::new() };
            return self.transport().deliver(&own, &params).await;
        }
        match self.ask_at_once(to, receipt).await {
            Ok(Reply::Status(status)) => AttemptOutcome::Answered(status),
            Ok(other) => AttemptOutcome::Unknown(RelayError::internal(format!("unexpected reply {other:?}"))),
            Err(e) => AttemptOutcome::Rejected(e),
        }
    }

    /// Carries out what the sender's account answered: a delivery to start
    /// now (its first attempt is in flight) or at its next due time.
    fn sent(&self, reply: Reply) -> Result<Sent, RelayError> {
        match reply {
            Reply::Status(status) | Reply::Settled { status, .. } => Ok(Sent { status, first_attempt: None }),
            Reply::Accepted { status, start } if start.state.in_flight.is_some() => {
                let (tx, rx) = oneshot::channel();
                self.resume_delivery(*start, tx);
                Ok(Sent { status, first_attempt: Some(rx) })
            }
            Reply::Accepted { status, start } => {
                self.schedule(start.stream, start.indexed_due_ms);
                Ok(Sent { status, first_attempt: None })
            }
            other => Err(RelayError::internal(format!("unexpected reply to message.send: {other:?}"))),
        }
    }
}

/// The account actors' ports: one handle shared by all of them, weak so
/// that the supervisor's state does not hold itself alive.
struct AccountPorts(std::sync::Weak<Inner>);

impl account::Ports for AccountPorts {
    fn passivated(&self, account_id: &str, addr: &Addr<AccountActor>) {
        let Some(inner) = self.0.upgrade() else { return };
        if inner.accounts.remove_if(account_id, |_, r| r.addr == *addr).is_some() {
            inner.metrics.actors_passivated.inc();
            inner.metrics.actors_resident.set(inner.accounts.len() as i64);
        }
    }

    fn schedule(&self, stream: String, due_ms: UnixMillis) {
        if let Some(inner) = self.0.upgrade() {
            Supervisor { inner }.schedule(stream, due_ms)
        }
    }
}

/// Deliveries reach accounts, route lookups and timers through here.
impl delivery::Ports for Supervisor {
    fn delivered_by_other_home(&self, from: &str, message_id: &str) -> bool {
        use relay_core::account::Reads;
        let stream = account::stream_id(from);
        let reads =
            account::StoreReads { store: &self.inner.store, account_id: from, stream: &stream, unfinished: None };
        // Read without loading the account: its ledger may still be in the
        // version 1 layout until its first load moves it.
        let entry = reads.send_entry(message_id).ok().flatten().or_else(|| reads.v1_send_entry(message_id));
        entry.is_some_and(|e| e.status.status == relay_schemas::objects::Status::TargetAccepted)
    }

    fn deliver_local(
        &self,
        to: &str,
        params: relay_schemas::methods::DeliverParams,
        digest: String,
    ) -> LocalFuture<AttemptOutcome> {
        let (sup, to) = (self.clone(), to.to_owned());
        Box::pin(async move {
            let known = match sup.routes().get(&params.envelope.from) {
                Ok(known) => known,
                Err(e) => return AttemptOutcome::Unknown(RelayError::internal(e.to_string())),
            };
            if let Err(e) = sup.check_sending_device(&params.envelope, known.as_ref()).await {
                return AttemptOutcome::Rejected(e);
            }
            sup.receive(&to, AccountCmd::MessageDeliver { params, digest }).await
        })
    }

    fn report(&self, from: &str, outcome: ReportOutcome) -> LocalFuture<Result<Recorded, RelayError>> {
        let (sup, from) = (self.clone(), from.to_owned());
        let ReportOutcome { message_id, status, settlement } = outcome;
        Box::pin(async move {
            match sup
                .ask(&from, AccountCmd::RecordDelivery { message_id: message_id.into(), status, settlement })
                .await?
            {
                Reply::Settled { status, head } => Ok(Recorded { status, head }),
                other => Err(RelayError::internal(format!("unexpected reply {other:?}"))),
            }
        })
    }

    fn lookup_route(&self, account_id: &str, fresh: bool) -> LocalFuture<RouteLookup> {
        let (sup, account_id) = (self.clone(), account_id.to_owned());
        // The inherent lookup, which sends also use.
        Box::pin(async move { Supervisor::lookup_route(&sup, &account_id, fresh).await })
    }

    fn schedule_to(&self, stream: String, due_ms: UnixMillis, destinations: Vec<String>) {
        if let Some(s) = self.inner.scheduler.get() {
            s.do_send(Schedule { stream, due_ms, destinations });
        }
    }

    fn stopping(&self, stream: &str, addr: &Addr<DeliveryActor>) {
        let mut running = lock(&self.inner.deliveries);
        if running.get(stream).is_some_and(|a| a == addr) {
            running.remove(stream);
        }
    }

    fn stopped(&self, stream: &str) {
        let mut running = lock(&self.inner.deliveries);
        if running.get(stream).is_some_and(|a| !a.connected()) {
            running.remove(stream);
        }
    }

    fn destination(&self, relay_id: &str) -> Arc<tokio::sync::Semaphore> {
        lock(&self.inner.destinations)
            .entry(relay_id.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(self.inner.policy.max_in_flight_per_destination)))
            .clone()
    }

    fn peer_seen(&self, relay_id: &str) {
        // The inherent one, which the transport also calls.
        Supervisor::peer_seen(self, relay_id)
    }
}

/// Ends a single-flight route lookup: removes it and answers its waiters
/// (with `Unknown` when the fetching future was dropped half-way).
struct LookupGuard<'a> {
    sup: &'a Supervisor,
    account_id: &'a str,
    result: Option<RouteLookup>,
}

impl Drop for LookupGuard<'_> {
    fn drop(&mut self) {
        let waiters = lock(&self.sup.inner.lookups).remove(self.account_id).unwrap_or_default();
        let result =
            self.result.take().unwrap_or_else(|| RouteLookup::Unknown("the route lookup was abandoned".into()));
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct Schedule {
    stream: String,
    due_ms: UnixMillis,
    destinations: Vec<String>,
}

/// A peer answered: its waiting deliveries may start now ([`Supervisor::peer_seen`]).
#[derive(Message)]
#[rtype(result = "()")]
struct PeerSeen {
    relay: String,
}

/// Answered after every `Schedule` sent before it ([`Supervisor::timers_armed`]).
#[derive(Message)]
#[rtype(result = "()")]
struct TimersArmed;

/// The retry timetable's timers, no polling scan: pending attempts wait in
/// a [`DueQueue`] and one actix timer is armed for the earliest. (A timer
/// per delivery would cost every wake a pass over all of them: actix polls
/// each item of a context on every wake.) Memory per pending delivery is one
/// queue entry, for at most `delivery.timers_in_memory` of them (the
/// earliest; the rest are read back from the store's due index as memory
/// empties, [`DueQueue`]); the delivery's actor exists only while an
/// attempt runs. Due and woken deliveries start through a bounded queue
/// ([`Starts`]), counted in that bound. Restored deliveries' destinations are
/// not in the index: they wait for any peer that comes back, and learn
/// their own at their next attempt.
pub struct Scheduler {
    sup: Supervisor,
    queue: DueQueue,
    /// The armed timer and the due time it is armed for.
    armed: Option<(UnixMillis, SpawnHandle)>,
    /// Deliveries to start, a turn at a time (the core's throttle).
    starts: Starts,
}

impl Scheduler {
    fn new(sup: Supervisor) -> Self {
        let queue = DueQueue::bounded_over_index(sup.policy().timers_in_memory);
        Scheduler { sup, queue, armed: None, starts: Starts::default() }
    }

    /// Reads the store's due index back into memory when the queue has room
    /// for what it spilled. A failed read leaves the queue as it is and is
    /// tried again a second later.
    fn top_up(&mut self, ctx: &mut Context<Self>) -> bool {
        let Some(((due, stream), room)) = self.queue.wants_refill(self.starts.len()) else { return true };
        let from = delivery::due_key(due, stream);
        let mut entries = Vec::with_capacity(room.min(4096));
        let mut rest = None;
        for kv in self.sup.store().kv_scan_from(delivery::DUE_PREFIX, &from) {
            let key = match kv {
                Ok((key, _)) => key,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read the due index; trying again in 1 s");
                    ctx.run_later(Duration::from_secs(1), |act, ctx| act.fire(ctx));
                    return false;
                }
            };
            let Some(entry) = delivery::parse_due_key(&key) else { continue };
            if entries.len() == room {
                rest = Some(entry);
                break;
            }
            entries.push(entry);
        }
        self.queue.refill(entries, rest);
        true
    }

    /// Moves every due delivery to the starts, reading the index back as the
    /// queue empties.
    fn collect_due(&mut self, ctx: &mut Context<Self>) {
        loop {
            let read = self.top_up(ctx);
            let due = self.queue.pop_due(self.sup.clock().now_ms());
            if due.is_empty() && read {
                break;
            }
            self.starts.due(due);
            if !read {
                break;
            }
        }
    }

    /// Arms the timer for the earliest due time, unless it already is.
    fn arm(&mut self, ctx: &mut Context<Self>) {
        let Some(next) = self.queue.next() else { return };
        match self.armed {
            Some((at, _)) if at <= next => return,
            Some((_, handle)) => {
                ctx.cancel_future(handle);
            }
            None => {}
        }
        let delay = next.since(self.sup.clock().now_ms());
        let handle = ctx.run_later(Duration::from_millis(delay), |act, ctx| {
            act.armed = None;
            act.fire(ctx);
        });
        self.armed = Some((next, handle));
    }

    /// Queues every delivery that is due, then arms for the next.
    fn fire(&mut self, ctx: &mut Context<Self>) {
        self.collect_due(ctx);
        self.start_some(ctx);
        self.arm(ctx);
    }

    /// Starts a turn of queued deliveries ([`Starts::turn`]); plans the
    /// next turn if more wait, or if the starts made room to read the
    /// index back.
    fn start_some(&mut self, ctx: &mut Context<Self>) {
        for (stream, woken) in self.starts.turn() {
            self.sup.start_delivery_with(&stream, None, woken);
        }
        if self.starts.plan_next(self.queue.wants_refill(0).is_some()) {
            ctx.run_later(Starts::PAUSE, |act, ctx| {
                act.starts.next_turn_begins();
                // Room made by the starts may let the index be read back.
                act.fire(ctx);
            });
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    /// Restores the timers of the deliveries in flight from the index, and
    /// starts the idle checks of the resident account actors.
    fn started(&mut self, ctx: &mut Self::Context) {
        self.fire(ctx);
        let every = Duration::from_millis((self.sup.inner.policy.passivate_after_ms / 2).max(10));
        ctx.run_interval(every, |act, _| act.sup.check_idle());
    }
}

impl Handler<Schedule> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: Schedule, ctx: &mut Self::Context) {
        // Asked only of a timer about to be left to the index: one the index
        // does not hold (a retry after a failed write) stays in memory.
        let store = self.sup.store();
        let indexed = |due, stream: &str| store.kv_get(&delivery::due_key(due, stream)).is_ok_and(|v| v.is_some());
        self.queue.insert_bounded(msg.due_ms, msg.stream, msg.destinations, self.starts.len(), indexed);
        self.arm(ctx);
    }
}

impl Handler<PeerSeen> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: PeerSeen, ctx: &mut Self::Context) {
        let (now, every) = (self.sup.clock().now_ms(), self.sup.policy().wake_min_interval_ms);
        let woken = self.queue.wake(&msg.relay, now, every);
        if !woken.is_empty() {
            tracing::info!(peer = %msg.relay, deliveries = woken.len(), "peer is back: pending deliveries start now");
            self.starts.woken(woken);
            self.fire(ctx);
        }
    }
}

/// How many delivery timers the scheduler holds in memory (its queue and
/// what waits to start): [`Supervisor::timers_in_memory`].
#[derive(Message)]
#[rtype(result = "usize")]
struct TimersHeld;

impl Handler<TimersHeld> for Scheduler {
    type Result = usize;

    fn handle(&mut self, _: TimersHeld, _: &mut Self::Context) -> usize {
        self.queue.len() + self.starts.len()
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct StopTimers;

impl Handler<StopTimers> for Scheduler {
    type Result = ();

    fn handle(&mut self, _: StopTimers, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<TimersArmed> for Scheduler {
    type Result = ();

    fn handle(&mut self, _: TimersArmed, _: &mut Self::Context) {}
}

#[cfg(test)]
mod tests {
    use super::{miss_cache, RouteLookup, MISS_ENTRIES};
    use relay_schemas::UnixMillis as Ms;

    #[test]
    fn a_hot_route_miss_survives_a_full_cache() {
        let misses = miss_cache();
        misses.insert("hot".into(), (Ms(5_000), RouteLookup::Absent));
        for n in 0..MISS_ENTRIES * 2 {
            misses.insert(format!("cold-{n}"), (Ms(5_000), RouteLookup::Absent));
            assert!(misses.get("hot").is_some(), "evicted after {n} others");
        }
        assert!(misses.len() <= MISS_ENTRIES, "{} misses kept", misses.len());
    }
}
