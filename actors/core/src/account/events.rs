//! Events of an account stream (`account/{account_id}`). Past tense, each
//! with a stable type name and a version for upcasting.

use relay_schemas::objects::{
    DeliveryStatus, DeviceCertificate, DeviceRevocation, KeyBox, MessageEnvelope, Registration, Route, Wire,
};
use serde::{Deserialize, Serialize};

/// A timeline record as stored at acceptance: the original envelope, the
/// boxes, and the devices that may read it (fixed now, never recomputed).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub sequence: u64,
    pub expires_at: u64,
    pub envelope: Wire<MessageEnvelope>,
    pub boxes: Vec<Wire<KeyBox>>,
    pub visible: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccountEvent {
    Registered {
        route: Wire<Route>,
        device_certificate: Wire<DeviceCertificate>,
        public_discovery: bool,
        /// blake3(JCS(params)), for idempotent re-registration.
        params_digest: String,
        /// The account key's signed request (absent in events written
        /// before registrations were required).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        registration: Option<Box<Wire<Registration>>>,
    },
    DeviceAdded {
        device_certificate: Wire<DeviceCertificate>,
    },
    DeviceRevoked {
        revocation: Wire<DeviceRevocation>,
    },
    SettingsUpdated {
        public_discovery: bool,
        /// When it was changed (absent in events written before two homes
        /// could change settings): the later change wins at both homes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<u64>,
    },
    RouteUpdated {
        route: Wire<Route>,
    },
    ContactRevoked {
        kind: String,
        id: String,
    },
    /// A cross-account `message.send` accepted; its delivery stream is
    /// created in the same batch unless `status` says the delivery ended
    /// already. `record` is the sent record, present only when
    /// `sender_boxes` were given.
    MessageSent {
        message_id: String,
        to: String,
        digest: String,
        accepted_at: u64,
        deadline: u64,
        retention_until: u64,
        record: Option<Box<Record>>,
        /// The delivery's final status when it ended before the acceptance
        /// was written (a recipient on this relay took or refused it at
        /// once: `message_send::settle`): acceptance and outcome in one event, no
        /// delivery stream. Absent: `delivering`, and a `delivery_updated`
        /// follows (and in every event written before this field).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<DeliveryStatus>,
    },
    /// Account self-delivery: one record, `target_accepted` at once.
    SelfDelivered {
        message_id: String,
        digest: String,
        accepted_at: u64,
        retention_until: u64,
        record: Box<Record>,
    },
    MessageReceived {
        from: String,
        message_id: String,
        digest: String,
        accepted_at: u64,
        retention_until: u64,
        record: Box<Record>,
        /// The sending device's certificate the envelope verified under:
        /// the account's other home checks the record against it before
        /// taking it (PROTOCOL §5 *What a partner home may replicate*).
        /// Absent in events written before it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sender_certificate: Option<Box<Wire<DeviceCertificate>>>,
    },
    /// The delivery of a sent message changed status (terminal states only
    /// ever once).
    DeliveryUpdated {
        message_id: String,
        status: DeliveryStatus,
    },
    CursorMoved {
        device_id: String,
        through: u64,
    },
    /// `push.subscribe` (PROTOCOL §9): the device's Web Push subscription,
    /// replacing any earlier one.
    PushSubscribed {
        device_id: String,
        subscription: PushSubscription,
    },
    /// The device's subscription was removed: `reason` is `unsubscribed`
    /// (`push.unsubscribe`) or `gone` (the push service answered 404/410
    /// for `endpoint`). A revoked device's subscription leaves with
    /// `device_revoked`, without an event of its own.
    PushUnsubscribed {
        device_id: String,
        endpoint: String,
        reason: String,
    },
    /// `event` came from `partner`, the account's other home relay, where
    /// it is event `origin_seq` of the account's stream (`timeline.replicate`,
    /// [`crate::account::method::timeline_replicate`]). Applied as `event` itself (a record restamped
    /// with this relay's next sequence); never offered back to the partner.
    Replicated {
        partner: String,
        origin_seq: u64,
        event: Box<AccountEvent>,
    },
    /// This relay applied the partner's items through `through` (its
    /// cursor in the partner's stream), in the same commit as the items.
    ReplicaPulled {
        partner: String,
        through: u64,
    },
    /// A `timeline.replicate` page through `through` was sent to `partner`.
    ReplicaServed {
        partner: String,
        through: u64,
    },
    /// `partner` acknowledged storing the items through `through`: they
    /// are synced.
    ReplicaAcked {
        partner: String,
        through: u64,
    },
    /// An operator marked everything unsynced for `partner` (`relay
    /// replication reset`): history is offered again.
    ReplicaReset {
        partner: String,
    },
}

/// A device's Web Push subscription (RFC 8030 endpoint, RFC 8291 keys),
/// as the browser gave it, base64url keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushSubscription {
    pub endpoint: String,
    pub p256dh: String,
    pub auth: String,
}

impl AccountEvent {
    /// v2: `push_subscribed` and `push_unsubscribed` were added; v3: the
    /// replication events (`replicated`, `replica_*`). No type changed, so
    /// older events decode as they are; an older relay refuses a newer log
    /// by its version instead of failing on an unknown type.
    pub const VERSION: u32 = 3;

    pub fn event_type(&self) -> &'static str {
        match self {
            AccountEvent::Registered { .. } => "registered",
            AccountEvent::DeviceAdded { .. } => "device_added",
            AccountEvent::DeviceRevoked { .. } => "device_revoked",
            AccountEvent::SettingsUpdated { .. } => "settings_updated",
            AccountEvent::RouteUpdated { .. } => "route_updated",
            AccountEvent::ContactRevoked { .. } => "contact_revoked",
            AccountEvent::MessageSent { .. } => "message_sent",
            AccountEvent::SelfDelivered { .. } => "self_delivered",
            AccountEvent::MessageReceived { .. } => "message_received",
            AccountEvent::DeliveryUpdated { .. } => "delivery_updated",
            AccountEvent::CursorMoved { .. } => "cursor_moved",
            AccountEvent::PushSubscribed { .. } => "push_subscribed",
            AccountEvent::PushUnsubscribed { .. } => "push_unsubscribed",
            AccountEvent::Replicated { .. } => "replicated",
            AccountEvent::ReplicaPulled { .. } => "replica_pulled",
            AccountEvent::ReplicaServed { .. } => "replica_served",
            AccountEvent::ReplicaAcked { .. } => "replica_acked",
            AccountEvent::ReplicaReset { .. } => "replica_reset",
        }
    }

    /// The timeline record this event appends, if any.
    pub fn record(&self) -> Option<&Record> {
        match self {
            AccountEvent::MessageSent { record, .. } => record.as_deref(),
            AccountEvent::SelfDelivered { record, .. } | AccountEvent::MessageReceived { record, .. } => Some(record),
            AccountEvent::Replicated { event, .. } => event.record(),
            _ => None,
        }
    }

    /// The event as written at its origin: a replicated one's inner event.
    pub fn origin(&self) -> &AccountEvent {
        match self {
            AccountEvent::Replicated { event, .. } => event.origin(),
            e => e,
        }
    }
}
