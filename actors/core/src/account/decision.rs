//! What an account decision produces, apart from the command that asks
//! for it (`command.rs`) and the method files that decide it
//! (`method/<wire name>.rs`): the [`Decision`] (events, [`Reply`],
//! [`Effect`]s), the [`Reads`] view a decision is given, and the
//! [`Acceptance`] of a send not yet written. Every method file imports
//! these and nothing of `command.rs`, so the dispatcher and the methods
//! import one way.

use super::events::AccountEvent;
use super::ledger::{ReceiptEntry, SendEntry};
use super::session::Grant;
use super::timeline::IndexEntry;
use crate::delivery::aggregate::Begun;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::DeliveryStatus;
use relay_schemas::RelayError;

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

/// What an account command decided: the events to append (in one
/// commit), what it answers, and what the shell does besides.
pub type Decision = crate::aggregate::Decision<AccountEvent, Reply, Effect>;

/// What a command answers: as the rules decide it (`Reply`, of
/// [`AsDecided`]), and as the actor shell answers it once the decision is
/// written (`W` adds what writing it made: a stream's head, a delivery to
/// start).
#[derive(Debug)]
pub enum Reply<W: Written = AsDecided> {
    /// A serialized result object.
    Json(String),
    Status(DeliveryStatus),
    /// A send decided, nothing written: deliver, then `Settle` or `Accept`.
    Accept(Box<Acceptance>),
    /// A delivery's status as this command recorded it (`Settle`,
    /// `RecordDelivery`, an `Accept` or `MessageSend` whose delivery ended
    /// at acceptance): the caller reports the delivery finished. `head`:
    /// the delivery stream's head after the commit, once written.
    Settled {
        status: DeliveryStatus,
        head: W::Head,
    },
    /// A cross-account send accepted with its delivery still running: the
    /// caller starts it. Only a shell answers it, from the decision's
    /// [`Effect::BeginDelivery`].
    Accepted {
        status: DeliveryStatus,
        start: W::Start,
    },
    /// A device's backlog: the latest record beyond its ack cursor it may
    /// read, if any (never on the wire; the WebSocket attach uses it).
    Backlog(Option<u64>),
    /// What a replication command tells the replicator.
    Replica(Outcome),
}

/// What writing a decision adds to its reply.
pub trait Written: std::fmt::Debug {
    /// Beside a settled status: the delivery stream's head after the commit.
    type Head: std::fmt::Debug;
    /// A delivery begun and still running, for the caller to start.
    type Start: std::fmt::Debug;
}

/// A reply as decided, nothing written: no head, and never
/// [`Reply::Accepted`] (its `start` cannot be made).
#[derive(Debug)]
pub enum AsDecided {}

impl Written for AsDecided {
    type Head = ();
    type Start = AsDecided;
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

impl<W: Written> Reply<W> {
    /// The empty result object.
    pub fn ok() -> Self {
        Reply::Json("{}".into())
    }
}

/// What the replication commands answer the replicator (never on the wire).
#[derive(Debug)]
pub enum Outcome {
    /// `ReplicaCursor`: this relay's cursor in the partner's stream.
    Cursor(u64),
    /// `ReplicaApply`: how many items wrote something here.
    Applied { items: usize },
}

/// A serialized result object.
pub(crate) fn json<T: serde::Serialize>(v: &T) -> Result<Reply, RelayError> {
    serde_json::to_string(v).map(Reply::Json).map_err(|e| RelayError::internal(e.to_string()))
}
