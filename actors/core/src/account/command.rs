//! Every command an account takes, and the one `decide` that forwards
//! each to its method's file (`method/<wire name>.rs`):
//! `decide(state, challenges, command, reads, ctx) -> Decision { events,
//! reply, effects }`, which is the account's [`Aggregate`] (with
//! [`AccountEnv`]). The shell loads the state, calls `decide`, appends
//! the events (with their projections), runs the effects and answers the
//! reply; nothing else. Time and randomness come in through [`Ctx`]; what
//! a decision reads besides the state (the ledger of idempotent results,
//! the timeline index) comes in through [`Reads`], a read-only view the
//! shell serves from the store and the tests from a map.

use super::decision::{Acceptance, Decision, Effect, Reads, Reply};
use super::events::AccountEvent;
use super::method::timeline_replicate::Page;
use super::method::*;
use super::session::Challenges;
use super::shared::Ctx;
use super::state::AccountState;
use crate::aggregate::Aggregate;
use crate::delivery::outcome::AttemptOutcome;
use relay_schemas::methods::*;
use relay_schemas::objects::{DeliveryStatus, DeviceCertificate, Route, Wire};
use relay_schemas::RelayError;

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

/// What an account decision is given besides its state and command: time,
/// policy and randomness, the store's view, and the outstanding session
/// challenges (kept in memory only).
pub struct AccountEnv<'a, R> {
    pub ctx: Ctx<'a>,
    pub reads: &'a R,
    pub challenges: &'a mut Challenges,
}

impl<'a, S, R: Reads> Aggregate<AccountCmd<S>, AccountEnv<'a, R>> for AccountState {
    type Event = AccountEvent;
    type Reply = Reply;
    type Effect = Effect;

    fn decide(&self, cmd: &AccountCmd<S>, env: AccountEnv<'a, R>) -> Result<Decision, RelayError> {
        decide(self, env.challenges, cmd, env.reads, env.ctx)
    }

    fn apply(&mut self, event: &AccountEvent) {
        AccountState::apply(self, event)
    }
}

/// Decides `cmd` on `state` by forwarding it to its method's file. On
/// error nothing is to be written. `challenges`: the outstanding session
/// challenges, kept in memory only.
pub fn decide<S>(
    state: &AccountState,
    challenges: &mut Challenges,
    cmd: &AccountCmd<S>,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    use AccountCmd as C;
    match cmd {
        C::AccountRegister { params, digest, known } => {
            account_register::decide(state, params, digest, known.as_ref(), ctx)
        }
        C::SessionChallenge { device_id } => session_challenge::decide(state, challenges, device_id, ctx),
        C::SessionOpen { params } => session_open::decide(state, challenges, params, ctx),
        C::CheckSession { device } => session_attach::decide_check(state, device, ctx),
        C::Backlog { device } => session_attach::decide_backlog(state, device, reads, ctx),
        C::DeviceAdd { device, params } => device_add::decide(state, device, params, ctx),
        C::DeviceRevoke { device, params } => device_revoke::decide(state, device, params, ctx),
        C::AccountDevicesGet => account_devices_get::decide(state),
        C::AccountSettingsUpdate { device, params } => account_settings_update::decide(state, device, params, ctx),
        C::RouteGet => route_get::decide(state),
        C::RouteUpdate { device, params } => route_update::decide(state, device, params, ctx),
        C::ContactRevoke { device, params } => contact_revoke::decide(state, device, params, ctx),
        C::MessageSend { device, params, digest, route } => {
            message_send::decide(state, device, params, digest, route.as_ref(), reads, ctx)
        }
        C::Settle { acceptance, status } => message_send::decide_settle(state, acceptance, status, reads, ctx),
        C::Accept { acceptance, route, first } => {
            message_send::decide_accept(state, acceptance, route.as_ref(), first.as_ref(), reads, ctx)
        }
        C::MessageDeliver { params, digest } => message_deliver::decide(state, params, digest, reads, ctx),
        C::CheckSender { device_id } => message_deliver::decide_check_sender(state, device_id, ctx),
        C::RecordDelivery { message_id, status, .. } => message_send::decide_record(message_id, status, reads),
        C::MessageDeliveryStatus { device, message_id } => {
            message_delivery_status::decide(state, device, message_id, reads, ctx)
        }
        C::MessageDeliveryPeerStatus { peer, message_id } => {
            message_delivery_peer_status::decide(state, peer, message_id, reads)
        }
        C::MessageTimelineSync { device, params } => message_timeline_sync::decide(state, device, params, reads, ctx),
        C::MessageTimelineAck { device, params } => message_timeline_ack::decide(state, device, params, ctx),
        C::PushSubscribe { device, params } => push_subscribe::decide(state, device, params, ctx),
        C::PushUnsubscribe { device } => push_unsubscribe::decide(state, device, ctx),
        C::PushGone { device_id, endpoint } => Ok(push_unsubscribe::decide_gone(state, device_id, endpoint)),
        C::TimelineReplicate { peer, params } => timeline_replicate::decide(state, peer, params, reads, ctx),
        C::ReplicaApply { partner, page, known, senders } => {
            timeline_replicate::decide_apply(state, partner, page, known.as_ref(), senders, reads, ctx)
        }
        C::ReplicaMoved { partner, route } => Ok(timeline_replicate::decide_moved(state, partner, route, ctx)),
        C::ReplicaCursor { partner } => Ok(timeline_replicate::decide_cursor(state, partner)),
        C::ReplicaReset { partner } => Ok(timeline_replicate::decide_reset(state, partner)),
    }
}

/// The commands of `message.send`'s process manager
/// ([`message_send::SendProcess`]), as this enum names them.
impl<S> message_send::SendCmds for AccountCmd<S> {
    fn message_send(device: String, params: SendParams, digest: String, route: Option<Wire<Route>>) -> Self {
        AccountCmd::MessageSend { device, params, digest, route }
    }
    fn message_deliver(params: DeliverParams, digest: String) -> Self {
        AccountCmd::MessageDeliver { params, digest }
    }
    fn settle(acceptance: Box<Acceptance>, status: DeliveryStatus) -> Self {
        AccountCmd::Settle { acceptance, status }
    }
    fn accept(acceptance: Box<Acceptance>, route: Option<Wire<Route>>, first: Option<AttemptOutcome>) -> Self {
        AccountCmd::Accept { acceptance, route, first }
    }
}
