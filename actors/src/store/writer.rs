//! The one writer: commits queue here, one thread writes them in groups.
//!
//! A commit (under the commit lock, no IO) checks its heads against the
//! heads kept in memory, takes the next ticket, lays its writes over the
//! engine in the overlay and appends them to the queue. The writer thread
//! takes the whole queue as one group, applies it to the engine, calls one
//! barrier, publishes the durable ticket, then installs the group in the
//! engine's indexes and drops it from the overlay. While it waits on the
//! barrier the next group queues up, so under load every barrier carries
//! what arrived during the previous one.
//!
//! An idle writer spends a barrier when someone waits for it: woken by a
//! commit, it starts a group once a queued commit is asked for
//! (`Store::durable`), or a window later. A commit answered later through
//! another one (a local send's receipt, made durable by the acceptance
//! that follows it) so rides in that one's group instead of taking a
//! barrier of its own; one nobody ever asks for still waits no longer
//! than the window. A busy writer takes what it finds after each group.
//!
//! Wake-ups: a commit, or a wait on a commit not yet taken, notifies the
//! writer only when the writer said it was idle; under load the writer
//! finds work after every group and is never notified. Waiters on
//! `durable` are woken once per group (a watch channel), not per commit.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::engine::{Engine, Write};
use super::overlay::Overlay;
use super::types::{Head, StoreError};

/// What the writer publishes.
#[derive(Clone, Debug, Default)]
pub(super) struct Durable {
    /// Every ticket <= this is durable.
    pub upto: u64,
    /// Set once a write or barrier failed; sticky: the store takes no
    /// commit after that and no waiter is told Ok for what was not synced.
    pub failed: Option<Arc<str>>,
}

/// What the writer did for one group, told to the observer (metrics).
#[derive(Clone, Copy, Debug)]
pub struct GroupReport {
    pub commits: u64,
    /// Real barriers (fsync/fdatasync) this group cost, checkpoints included.
    pub barriers: u64,
    /// Bytes the engine wrote for it.
    pub bytes: u64,
    /// From taking the group to publishing it durable.
    pub took: Duration,
}

pub type GroupObserver = Box<dyn Fn(&GroupReport) + Send + Sync>;

/// Stream heads kept in memory past this many are dropped when their last
/// commit is in the engine (where `Store::head` finds them again).
const HEADS_KEPT: usize = 1 << 16;

/// Half a millisecond: groups start at most this often (`Store::set_group_commit_window`).
pub(super) const DEFAULT_WINDOW_US: u64 = 500;

/// Everything the commit lock guards.
#[derive(Default)]
pub(super) struct CommitState {
    /// Last ticket handed out (tickets start at 1).
    pub last_ticket: u64,
    /// Head of every stream with a commit not yet in the engine, and of
    /// others up to `HEADS_KEPT`, with the ticket that wrote it.
    pub heads: HashMap<String, (Head, u64)>,
    /// The writes of the commits waiting for the writer, in ticket order.
    pub queue: Vec<Write>,
    pub queued_commits: u64,
    /// The highest ticket someone waits for (`Store::durable`): the
    /// writer starts a group at once while it is queued.
    pub wanted: u64,
    /// The writer waits for a notification (see the module doc).
    pub writer_idle: bool,
    pub closing: bool,
}

impl CommitState {
    /// Bounds `heads`: forgets heads whose commit is in the engine once
    /// there are too many. Returns whether it forgot any.
    pub fn trim_heads(&mut self, applied: u64) -> bool {
        if self.heads.len() <= HEADS_KEPT {
            return false;
        }
        self.heads.retain(|_, (_, ticket)| *ticket > applied);
        true
    }
}

/// State shared by all `Store` clones and the writer thread.
pub(super) struct Shared {
    pub engine: Arc<dyn Engine>,
    pub overlay: Overlay,
    pub state: Mutex<CommitState>,
    wake: Condvar,
    pub durable: watch::Receiver<Durable>,
    /// Every ticket <= this is in the engine and gone from the overlay.
    pub applied: AtomicU64,
    /// Times `heads` was trimmed: a head read outside the lock is stale if
    /// this moved meanwhile.
    pub head_trims: AtomicU64,
    pub events: AtomicU64,
    pub groups: AtomicU64,
    pub window_us: AtomicU64,
    pub observer: OnceLock<GroupObserver>,
}

impl Shared {
    pub fn new(engine: Arc<dyn Engine>) -> (Arc<Shared>, watch::Sender<Durable>) {
        let (tx, rx) = watch::channel(Durable::default());
        let shared = Shared {
            engine,
            overlay: Overlay::default(),
            state: Mutex::new(CommitState::default()),
            wake: Condvar::new(),
            durable: rx,
            applied: AtomicU64::new(0),
            head_trims: AtomicU64::new(0),
            events: AtomicU64::new(0),
            groups: AtomicU64::new(0),
            window_us: AtomicU64::new(DEFAULT_WINDOW_US),
            observer: OnceLock::new(),
        };
        (Arc::new(shared), tx)
    }

    pub fn lock(&self) -> MutexGuard<'_, CommitState> {
        lock(&self.state)
    }

    pub fn failed(&self) -> Option<Arc<str>> {
        self.durable.borrow().failed.clone()
    }

    /// Wakes the writer; call with what `take_idle` returned.
    pub fn wake_writer(&self) {
        self.wake.notify_one();
    }

    /// Someone waits for `ticket` to be durable: the writer starts its
    /// group now rather than a window later (module doc).
    pub fn want(&self, ticket: u64) {
        let wake = {
            let mut st = self.lock();
            st.wanted = st.wanted.max(ticket);
            std::mem::take(&mut st.writer_idle)
        };
        if wake {
            self.wake_writer();
        }
    }

    /// Waits, under the commit lock, until there is a group to write or
    /// the store closes. Work found right `after_group` is taken at once:
    /// under load the asks follow close behind, and a writer put to sleep
    /// would only add a wake-up per group (measured: more CPU per send at
    /// 16 clients). Otherwise it waits until the queue holds a commit
    /// someone asked for (past `taken`, the last ticket already written),
    /// or has held commits for a window without one.
    fn wait_for_group<'a>(
        &'a self,
        mut st: MutexGuard<'a, CommitState>,
        taken: u64,
        after_group: bool,
    ) -> MutexGuard<'a, CommitState> {
        if after_group && !st.queue.is_empty() {
            return st;
        }
        // Set once the queue holds commits: only the writer empties it.
        let mut unasked_since: Option<Instant> = None;
        while !st.closing {
            if st.queue.is_empty() {
                st.writer_idle = true;
                st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            if st.wanted > taken {
                break;
            }
            let window = Duration::from_micros(self.window_us.load(SeqCst));
            let since = *unasked_since.get_or_insert_with(Instant::now);
            match window.checked_sub(since.elapsed()) {
                Some(rest) if !rest.is_zero() => {
                    st.writer_idle = true;
                    st = self.wake.wait_timeout(st, rest).unwrap_or_else(|e| e.into_inner()).0;
                }
                _ => break,
            }
        }
        st.writer_idle = false;
        st
    }

    /// The writer thread's body. Whether it closed the engine: a writer
    /// stopped by a failed write leaves that to [`super::Store::close`]
    /// (reads go on until then).
    pub fn run_writer(&self, tx: watch::Sender<Durable>) -> bool {
        let mut last_start: Option<Instant> = None;
        // The last ticket of the groups taken so far.
        let mut taken = 0;
        loop {
            let mut st = self.wait_for_group(self.lock(), taken, last_start.is_some());
            if st.queue.is_empty() {
                drop(st);
                if let Err(e) = self.engine.close() {
                    fail(&tx, &e.to_string());
                }
                return true;
            }
            // The group-commit window: let a group gather for what is left of it.
            let window = Duration::from_micros(self.window_us.load(SeqCst));
            if let Some(rest) = last_start.and_then(|t| window.checked_sub(t.elapsed())) {
                if !st.closing {
                    drop(st);
                    std::thread::sleep(rest);
                    st = self.lock();
                }
            }
            let group = std::mem::take(&mut st.queue);
            let commits = std::mem::take(&mut st.queued_commits);
            let upto = st.last_ticket;
            taken = upto;
            drop(st);

            let started = Instant::now();
            last_start = Some(started);
            let (bytes, barriers) = (self.engine.bytes_written(), self.engine.barriers());
            let stop = |e: StoreError| {
                tracing::error!(error = %e, "event store write failed");
                fail(&tx, &e.to_string());
                false
            };
            if let Err(e) = self.engine.apply(group).and_then(|()| self.engine.barrier()) {
                return stop(e);
            }
            // Durable now: waiters need not wait for the engine's indexes.
            self.groups.fetch_add(1, SeqCst);
            tx.send_modify(|d| d.upto = upto);
            if let Err(e) = self.engine.install() {
                return stop(e);
            }
            self.overlay.remove_applied(upto);
            self.applied.store(upto, SeqCst);
            if let Some(observe) = self.observer.get() {
                observe(&GroupReport {
                    commits,
                    barriers: self.engine.barriers() - barriers,
                    bytes: self.engine.bytes_written() - bytes,
                    took: started.elapsed(),
                });
            }
        }
    }
}

fn fail(tx: &watch::Sender<Durable>, error: &str) {
    tx.send_modify(|d| d.failed = Some(error.into()));
}

/// Locks, ignoring poison: no code panics while holding these locks with
/// the data half-changed.
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
