//! What an owner holds in memory of its shard: the JetStream engine reads
//! from its local copy on disk, so the heap stays put while the shard
//! grows (counted by this test binary's allocator, not RSS: live bytes
//! allocated and not yet freed, every thread included).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::sync::Arc;

use relay_actors::nats_server::{self, NatsServer};
use relay_actors::store::{JetStreamConfig, JetStreamEngine, NewEvent, Store};
use serde_json::value::RawValue;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Sends of 16 KiB each, one commit each, to 97 accounts in turn.
fn send(store: &Store, from: usize, to: usize) {
    let body = format!(r#"{{"body":"{}"}}"#, "x".repeat(16 << 10));
    for i in from..to {
        let stream = format!("account/{}", i % 97);
        let mut batch = store.batch();
        let head = store.head(&stream).unwrap();
        let event = NewEvent {
            event_type: "noted".into(),
            version: 1,
            at: i as u64,
            data: RawValue::from_string(body.clone()).unwrap(),
        };
        batch.append(&stream, head, vec![event]);
        store.commit_durable_blocking(batch).unwrap();
    }
}

#[test]
fn owner_memory_does_not_grow_with_the_shard() {
    let Some(bin) = nats_server::binary_for_test() else { return };
    let (dir, copy) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = NatsServer::single(&bin, dir.path()).unwrap();
    let cfg = JetStreamConfig {
        copy_dir: Some(copy.path().join("copy")),
        cache_bytes: 64 << 10,
        ..JetStreamConfig::shard(vec![server.url()], "t", 0, 1)
    };
    let store = Store::with_engine(Arc::new(JetStreamEngine::open(cfg, 1).unwrap())).unwrap();
    // Past the client's and sled's buffers filling up.
    send(&store, 0, 1500);
    let before = LIVE.load(Relaxed);
    send(&store, 1500, 3000);
    let grown = LIVE.load(Relaxed) - before;
    // 1,500 sends of 16 KiB, 24 MiB: an engine with the shard in memory
    // grows by more than that here.
    assert!(grown < 4 << 20, "the heap grew by {grown} bytes over 1,500 sends of 16 KiB");
}
