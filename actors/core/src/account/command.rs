//! Every command an account takes, and the one `decide` over them:
//! `decide(state, challenges, command, reads, ctx) -> Decision { events,
//! reply, effects }`. The shell loads the state, calls `decide`, appends
//! the events (with their projections), runs the effects and answers the
//! reply; nothing else. Time and randomness come in through [`Ctx`]; what
//! a decision reads besides the state (the ledger of idempotent results,
//! the timeline index) comes in through [`Reads`], a read-only view the
//! shell serves from the store and the tests from a map.

use super::decide::{self, Ctx, ReceiveDecision, SendDecision, SettleDecision};
use super::events::AccountEvent;
use super::ledger::{ReceiptEntry, SendEntry};
use super::replica::{self, Outcome, Page};
use super::session::{Challenges, Grant};
use super::state::AccountState;
use super::sync;
use super::timeline::IndexEntry;
use crate::delivery::core::{decide_acceptance, delivered_here_first, Begun};
use crate::delivery::AttemptOutcome;
use relay_schemas::encoding::b64_encode;
use relay_schemas::methods::*;
use relay_schemas::objects::{DeviceCertificate, Route};
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, UnixSecs, Wire};

/// Every command an account takes. `device` is the session's device, taken
/// from the authenticated session, never from params. A command that
/// serves a protocol method is named after it (`message.deliver` is
/// `MessageDeliver`); the others are the relay's own. `S` is what a
/// settling delivery writes in the same commit ([`AccountCmd::RecordDelivery`]):
/// store data the rules never look at.
#[derive(Debug)]
pub enum AccountCmd<S> {
    AccountRegister {
        params: RegisterParams,
        digest: String,
        /// The highest route of the account known here or at the peers.
        known: Option<Wire<Route>>,
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
    /// delivers first and settles after. Otherwise writes the acceptance
    /// with its delivery (and the first attempt when `route` is known).
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
        settlement: Option<S>,
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
    /// `timeline.replicate` from `peer`, the account's other home relay.
    TimelineReplicate {
        peer: String,
        params: ReplicateParams,
    },
    /// A page pulled from `partner`'s `timeline.replicate`, to apply.
    /// `known`: the account's highest route this relay knows (for an
    /// account not here yet, also what its peers answered just now).
    ReplicaApply {
        partner: String,
        page: Box<Page>,
        known: Option<Wire<Route>>,
        /// Certificates of senders of the page's received records that
        /// carry none (accepted before certificates were kept with them),
        /// as the senders' homes answered `account.devices.get`.
        senders: Vec<Wire<DeviceCertificate>>,
    },
    /// `partner` answered `route_stale` with this route: the account moved.
    ReplicaMoved {
        partner: String,
        route: Wire<Route>,
    },
    /// This relay's cursor in `partner`'s stream of the account: where its
    /// next pull starts.
    ReplicaCursor {
        partner: String,
    },
    /// An operator marks everything unsynced for `partner`: history is
    /// offered again (finished deliveries and records stay as they are).
    ReplicaReset {
        partner: String,
    },
}

impl<S> AccountCmd<S> {
    /// What a settling delivery writes in this command's commit.
    pub fn settlement(&self) -> Option<&S> {
        match self {
            AccountCmd::RecordDelivery { settlement, .. } => settlement.as_ref(),
            _ => None,
        }
    }
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

/// What a decision reads besides the state: the account's ledger and
/// timeline index, and the events records point at.
pub trait Reads {
    /// The ledger's result of this account's `message.send` of `message_id`.
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError>;
    /// The ledger's result of the message `(from, message_id)` received here.
    fn receipt_entry(&self, from: &str, message_id: &str) -> Result<Option<ReceiptEntry>, RelayError>;
    /// The timeline index from sequence `after + 1` on, in sequence order.
    fn timeline_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, IndexEntry), RelayError>>;
    /// The account event at `seq` of its stream (one that wrote a record).
    fn event(&self, seq: u64) -> Result<AccountEvent, RelayError>;
    /// The account's events from sequence `after + 1` on, in order.
    fn events_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, AccountEvent), RelayError>>;
    /// The params of this relay's delivery of the account's message
    /// `message_id`, if this relay runs (or ran) one.
    fn delivery_params(&self, message_id: &str) -> Result<Option<DeliverParams>, RelayError>;
}

/// What a command decided: the events to append (in one commit), what it
/// answers, and what the shell does besides.
#[derive(Debug)]
pub struct Decision {
    pub events: Vec<AccountEvent>,
    pub reply: Reply,
    pub effects: Vec<Effect>,
}

/// What a command answers, as far as the rules know it.
#[derive(Debug)]
pub enum Reply {
    /// A serialized result object.
    Json(String),
    Status(DeliveryStatus),
    /// A send decided, nothing written: deliver, then `Settle` or `Accept`.
    Accept(Box<Acceptance>),
    /// A delivery's status as this command recorded it (`Settle`,
    /// `RecordDelivery`, an `Accept` or `MessageSend` whose delivery ended
    /// at acceptance): the caller reports the delivery finished.
    Settled(DeliveryStatus),
    /// A device's backlog: the latest record beyond its ack cursor it may
    /// read, if any (never on the wire; the WebSocket attach uses it).
    Backlog(Option<u64>),
    /// What a replication command tells the replicator.
    Replica(replica::Outcome),
}

/// A session token on its way to the store: never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

/// What the shell does besides appending the events.
#[derive(Debug)]
pub enum Effect {
    /// The acceptance's delivery begins: its stream's first events and its
    /// due-index entry ride in the same commit, and its actor starts from
    /// `begun.state` unless the delivery already ended.
    BeginDelivery(Box<Begun>),
    /// `session.open` proved the device: store the session of `token`.
    StoreSession { token: Token, grant: Grant },
    /// A revoked device: its stored sessions end and its sockets close.
    EndDevice { device_id: String },
    /// A delivery this relay takes on for the sender's other home: its
    /// stream and due entry ride in the same commit, and it starts when due.
    Forward(Box<Begun>),
}

impl Reply {
    /// The empty result object.
    pub fn ok() -> Self {
        Reply::Json("{}".into())
    }
}

impl Decision {
    fn reply(reply: Reply) -> Self {
        Decision { events: Vec::new(), reply, effects: Vec::new() }
    }
    fn write(events: Vec<AccountEvent>, reply: Reply) -> Self {
        Decision { events, reply, effects: Vec::new() }
    }
}

fn json<T: serde::Serialize>(v: &T) -> Result<Reply, RelayError> {
    serde_json::to_string(v).map(Reply::Json).map_err(|e| RelayError::internal(e.to_string()))
}

/// The account's route once `events` are applied.
fn route_after<'a>(state: &'a AccountState, events: &'a [AccountEvent]) -> Result<&'a Wire<Route>, RelayError> {
    let written = events.iter().rev().find_map(|e| match e {
        AccountEvent::Registered { route, .. } | AccountEvent::RouteUpdated { route } => Some(route),
        _ => None,
    });
    written.or(state.route()).ok_or_else(|| RelayError::internal("route missing"))
}

/// Decides `cmd` on `state`. On error nothing is to be written.
/// `challenges`: the outstanding session challenges, kept in memory only.
pub fn decide<S>(
    state: &AccountState,
    challenges: &mut Challenges,
    cmd: &AccountCmd<S>,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let session = |device: &str| decide::check_session(state, device, ctx);
    Ok(match cmd {
        AccountCmd::AccountRegister { params, digest, known } => {
            let events = decide::register(state, params, digest, known.as_ref(), ctx)?;
            let route = route_after(state, &events)?;
            let reply = json(&RegisterResult { account_id: &state.account_id, route })?;
            Decision::write(events, reply)
        }
        AccountCmd::SessionChallenge { device_id } => {
            Decision::reply(json(&challenges.issue(state, device_id, ctx.random()?, ctx)?)?)
        }
        AccountCmd::SessionOpen { params } => {
            // Drawn first: a refusal must not use up the challenge.
            let token = format!("{}{}", ctx.policy.token_prefix, b64_encode(&ctx.random()?));
            let grant = challenges.answer(state, params, ctx)?;
            let reply = json(&SessionOpenResult { token: token.clone(), expires_at: grant.expires_at })?;
            Decision { events: Vec::new(), reply, effects: vec![Effect::StoreSession { token: Token(token), grant }] }
        }
        AccountCmd::CheckSession { device } => {
            session(device)?;
            Decision::reply(Reply::ok())
        }
        AccountCmd::CheckSender { device_id } => {
            decide::check_sender(state, device_id, ctx)?;
            Decision::reply(Reply::ok())
        }
        AccountCmd::DeviceAdd { device, params } => {
            session(device)?;
            Decision::write(decide::add_device(state, &params.device_certificate, ctx)?, Reply::ok())
        }
        AccountCmd::DeviceRevoke { device, params } => {
            session(device)?;
            let events = decide::revoke_device(state, &params.revocation, ctx)?;
            let device_id = params.revocation.device_id.clone();
            Decision { events, reply: Reply::ok(), effects: vec![Effect::EndDevice { device_id }] }
        }
        AccountCmd::AccountDevicesGet => {
            if !state.is_registered() {
                return Err(RelayError::not_found("unknown account"));
            }
            Decision::reply(json(&DevicesResult {
                certificates: state.certificates().collect(),
                revocations: state.revocations.values().collect(),
            })?)
        }
        AccountCmd::AccountSettingsUpdate { device, params } => {
            session(device)?;
            Decision::write(decide::update_settings(state, params.public_discovery, ctx)?, Reply::ok())
        }
        AccountCmd::RouteGet => {
            let route = state
                .route()
                .ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
            Decision::reply(json(route)?)
        }
        AccountCmd::RouteUpdate { device, params } => {
            session(device)?;
            let events = decide::update_route(state, &params.route, ctx)?;
            let reply = json(route_after(state, &events)?)?;
            Decision::write(events, reply)
        }
        AccountCmd::ContactRevoke { device, params } => {
            session(device)?;
            Decision::write(decide::revoke_contact(state, params, ctx)?, Reply::ok())
        }
        AccountCmd::MessageSend { device, params, digest, route } => {
            session(device)?;
            let prior = reads.send_entry(&params.envelope.message_id)?;
            match decide::send(state, prior.as_ref(), device, params, digest, ctx)? {
                SendDecision::Duplicate(status) => Decision::reply(Reply::Status(status)),
                SendDecision::SelfDelivered { event, status } => Decision::write(vec![event], Reply::Status(status)),
                SendDecision::Sent { event, status, deliver, deadline } => {
                    let deliver_digest = decide::deliver_digest(&deliver)?;
                    let acceptance = Acceptance { event, status, deliver, deliver_digest, deadline };
                    if delivered_here_first(route.as_ref(), &ctx.policy.relay_id) {
                        return Ok(Decision::reply(Reply::Accept(Box::new(acceptance))));
                    }
                    accept(state, acceptance, route.as_ref(), None, ctx)
                }
            }
        }
        AccountCmd::Settle { acceptance, status } => {
            let prior = reads.send_entry(&acceptance.deliver.envelope.message_id)?;
            match decide::settle(state, prior.as_ref(), &acceptance.event, status, ctx)? {
                SettleDecision::Duplicate(status) => Decision::reply(Reply::Status(status)),
                SettleDecision::Settled { events, status } => Decision::write(events, Reply::Settled(status)),
            }
        }
        AccountCmd::Accept { acceptance, route, first } => {
            match reads.send_entry(&acceptance.deliver.envelope.message_id)? {
                // A retry racing this one was accepted first.
                Some(entry) => match decide::settle(state, Some(&entry), &acceptance.event, &acceptance.status, ctx)? {
                    SettleDecision::Duplicate(status) | SettleDecision::Settled { status, .. } => {
                        Decision::reply(Reply::Status(status))
                    }
                },
                None => accept(state, (**acceptance).clone(), route.as_ref(), first.clone(), ctx),
            }
        }
        AccountCmd::MessageDeliver { params, digest } => {
            let prior = reads.receipt_entry(&params.envelope.from, &params.envelope.message_id)?;
            match decide::receive(state, prior.as_ref(), params, digest, ctx)? {
                ReceiveDecision::Duplicate(status) => Decision::reply(Reply::Status(status)),
                ReceiveDecision::Accepted { event, status } => Decision::write(vec![*event], Reply::Status(status)),
            }
        }
        AccountCmd::RecordDelivery { message_id, status, .. } => {
            let entry = reads.send_entry(message_id)?;
            let events = decide::record_delivery(entry.as_ref(), message_id, status);
            // The status as recorded: a terminal one never changes.
            let current = match events.first() {
                Some(AccountEvent::DeliveryUpdated { status, .. }) => status.clone(),
                _ => entry.map_or_else(|| status.clone(), |e| e.status),
            };
            Decision::write(events, Reply::Settled(current))
        }
        AccountCmd::MessageDeliveryStatus { device, message_id } => {
            session(device)?;
            relay_schemas::ids::check_message_id("message_id", message_id)?;
            let entry = reads.send_entry(message_id)?;
            Decision::reply(Reply::Status(decide::delivery_status(entry.as_ref(), ctx.now)?))
        }
        AccountCmd::MessageDeliveryPeerStatus { peer, message_id } => {
            decide::may_ask_peer_status(state, peer)?;
            let status = reads.send_entry(message_id)?.map(|e| e.status);
            let result = PeerStatusResult { known: status.is_some(), status };
            // Through a JSON value, as this answer has always been sent: members sorted.
            let value = serde_json::to_value(result).map_err(|e| RelayError::internal(e.to_string()))?;
            Decision::reply(json(&value)?)
        }
        AccountCmd::MessageTimelineSync { device, params } => {
            session(device)?;
            let index = reads.timeline_after(params.after);
            let page = sync::page(device, params, ctx.policy.max_page_bytes, index, |seq| reads.event(seq))?;
            let records = sync::records(device, &page.found, |id| Ok(reads.send_entry(id)?.map(|e| e.status)))?;
            Decision::reply(json(&SyncResult { records, next: page.next, has_more: page.has_more })?)
        }
        AccountCmd::Backlog { device } => {
            session(device)?;
            let cursor = state.cursors.get(device).copied().unwrap_or(0);
            let mut latest = None;
            for item in reads.timeline_after(cursor) {
                let (seq, entry) = item?;
                if entry.visible.iter().any(|d| d == device) {
                    latest = Some(seq);
                }
            }
            Decision::reply(Reply::Backlog(latest))
        }
        AccountCmd::MessageTimelineAck { device, params } => {
            session(device)?;
            Decision::write(decide::ack(state, device, params.through)?, Reply::ok())
        }
        AccountCmd::PushSubscribe { device, params } => {
            session(device)?;
            Decision::write(decide::push_subscribe(state, device, params)?, Reply::ok())
        }
        AccountCmd::PushUnsubscribe { device } => {
            session(device)?;
            Decision::write(decide::push_unsubscribe(state, device), Reply::ok())
        }
        AccountCmd::PushGone { device_id, endpoint } => {
            Decision::write(decide::push_gone(state, device_id, endpoint), Reply::ok())
        }
        AccountCmd::TimelineReplicate { peer, params } => {
            let (events, page) = replica::serve(state, peer, params, reads, ctx)?;
            Decision::write(events, json(&page)?)
        }
        AccountCmd::ReplicaApply { partner, page, known, senders } => {
            let applied = replica::apply(state, partner, page, known.as_ref(), senders, reads, ctx)?;
            let reply = Reply::Replica(Outcome::Applied { items: applied.applied });
            // A revocation made at the other home ends the device here too.
            let revoked = applied.events.iter().filter_map(|e| match e.origin() {
                AccountEvent::DeviceRevoked { revocation } => Some(revocation.device_id.clone()),
                _ => None,
            });
            let mut effects: Vec<Effect> = revoked.map(|device_id| Effect::EndDevice { device_id }).collect();
            effects.extend(applied.forwarded.into_iter().map(|b| Effect::Forward(Box::new(b))));
            Decision { events: applied.events, reply, effects }
        }
        AccountCmd::ReplicaMoved { partner, route } => {
            Decision::write(replica::moved(state, partner, route, ctx), Reply::ok())
        }
        AccountCmd::ReplicaCursor { partner } => {
            Decision::reply(Reply::Replica(Outcome::Cursor(state.replica(partner).pulled)))
        }
        AccountCmd::ReplicaReset { partner } => {
            let mark = state.replica(partner);
            let events = match mark.served > 0 || mark.acked > 0 {
                true => vec![AccountEvent::ReplicaReset { partner: partner.clone() }],
                false => vec![],
            };
            Decision::write(events, Reply::ok())
        }
    })
}

/// Atomic acceptance: the sent record, the idempotency result, the
/// delivery's first events and its due-index entry in one commit. With the
/// route known, the first attempt rides in it: in flight (`first` is
/// `None`: the shell starts it once the commit is durable), or already
/// made here with outcome `first` (then the next is due by the timetable,
/// or the delivery ended and its status is written too).
fn accept(
    state: &AccountState,
    a: Acceptance,
    route: Option<&Wire<Route>>,
    first: Option<AttemptOutcome>,
    ctx: Ctx,
) -> Decision {
    let Acceptance { event, status, deliver, deliver_digest, deadline } = a;
    let message_id = deliver.envelope.message_id.clone();
    let times = (UnixSecs(status.accepted_at), UnixSecs(deadline));
    let begun = decide_acceptance(deliver, deliver_digest, times, route, first, ctx.now.millis(), ctx.policy);
    let mut events = vec![decide::restamp(state, event)];
    let reply = match &begun.state.finished {
        // Ended by the attempt made before: reported finished with the acceptance.
        Some(done) => {
            events.push(AccountEvent::DeliveryUpdated { message_id, status: done.clone() });
            Reply::Settled(done.clone())
        }
        None => Reply::Status(status),
    };
    Decision { events, reply, effects: vec![Effect::BeginDelivery(Box::new(begun))] }
}
