//! Crash points for kill tests at the write path's commit boundaries.
//!
//! `RELAY_CRASH_AT=<name>` in the environment of `relay serve` makes the
//! process abort when it first reaches the point `<name>`, once everything
//! committed before the point is durable: the state a SIGKILL or power cut
//! leaves exactly there. The points are `fail` crate fail points, compiled
//! in only with the `crash-points` feature: the test builds enable it (a
//! dev-dependency of this crate and of the server on this crate with the
//! feature), a release build without it has no point and reads no
//! variable. With it, `fail::cfg` arms a point in-process too (any `fail`
//! action; `return` aborts as above). The points:
//!
//! - `send.after_receipt`: a local send's receipt is durable, its
//!   acceptance not written (the client gets no answer);
//! - `deliver.before_send`: a remote send's acceptance and first attempt
//!   are durable, the request has not left;
//! - `deliver.before_outcome`: the target answered the attempt, its outcome
//!   is not written.
//!
//! And in the value log's compaction (`store/sled_engine.rs`, step 7),
//! reached by the writer or `Store::compact_now`:
//!
//! - `compact.before_install`: a compaction record is synced, not in sled;
//! - `compact.before_checkpoint`: a victim's last copies are in sled, no
//!   checkpoint has flushed them;
//! - `compact.before_remove`: that checkpoint moved replay-from, no victim
//!   is removed;
//! - `compact.during_remove`: the first of its victims is removed, the
//!   others and the directory's sync are not.
//!
//! And in sled's rewrite (`store/sled_engine.rs`, step 9):
//!
//! - `rewrite.after_swap`: the copy is the engine's sled, its files not
//!   synced, `tree` not written;
//! - `rewrite.before_switch`: the copy is synced, `tree` does not name it;
//! - `rewrite.after_switch`: `tree` names the copy, the old sled's files
//!   are still there.
//!
//! And in cluster mode's checkpoints (`store/checkpoint.rs`):
//!
//! - `checkpoint.after_chunk`: a checkpoint's first chunk is stored, its
//!   other chunks and its mark are not;
//! - `bootstrap.after_chunk`: a bootstrap emptied the local copy and laid
//!   the checkpoint's first chunk, no sequence named.

use std::future::Future;

/// Whether crash points are compiled in (the `crash-points` feature).
pub fn compiled_in() -> bool {
    cfg!(feature = "crash-points")
}

/// Whether the point `name` fires now (then the caller aborts). The point
/// named by `RELAY_CRASH_AT` is armed as a fail point (`return`, every
/// time) on the first evaluation of any point.
#[cfg(feature = "crash-points")]
fn fires(name: &str) -> bool {
    static ARMED: std::sync::Once = std::sync::Once::new();
    ARMED.call_once(|| {
        if let Some(at) = std::env::var("RELAY_CRASH_AT").ok().filter(|s| !s.is_empty()) {
            fail::cfg(at, "return").expect("`return` is a fail action");
        }
    });
    fail::fail_point!(name, |_| true);
    false
}

#[cfg(not(feature = "crash-points"))]
fn fires(_name: &str) -> bool {
    false
}

/// The crash point `name`: aborts the process if armed, once `committed`'s
/// wait ends (everything committed so far durable: the caller's store,
/// named by the caller so this module stays below the store).
pub async fn point<F: Future>(name: &str, committed: impl FnOnce() -> F) {
    if !fires(name) {
        return;
    }
    let _ = committed().await;
    eprintln!("crash point {name}: aborting");
    std::process::abort();
}

/// A crash point inside the store's engine, where what precedes it is
/// durable by the engine's own order of writes: aborts if armed.
pub fn engine_point(name: &str) {
    if fires(name) {
        eprintln!("crash point {name}: aborting");
        std::process::abort();
    }
}
