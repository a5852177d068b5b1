//! One file per protocol method, named after its wire name: the method's
//! decision (`decide`, and the relay's own commands that serve it) beside
//! its unit tests, given(events) / when(command) / then(events or error).
//! [`super::command::decide`] forwards each command here; what several
//! methods share is in [`super::shared`].

pub mod account_devices_get;
pub mod account_register;
pub mod account_settings_update;
pub mod contact_revoke;
pub mod device_add;
pub mod device_revoke;
pub mod message_deliver;
pub mod message_delivery_peer_status;
pub mod message_delivery_status;
pub mod message_send;
pub mod message_timeline_ack;
pub mod message_timeline_sync;
pub mod push_subscribe;
pub mod push_unsubscribe;
pub mod route_get;
pub mod route_update;
pub mod session_attach;
pub mod session_challenge;
pub mod session_open;
pub mod timeline_replicate;
