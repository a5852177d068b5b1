//! The thin actix shell around the account core: load (snapshot + tail),
//! read the command's ledger entry, decide, append (with the ledger and
//! timeline projections), apply, reply once durable.

use super::decide::{self, Ctx, ReceiveDecision, SendDecision, SettleDecision};
use super::events::{AccountEvent, PushSubscription};
use super::ledger::{self, ReceiptEntry, SendEntry};
use super::session::{Challenges, Grant};
use super::state::AccountState;
use super::{stream_id, sync, timeline};
use crate::delivery::{self, AttemptOutcome};
use crate::sessions::Session;
use crate::store::{Batch, Head, NewEvent, Snapshot, StoreError, Ticket};
use crate::supervisor::{internal, Supervisor};
use actix::prelude::*;
use relay_schemas::methods::*;
use relay_schemas::objects::Route;
use relay_schemas::{DeliveryStatus, RelayError, Wire};
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Every command an account takes. `device` is the session's device, taken
/// from the authenticated session, never from params. A command that
/// serves a protocol method is named after it (`message.deliver` is
/// `MessageDeliver`); the others are the relay's own.
#[derive(Debug)]
pub enum AccountCmd {
    AccountRegister {
        params: RegisterParams,
        digest: String,
        /// The highest route of the account known here or at the peers.
        known: Option<relay_schemas::Wire<relay_schemas::objects::Route>>,
    },
    SessionChallenge {
        device_id: String,
    },
    SessionOpen {
        params: SessionOpenParams,
    },
    CheckSession {
        device: String,
    },
    /// A `message.deliver` from another relay names this account's device
    /// as the sender: it must be valid here (PROTOCOL §5 *Who may deliver*).
    CheckSender {
        device_id: String,
    },
    DeviceAdd {
        device: String,
        params: DeviceAddParams,
    },
    DeviceRevoke {
        device: String,
        params: DeviceRevokeParams,
    },
    AccountDevicesGet,
    AccountSettingsUpdate {
        device: String,
        params: SettingsUpdateParams,
    },
    RouteGet,
    RouteUpdate {
        device: String,
        params: RouteUpdateParams,
    },
    ContactRevoke {
        device: String,
        params: ContactRevokeParams,
    },
    /// `message.send`. With `route` naming this relay alone, only decides
    /// (writes nothing) and answers [`Reply::Accept`]: the process manager
    /// ([`crate::send`]) delivers first and settles after. Otherwise writes
    /// the acceptance with its delivery (and the first attempt when `route`
    /// is known) and answers [`Reply::Accepted`].
    MessageSend {
        device: String,
        params: SendParams,
        digest: String,
        route: Option<Wire<Route>>,
    },
    /// Writes a decided acceptance with the final status of its delivery,
    /// which ended at once here.
    Settle {
        acceptance: Box<Acceptance>,
        status: DeliveryStatus,
    },
    /// Writes a decided acceptance with its delivery and `first`, the
    /// outcome of the local attempt made before (it did not end it at once).
    Accept {
        acceptance: Box<Acceptance>,
        route: Option<Wire<Route>>,
        first: Option<AttemptOutcome>,
    },
    MessageDeliver {
        params: DeliverParams,
        digest: String,
    },
    /// A delivery's outcome for the sender; with a settlement, the
    /// delivery's own last events and index removal in the same commit.
    RecordDelivery {
        message_id: String,
        status: DeliveryStatus,
        settlement: Option<Settlement>,
    },
    MessageDeliveryStatus {
        device: String,
        message_id: String,
    },
    /// `message.delivery.peer_status` from `peer`, one of this account's home
    /// relays: read-only.
    MessageDeliveryPeerStatus {
        peer: String,
        message_id: String,
    },
    MessageTimelineSync {
        device: String,
        params: SyncParams,
    },
    /// The last sequence the device may read beyond its ack cursor, if any:
    /// what a (re)connecting device has to catch up on.
    Backlog {
        device: String,
    },
    MessageTimelineAck {
        device: String,
        params: AckParams,
    },
    /// `push.subscribe` (shape checked by the transport).
    PushSubscribe {
        device: String,
        params: PushSubscribeParams,
    },
    PushUnsubscribe {
        device: String,
    },
    /// The push service answered 404/410 for this endpoint of the device.
    PushGone {
        device_id: String,
        endpoint: String,
    },
}

/// A `message.send` decided and not yet written: what settling or
/// accepting it writes.
#[derive(Clone, Debug)]
pub struct Acceptance {
    /// The `MessageSent` event.
    pub event: AccountEvent,
    /// `delivering` at `accepted_at`.
    pub status: DeliveryStatus,
    pub deliver: Box<DeliverParams>,
    /// blake3(JCS(deliver params)): the receipt's idempotency key.
    pub deliver_digest: String,
    pub deadline: u64,
}

pub use crate::delivery::Settlement;

/// What a command answers.
#[derive(Debug)]
pub enum Reply {
    /// A serialized result object.
    Json(String),
    Status(DeliveryStatus),
    /// A send decided, nothing written: deliver, then `Settle` or `Accept`.
    Accept(Box<Acceptance>),
    /// A cross-account send was accepted: its delivery is to start (an
    /// effect for the caller; nothing has started it).
    Accepted {
        status: DeliveryStatus,
        start: Box<delivery::actor::Start>,
    },
    /// A delivery outcome recorded; `head`: the delivery stream's head
    /// after its settlement, when one was written.
    Settled {
        status: DeliveryStatus,
        head: Option<Head>,
    },
    /// A device's backlog: the latest record beyond its ack cursor it may
    /// read, if any (never on the wire; the WebSocket attach uses it).
    Backlog(Option<u64>),
}

impl Reply {
    fn empty() -> Self {
        Reply::Json("{}".into())
    }
    fn json<T: serde::Serialize>(v: &T) -> Result<Self, RelayError> {
        serde_json::to_string(v).map(Reply::Json).map_err(|e| internal(&e))
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
/// supervisor asks a fresh actor.
#[derive(Debug)]
pub struct Passivated;

impl Message for Ask {
    type Result = Result<Result<Reply, RelayError>, Passivated>;
}

pub struct AccountActor {
    sup: Supervisor,
    stream: String,
    head: Head,
    state: AccountState,
    since_snapshot: u64,
    last_ticket: Option<Ticket>,
    /// Outstanding session challenges (memory only).
    challenges: Challenges,
    last_active_ms: u64,
    /// Replies still waiting for durability; the actor is not passivated
    /// while any is pending.
    pending: Arc<AtomicUsize>,
    passivated: bool,
    /// Notifications of what was written, in write order with the commit
    /// that wrote it; published, in that order, once that commit is durable.
    outbox: VecDeque<(Ticket, Notice)>,
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
    pub fn load(sup: Supervisor, account_id: &str) -> Result<Self, StoreError> {
        let stream = stream_id(account_id);
        let store = sup.store();
        let snapshot = store.load_snapshot(&stream)?;
        let (mut state, mut head) = match &snapshot {
            Some(snap) => {
                let state: AccountState = serde_json::from_slice(&snap.state).map_err(|e| StoreError::Corrupt {
                    stream: stream.clone(),
                    seq: snap.seq,
                    what: format!("snapshot: {e}"),
                })?;
                (state, Head { seq: snap.seq, hash: snap.hash })
            }
            None => (AccountState::new(account_id), Head::default()),
        };
        state.rebuild_caches();
        let mut since_snapshot = 0;
        for ev in store.read(&stream, head.seq) {
            let ev = ev?;
            let event: AccountEvent = crate::upcast::account_event(&ev)?;
            state.apply(&event);
            head = ev.head();
            since_snapshot += 1;
        }
        let last_ticket = if head.seq > 0 && store.kv_get(&ledger::version_key(account_id))?.is_none() {
            Some(super::upgrade::ledger(&store, &stream, account_id, snapshot.as_ref())?)
        } else {
            None
        };
        // The route book may have missed the account's latest route if the
        // relay stopped between the two writes.
        if let Some(route) = state.route() {
            sup.routes().offer(route)?;
        }
        Ok(AccountActor {
            last_active_ms: sup.clock().now_ms(),
            sup,
            stream,
            head,
            state,
            since_snapshot,
            last_ticket,
            challenges: Challenges::default(),
            pending: Arc::new(AtomicUsize::new(0)),
            passivated: false,
            outbox: VecDeque::new(),
        })
    }

    pub fn state(&self) -> &AccountState {
        &self.state
    }

    fn ctx(&self) -> (u64, Arc<crate::policy::Policy>) {
        (self.sup.clock().now(), self.sup.policy())
    }

    /// Appends `events` (plus whatever `extra` adds to the same atomic batch),
    /// applies them, and remembers the ticket to wait for before replying.
    /// On error nothing is written and nothing changes in memory.
    fn persist(&mut self, events: Vec<AccountEvent>, extra: impl FnOnce(&mut Batch)) -> Result<(), RelayError> {
        let store = self.sup.store();
        let mut batch = store.batch();
        let now = self.sup.clock().now();
        let first = self.head.seq + 1;
        let account = &self.state.account_id;
        let mut new_events = Vec::with_capacity(events.len());
        // The ledger entry each event writes (the projection, in this batch).
        let mut written: Vec<Option<ledger::Entry>> = Vec::with_capacity(events.len());
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
                batch.kv_put(&w.key(account), &w.value().map_err(|e| internal(&e))?);
            }
            written.push(entry);
            new_events.push(NewEvent::new(e.event_type(), AccountEvent::VERSION, now, e).map_err(|e| internal(&e))?);
        }
        if self.head.seq == 0 && !events.is_empty() {
            // A stream begun by this code: its ledger is complete from the start.
            batch.kv_put(&ledger::version_key(account), ledger::VERSION);
        }
        let head = batch.append(&self.stream, self.head, new_events);
        extra(&mut batch);
        let ticket = store.commit(batch).map_err(|e| internal(&e))?;
        self.head = head;
        self.last_ticket = Some(ticket);
        for (e, w) in events.iter().zip(&written) {
            self.state.apply(e);
            for mut n in Self::notices(e, w.as_ref()) {
                if let Notice::Timeline { visible, sender_device, subscribed, .. } = &mut n {
                    *subscribed = self.push_targets(visible, sender_device.as_deref(), |_| false);
                }
                self.outbox.push_back((ticket, n));
            }
        }
        self.since_snapshot += events.len() as u64;
        for e in &events {
            if let AccountEvent::Registered { route, .. } | AccountEvent::RouteUpdated { route } = e {
                self.sup.routes().offer(route).map_err(|e| internal(&e))?;
            }
        }
        if self.since_snapshot >= self.sup.policy().snapshot_every {
            self.snapshot();
        }
        Ok(())
    }

    /// What connected devices hear of an event (`written`: the ledger
    /// entry it wrote): a new record (its visible devices), and a sent
    /// message's status (all the account's devices).
    fn notices(e: &AccountEvent, written: Option<&ledger::Entry>) -> impl Iterator<Item = Notice> {
        let sender_device = match e {
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
        let delivery = match (e, written) {
            (
                AccountEvent::MessageSent { .. } | AccountEvent::DeliveryUpdated { .. },
                Some(ledger::Entry::Send { message_id, entry }),
            ) => Some(Notice::Delivery { message_id: message_id.clone(), status: entry.status.clone() }),
            _ => None,
        };
        timeline.into_iter().chain(delivery)
    }

    fn ledger_get<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, RelayError> {
        let Some(bytes) = self.sup.store().kv_get(key).map_err(|e| internal(&e))? else { return Ok(None) };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| internal(&e))
    }

    /// The ledger's result of this account's `message.send` of `message_id`.
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError> {
        self.ledger_get(&ledger::send_key(&self.state.account_id, message_id))
    }

    /// The ledger's result of the message `(from, message_id)` received here.
    fn receipt_entry(&self, from: &str, message_id: &str) -> Result<Option<ReceiptEntry>, RelayError> {
        self.ledger_get(&ledger::receipt_key(&self.state.account_id, from, message_id))
    }

    /// Writes a snapshot of the current state. A failed snapshot only costs
    /// a longer replay next time.
    fn snapshot(&mut self) {
        let store = self.sup.store();
        let Ok(state) = serde_json::to_vec(&self.state) else { return };
        let mut batch = store.batch();
        batch.put_snapshot(&self.stream, Snapshot { seq: self.head.seq, hash: self.head.hash, state });
        match store.commit(batch) {
            Ok(t) => {
                self.last_ticket = Some(t);
                self.since_snapshot = 0;
            }
            Err(e) => tracing::warn!(stream = %self.stream, error = %e, "snapshot failed"),
        }
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
        let ticket = self.last_ticket;
        let publish = !self.outbox.is_empty();
        if answer == Answer::AtOnce && !publish {
            return Box::pin(async move { reply });
        }
        let wait = ticket.map(|t| self.sup.store().durable(t));
        let pending = self.pending.clone();
        pending.fetch_add(1, Ordering::SeqCst);
        let durable = async move {
            let durable = match wait {
                Some(w) => w.await.map_err(|e| RelayError::unavailable(format!("store: {e}"))),
                None => Ok(()),
            };
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

    fn handle_cmd(&mut self, cmd: &AccountCmd) -> Result<Reply, RelayError> {
        let (now, policy) = self.ctx();
        let ctx = Ctx { now, policy: &policy };
        let session = |device: &str| decide::check_session(&self.state, device, ctx);
        match cmd {
            AccountCmd::AccountRegister { params, digest, known } => {
                let events = decide::register(&self.state, params, digest, known.as_ref(), ctx)?;
                self.persist(events, |_| {})?;
                let route = self.state.route().ok_or_else(|| RelayError::internal("route missing"))?;
                Reply::json(&RegisterResult { account_id: &self.state.account_id, route })
            }
            AccountCmd::SessionChallenge { device_id } => {
                Reply::json(&self.challenges.issue(&self.state, device_id, rand::random(), ctx)?)
            }
            AccountCmd::SessionOpen { params } => {
                let grant = self.challenges.answer(&self.state, params, ctx)?;
                self.open_session(grant, &policy)
            }
            AccountCmd::CheckSession { device } => {
                session(device)?;
                Ok(Reply::empty())
            }
            AccountCmd::CheckSender { device_id } => {
                decide::check_sender(&self.state, device_id, ctx)?;
                Ok(Reply::empty())
            }
            AccountCmd::DeviceAdd { device, params } => {
                session(device)?;
                let events = decide::add_device(&self.state, &params.device_certificate, ctx)?;
                self.persist(events, |_| {})?;
                Ok(Reply::empty())
            }
            AccountCmd::DeviceRevoke { device, params } => {
                session(device)?;
                let events = decide::revoke_device(&self.state, &params.revocation, ctx)?;
                self.persist(events, |_| {})?;
                let revoked = &params.revocation.device_id;
                if let Err(e) = self.sup.sessions().forget_device(&self.state.account_id, revoked) {
                    // Only the stored tokens stay; the account refuses them.
                    tracing::warn!(account = %self.state.account_id, error = %e, "dropping a revoked device's sessions");
                }
                self.sup.notifier().disconnect(&self.state.account_id, &params.revocation.device_id, "device revoked");
                Ok(Reply::empty())
            }
            AccountCmd::AccountDevicesGet => {
                if !self.state.is_registered() {
                    return Err(RelayError::not_found("unknown account"));
                }
                Reply::json(&DevicesResult {
                    certificates: self.state.certificates().collect(),
                    revocations: self.state.revocations.values().collect(),
                })
            }
            AccountCmd::AccountSettingsUpdate { device, params } => {
                session(device)?;
                let events = decide::update_settings(&self.state, params.public_discovery)?;
                self.persist(events, |_| {})?;
                Ok(Reply::empty())
            }
            AccountCmd::RouteGet => {
                let route = self.state.route().ok_or_else(|| {
                    RelayError::new(relay_schemas::ErrorCode::RouteNotFound, "no route known for this account")
                })?;
                Reply::json(route)
            }
            AccountCmd::RouteUpdate { device, params } => {
                session(device)?;
                let events = decide::update_route(&self.state, &params.route, ctx)?;
                self.persist(events, |_| {})?;
                Reply::json(self.state.route().ok_or_else(|| RelayError::internal("route missing"))?)
            }
            AccountCmd::ContactRevoke { device, params } => {
                session(device)?;
                let events = decide::revoke_contact(&self.state, params)?;
                self.persist(events, |_| {})?;
                Ok(Reply::empty())
            }
            AccountCmd::MessageSend { device, params, digest, route } => {
                session(device)?;
                self.send(device, params, digest, route.as_ref(), ctx)
            }
            AccountCmd::Settle { acceptance, status } => {
                let prior = self.send_entry(&acceptance.deliver.envelope.message_id)?;
                match decide::settle(&self.state, prior.as_ref(), &acceptance.event, status, ctx)? {
                    SettleDecision::Duplicate(status) => Ok(Reply::Status(status)),
                    SettleDecision::Settled { events, status } => {
                        self.persist(events, |_| {})?;
                        Ok(Reply::Settled { status, head: None })
                    }
                }
            }
            AccountCmd::Accept { acceptance, route, first } => {
                let prior = self.send_entry(&acceptance.deliver.envelope.message_id)?;
                match prior {
                    // A retry racing this one was accepted first.
                    Some(entry) => {
                        match decide::settle(&self.state, Some(&entry), &acceptance.event, &acceptance.status, ctx)? {
                            SettleDecision::Duplicate(status) | SettleDecision::Settled { status, .. } => {
                                Ok(Reply::Status(status))
                            }
                        }
                    }
                    None => self.accept((**acceptance).clone(), route.as_ref(), first.clone(), ctx),
                }
            }
            AccountCmd::MessageDeliver { params, digest } => {
                let prior = self.receipt_entry(&params.envelope.from, &params.envelope.message_id)?;
                match decide::receive(&self.state, prior.as_ref(), params, digest, ctx)? {
                    ReceiveDecision::Duplicate(status) => Ok(Reply::Status(status)),
                    ReceiveDecision::Accepted { event, status } => {
                        self.persist(vec![*event], |_| {})?;
                        Ok(Reply::Status(status))
                    }
                }
            }
            AccountCmd::RecordDelivery { message_id, status, settlement } => {
                let entry = self.send_entry(message_id)?;
                let events = decide::record_delivery(entry.as_ref(), message_id, status);
                let current = match events.first() {
                    Some(AccountEvent::DeliveryUpdated { status, .. }) => Some(status.clone()),
                    _ => entry.map(|e| e.status),
                };
                let mut head = None;
                self.persist(events, |batch| {
                    if let Some(s) = settlement {
                        head = Some(batch.append(&s.stream, s.head, s.events.clone()));
                        if let Some(key) = &s.remove_due {
                            batch.kv_remove(key);
                        }
                    }
                })?;
                Ok(Reply::Settled { status: current.unwrap_or_else(|| status.clone()), head })
            }
            AccountCmd::MessageDeliveryStatus { device, message_id } => {
                session(device)?;
                relay_schemas::ids::check_message_id("message_id", message_id)?;
                Ok(Reply::Status(decide::delivery_status(self.send_entry(message_id)?.as_ref(), now)?))
            }
            AccountCmd::MessageDeliveryPeerStatus { peer, message_id } => {
                decide::may_ask_peer_status(&self.state, peer)?;
                let status = self.send_entry(message_id)?.map(|e| e.status.clone());
                let result = PeerStatusResult { known: status.is_some(), status };
                // Through a JSON value, as this answer has always been sent: members sorted.
                Reply::json(&serde_json::to_value(result).map_err(|e| internal(&e))?)
            }
            AccountCmd::MessageTimelineSync { device, params } => {
                session(device)?;
                self.sync(device, params)
            }
            AccountCmd::Backlog { device } => {
                session(device)?;
                Ok(Reply::Backlog(self.backlog(device)?))
            }
            AccountCmd::MessageTimelineAck { device, params } => {
                session(device)?;
                let events = decide::ack(&self.state, device, params.through)?;
                self.persist(events, |_| {})?;
                Ok(Reply::empty())
            }
            AccountCmd::PushSubscribe { device, params } => {
                session(device)?;
                let events = decide::push_subscribe(&self.state, device, params)?;
                self.persist(events, |_| {})?;
                Ok(Reply::empty())
            }
            AccountCmd::PushUnsubscribe { device } => {
                session(device)?;
                self.persist(decide::push_unsubscribe(&self.state, device), |_| {})?;
                Ok(Reply::empty())
            }
            AccountCmd::PushGone { device_id, endpoint } => {
                self.persist(decide::push_gone(&self.state, device_id, endpoint), |_| {})?;
                Ok(Reply::empty())
            }
        }
    }

    /// Issues the token of a session `session.open` granted.
    fn open_session(&mut self, grant: Grant, policy: &crate::policy::Policy) -> Result<Reply, RelayError> {
        let session =
            Session { account_id: grant.account_id, device_id: grant.device_id, expires_at: grant.expires_at };
        let store = self.sup.store();
        let mut batch = store.batch();
        let sessions = self.sup.sessions();
        let issued = sessions
            .issue(&mut batch, &session, self.sup.clock().now_ms(), policy.max_sessions_per_device)
            .map_err(|e| internal(&e))?;
        self.last_ticket = Some(store.commit(batch).map_err(|e| internal(&e))?);
        sessions.remember_issued(&issued, session.clone());
        Reply::json(&SessionOpenResult { token: issued.token, expires_at: session.expires_at })
    }

    fn send(
        &mut self,
        device: &str,
        p: &SendParams,
        digest: &str,
        route: Option<&Wire<Route>>,
        ctx: Ctx,
    ) -> Result<Reply, RelayError> {
        let prior = self.send_entry(&p.envelope.message_id)?;
        match decide::send(&self.state, prior.as_ref(), device, p, digest, ctx)? {
            SendDecision::Duplicate(status) => Ok(Reply::Status(status)),
            SendDecision::SelfDelivered { event, status } => {
                self.persist(vec![event], |_| {})?;
                Ok(Reply::Status(status))
            }
            SendDecision::Sent { event, status, deliver, deadline } => {
                let deliver_digest = decide::deliver_digest(&deliver)?;
                let acceptance = Acceptance { event, status, deliver, deliver_digest, deadline };
                if delivery::core::delivered_here_first(route, &ctx.policy.relay_id) {
                    return Ok(Reply::Accept(Box::new(acceptance)));
                }
                self.accept(acceptance, route, None, ctx)
            }
        }
    }

    /// Atomic acceptance: the sent record, the idempotency result, the
    /// delivery stream and its due-index entry in one commit. With the route
    /// known, the first attempt rides in it: in flight (`first` is `None`:
    /// the caller starts it, and a request leaving the process waits for
    /// this commit to be durable), or already made here with outcome
    /// `first` (then the next is due by the timetable, or the delivery
    /// ended and its status is written too).
    fn accept(
        &mut self,
        a: Acceptance,
        route: Option<&Wire<Route>>,
        first: Option<AttemptOutcome>,
        ctx: Ctx,
    ) -> Result<Reply, RelayError> {
        let Acceptance { event, status, deliver, deliver_digest, deadline } = a;
        let event = decide::restamp(&self.state, event);
        let env = &deliver.envelope;
        let (message_id, stream) = (env.message_id.clone(), delivery::stream_id(&env.from, &env.message_id));
        let now_ms = ctx.now * 1000;
        let times = (status.accepted_at, deadline);
        let delivery::core::Begun { events, state, due_ms: due } =
            delivery::core::decide_acceptance(deliver, deliver_digest, times, route, first, now_ms, ctx.policy);
        let encoded = events
            .iter()
            .map(|e| crate::delivery::encode(e, ctx.now).map_err(|e| internal(&e)))
            .collect::<Result<Vec<_>, RelayError>>()?;
        let mut account_events = vec![event];
        if let Some(done) = &state.finished {
            account_events.push(AccountEvent::DeliveryUpdated { message_id, status: done.clone() });
        }
        let mut head = Head::default();
        self.persist(account_events, |batch| {
            head = batch.append(&stream, Head::default(), encoded);
            if let Some(due) = due {
                batch.kv_put(&delivery::due_key(due, &stream), b"");
            }
        })?;
        let Some(due) = due else {
            return Ok(Reply::Settled { status: state.status(), head: Some(head) });
        };
        self.sup.metrics().deliveries_in_flight.inc();
        let ticket = self.last_ticket.ok_or_else(|| RelayError::internal("acceptance without a commit"))?;
        let start = delivery::actor::Start { stream, head, state, indexed_due_ms: due, ticket };
        Ok(Reply::Accepted { status, start: Box::new(start) })
    }

    /// `message.timeline.sync`: the rules choose the page (`sync`); this
    /// reads the index, the events and the ledger for them.
    fn sync(&self, device: &str, p: &SyncParams) -> Result<Reply, RelayError> {
        let store = self.sup.store();
        let account = &self.state.account_id;
        let from = timeline::key(account, p.after.saturating_add(1));
        let index = store.kv_scan_from(&timeline::prefix(account), &from).map(|item| {
            let (key, value) = item.map_err(|e| internal(&e))?;
            let seq = timeline::sequence_of(&key).ok_or_else(|| RelayError::internal("bad timeline key"))?;
            Ok((seq, serde_json::from_slice(&value).map_err(|e| internal(&e))?))
        });
        let load = |event: u64| {
            let ev = store
                .read(&self.stream, event - 1)
                .next()
                .ok_or_else(|| RelayError::internal("timeline event missing"))?
                .map_err(|e| internal(&e))?;
            serde_json::from_str(ev.data.get()).map_err(|e| internal(&e))
        };
        let page = sync::page(device, p, self.sup.policy().max_page_bytes, index, load)?;
        let records =
            sync::records(device, &page.found, |message_id| Ok(self.send_entry(message_id)?.map(|e| e.status)))?;
        Reply::json(&SyncResult { records, next: page.next, has_more: page.has_more })
    }

    fn backlog(&self, device: &str) -> Result<Option<u64>, RelayError> {
        let cursor = self.state.cursors.get(device).copied().unwrap_or(0);
        let account = &self.state.account_id;
        let from = timeline::key(account, cursor.saturating_add(1));
        let mut latest = None;
        for item in self.sup.store().kv_scan_from(&timeline::prefix(account), &from) {
            let (key, value) = item.map_err(|e| internal(&e))?;
            let entry: timeline::IndexEntry = serde_json::from_slice(&value).map_err(|e| internal(&e))?;
            if entry.visible.iter().any(|d| d == device) {
                latest = timeline::sequence_of(&key);
            }
        }
        Ok(latest)
    }

    fn maybe_passivate(&mut self, ctx: &mut Context<Self>) {
        let now_ms = self.sup.clock().now_ms();
        let idle = now_ms.saturating_sub(self.last_active_ms);
        // Outstanding challenges live only here: keep the actor until they expire.
        self.challenges.expire(now_ms / 1000);
        // A resident but quiet actor keeps no spare buffers.
        self.outbox.shrink_to_fit();
        if idle >= self.sup.policy().passivate_after_ms && self.challenges.is_empty() {
            self.passivate(ctx);
        }
    }

    /// Leaves memory (snapshot first) unless replies or notifications are
    /// still owed; the next command loads the account again.
    fn passivate(&mut self, ctx: &mut Context<Self>) {
        if self.pending.load(Ordering::SeqCst) != 0 || !self.outbox.is_empty() {
            return;
        }
        if self.since_snapshot > 0 {
            self.snapshot();
        }
        self.leave(ctx);
    }

    fn leave(&mut self, ctx: &mut Context<Self>) {
        self.passivated = true;
        self.sup.forget_account(&self.state.account_id, &ctx.address());
        ctx.stop();
    }
}

impl AccountActor {
    /// `decide::push_targets` on the current state; none without a push
    /// sender.
    fn push_targets(
        &self,
        visible: &[String],
        sender_device: Option<&str>,
        connected: impl Fn(&str) -> bool,
    ) -> Vec<(String, PushSubscription)> {
        if self.sup.push_sink().is_none() {
            return Vec::new();
        }
        let now = self.sup.clock().now();
        decide::push_targets(&self.state, visible, sender_device, connected, now)
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
        let Some(sink) = self.sup.push_sink() else { return };
        let (notifier, account) = (self.sup.notifier(), &self.state.account_id);
        let connected = |device: &str| notifier.is_connected(account, device);
        for (device_id, subscription) in self.push_targets(visible, sender_device, connected) {
            if !subscribed.iter().any(|(d, s)| *d == device_id && *s == subscription) {
                continue;
            }
            sink.offer(crate::push::PushJob {
                account_id: account.clone(),
                device_id,
                sequence,
                subscription,
                attempt: 0,
            });
        }
    }
}

impl Actor for AccountActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let every = Duration::from_millis((self.sup.policy().passivate_after_ms / 2).max(10));
        ctx.run_interval(every, |act, ctx| act.maybe_passivate(ctx));
    }
}

impl Handler<Ask> for AccountActor {
    type Result = ResponseFuture<Result<Result<Reply, RelayError>, Passivated>>;

    fn handle(&mut self, msg: Ask, ctx: &mut Self::Context) -> Self::Result {
        if self.passivated {
            return Box::pin(async { Err(Passivated) });
        }
        self.last_active_ms = self.sup.clock().now_ms();
        let reply = self.handle_cmd(&msg.0);
        // A decision that wrote nothing tells no one outside anything a
        // crash could undo: its caller writes before anyone hears of it.
        let answer = if matches!(reply, Ok(Reply::Accept(_))) { Answer::AtOnce } else { msg.1 };
        let reply = self.reply_durable(reply, answer, ctx.address());
        // No actor outlives a command for an account without events: a
        // stranger's refused request leaves nothing resident.
        // (Nothing was written, so no reply waits on durability.)
        if self.head.seq == 0 {
            self.leave(ctx);
        }
        Box::pin(async move { Ok(reply.await) })
    }
}

/// The supervisor is over its cap of resident actors: leave memory now,
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
        let (notifier, account) = (self.sup.notifier(), &self.state.account_id);
        while self.outbox.front().is_some_and(|(t, _)| *t <= msg.0) {
            let Some((_, notice)) = self.outbox.pop_front() else { break };
            match notice {
                Notice::Timeline { sequence, visible, sender_device, subscribed } => {
                    notifier.timeline_changed(account, sequence, &visible);
                    self.offer_pushes(sequence, &visible, sender_device.as_deref(), &subscribed);
                }
                Notice::Delivery { message_id, status } => notifier.delivery_changed(account, &message_id, &status),
            }
        }
    }
}
