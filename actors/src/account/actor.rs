//! The account's actix shell: load (snapshot + tail), then every command
//! through the one loop (`Shell::run`), of which this file holds only the
//! account's hooks: the core's [`Aggregate`] deciding (reading the ledger
//! and timeline through `StoreReads`, at the end of this file), the ledger and timeline projections
//! and the deliveries riding in the commit, the notifications owed once
//! durable, the effects; and the reply once durable.

use super::sweep;
use crate::delivery;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::routes::RouteBook;
use crate::sessions::{Session, Sessions};
use crate::shell::{self, internal, EventSourced, Shell, Stream};
use crate::store::{Batch, Head, NewEvent, Store, StoreError, StoredEvent, Ticket};
use actix::prelude::*;
use relay_core::account::ledger::{self, ReceiptEntry, SendEntry};
use relay_core::account::method::push_subscribe::push_targets;
use relay_core::account::method::timeline_replicate as replica;
use relay_core::account::session::{Challenges, Grant};
use relay_core::account::AccountState;
use relay_core::account::{timeline, Ctx, Reads};
use relay_core::account::{AccountEnv, AccountEvent, Decision, Effect, PushSubscription, Reply as Decided, Written};
use relay_core::aggregate::Aggregate;
use relay_core::clock::SharedClock;
use relay_core::delivery::aggregate::{Begun, DeliveryEvent};
use relay_core::policy::Policy;
use relay_core::push::PushSink;
use relay_core::retention::{self, IndexEntry};
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::DeliveryStatus;
use relay_schemas::{RelayError, UnixMillis, UnixSecs};
use serde::de::DeserializeOwned;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The shared handles an account reads and writes directly (cheap to clone).
#[derive(Clone)]
pub struct Env {
    pub store: Store,
    pub clock: SharedClock,
    pub policy: Arc<Policy>,
    /// Where an account's newest route goes when it writes one.
    pub routes: RouteBook,
    /// Session tokens: `session.open` stores one, a revoked device's end.
    pub sessions: Sessions,
    /// Connected devices, told of new records and statuses once durable.
    pub notifier: Notifier,
    /// The Web Push sender, once push is on.
    pub push: Arc<OnceLock<Arc<dyn PushSink>>>,
    /// The replicator, once the relay runs one.
    pub replica: Arc<OnceLock<Arc<dyn ReplicaSink>>>,
    pub metrics: Arc<Metrics>,
}

/// What an account tells whoever keeps the resident actors.
pub trait Ports: Send + Sync + 'static {
    /// Actor `addr` of `account_id` left memory: forget it, unless it was
    /// already replaced.
    fn passivated(&self, account_id: &str, addr: &Addr<AccountActor>);
    /// A delivery this account began for its other home (written with its
    /// due entry) is due at `due_ms`.
    fn schedule(&self, stream: String, due_ms: relay_schemas::UnixMillis);
}

/// Who carries an account's news to its other home relay (`timeline.replicate`).
pub trait ReplicaSink: Send + Sync + 'static {
    /// `account_id` wrote events `partner` has not seen: have it pull.
    fn changed(&self, account_id: &str, partner: &str);
}

pub fn stream_id(account_id: &str) -> String {
    format!("account/{account_id}")
}

/// Every command an account takes ([`relay_core::account::AccountCmd`]),
/// a settling delivery's own writes riding along.
pub type AccountCmd = relay_core::account::AccountCmd<Settlement>;

pub use crate::delivery::Settlement;

/// What a command answers once written: the core's reply, with the
/// delivery stream's head beside a settled status and the delivery to
/// start beside an accepted one.
pub type Reply = relay_core::account::Reply<Stored>;

/// What the account's shell adds to a reply by writing the decision.
#[derive(Debug)]
pub struct Stored;

impl Written for Stored {
    /// The delivery stream's head after a settlement, when one was written.
    type Head = Option<Head>;
    type Start = Box<delivery::actor::Start>;
}

/// What rides in an account's commit besides its own events: a settling
/// delivery's last events and index removal (`RecordDelivery`), or the
/// first events and due entries of deliveries begun (at acceptance, or for
/// the sender's other home).
pub(crate) struct Rides<'a> {
    settlement: Option<&'a Settlement>,
    /// Each begun delivery's stream, its events encoded, its due time.
    begun: Vec<(String, Vec<NewEvent>, Option<UnixMillis>)>,
}

/// The delivery streams' heads after a commit with [`Rides`] (each begun
/// delivery's with its stream, in order).
#[derive(Default)]
pub(crate) struct Heads {
    settled: Option<Head>,
    begun: Vec<(String, Head)>,
}

impl<'a> Rides<'a> {
    fn new<'b>(
        settlement: Option<&'a Settlement>,
        begun: impl Iterator<Item = &'b Begun>,
        now: UnixSecs,
    ) -> Result<Self, RelayError> {
        let begun = begun
            .map(|b| {
                let stream = delivery::stream_id(&b.state.from, &b.state.message_id);
                let encoded = b.events.iter().map(|e| delivery::encode(e, now)).collect::<Result<_, _>>();
                Ok((stream, encoded.map_err(|e| internal(&e))?, b.due_ms))
            })
            .collect::<Result<_, RelayError>>()?;
        Ok(Rides { settlement, begun })
    }
}

impl shell::Rides for Rides<'_> {
    type Written = Heads;

    fn is_empty(&self) -> bool {
        self.settlement.is_none() && self.begun.is_empty()
    }

    fn write(self, batch: &mut Batch) -> Heads {
        let settled = self.settlement.map(|s| {
            if let Some(key) = &s.remove_due {
                batch.kv_remove(key);
            }
            batch.append(&s.stream, s.head, s.events.clone())
        });
        let begun = self
            .begun
            .into_iter()
            .map(|(stream, events, due)| {
                if let Some(due) = due {
                    batch.kv_put(&delivery::due_key(due, &stream), b"");
                }
                let head = batch.append(&stream, Head::default(), events);
                (stream, head)
            })
            .collect();
        Heads { settled, begun }
    }
}

impl Stream for AccountState {
    type Event = AccountEvent;
    const VERSION: u32 = AccountEvent::VERSION;

    fn event_type(event: &AccountEvent) -> &'static str {
        event.event_type()
    }

    fn decode(event: &StoredEvent) -> Result<AccountEvent, StoreError> {
        crate::upcast::account_event(event)
    }

    fn fold(&mut self, event: &AccountEvent) {
        self.apply(event);
    }
}

/// A command on its way to an account actor (shared, so a retry after
/// passivation costs no copy).
pub struct Ask(pub Arc<AccountCmd>, pub Answer);

/// When a command is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Once everything the actor wrote so far is durable: what anyone
    /// outside the process may act on.
    WhenDurable,
    /// At once. Only for callers in this process that report onwards only
    /// after a later durable write, which covers this one (flushes are in
    /// commit order): a local delivery attempt.
    AtOnce,
}

/// The actor had passivated: the command was not handled, and the
/// caller asks a fresh actor.
#[derive(Debug)]
pub struct Passivated;

impl Message for Ask {
    type Result = Result<Result<Reply, RelayError>, Passivated>;
}

pub struct AccountActor {
    /// Shared by every account actor (one `Arc`, not a copy of each handle).
    env: Arc<Env>,
    ports: Arc<dyn Ports>,
    /// The account's stream and state.
    es: EventSourced<AccountState>,
    last_active_ms: UnixMillis,
    passivated: bool,
    /// What it holds only while busy; `None` once nothing in it is owed.
    busy: Option<Box<Busy>>,
    /// The `retention_until` of its last message a retention run covers
    /// (`relay_core::retention::starts_run`); `None` until it writes one,
    /// and after a sweep (which may have ended that run).
    run_until: Option<u64>,
}

/// What an account actor holds only while something is under way or owed,
/// in one allocation made when first needed and dropped when all of it is
/// empty again: a resident idle actor does not carry it (issue 44's budget
/// of heap per idle actor, `actors/tests/actor_heap.rs`).
#[derive(Default)]
struct Busy {
    /// Outstanding session challenges (memory only).
    challenges: Challenges,
    /// Replies still waiting for durability; the actor is not passivated
    /// while any is pending.
    pending: Arc<AtomicUsize>,
    /// Notifications of what was written, in write order with the commit
    /// that wrote it; published, in that order, once that commit is durable.
    outbox: VecDeque<(Ticket, Notice)>,
    /// Its sends under way, as last read or written (memory only).
    unfinished: UnfinishedSends,
}

impl Busy {
    fn owes_nothing(&self) -> bool {
        self.challenges.is_empty()
            && self.outbox.is_empty()
            && self.pending.load(Ordering::SeqCst) == 0
            && self.unfinished.is_empty()
    }
}

/// A notification owed to connected devices for a write.
#[derive(Debug)]
enum Notice {
    /// `sender_device`: the device whose own send wrote the record (it is
    /// not woken by a push for it). `subscribed`: the push targets as the
    /// record was written (filled in by `persist`).
    Timeline {
        sequence: u64,
        visible: Vec<String>,
        sender_device: Option<String>,
        subscribed: Vec<(String, PushSubscription)>,
    },
    Delivery {
        message_id: String,
        status: DeliveryStatus,
    },
}

impl AccountActor {
    /// Rebuilds the account from its snapshot and the events after it.
    pub fn load(env: Arc<Env>, ports: Arc<dyn Ports>, account_id: &str) -> Result<Self, StoreError> {
        let stream = stream_id(account_id);
        let store = env.store.clone();
        let snapshot = store.load_snapshot(&stream)?;
        let (mut state, head) = shell::start(&store, &stream, snapshot.as_ref())?
            .unwrap_or_else(|| (AccountState::new(account_id), Head::default()));
        state.rebuild_caches();
        let mut es = EventSourced::at(stream, state, head);
        es.replay(&store, |_| {})?;
        let (stream, head) = (&es.stream, es.head);
        let layout = super::upgrade::stored_layout(&store, account_id)?.map_err(|what| StoreError::Corrupt {
            stream: stream.clone(),
            seq: head.seq,
            what,
        })?;
        let last_ticket = match layout {
            ledger::Layout::Current => None,
            // A new stream's first events write the current marker.
            _ if head.seq == 0 => None,
            layout => Some(super::upgrade::ledger(&store, stream, account_id, snapshot.as_ref(), layout)?),
        };
        es.last_ticket = last_ticket;
        // The route book may have missed the account's latest route if the
        // relay stopped between the two writes.
        if let Some(route) = es.state.route.as_mut() {
            env.routes.offer(route)?;
            env.routes.share(route);
        }
        Ok(AccountActor {
            last_active_ms: env.clock.now_ms(),
            env,
            ports,
            es,
            passivated: false,
            busy: None,
            run_until: None,
        })
    }

    pub fn state(&self) -> &AccountState {
        &self.es.state
    }

    /// The relays besides this one the account's route names.
    fn partners(&self) -> Vec<String> {
        let own = &self.env.policy.relay_id;
        let relays = self.es.state.route().map(|r| r.relays.as_slice()).unwrap_or_default();
        relays.iter().filter(|r| r.id != **own).map(|r| r.id.clone()).collect()
    }

    /// The account wrote what its other home has not seen: the replicator
    /// has it pull (the page it serves waits for this commit's durability).
    fn tell_partners(&self, mut partners: Vec<String>) {
        let Some(sink) = self.env.replica.get() else { return };
        partners.extend(self.partners());
        partners.sort();
        partners.dedup();
        for partner in partners {
            sink.changed(&self.es.state.account_id, &partner);
        }
    }

    /// What connected devices hear of an event (`written`: the ledger
    /// entry it wrote): a new record (its visible devices), and a sent
    /// message's status (all the account's devices).
    fn notices(e: &AccountEvent, written: Option<&ledger::Entry>) -> impl Iterator<Item = Notice> {
        let sender_device = match e.origin() {
            AccountEvent::MessageSent { .. } | AccountEvent::SelfDelivered { .. } => {
                e.record().map(|r| r.envelope.from_device_id.clone())
            }
            _ => None,
        };
        let timeline = e.record().map(|r| Notice::Timeline {
            sequence: r.sequence,
            visible: r.visible.clone(),
            sender_device: sender_device.clone(),
            subscribed: Vec::new(),
        });
        let delivery = match (e.origin(), written) {
            (
                AccountEvent::MessageSent { .. } | AccountEvent::DeliveryUpdated { .. },
                Some(ledger::Entry::Send { message_id, entry }),
            ) => Some(Notice::Delivery { message_id: message_id.clone(), status: entry.status.clone() }),
            _ => None,
        };
        // Settled at acceptance: the sender's devices hear `delivering` and
        // then the outcome, as when a `delivery_updated` follows.
        let accepted = match (e.origin(), written) {
            (
                AccountEvent::MessageSent { status: Some(_), accepted_at, .. },
                Some(ledger::Entry::Send { message_id, .. }),
            ) => Some(Notice::Delivery {
                message_id: message_id.clone(),
                status: DeliveryStatus::delivering(*accepted_at),
            }),
            _ => None,
        };
        timeline.into_iter().chain(accepted).chain(delivery)
    }

    /// What a decision of this account reads besides its state.
    fn reads(&self) -> StoreReads<'_> {
        StoreReads {
            store: &self.env.store,
            account_id: &self.es.state.account_id,
            stream: &self.es.stream,
            unfinished: self.busy.as_deref().map(|b| &b.unfinished),
        }
    }

    fn busy(&mut self) -> &mut Busy {
        self.busy.get_or_insert_with(Default::default)
    }

    /// Drops what it held while busy once nothing in it is owed.
    fn rest(&mut self) {
        if self.busy.as_ref().is_some_and(|b| b.owes_nothing()) {
            self.busy = None;
        }
    }

    /// The ledger's result of this account's `message.send` of `message_id`.
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError> {
        self.reads().send_entry(message_id)
    }

    /// Writes a snapshot of the current state. A failed snapshot only costs
    /// a longer replay next time.
    fn snapshot(&mut self) {
        self.es.snapshot(&self.env.store);
    }

    /// The reply, sent once everything this actor wrote so far is durable
    /// (so even a duplicate's answer never reports what a crash could undo).
    /// Notifications owed for those writes are published then, by the actor
    /// itself, so they leave in write order.
    /// With [`Answer::AtOnce`] the reply leaves now and only the
    /// notifications wait for durability.
    fn reply_durable(
        &mut self,
        reply: Result<Reply, RelayError>,
        answer: Answer,
        me: Addr<Self>,
    ) -> ResponseFuture<Result<Reply, RelayError>> {
        let ticket = self.es.last_ticket;
        let publish = self.busy.as_ref().is_some_and(|b| !b.outbox.is_empty());
        // Nothing written since it was loaded: nothing to wait for.
        if !publish && (answer == Answer::AtOnce || self.es.last_ticket.is_none()) {
            return Box::pin(async move { reply });
        }
        // Answered at once, the caller asks for a later commit that covers
        // this one (`Answer::AtOnce`); the notifications need not hurry it.
        let wait = self.es.when_durable(&self.env.store, answer != Answer::AtOnce);
        let pending = self.busy().pending.clone();
        pending.fetch_add(1, Ordering::SeqCst);
        let durable = async move {
            let durable = wait.await;
            if let (true, Ok(()), Some(t)) = (publish, &durable, ticket) {
                me.do_send(Publish(t));
            }
            pending.fetch_sub(1, Ordering::SeqCst);
            durable
        };
        if answer == Answer::AtOnce {
            actix::spawn(async move {
                let _ = durable.await;
            });
            return Box::pin(async move { reply });
        }
        Box::pin(async move {
            durable.await?;
            reply
        })
    }

    /// A delivery begun in the commit just made (`written`: its stream and
    /// head), still running: the caller starts its actor. `None` when it
    /// ended at acceptance.
    fn start_delivery(&mut self, begun: Begun, written: Option<&(String, Head)>) -> Result<Option<Reply>, RelayError> {
        let Begun { state, due_ms, .. } = begun;
        let (Some(due), Some((stream, head))) = (due_ms, written) else { return Ok(None) };
        self.env.metrics.deliveries_in_flight.inc();
        let ticket = self.es.last_ticket.ok_or_else(|| RelayError::internal("acceptance without a commit"))?;
        let status = state.status();
        let start = delivery::actor::Start { stream: stream.clone(), head: *head, state, indexed_due_ms: due, ticket };
        Ok(Some(Reply::Accepted { status, start: Box::new(start) }))
    }

    /// A revoked device: its stored sessions end, its sockets close.
    fn end_device(&self, device_id: &str) {
        if let Err(e) = self.env.sessions.forget_device(&self.es.state.account_id, device_id) {
            // Only the stored tokens stay; the account refuses them.
            tracing::warn!(account = %self.es.state.account_id, error = %e, "dropping a revoked device's sessions");
        }
        self.env.notifier.disconnect(&self.es.state.account_id, device_id, "device revoked");
    }

    /// Stores the session `session.open` granted, under the token decided.
    fn store_session(&mut self, token: String, grant: Grant) -> Result<(), RelayError> {
        let session =
            Session { account_id: grant.account_id, device_id: grant.device_id, expires_at: grant.expires_at };
        let store = self.env.store.clone();
        let mut batch = store.batch();
        let sessions = &self.env.sessions;
        let issued = sessions
            .issue(&mut batch, &session, token, self.env.clock.now_ms(), self.env.policy.max_sessions_per_device)
            .map_err(|e| internal(&e))?;
        self.es.last_ticket = Some(store.commit(batch).map_err(|e| e.to_relay_error())?);
        sessions.remember_issued(&issued, session);
        Ok(())
    }

    fn maybe_passivate(&mut self, ctx: &mut Context<Self>) {
        let now_ms = self.env.clock.now_ms();
        let idle = now_ms.since(self.last_active_ms);
        // Expired challenges no longer keep the actor.
        if let Some(busy) = &mut self.busy {
            busy.challenges.expire(now_ms.secs());
            // A resident but quiet actor keeps no spare buffers.
            busy.outbox.shrink_to_fit();
        }
        self.rest();
        let challenges = self.busy.as_ref().is_some_and(|b| !b.challenges.is_empty());
        if relay_core::resident::idle_leaves(idle, self.env.policy.passivate_after_ms, challenges) {
            self.passivate(ctx);
        }
    }

    /// Leaves memory (snapshot first) unless replies or notifications are
    /// still owed; the next command loads the account again.
    fn passivate(&mut self, ctx: &mut Context<Self>) {
        if self.busy.as_ref().is_some_and(|b| b.pending.load(Ordering::SeqCst) != 0 || !b.outbox.is_empty()) {
            return;
        }
        if self.es.since_snapshot > 0 {
            self.snapshot();
        }
        self.leave(ctx);
    }

    fn leave(&mut self, ctx: &mut Context<Self>) {
        self.passivated = true;
        self.ports.passivated(&self.es.state.account_id, &ctx.address());
        ctx.stop();
    }
}

impl AccountActor {
    /// [`push_targets`] on the current state; none without a push
    /// sender.
    fn push_targets(
        &self,
        visible: &[String],
        sender_device: Option<&str>,
        connected: impl Fn(&str) -> bool,
    ) -> Vec<(String, PushSubscription)> {
        if self.env.push.get().is_none() {
            return Vec::new();
        }
        let now = self.env.clock.now();
        push_targets(&self.es.state, visible, sender_device, connected, now)
            .into_iter()
            .map(|(device, subscription)| (device.to_owned(), subscription.clone()))
            .collect()
    }

    /// Hands the push sender a wake-up for each device that may read record
    /// `sequence` and has no open WebSocket (PROTOCOL §9). Only a
    /// subscription the device had when the record was written and still
    /// has (`subscribed`): one made later does not get older records, and
    /// one dropped since gets nothing. Never waits: the sender's queue is
    /// bounded and coalesces.
    fn offer_pushes(
        &self,
        sequence: u64,
        visible: &[String],
        sender_device: Option<&str>,
        subscribed: &[(String, PushSubscription)],
    ) {
        let Some(sink) = self.env.push.get() else { return };
        let (notifier, account) = (&self.env.notifier, &self.es.state.account_id);
        let connected = |device: &str| notifier.is_connected(account, device);
        for (device_id, subscription) in self.push_targets(visible, sender_device, connected) {
            if !subscribed.iter().any(|(d, s)| *d == device_id && *s == subscription) {
                continue;
            }
            sink.offer(relay_core::push::PushJob {
                account_id: account.to_string(),
                device_id,
                sequence,
                subscription,
                attempt: 0,
            });
        }
    }
}

/// What the projections of a commit's events leave for after it: the
/// ledger entry each event wrote, and the partners before the commit when
/// they have news.
pub(crate) struct Projected {
    ledger: Vec<Option<ledger::Entry>>,
    partners_before: Option<Vec<String>>,
    /// [`AccountActor::run_until`] once the commit is written.
    run_until: Option<u64>,
}

/// The account in the one loop: its decisions read the ledger and timeline
/// through [`StoreReads`]; its projections (the timeline and retention
/// indexes, the ledger) and any delivery's writes ride in the commit; what
/// it wrote is owed to connected devices once durable; the effects start
/// deliveries and store sessions.
impl Shell for AccountActor {
    type State = AccountState;
    type Cmd<'c> = AccountCmd;
    type Reply = Decided;
    type Effect = Effect;
    type Projected = Projected;
    type Rides<'c> = Rides<'c>;
    type Written = Heads;
    type Out = Reply;

    fn es(&mut self) -> &mut EventSourced<AccountState> {
        &mut self.es
    }

    fn store(&self) -> Store {
        self.env.store.clone()
    }

    fn now_ms(&self) -> UnixMillis {
        self.env.clock.now_ms()
    }

    fn snapshot_every(&self) -> Option<u64> {
        Some(self.env.policy.snapshot_every)
    }

    fn decide(&mut self, cmd: &AccountCmd, now: UnixMillis) -> Result<Decision, RelayError> {
        let ctx = Ctx::new(now.secs(), &self.env.policy).with_random(rand::random());
        // An actor at rest has no `Busy`: a decision that issues a
        // challenge gets one.
        let mut spare = Challenges::default();
        let (challenges, unfinished) = match self.busy.as_deref_mut() {
            Some(Busy { challenges, unfinished, .. }) => (challenges, Some(&*unfinished)),
            None => (&mut spare, None),
        };
        let reads = StoreReads {
            store: &self.env.store,
            account_id: &self.es.state.account_id,
            stream: &self.es.stream,
            unfinished,
        };
        let decision = self.es.state.decide(cmd, AccountEnv { ctx, reads: &reads, challenges });
        if !spare.is_empty() {
            self.busy().challenges = spare;
        }
        decision
    }

    fn rides<'c>(
        &mut self,
        cmd: &'c AccountCmd,
        _: &[AccountEvent],
        effects: &[Effect],
        now: UnixMillis,
    ) -> Result<Rides<'c>, RelayError> {
        let begun = effects.iter().filter_map(|e| match e {
            Effect::BeginDelivery(b) | Effect::Forward(b) => Some(&**b),
            _ => None,
        });
        Rides::new(cmd.settlement(), begun, now.secs())
    }

    /// The timeline index, the ledger entry and the retention index of
    /// each event, in the events' batch.
    fn project(&mut self, batch: &mut Batch, events: &[AccountEvent]) -> Result<Projected, RelayError> {
        let first = self.es.head.seq + 1;
        let account = &self.es.state.account_id;
        let mut written: Vec<Option<ledger::Entry>> = Vec::with_capacity(events.len());
        let mut run_until = self.run_until;
        for (i, e) in events.iter().enumerate() {
            if let Some(r) = e.record() {
                let entry = timeline::IndexEntry { event: first + i as u64, visible: r.visible.clone() };
                let bytes = serde_json::to_vec(&entry).map_err(|e| internal(&e))?;
                batch.kv_put(&timeline::key(account, r.sequence), &bytes);
            }
            let current = match ledger::changes(e) {
                Some(message_id) => match written.iter().rev().flatten().find_map(|w| match w {
                    ledger::Entry::Send { message_id: m, entry } if m == message_id => Some(entry.clone()),
                    _ => None,
                }) {
                    Some(entry) => Some(entry),
                    None => self.send_entry(message_id)?,
                },
                None => None,
            };
            let entry = ledger::written(account, e, current.as_ref());
            if let Some(w) = &entry {
                batch.blob_put(&w.key(account), &w.value().map_err(|e| internal(&e))?);
                // A message accepted: the sweep finds its traces when they
                // are due, through its run's entry (an entry changed, by a
                // status, is indexed already).
                if current.is_none() {
                    let until = w.retention_until();
                    if retention::starts_run(run_until, until) {
                        batch.kv_put(&retention::index_key(until, account, first + i as u64), retention::DUE);
                    }
                    run_until = Some(until);
                }
            }
            written.push(entry);
        }
        if self.es.head.seq == 0 && !events.is_empty() {
            // A stream begun by this code: its ledger is complete from the start.
            batch.kv_put(&ledger::version_key(account), ledger::VERSION);
        }
        // Partners before this commit too (one the account just left learns
        // the move), looked up only when the partners have news.
        let partners_before = events.iter().any(replica::offered).then(|| self.partners());
        Ok(Projected { ledger: written, partners_before, run_until })
    }

    /// What connected devices are owed for the event, once its commit is durable.
    fn applied(&mut self, n: usize, event: &AccountEvent, ticket: Ticket, projected: &Projected) {
        for mut notice in Self::notices(event, projected.ledger[n].as_ref()) {
            if let Notice::Timeline { visible, sender_device, subscribed, .. } = &mut notice {
                *subscribed = self.push_targets(visible, sender_device.as_deref(), |_| false);
            }
            self.busy().outbox.push_back((ticket, notice));
        }
    }

    /// The sends under way, the route book and the partners learn what
    /// was written.
    fn committed(&mut self, events: &[AccountEvent], projected: Projected) -> Result<(), RelayError> {
        self.run_until = projected.run_until;
        for w in projected.ledger.iter().flatten() {
            if let ledger::Entry::Send { message_id, entry } = w {
                self.busy().unfinished.record(message_id, Some(entry));
            }
        }
        for e in events {
            if let AccountEvent::Registered { route, .. } | AccountEvent::RouteUpdated { route } = e.origin() {
                self.env.routes.offer(route).map_err(|e| e.to_relay_error())?;
            }
        }
        if let Some(partners_before) = projected.partners_before {
            self.tell_partners(partners_before);
        }
        Ok(())
    }

    fn carry_out(&mut self, reply: Decided, effects: Vec<Effect>, heads: Heads) -> Result<Reply, RelayError> {
        let mut started = None;
        let mut begun_heads = heads.begun.iter();
        for effect in effects {
            match effect {
                Effect::BeginDelivery(begun) => started = self.start_delivery(*begun, begun_heads.next())?,
                Effect::Forward(begun) => {
                    let (Some((stream, _)), Some(due)) = (begun_heads.next(), begun.due_ms) else { continue };
                    self.env.metrics.deliveries_in_flight.inc();
                    self.ports.schedule(stream.clone(), due);
                }
                Effect::StoreSession { token, grant } => self.store_session(token.0, grant)?,
                Effect::EndDevice { device_id } => self.end_device(&device_id),
            }
        }
        Ok(match (started, reply) {
            (Some(accepted), _) => accepted,
            (None, Decided::Json(json)) => Reply::Json(json),
            (None, Decided::Status(status)) => Reply::Status(status),
            (None, Decided::Accept(acceptance)) => Reply::Accept(acceptance),
            (None, Decided::Backlog(seq)) => Reply::Backlog(seq),
            (None, Decided::Replica(outcome)) => Reply::Replica(outcome),
            // Settled by a delivery's report, or at acceptance.
            (None, Decided::Settled { status, head: () }) => {
                Reply::Settled { status, head: heads.settled.or(heads.begun.first().map(|(_, head)| *head)) }
            }
            (None, Decided::Accepted { start, .. }) => match start {},
        })
    }
}

impl Actor for AccountActor {
    type Context = Context<Self>;
}

/// Every half `passivate_after`, from whoever keeps the resident actors
/// (one timer for all of them, not one each: an idle actor holds no timer):
/// leave memory if idle that long, and drop what was held while busy.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct IdleCheck;

impl Handler<IdleCheck> for AccountActor {
    type Result = ();

    fn handle(&mut self, _: IdleCheck, ctx: &mut Self::Context) {
        if !self.passivated {
            self.maybe_passivate(ctx);
        }
    }
}

impl Handler<Ask> for AccountActor {
    type Result = ResponseFuture<Result<Result<Reply, RelayError>, Passivated>>;

    fn handle(&mut self, msg: Ask, ctx: &mut Self::Context) -> Self::Result {
        if self.passivated {
            return Box::pin(async { Err(Passivated) });
        }
        self.last_active_ms = self.env.clock.now_ms();
        let reply = self.run(&msg.0);
        // A decision that wrote nothing tells no one outside anything a
        // crash could undo: its caller writes before anyone hears of it.
        let answer = if matches!(reply, Ok(Reply::Accept(_))) { Answer::AtOnce } else { msg.1 };
        let reply = self.reply_durable(reply, answer, ctx.address());
        // No actor outlives a command for an account without events: a
        // stranger's refused request leaves nothing resident.
        // (Nothing was written, so no reply waits on durability.)
        if self.es.head.seq == 0 {
            self.leave(ctx);
        }
        self.rest();
        Box::pin(async move { Ok(reply.await) })
    }
}

/// A retention sweep's turn for this account: `due`, its index entries
/// past their time with their values. Answers once the deletions are
/// durable. Does not count as activity: sweeping keeps no actor resident.
#[derive(Message)]
#[rtype(result = "Result<Result<sweep::Swept, RelayError>, Passivated>")]
pub struct Sweep(pub Vec<(IndexEntry, Vec<u8>)>);

impl Handler<Sweep> for AccountActor {
    type Result = ResponseFuture<Result<Result<sweep::Swept, RelayError>, Passivated>>;

    fn handle(&mut self, msg: Sweep, ctx: &mut Self::Context) -> Self::Result {
        if self.passivated {
            return Box::pin(async { Err(Passivated) });
        }
        let store = self.env.store.clone();
        let sweep = sweep::Sweep {
            store: &store,
            state: &self.es.state,
            stream: &self.es.stream,
            now: self.env.clock.now(),
            policy: &self.env.policy,
        };
        let mut batch = store.batch();
        // A walk that reached the stream's end took its run's entry: the
        // next message starts a run.
        self.run_until = None;
        let done = sweep.run(&mut batch, &msg.0).and_then(|swept| {
            if batch.is_empty() {
                return Ok((swept, None));
            }
            let ticket = store.commit(batch).map_err(|e| e.to_relay_error())?;
            self.es.last_ticket = Some(ticket);
            Ok((swept, Some(ticket)))
        });
        if self.es.head.seq == 0 {
            self.leave(ctx);
        }
        Box::pin(async move {
            Ok(match done {
                Ok((swept, Some(ticket))) => match store.durable(ticket).await {
                    Ok(()) => Ok(swept),
                    Err(e) => Err(e.to_relay_error()),
                },
                Ok((swept, None)) => Ok(swept),
                Err(e) => Err(e),
            })
        })
    }
}

/// Whoever keeps the resident actors is over its cap: leave memory now,
/// however recently used, unless replies or notifications are owed.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Evict;

impl Handler<Evict> for AccountActor {
    type Result = ();

    fn handle(&mut self, _: Evict, ctx: &mut Self::Context) {
        if !self.passivated {
            self.passivate(ctx);
        }
    }
}

/// Everything written up to this commit is durable: publish its notifications.
#[derive(Message)]
#[rtype(result = "()")]
struct Publish(Ticket);

impl Handler<Publish> for AccountActor {
    type Result = ();

    fn handle(&mut self, msg: Publish, _ctx: &mut Self::Context) {
        let Some(mut busy) = self.busy.take() else { return };
        let (notifier, account) = (&self.env.notifier, &self.es.state.account_id);
        while busy.outbox.front().is_some_and(|(t, _)| *t <= msg.0) {
            let Some((_, notice)) = busy.outbox.pop_front() else { break };
            match notice {
                Notice::Timeline { sequence, visible, sender_device, subscribed } => {
                    notifier.timeline_changed(account, sequence, &visible);
                    self.offer_pushes(sequence, &visible, sender_device.as_deref(), &subscribed);
                }
                Notice::Delivery { message_id, status } => notifier.delivery_changed(account, &message_id, &status),
            }
        }
        self.busy = Some(busy);
        self.rest();
    }
}

// The store's side of [`Reads`]: what an account's decision reads besides
// its state, served from the ledger and timeline projections and the
// account's own stream (the actor's own writes included, durable or not).

pub struct StoreReads<'a> {
    pub store: &'a Store,
    pub account_id: &'a str,
    /// The account's stream.
    pub stream: &'a str,
    /// The account actor's memo of its unfinished sends; `None` for a read
    /// from outside the actor.
    pub unfinished: Option<&'a UnfinishedSends>,
}

/// The send entries of an account's sends still under way, as its actor
/// last read or wrote them, absent ones included: the steps of one send
/// (its decision, the settle's or report's decision, and the write of its
/// entry) read the ledger once, not three times. Sound because the actor
/// is the only writer of its account's ledger while it is resident (an
/// upgrade of the ledger's layout runs before it starts), and it records
/// each entry it writes once the commit is made: what the memo holds is
/// what the store holds, durable or not. A send leaves the memo when its
/// entry becomes terminal (a later retry reads the store), and past
/// [`UnfinishedSends::CAPACITY`] the least used leave, so it stays small
/// whatever ids clients send.
#[derive(Debug)]
pub struct UnfinishedSends(RefCell<quick_cache::unsync::Cache<String, Option<SendEntry>>>);

impl Default for UnfinishedSends {
    fn default() -> Self {
        UnfinishedSends(RefCell::new(quick_cache::unsync::Cache::new(Self::CAPACITY)))
    }
}

impl UnfinishedSends {
    pub const CAPACITY: usize = 256;

    fn get(&self, message_id: &str) -> Option<Option<SendEntry>> {
        self.0.borrow().get(message_id).cloned()
    }

    /// Records the ledger's entry of `message_id` as read or just written.
    pub fn record(&self, message_id: &str, entry: Option<&SendEntry>) {
        let mut known = self.0.borrow_mut();
        if entry.is_some_and(|e| e.status.status.is_terminal()) {
            known.remove(message_id);
            return;
        }
        known.insert(message_id.to_owned(), entry.cloned());
    }

    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

impl StoreReads<'_> {
    /// The send entry of an account whose ledger is still in the version 1
    /// layout (not loaded since the upgrade); `None` otherwise.
    pub fn v1_send_entry(&self, message_id: &str) -> Option<SendEntry> {
        let bytes = self.store.kv_get(&ledger::v1::send_key(self.account_id, message_id)).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    fn ledger<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, RelayError> {
        let Some(bytes) = self.store.blob_get(key).map_err(|e| internal(&e))? else { return Ok(None) };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| internal(&e))
    }
}

impl Reads for StoreReads<'_> {
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError> {
        if let Some(known) = self.unfinished.and_then(|u| u.get(message_id)) {
            return Ok(known);
        }
        let entry = self.ledger(&ledger::send_key(self.account_id, message_id))?;
        if let Some(unfinished) = self.unfinished {
            unfinished.record(message_id, entry.as_ref());
        }
        Ok(entry)
    }

    fn receipt_entry(&self, from: &str, message_id: &str) -> Result<Option<ReceiptEntry>, RelayError> {
        self.ledger(&ledger::receipt_key(self.account_id, from, message_id))
    }

    fn timeline_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, timeline::IndexEntry), RelayError>> {
        let from = timeline::key(self.account_id, after.saturating_add(1));
        self.store.kv_scan_from(&timeline::prefix(self.account_id), &from).map(|item| {
            let (key, value) = item.map_err(|e| internal(&e))?;
            let seq = timeline::sequence_of(&key).ok_or_else(|| RelayError::internal("bad timeline key"))?;
            Ok((seq, serde_json::from_slice(&value).map_err(|e| internal(&e))?))
        })
    }

    fn event(&self, seq: u64) -> Result<AccountEvent, RelayError> {
        let after = seq.checked_sub(1).ok_or_else(|| RelayError::internal("no event 0"))?;
        let ev = self
            .store
            .read(self.stream, after)
            .next()
            .ok_or_else(|| RelayError::internal("timeline event missing"))?
            .map_err(|e| internal(&e))?;
        serde_json::from_str(ev.data.get()).map_err(|e| internal(&e))
    }

    fn events_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, AccountEvent), RelayError>> {
        self.store.read(self.stream, after).map(|ev| {
            let ev = ev.map_err(|e| internal(&e))?;
            Ok((ev.seq, crate::upcast::account_event(&ev).map_err(|e| internal(&e))?))
        })
    }

    fn delivery_params(&self, message_id: &str) -> Result<Option<DeliverParams>, RelayError> {
        let stream = crate::delivery::stream_id(self.account_id, message_id);
        let Some(first) = self.store.read(&stream, 0).next() else { return Ok(None) };
        let first = first.map_err(|e| internal(&e))?;
        match crate::upcast::delivery_event(&first).map_err(|e| internal(&e))? {
            DeliveryEvent::Accepted { params, .. } => Ok(Some(*params)),
            _ => Err(RelayError::internal("a delivery stream that does not begin with its acceptance")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::objects::DeliveryStatus;

    fn entry(status: DeliveryStatus) -> SendEntry {
        SendEntry { digest: "d".into(), to: "bob".into(), deadline: 2, retention_until: 3, status, sequence: None }
    }

    #[test]
    fn the_memo_of_unfinished_sends_forgets_a_send_once_its_entry_is_terminal() {
        let memo = UnfinishedSends::default();
        memo.record("m1", None);
        assert_eq!(memo.get("m1"), Some(None), "known absent");
        let delivering = entry(DeliveryStatus::delivering(1));
        memo.record("m1", Some(&delivering));
        assert_eq!(memo.get("m1"), Some(Some(delivering)));
        memo.record("m1", Some(&entry(DeliveryStatus::target_accepted(1))));
        assert_eq!(memo.get("m1"), None, "a finished send is read from the store");
        memo.record("m2", Some(&entry(DeliveryStatus::target_accepted(1))));
        assert_eq!(memo.get("m2"), None);
    }

    #[test]
    fn the_memo_of_unfinished_sends_is_bounded_whatever_ids_are_sent() {
        let memo = UnfinishedSends::default();
        for n in 0..UnfinishedSends::CAPACITY * 3 + 7 {
            memo.record(&format!("m{n}"), None);
            assert!(memo.len() <= UnfinishedSends::CAPACITY);
        }
        // The newest is kept; an id it holds is updated in place.
        let last = format!("m{}", UnfinishedSends::CAPACITY * 3 + 6);
        assert_eq!(memo.get(&last), Some(None));
        let len = memo.len();
        memo.record(&last, Some(&entry(DeliveryStatus::delivering(1))));
        assert_eq!(memo.len(), len);
    }

    #[test]
    fn a_hot_unfinished_send_survives_a_full_memo() {
        let memo = UnfinishedSends::default();
        memo.record("hot", None);
        for n in 0..UnfinishedSends::CAPACITY * 2 {
            memo.record(&format!("m{n}"), None);
            assert_eq!(memo.get("hot"), Some(None), "forgotten after {n} others");
        }
    }
}
