//! The methods: [`Method`], one variant per client method (PROTOCOL §4)
//! and relay method (§5) with its wire name and caller, then the params
//! and results of each. Params keep unknown members out of the typed view;
//! the transport keeps the whole params object for idempotency.

use crate::objects::{present, *};
use serde::{Deserialize, Serialize};

/// Who may call a method: anyone (rate limited per client address), a
/// device with a session at this relay, or a configured peer relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    None,
    Session,
    Relay,
}

/// The enum and its `ALL`, `as_str` and `caller` from one table, so a
/// method's wire name and caller are written once.
macro_rules! methods {
    ($(#[$meta:meta])* pub enum Method { $($variant:ident = $wire:literal, $caller:ident;)* }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Method {
            $($variant,)*
        }

        impl Method {
            /// Every variant, client methods first, in PROTOCOL order.
            pub const ALL: [Method; [$(Method::$variant),*].len()] = [$(Method::$variant),*];

            /// The wire name (both sides of a shared name answer the same).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Method::$variant => $wire,)*
                }
            }

            /// Who may call it.
            pub const fn caller(self) -> Caller {
                match self {
                    $(Method::$variant => Caller::$caller,)*
                }
            }
        }
    };
}

methods! {
    /// Every method this relay serves, one variant per wire method and side:
    /// `route.get` and `account.devices.get` are served to clients
    /// (`/v1/rpc`) and to peers (`/v1/relay`), with different callers and
    /// rules, so each has a `Relay…` variant too. The variant is the wire name
    /// in camel case; the relay's handler is `server/src/method/<wire_name>.rs`
    /// (dots as underscores). `Caller::None` methods are rate limited per
    /// client address; `route.get` also takes an optional session (then it
    /// asks the peers too); `session.attach` attaches a session on a
    /// WebSocket.
    pub enum Method {
        AccountRegister = "account.register", None;
        SessionChallenge = "session.challenge", None;
        SessionOpen = "session.open", None;
        SessionAttach = "session.attach", Session;
        DeviceAdd = "device.add", Session;
        DeviceRevoke = "device.revoke", Session;
        AccountDevicesGet = "account.devices.get", Session;
        AccountSettingsUpdate = "account.settings.update", Session;
        RouteGet = "route.get", None;
        RouteUpdate = "route.update", Session;
        ContactRevoke = "contact.revoke", Session;
        MessageSend = "message.send", Session;
        MessageDeliveryStatus = "message.delivery.status", Session;
        MessageTimelineSync = "message.timeline.sync", Session;
        MessageTimelineAck = "message.timeline.ack", Session;
        PushVapidKey = "push.vapid_key", None;
        PushSubscribe = "push.subscribe", Session;
        PushUnsubscribe = "push.unsubscribe", Session;
        MessageDeliver = "message.deliver", Relay;
        RelayRouteGet = "route.get", Relay;
        RelayAccountDevicesGet = "account.devices.get", Relay;
        MessageDeliveryPeerStatus = "message.delivery.peer_status", Relay;
        TimelineReplicate = "timeline.replicate", Relay;
        AuditCheckpoint = "audit.checkpoint", Relay;
        MessageDeliverBatch = "message.deliver.batch", Relay;
    }
}

impl Method {
    /// A client method (`POST /v1/rpc/{method}`, WebSocket frames) by wire name.
    pub fn from_client_wire(name: &str) -> Option<Method> {
        Self::ALL.into_iter().find(|m| m.caller() != Caller::Relay && m.as_str() == name)
    }

    /// A relay method (`POST /v1/relay/{method}`) by wire name.
    pub fn from_relay_wire(name: &str) -> Option<Method> {
        Self::ALL.into_iter().find(|m| m.caller() == Caller::Relay && m.as_str() == name)
    }
}

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

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccountIdParams {
    pub account_id: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct DevicesResult<'a> {
    pub certificates: Vec<&'a Wire<DeviceCertificate>>,
    pub revocations: Vec<&'a Wire<DeviceRevocation>>,
}

/// An `account.devices.get` result as read from another relay (the
/// account's home), to be checked before it is passed on.
#[derive(Clone, Debug, Deserialize)]
pub struct DevicesAnswer {
    pub certificates: Vec<Wire<DeviceCertificate>>,
    pub revocations: Vec<Wire<DeviceRevocation>>,
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

impl DeliverParams {
    /// RFC 8785 (JCS) bytes of the params as they go on the wire, what the
    /// deliver digest hashes: `encoding::jcs(self)`, written from each
    /// object's own canonical bytes ([`Wire::jcs`]) instead of parsing
    /// every object again. Members in JCS order, optional ones only when
    /// present, as serde writes them; a new member must be added here too
    /// (the destructuring below stops the build until it is).
    pub fn jcs(&self) -> Result<Vec<u8>, crate::RelayError> {
        let DeliverParams { envelope, recipient_boxes, sender_device_certificate, sender_route, authorization } = self;
        let mut out = Vec::with_capacity(2048);
        out.push(b'{');
        if let Some(a) = authorization {
            let (variant, wire) = match a {
                Authorization::ContactGrant(w) => ("contact_grant", w.jcs()?),
                Authorization::ContactInvite(w) => ("contact_invite", w.jcs()?),
            };
            out.extend_from_slice(b"\"authorization\":{\"");
            out.extend_from_slice(variant.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(wire);
            out.extend_from_slice(b"},");
        }
        out.extend_from_slice(b"\"envelope\":");
        out.extend_from_slice(envelope.jcs()?);
        out.extend_from_slice(b",\"recipient_boxes\":[");
        for (i, b) in recipient_boxes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b.jcs()?);
        }
        out.extend_from_slice(b"],\"sender_device_certificate\":");
        out.extend_from_slice(sender_device_certificate.jcs()?);
        if let Some(r) = sender_route {
            out.extend_from_slice(b",\"sender_route\":");
            out.extend_from_slice(r.jcs()?);
        }
        out.push(b'}');
        Ok(out)
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct MessageIdParams {
    pub message_id: String,
}

/// `message.delivery.peer_status` params (a relay method): the sender's
/// account and the message.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerStatusParams {
    pub from: String,
    pub message_id: String,
}

/// `message.delivery.peer_status` result: whether the asked relay knows the
/// message, and its status if so.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerStatusResult {
    pub known: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DeliveryStatus>,
}

/// `message.deliver.batch` (PROTOCOL §5): many `message.deliver` params
/// to one peer in one signed request. Items stay raw: each is checked,
/// digested and decided exactly as a single `message.deliver` body.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeliverBatchParams {
    pub items: Vec<Box<serde_json::value::RawValue>>,
}

impl DeliverBatchParams {
    /// Items one batch carries at most (PROTOCOL §5).
    pub const MAX_ITEMS: usize = 256;
}

/// `message.deliver.batch` result: one answer per item, in order, each what
/// a single `message.deliver` would have answered (a `DeliveryStatus`, or
/// `{"error": RelayError}`). Kept raw: a peer's error code may be one this
/// version does not define, which ends that item's delivery alone.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeliverBatchResult {
    pub results: Vec<Box<serde_json::value::RawValue>>,
}

/// `timeline.replicate` params (PROTOCOL §5): the caller's cursor in the
/// callee's stream of the account (`after`), a page size, and `ack`, what
/// the caller stored from the last page. `notify` (an extension member the
/// protocol's params allow): the caller has new items of its own, so the
/// callee should pull from it soon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicateParams {
    pub account_id: String,
    pub after: u64,
    pub limit: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify: bool,
}

pub const REPLICATE_MAX_LIMIT: u32 = 500;

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

// ---- Notifications (PROTOCOL §3, §4) ------------------------------------------

/// The notifications a relay pushes to connected devices, as
/// `{"method", "params"}` frames.
pub mod notifications {
    use crate::objects::Status;
    use crate::RelayError;
    use serde::{Deserialize, Serialize};

    /// The account's timeline has records up to `sequence`.
    pub const TIMELINE_CHANGED: &str = "message.timeline.changed";
    /// A message this account sent has a new delivery status.
    pub const DELIVERY_CHANGED: &str = "message.delivery.changed";

    /// [`TIMELINE_CHANGED`] params.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct TimelineChanged {
        pub account_id: String,
        pub sequence: u64,
    }

    /// [`DELIVERY_CHANGED`] params: `error` iff `failed`.
    #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
    pub struct DeliveryChanged {
        pub message_id: String,
        pub status: Status,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub error: Option<RelayError>,
    }
}

// ---- Web Push (PROTOCOL §9) ---------------------------------------------------

/// Longest accepted push endpoint URL.
pub const PUSH_ENDPOINT_MAX: usize = 2048;

/// `push.vapid_key` result: the relay's VAPID public key (RFC 8292), the
/// 65-byte uncompressed P-256 point in base64url.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VapidKeyResult {
    pub public_key: String,
}

/// The keys of a Web Push subscription (RFC 8291): the user agent's ECDH
/// public key and its authentication secret, base64url.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushKeys {
    pub p256dh: String,
    pub auth: String,
}

/// `push.subscribe` params: a browser's `PushSubscription.toJSON()`
/// (`expirationTime` and other members are ignored).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushSubscribeParams {
    pub endpoint: String,
    pub keys: PushKeys,
}

impl PushSubscribeParams {
    /// The shape checks: an absolute `https://` endpoint (`http://` too with
    /// `allow_http`) with a host, no whitespace or control characters, at
    /// most [`PUSH_ENDPOINT_MAX`] long; `p256dh` 65 bytes starting 0x04 (an
    /// uncompressed point; whether it is on the curve is checked where the
    /// curve is known), `auth` 16 bytes.
    ///
    /// Unless `allow_private`, a host that names this machine or a private
    /// network directly (`localhost`, loopback, RFC 1918, link-local,
    /// unique-local or unspecified addresses) is refused: a subscriber must
    /// not make the relay probe its operator's network. This reads the text
    /// only (a clear early error): other spellings of an address and names
    /// resolving to one are refused by the push sender's connector, which
    /// checks every address it would connect to ([`is_public_address`]).
    pub fn check(&self, allow_http: bool, allow_private: bool) -> Result<(), crate::RelayError> {
        use crate::RelayError;
        let e = &self.endpoint;
        if e.len() > PUSH_ENDPOINT_MAX {
            return Err(RelayError::invalid_params(format!("endpoint is longer than {PUSH_ENDPOINT_MAX}")));
        }
        if e.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(RelayError::invalid_params("endpoint has whitespace or control characters"));
        }
        let rest = match (e.strip_prefix("https://"), e.strip_prefix("http://")) {
            (Some(rest), _) => rest,
            (None, Some(rest)) if allow_http => rest,
            _ => return Err(RelayError::invalid_params("endpoint must be an https:// URL")),
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.is_empty() || authority.contains('@') {
            return Err(RelayError::invalid_params("endpoint has no host (or has user info)"));
        }
        if !allow_private && is_private_host(authority) {
            return Err(RelayError::invalid_params("endpoint names a local or private-network host"));
        }
        let p256dh = crate::encoding::b64_decode("keys.p256dh", &self.keys.p256dh)?;
        if p256dh.len() != 65 || p256dh[0] != 4 {
            return Err(RelayError::invalid_params("keys.p256dh must be a 65-byte uncompressed P-256 point"));
        }
        let auth = crate::encoding::b64_decode("keys.auth", &self.keys.auth)?;
        if auth.len() != 16 {
            return Err(RelayError::invalid_params("keys.auth must be 16 bytes"));
        }
        Ok(())
    }
}

/// Whether a URL authority (`host[:port]`, `[v6][:port]`) names this machine
/// or a private network directly.
fn is_private_host(authority: &str) -> bool {
    use std::net::{IpAddr, Ipv4Addr};
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    let v4 = |ip: Ipv4Addr| {
        ip.is_loopback() || ip.is_private() || ip.is_link_local() || ip.is_unspecified() || ip.is_broadcast()
            // 100.64.0.0/10, shared address space (carrier-grade NAT)
            || (ip.octets()[0] == 100 && (ip.octets()[1] & 0xc0) == 64)
    };
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => v4(ip),
        Ok(IpAddr::V6(ip)) => {
            let seg = ip.segments()[0];
            ip.is_loopback()
                || ip.is_unspecified()
                || (seg & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (seg & 0xffc0) == 0xfe80 // link-local fe80::/10
                || ip.to_ipv4_mapped().is_some_and(v4)
        }
        Err(_) => false,
    }
}

/// Whether the push sender may connect to `ip` (unless
/// `push.allow_private_endpoints`): a globally routed unicast address. Refused:
/// loopback, RFC 1918, link-local, unspecified / "this network" (0.0.0.0/8),
/// broadcast, multicast, reserved (240/4), documentation, benchmarking
/// (198.18/15), IETF protocol assignments (192.0.0/24), shared CGNAT space
/// (100.64/10); for IPv6 the same through IPv4-mapped, IPv4-compatible and
/// NAT64 (64:ff9b::/96) forms, unique-local, site-local and link-local,
/// multicast and documentation (2001:db8::/32). This is checked on the
/// address the sender is about to connect to, after name resolution: the
/// endpoint's text can spell an address many ways (`127.1`, `2130706433`,
/// `0x7f000001`, `0177.0.0.1`, `0`) and a name can resolve to anything.
pub fn is_public_address(ip: std::net::IpAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr};
    fn v4(ip: Ipv4Addr) -> bool {
        let [a, b, c, _] = ip.octets();
        !(a == 0
            || ip.is_loopback()
            || ip.is_private()
            || ip.is_link_local()
            || ip.is_broadcast()
            || ip.is_multicast()
            || a >= 240
            || ip.is_documentation()
            || (a == 100 && (b & 0xc0) == 64)
            || (a == 198 && (b & 0xfe) == 18)
            || (a == 192 && b == 0 && c == 0))
    }
    match ip {
        IpAddr::V4(ip) => v4(ip),
        IpAddr::V6(ip) => {
            let s = ip.segments();
            if let Some(mapped) = ip.to_ipv4_mapped() {
                return v4(mapped);
            }
            let embedded = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
            // ::a.b.c.d (IPv4-compatible, deprecated) and 64:ff9b::a.b.c.d (NAT64) reach an IPv4 host.
            if s[..6] == [0; 6] && !ip.is_loopback() && !ip.is_unspecified() {
                return v4(embedded);
            }
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return v4(embedded);
            }
            !(ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (s[0] & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (s[0] & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || (s[0] == 0x2001 && s[1] == 0x0db8)) // documentation
        }
    }
}

/// The payload of a Web Push message, before RFC 8291 encryption: which
/// account's timeline changed and its new last sequence. Never content or
/// sender (PROTOCOL §9).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushPayload {
    /// Always `"timeline.changed"`.
    #[serde(rename = "type")]
    pub kind: String,
    pub account_id: String,
    pub sequence: u64,
}

impl PushPayload {
    pub fn timeline_changed(account_id: &str, sequence: u64) -> Self {
        PushPayload { kind: "timeline.changed".into(), account_id: account_id.into(), sequence }
    }
}

#[cfg(test)]
mod tests {
    use super::{is_private_host, is_public_address, Caller, Method};

    #[test]
    fn every_method_is_found_by_its_wire_name_and_named_after_it() {
        for m in Method::ALL {
            let found = match m.caller() {
                Caller::Relay => Method::from_relay_wire(m.as_str()),
                _ => Method::from_client_wire(m.as_str()),
            };
            assert_eq!(found, Some(m), "{m:?}");
            // The variant is the wire name in camel case (a relay-side twin adds `Relay`).
            let camel: String = m.as_str().split(['.', '_']).map(|w| w[..1].to_uppercase() + &w[1..]).collect();
            let variant = format!("{m:?}");
            assert_eq!(
                variant.strip_prefix("Relay").filter(|_| m.caller() == Caller::Relay).unwrap_or(&variant),
                camel
            );
        }
        assert_eq!(Method::from_client_wire("message.deliver"), None);
        assert_eq!(Method::from_relay_wire("message.send"), None);
    }

    #[test]
    fn push_endpoints_naming_local_or_private_hosts_are_recognised() {
        for h in [
            "localhost",
            "a.localhost:8080",
            "127.0.0.1",
            "127.1.2.3:443",
            "10.0.0.1",
            "172.16.5.4",
            "192.168.1.1:8443",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "[::1]",
            "[::1]:443",
            "[fe80::1]",
            "[fd00::1]",
            "[::ffff:10.0.0.1]",
            "LOCALHOST.",
        ] {
            assert!(is_private_host(h), "{h}");
        }
        for h in
            ["fcm.googleapis.com", "updates.push.services.mozilla.com:443", "8.8.8.8", "[2001:db8::1]", "100.128.0.1"]
        {
            assert!(!is_private_host(h), "{h}");
        }
    }

    #[test]
    fn the_push_sender_connects_only_to_public_unicast_addresses() {
        for a in [
            "127.0.0.1",
            "127.0.1.1",
            "0.0.0.0",
            "0.1.2.3",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "192.0.0.8",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b::7f00:1",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
            "2001:db8::1",
        ] {
            assert!(!is_public_address(a.parse().unwrap()), "{a}");
        }
        for a in [
            "8.8.8.8",
            "142.250.185.74",
            "100.128.0.1",
            "198.20.0.1",
            "2a00:1450:4001:82b::200a",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(is_public_address(a.parse().unwrap()), "{a}");
        }
    }
}
