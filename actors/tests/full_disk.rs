//! A store that can no longer make writes durable (a full disk) is one
//! cause, answered one way: every write after it is
//! `temporarily_unavailable` (503), whether it was waiting for the failed
//! barrier or came later and was refused by the failed store.

use relay_actors::account::AccountCmd;
use relay_actors::delivery::NoPeers;
use relay_actors::store::{Engine, KvIter, ModelEngine, Store, StoreError, Write};
use relay_actors::Supervisor;
use relay_core::clock::ManualClock;
use relay_core::policy::Policy;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::methods::{RegisterParams, SendParams};
use relay_schemas::ErrorCode;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

const T0: u64 = 1_800_000_000;

/// The model engine on a disk that fills up when told.
#[derive(Default)]
struct Filling {
    inner: ModelEngine,
    full: AtomicBool,
}

impl Filling {
    fn refuse(&self) -> Result<(), StoreError> {
        match self.full.load(Relaxed) {
            true => Err(StoreError::Io("No space left on device (os error 28)".into())),
            false => Ok(()),
        }
    }
}

impl Engine for Filling {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get(key)
    }
    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        self.inner.range(start, end)
    }
    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError> {
        self.refuse()?;
        self.inner.apply(group)
    }
    fn barrier(&self) -> Result<(), StoreError> {
        self.refuse()?;
        self.inner.barrier()
    }
    fn bytes_written(&self) -> u64 {
        self.inner.bytes_written()
    }
    fn barriers(&self) -> u64 {
        self.inner.barriers()
    }
}

async fn register(sup: &Supervisor, account: &Account, device: &Device) -> Result<(), ErrorCode> {
    let route = account.route(1, &[("relay-a", "http://a")], T0);
    let reg = account.register_params(&route, &account.certificate(device, T0, None), "relay-a", true, T0);
    let params: RegisterParams = serde_json::from_str(&reg.to_string()).unwrap();
    let cmd = AccountCmd::AccountRegister { params, digest: format!("r-{}", account.id), known: None };
    sup.ask(&account.id, cmd).await.map(drop).map_err(|e| e.code)
}

#[actix_rt::test]
async fn a_full_disk_answers_temporarily_unavailable_to_every_write_after_it() {
    let engine = Arc::new(Filling::default());
    let store = Store::with_engine(engine.clone()).unwrap();
    let sup =
        Supervisor::new(store, Policy::with_relay_id("relay-a"), ManualClock::at_ms(T0 * 1000), Arc::new(NoPeers));
    sup.start().unwrap();
    let (alice, phone) = (Account::from_seed([1; 32]), Device::from_seed("phone", [2; 32]));
    let (bob, laptop) = (Account::from_seed([3; 32]), Device::from_seed("laptop", [4; 32]));
    register(&sup, &alice, &phone).await.unwrap();
    register(&sup, &bob, &laptop).await.unwrap();
    assert!(sup.store().is_healthy());

    engine.full.store(true, Relaxed);
    let send = |mid: &str| {
        let env = phone.envelope(&alice.id, &bob.id, mid, T0, b"x");
        let p = json!({"envelope": env, "recipient_boxes": [key_box("laptop", b"k")]});
        let params: SendParams = serde_json::from_str(&p.to_string()).unwrap();
        sup.message_send(&alice.id, "phone".into(), params, format!("d-{mid}"))
    };
    // The first write waits for the barrier that fails; the next ones are
    // refused by the failed store before they are queued.
    let first = send("msg-0000000000000001").await.map(drop).map_err(|e| e.code);
    assert_eq!(first, Err(ErrorCode::TemporarilyUnavailable));
    assert!(!sup.store().is_healthy(), "the readiness check reports it");
    let second = send("msg-0000000000000002").await.map(drop).map_err(|e| e.code);
    assert_eq!(second, Err(ErrorCode::TemporarilyUnavailable));
    let carol = (Account::from_seed([5; 32]), Device::from_seed("phone", [6; 32]));
    assert_eq!(register(&sup, &carol.0, &carol.1).await, Err(ErrorCode::TemporarilyUnavailable));
}
