//! Heap bytes per resident idle account actor, counted by a global
//! allocator: exact, and the same on every machine and build, where RSS
//! (`cargo bench --bench actor_scale`) adds the allocator's overhead and
//! the machine's noise. Its own test binary: the allocator counts every
//! thread, so nothing else may run beside it.

use relay_actors::account::AccountCmd;
use relay_actors::delivery::NoPeers;
use relay_actors::Supervisor;
use relay_core::clock::ManualClock;
use relay_core::policy::Policy;
use relay_schemas::client::{Account, Device};
use relay_schemas::methods::RegisterParams;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;

struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
static LIVE_BLOCKS: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to the system allocator, counting on the way.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Relaxed);
        LIVE_BLOCKS.fetch_add(1, Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new as i64 - layout.size() as i64, Relaxed);
        System.realloc(ptr, layout, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const T0: u64 = 1_800_000_000;
const N: usize = 2000;

fn register(i: usize) -> (String, AccountCmd) {
    let mut seed = [0xa1; 32];
    seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
    let account = Account::from_seed(seed);
    seed[8] = 0xd1;
    let phone = Device::from_seed("phone", seed);
    let route = account.route(1, &[("relay-a", "http://127.0.0.1:1")], T0);
    let v = account.register_params(&route, &account.certificate(&phone, T0, None), "relay-a", true, T0);
    let params: RegisterParams = serde_json::from_str(&v.to_string()).unwrap();
    // A registration's digest is 64 hex digits, kept in the state.
    let digest = format!("{i:064x}");
    (account.id.clone(), AccountCmd::AccountRegister { params, digest, known: None })
}

fn live() -> (i64, i64) {
    (LIVE_BYTES.load(Relaxed), LIVE_BLOCKS.load(Relaxed))
}

#[actix_rt::test]
async fn a_resident_idle_account_actor_holds_at_most_its_budget_of_heap() {
    let store = relay_actors::store::Store::temporary().unwrap();
    let clock = ManualClock::at_ms(T0 * 1000);
    let mut ids = Vec::new();
    {
        let sup = Supervisor::new(store.clone(), Policy::with_relay_id("relay-a"), clock.clone(), Arc::new(NoPeers));
        sup.start().unwrap();
        for i in 0..N {
            let (id, cmd) = register(i);
            sup.ask(&id, cmd).await.unwrap();
            ids.push(id);
        }
    }
    let sup = Supervisor::new(store.clone(), Policy::with_relay_id("relay-a"), clock, Arc::new(NoPeers));
    sup.start().unwrap();
    // Warm what is shared, as the bench does: sled's cache (the events
    // a load reads), the route book.
    for id in &ids {
        for ev in store.read(&relay_actors::account::stream_id(id), 0) {
            ev.unwrap();
        }
        let _ = sup.routes().get(id).unwrap();
    }
    let (b0, n0) = live();
    for id in &ids {
        sup.ask(id, AccountCmd::RouteGet).await.unwrap();
    }
    assert_eq!(sup.resident_accounts(), N);
    let (b1, n1) = live();
    let per = (b1 - b0) as f64 / N as f64;
    let blocks = (n1 - n0) as f64 / N as f64;
    eprintln!("per resident idle actor: {per:.0} B of heap in {blocks:.1} blocks");
    // 3,814 B in 31 blocks before the route was shared with the route
    // book, the actors' handles shared and the keys parsed when first
    // asked; 2,551 B in 23 after (with a 2-byte digest). Then 2,672 B in
    // 23 blocks before, and 1,816 B in 13 after (a 64-digit digest): no timer of its own, what
    // it holds while busy in one allocation made when needed, one `Ports`
    // for all, the certificate kept as text until read. Then 1,831 B in
    // 13.1 blocks before, and 1,639 B in 12.1 after: the rarely written
    // maps behind one box (the actor 392 -> 320 B inline, so actix's task
    // holding it drops from 896 to 768 B), the registration digest as its
    // 32 bytes inline. RSS adds the allocator's ~8-16 B a block.
    assert!(per <= BUDGET as f64, "{per:.0} B of heap per resident idle actor, over {BUDGET}");
}

/// Heap bytes one resident idle account actor (one device, one route) may
/// hold: its state, its actix context and mailbox, its place in the
/// supervisor's map. Issue 44's bound is 2 KiB of RSS; this is what the
/// actor reached (1,639 B) with a little margin, so it cannot grow back
/// unnoticed (one more 128-byte step of actix's task breaks it).
const BUDGET: usize = 1_680;
