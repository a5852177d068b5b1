//! Params and results of the client methods (PROTOCOL §4) and relay
//! methods (§5). Params keep unknown members out of the typed view; the
//! transport keeps the whole params object for idempotency.

use crate::objects::{present, *};
use serde::{Deserialize, Serialize};

/// The client methods of PROTOCOL §4.
pub const CLIENT_METHODS: &[&str] = &[
    "account.register",
    "session.challenge",
    "session.open",
    "session.attach",
    "device.add",
    "device.revoke",
    "account.devices.get",
    "account.settings.update",
    "route.get",
    "route.update",
    "contact.revoke",
    "message.send",
    "message.delivery.status",
    "message.timeline.sync",
    "message.timeline.ack",
];

/// The relay methods of PROTOCOL §5 that this relay serves.
pub const RELAY_METHODS: &[&str] =
    &["message.deliver", "route.get", "account.devices.get", "message.delivery.peer_status"];

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default, deserialize_with = "present")]
    pub public_discovery: Option<bool>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RegisterParams {
    pub route: Wire<Route>,
    pub device_certificate: Wire<DeviceCertificate>,
    /// Signed by the account key: the only source of the account's settings.
    pub registration: Wire<Registration>,
    /// The earlier, unsigned form of the settings: refused when it disagrees
    /// with `registration`.
    #[serde(default, deserialize_with = "present")]
    pub settings: Option<Settings>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RegisterResult<'a> {
    pub account_id: &'a str,
    pub route: &'a Wire<Route>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ChallengeParams {
    pub account_id: String,
    pub device_id: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChallengeResult {
    pub challenge: String,
    pub expires_at: u64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct SessionOpenParams {
    pub account_id: String,
    pub device_id: String,
    pub challenge: String,
    pub signature: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionOpenResult {
    pub token: String,
    pub expires_at: u64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DeviceAddParams {
    pub device_certificate: Wire<DeviceCertificate>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct DeviceRevokeParams {
    pub revocation: Wire<DeviceRevocation>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AccountIdParams {
    pub account_id: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct DevicesResult<'a> {
    pub certificates: Vec<&'a Wire<DeviceCertificate>>,
    pub revocations: Vec<&'a Wire<DeviceRevocation>>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct SettingsUpdateParams {
    pub public_discovery: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RouteUpdateParams {
    pub route: Wire<Route>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct ContactRevokeParams {
    #[serde(default, deserialize_with = "present")]
    pub grant_id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub invite_id: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SendParams {
    pub envelope: Wire<MessageEnvelope>,
    pub recipient_boxes: Vec<Wire<KeyBox>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub sender_boxes: Option<Vec<Wire<KeyBox>>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeliverParams {
    pub envelope: Wire<MessageEnvelope>,
    pub recipient_boxes: Vec<Wire<KeyBox>>,
    pub sender_device_certificate: Wire<DeviceCertificate>,
    /// The sender's signed Route under which the source accepted the
    /// message (PROTOCOL §5 *Who may deliver*). Required on the wire; a
    /// delivery accepted before this member existed has none stored and
    /// gets the sender's current route when it is sent.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub sender_route: Option<Wire<Route>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub authorization: Option<Authorization>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct MessageIdParams {
    pub message_id: String,
}

pub const SYNC_DEFAULT_LIMIT: u32 = 100;
pub const SYNC_MAX_LIMIT: u32 = 500;

#[derive(Clone, Debug, Deserialize)]
pub struct SyncParams {
    pub after: u64,
    #[serde(default, deserialize_with = "present")]
    pub limit: Option<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SyncResult<'a> {
    pub records: Vec<TimelineRecord<'a>>,
    pub next: u64,
    pub has_more: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AckParams {
    pub through: u64,
}
