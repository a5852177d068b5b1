//! Accounts built to sit at a limit (`max_devices`, `max_revoked_contacts`,
//! `max_object_bytes`), for the tests of the limits' rules.

use crate::account::ledger::SendEntry;
use crate::account::method::account_register::register;
use crate::account::method::device_add::add_device;
use crate::account::shared::Ctx;
use crate::account::state::AccountState;
use crate::policy::Policy;
use relay_schemas::client::{Account, Device};
use relay_schemas::methods::RegisterParams;
use relay_schemas::objects::{DeliveryStatus, DeviceCertificate, Wire};
use relay_schemas::sign::Tag;
use relay_schemas::{ErrorCode, RelayError};
use serde_json::{json, Value};

pub const NOW: u64 = 1_764_400_000;

pub fn policy(max_devices: usize, max_revoked_contacts: usize) -> Policy {
    Policy { max_devices, max_revoked_contacts, ..Policy::with_relay_id("relay-a") }
}

pub fn wire<T: serde::de::DeserializeOwned>(v: &Value) -> Wire<T> {
    Wire::from_value(v).unwrap()
}

pub fn alice() -> Account {
    Account::from_seed([1; 32])
}

pub fn device(i: u8) -> Device {
    Device::from_seed(&format!("device-{i}"), [i + 10; 32])
}

pub fn register_value(cert: &Value) -> Value {
    let route = alice().route(1, &[("relay-a", "https://a.example")], NOW);
    alice().register_params(&route, cert, "relay-a", false, NOW)
}

/// Alice registered with device 0, then devices 1..n added.
pub fn alice_with(n: u8, ctx: Ctx) -> AccountState {
    let mut state = AccountState::new(&alice().id);
    let p: RegisterParams =
        serde_json::from_str(&register_value(&alice().certificate(&device(0), NOW, None)).to_string()).unwrap();
    for e in register(&state, &p, "digest", None, ctx).unwrap() {
        state.apply(&e);
    }
    for i in 1..n {
        for e in add_device(&state, &wire(&alice().certificate(&device(i), NOW, None)), ctx).unwrap() {
            state.apply(&e);
        }
    }
    state
}

/// A valid certificate of device `i` whose canonical JSON is `bytes`
/// long: padded with a signed unknown member.
pub fn padded_certificate(i: u8, bytes: usize) -> Value {
    let cert = alice().certificate(&device(i), NOW, None);
    let base = wire::<DeviceCertificate>(&alice().with_member(Tag::DeviceCertificate, &cert, "x-pad", json!("")))
        .jcs()
        .unwrap()
        .len();
    alice().with_member(Tag::DeviceCertificate, &cert, "x-pad", json!("a".repeat(bytes - base)))
}

pub fn limit_of(e: &RelayError) -> &str {
    assert_eq!(e.code, ErrorCode::PayloadTooLarge, "{e:?}");
    e.data.as_ref().and_then(|d| d["limit"].as_str()).unwrap_or_else(|| panic!("no data.limit in {e:?}"))
}

pub fn entry(retention_until: u64) -> SendEntry {
    let status = DeliveryStatus::target_accepted(10);
    SendEntry { digest: "d".into(), to: "b".into(), deadline: 50, retention_until, status, sequence: None }
}
