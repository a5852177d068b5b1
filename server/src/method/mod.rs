//! One file per protocol method, named after its wire name with dots as
//! underscores: `message.send` is `message_send.rs`, `message.deliver` is
//! `message_deliver.rs`. `route.get` and `account.devices.get` are served to
//! clients and to peers with different rules; each has one file holding
//! both sides (`handle` for clients, `handle_relay` for peers), so a wire
//! name leads to one file.
//!
//! A file holds the method's handler and the params it reads; who may call
//! it is declared with `caller!` and checked at compile time against
//! [`Method::caller`], where the wire name and caller are listed once.
//! The shared plumbing stays in [`crate::app`] (params parsing, sessions,
//! rate limits, result mapping) and [`crate::peer_rpc`] (peer
//! authentication). `client` and `relay` dispatch with exhaustive
//! matches: a new [`Method`] variant fails to compile until it is routed.

use crate::app::App;
use relay_schemas::methods::Method;
use relay_schemas::RelayError;

/// Declares who may call `Method::$method`; a mismatch with
/// [`Method::caller`] fails to compile.
macro_rules! caller {
    ($method:ident, $caller:ident) => {
        const _: () = assert!(matches!(
            relay_schemas::methods::Method::$method.caller(),
            relay_schemas::methods::Caller::$caller
        ));
    };
}

mod account_devices_get;
mod account_register;
mod account_settings_update;
mod audit_checkpoint;
mod contact_revoke;
mod device_add;
mod device_revoke;
mod message_deliver;
mod message_deliver_batch;
mod message_delivery_peer_status;
mod message_delivery_status;
mod message_send;
mod message_timeline_ack;
mod message_timeline_sync;
mod push_subscribe;
mod push_unsubscribe;
mod push_vapid_key;
mod route_get;
mod route_update;
mod session_attach;
mod session_challenge;
mod session_open;
mod timeline_replicate;

/// A client method (`/v1/rpc/{method}` or a WebSocket frame); `token` is
/// the caller's session token, if it sent one.
pub(crate) async fn client(
    relay: &App,
    method: Method,
    token: Option<&str>,
    body: &[u8],
) -> Result<String, RelayError> {
    use Method::*;
    match method {
        AccountRegister => account_register::handle(relay, token, body).await,
        SessionChallenge => session_challenge::handle(relay, token, body).await,
        SessionOpen => session_open::handle(relay, token, body).await,
        SessionAttach => session_attach::handle(relay, token, body).await,
        DeviceAdd => device_add::handle(relay, token, body).await,
        DeviceRevoke => device_revoke::handle(relay, token, body).await,
        AccountDevicesGet => account_devices_get::handle(relay, token, body).await,
        AccountSettingsUpdate => account_settings_update::handle(relay, token, body).await,
        RouteGet => route_get::handle(relay, token, body).await,
        RouteUpdate => route_update::handle(relay, token, body).await,
        ContactRevoke => contact_revoke::handle(relay, token, body).await,
        MessageSend => message_send::handle(relay, token, body).await,
        MessageDeliveryStatus => message_delivery_status::handle(relay, token, body).await,
        MessageTimelineSync => message_timeline_sync::handle(relay, token, body).await,
        MessageTimelineAck => message_timeline_ack::handle(relay, token, body).await,
        PushVapidKey => push_vapid_key::handle(relay, token, body).await,
        PushSubscribe => push_subscribe::handle(relay, token, body).await,
        PushUnsubscribe => push_unsubscribe::handle(relay, token, body).await,
        MessageDeliver
        | MessageDeliverBatch
        | RelayRouteGet
        | RelayAccountDevicesGet
        | MessageDeliveryPeerStatus
        | TimelineReplicate
        | AuditCheckpoint => Err(RelayError::not_found(format!("unknown method {:?}", method.as_str()))),
    }
}

/// A relay method (`/v1/relay/{method}`) from the authenticated `peer`.
pub(crate) async fn relay(relay: &App, method: Method, peer: &str, body: &[u8]) -> Result<String, RelayError> {
    use Method::*;
    match method {
        MessageDeliver => message_deliver::handle_relay(relay, peer, body).await,
        MessageDeliverBatch => message_deliver_batch::handle_relay(relay, peer, body).await,
        RelayRouteGet => route_get::handle_relay(relay, peer, body).await,
        RelayAccountDevicesGet => account_devices_get::handle_relay(relay, peer, body).await,
        MessageDeliveryPeerStatus => message_delivery_peer_status::handle_relay(relay, peer, body).await,
        TimelineReplicate => timeline_replicate::handle_relay(relay, peer, body).await,
        AuditCheckpoint => audit_checkpoint::handle_relay(relay, peer, body).await,
        AccountRegister
        | SessionChallenge
        | SessionOpen
        | SessionAttach
        | DeviceAdd
        | DeviceRevoke
        | AccountDevicesGet
        | AccountSettingsUpdate
        | RouteGet
        | RouteUpdate
        | ContactRevoke
        | MessageSend
        | MessageDeliveryStatus
        | MessageTimelineSync
        | MessageTimelineAck
        | PushVapidKey
        | PushSubscribe
        | PushUnsubscribe => Err(RelayError::not_found(format!("unknown relay method {:?}", method.as_str()))),
    }
}
