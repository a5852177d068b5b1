//! Group commit: one flusher thread makes many commits durable with one fsync.
//!
//! 1. `commit` applies its sled batch, then takes the next ticket from
//!    `committed` (so every ticket <= a value read later was applied before
//!    that read) and wakes the flusher.
//! 2. The flusher reads `committed` as its target, calls `db.flush()`, and
//!    publishes the target on a watch channel: every commit applied before the
//!    flush started is now durable. Commits that arrive during a flush wait
//!    for the next one, so under load one flush covers many commits.
//! 3. `durable(ticket)` waits on the channel until the published value
//!    covers its ticket. A failed flush is published too and is sticky, so
//!    no waiter is ever told Ok for data that might not be on disk.
//! 4. On close the flusher flushes what is left, then exits and drops the
//!    sender, so a waiter that can no longer be served gets `Closed`.
//! 5. Flushes start at most once per `interval` (the group-commit window).
//!    An idle store flushes a lone commit at once; under load the flusher
//!    would otherwise flush back to back, a handful of commits each, and
//!    every flush costs a write and a `sync_file_range` in sled's IO
//!    threads whatever it carries. Waiting out the rest of the window costs
//!    a commit at most `interval` and lets one flush carry many.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake};

use tokio::sync::watch;

/// What the flusher publishes.
#[derive(Clone, Debug, Default)]
pub(super) struct Flushed {
    /// Every ticket <= this is durable.
    pub upto: u64,
    /// Set once a flush failed; the store accepts no commit after that.
    pub failed: Option<Arc<str>>,
}

/// State shared by all `Store` clones and the flusher thread.
pub(super) struct Shared {
    pub db: sled::Db,
    /// Serializes commits, so the head check and the apply are atomic and
    /// `close` can be sure no commit is half done.
    pub commit_lock: Mutex<()>,
    /// Last ticket handed out (tickets start at 1).
    pub committed: AtomicU64,
    pub closing: AtomicBool,
    /// The flusher sleeps on this until there is work or a close.
    wake: (Mutex<()>, Condvar),
    pub flushed: watch::Receiver<Flushed>,
    pub events: AtomicU64,
    pub flushes: AtomicU64,
    /// The group-commit window in microseconds (see 5. above).
    pub interval_us: AtomicU64,
    /// Told (commits covered, duration) after every flush.
    pub observer: std::sync::OnceLock<FlushObserver>,
}

/// Half a millisecond: under load about 2,000 flushes a second at most,
/// and a commit waits at most that long for its window.
pub(super) const DEFAULT_INTERVAL_US: u64 = 500;

pub type FlushObserver = Box<dyn Fn(u64, std::time::Duration) + Send + Sync>;

impl Shared {
    pub fn new(db: sled::Db) -> (Arc<Shared>, watch::Sender<Flushed>) {
        let (tx, rx) = watch::channel(Flushed::default());
        let shared = Shared {
            db,
            commit_lock: Mutex::new(()),
            committed: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
            flushed: rx,
            events: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            interval_us: AtomicU64::new(DEFAULT_INTERVAL_US),
            observer: std::sync::OnceLock::new(),
        };
        (Arc::new(shared), tx)
    }

    /// Wakes the flusher. Taking the lock orders this after the flusher's
    /// check of its wait condition, so no wake-up is lost.
    pub fn wake_flusher(&self) {
        let _g = lock(&self.wake.0);
        self.wake.1.notify_one();
    }

    /// The flusher thread's body.
    pub fn run_flusher(&self, tx: watch::Sender<Flushed>) {
        let mut flushed = 0;
        let mut last_start: Option<std::time::Instant> = None;
        loop {
            {
                let mut g = lock(&self.wake.0);
                while !self.closing.load(SeqCst) && self.committed.load(SeqCst) <= flushed {
                    g = self.wake.1.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            }
            let interval = std::time::Duration::from_micros(self.interval_us.load(SeqCst));
            if let Some(rest) = last_start.and_then(|t| interval.checked_sub(t.elapsed())) {
                if !self.closing.load(SeqCst) {
                    std::thread::sleep(rest);
                }
            }
            // `close` sets the flag under the commit lock, so if it is set here
            // no ticket can follow this read of `committed`: a final flush.
            let closing = self.closing.load(SeqCst);
            let target = self.committed.load(SeqCst);
            if target > flushed {
                let started = std::time::Instant::now();
                last_start = Some(started);
                match self.db.flush() {
                    Ok(_) => {
                        if let Some(observe) = self.observer.get() {
                            observe(target - flushed, started.elapsed());
                        }
                        flushed = target;
                        self.flushes.fetch_add(1, SeqCst);
                        tx.send_modify(|f| f.upto = target);
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "event store flush failed");
                        tx.send_modify(|f| f.failed = Some(e.to_string().into()));
                        return;
                    }
                }
            }
            if closing && self.committed.load(SeqCst) <= flushed {
                return;
            }
        }
    }
}

/// Locks, ignoring poison: the data behind these mutexes is `()`.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a future on the current thread without a runtime (the watch channel
/// needs none). Used by the blocking helpers for CLI and tests; do not call it
/// on an async executor thread.
pub(super) fn block_on<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}
