pub mod account;
pub mod canonical;
pub mod envelope;
pub mod http;
pub mod store;
pub mod timetable;

use relay_schemas::client::{key_box, Account, Device};
use serde_json::{json, Value};

pub const NOW: u64 = 1_764_400_000;

/// Alice (device "phone") sending to Bob (device "laptop").
pub struct Fixture {
    pub alice: Account,
    pub phone: Device,
    pub bob: Account,
    pub laptop: Device,
}

impl Fixture {
    pub fn new() -> Self {
        Fixture {
            alice: Account::from_seed([1; 32]),
            phone: Device::from_seed("phone", [2; 32]),
            bob: Account::from_seed([3; 32]),
            laptop: Device::from_seed("laptop", [4; 32]),
        }
    }

    pub fn send_params(&self, n: u64, payload: usize) -> Value {
        let env = self.phone.envelope(&self.alice.id, &self.bob.id, &format!("msg-{n:016}"), NOW, &vec![7u8; payload]);
        json!({"envelope": env, "recipient_boxes": [key_box(&self.laptop.id, &[9u8; 64])], "sender_boxes": [key_box("phone", &[8u8; 64])]})
    }
}
