//! What sled holds in a stopped relay's store, by kind of key: count, key
//! and value bytes (values as sled has them: pointers for events and
//! blobs), beside the size of sled's file and of the value log. For the
//! retention soak (`docs/performance-journal.md`): whether the file follows
//! the live keys or its own garbage.
//!
//! ```text
//! cargo run --release -p relay-actors --example store_space -- DATA_DIR [--rewrite]
//! ```
//!
//! `--rewrite` then rewrites sled into a fresh copy (the store's step 9,
//! which a running relay does once the file has tripled) and prints its
//! size: the low end of the sawtooth sled's file follows.

use relay_actors::store::Store;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn dir_bytes(path: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// A key's kind: its space byte (`codec.rs`) and the name up to the first
/// `/` (the kind of stream, or the projection that wrote a kv entry).
fn kind(key: &[u8]) -> String {
    let Some((space, rest)) = key.split_first() else { return "empty".into() };
    let name: String = rest.iter().take_while(|b| **b != b'/' && **b != 0).take(16).map(|b| *b as char).collect();
    format!("{} {name}", *space as char)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = PathBuf::from(std::env::args().nth(1).ok_or("usage: store_space DATA_DIR")?);
    let store_dir = data.join("store");
    let store = Store::open(&store_dir)?;
    let mut kinds: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for pair in store.raw_db().iter() {
        let (k, v) = pair?;
        let entry = kinds.entry(kind(&k)).or_default();
        entry.0 += 1;
        entry.1 += k.len() as u64;
        entry.2 += v.len() as u64;
    }
    let (mut n, mut kb, mut vb) = (0, 0, 0);
    println!("{:<24} {:>12} {:>14} {:>14}", "kind", "keys", "key bytes", "value bytes");
    for (kind, (count, keys, values)) in &kinds {
        println!("{kind:<24} {count:>12} {keys:>14} {values:>14}");
        (n, kb, vb) = (n + count, kb + keys, vb + values);
    }
    println!("{:<24} {n:>12} {kb:>14} {vb:>14}", "all");
    let db = std::fs::metadata(store_dir.join("db")).map(|m| m.len()).unwrap_or(0);
    println!(
        "sled db file {db} bytes ({:.1} per live key); value log {} bytes",
        db as f64 / n.max(1) as f64,
        dir_bytes(&store_dir.join("log"))
    );
    store.close()?;
    drop(store);
    if std::env::args().nth(2).as_deref() == Some("--rewrite") {
        let engine = relay_actors::store::SledEngine::open(&store_dir, None)?;
        let pairs = engine.rewrite_now()?;
        let (_, fresh) = engine.rewrites();
        relay_actors::store::Engine::close(&engine)?;
        println!(
            "rewritten: {pairs} pairs, fresh sled file {fresh} bytes ({:.1} per key)",
            fresh as f64 / pairs.max(1) as f64
        );
    }
    Ok(())
}
