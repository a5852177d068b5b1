//! # relay-sim
//!
//! A deterministic simulator of a network of relays. One thread, one seeded
//! random generator and one event queue ordered by (time, sequence) drive
//! everything that varies between runs: the clock, the network (delay,
//! loss, duplication, reordering, partitions, refused connections, 5xx,
//! late answers), each relay's disk (crash, power cut losing what followed
//! the last barrier, restart by folding what survived) and clock jumps.
//! The same seed gives the same run, event for event.
//!
//! # Layout
//!
//! - [`world`]: the event loop, the network, clients, and the shells'
//!   part (the send process's commits, the deliver handler's checks, the
//!   replicator's loop, the sweep's turns);
//! - [`core`]: the one seam to relay-core, every rule the sim runs;
//! - [`relay`]: one relay's disk (groups and barrier), its accounts and
//!   deliveries folded by relay-core's `apply`, and the reads its
//!   decisions make;
//! - [`check`]: the invariants' names, the violation, the coverage counters;
//! - [`fixtures`]: what the clients sign that is the same in every seed,
//!   made once per process.
//!
//! What is simulated and what is not: `docs/simulation.md`.

pub mod check;
pub mod core;
pub mod fixtures;
pub mod relay;
pub mod world;

pub use check::{Coverage, Violation};
pub use world::Run;

/// A bug planted on purpose, in the simulator's adapter only (never in the
/// relay's code): each must be caught by an invariant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plant {
    /// The client is answered before the acceptance is behind a barrier.
    AckBeforeBarrier,
    /// A client retries with a fresh message id.
    RetryNewId,
    /// A delivery follows the first route answer, even of a lower revision.
    LowerRevision,
    /// A replicated record is applied even when already held.
    ReplicateTwice,
    /// A restart recomputes deadlines from now.
    ForgetDeadline,
    /// A home accepts envelopes from a device it knows revoked.
    DeliverAfterRevocation,
    /// The sweep runs on a clock half a retention ahead.
    SweepEarly,
    /// A restart recomputes each record's visible devices from the account
    /// as it is now.
    RecomputeVisibility,
    /// A restart folds each stream's last sequence but not its last hash.
    ForgetChainHead,
}

impl Plant {
    pub const ALL: [Plant; 9] = [
        Plant::AckBeforeBarrier,
        Plant::RetryNewId,
        Plant::LowerRevision,
        Plant::ReplicateTwice,
        Plant::ForgetDeadline,
        Plant::DeliverAfterRevocation,
        Plant::SweepEarly,
        Plant::RecomputeVisibility,
        Plant::ForgetChainHead,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Plant::AckBeforeBarrier => "ack-before-barrier",
            Plant::RetryNewId => "retry-new-id",
            Plant::LowerRevision => "lower-revision",
            Plant::ReplicateTwice => "replicate-twice",
            Plant::ForgetDeadline => "forget-deadline",
            Plant::DeliverAfterRevocation => "deliver-after-revocation",
            Plant::SweepEarly => "sweep-early",
            Plant::RecomputeVisibility => "recompute-visibility",
            Plant::ForgetChainHead => "forget-chain-head",
        }
    }

    pub fn parse(name: &str) -> Option<Plant> {
        Plant::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// Runs one seed: `messages` messages between the accounts of 3 to 6
/// relays; `trace` keeps a line per step (for a replay).
pub fn run(seed: u64, messages: usize, plant: Option<Plant>, trace: bool) -> Run {
    world::World::new(seed, messages, plant, trace).run()
}

/// The lines of a trace that concern message `mid`, plus every fault: the
/// short story of a failure.
pub fn minimal_trace<'t>(trace: &'t [String], mid: Option<&str>) -> Vec<&'t str> {
    const FAULTS: [&str; 6] = ["crash", "restart", "partition", "heal", "clock", "route of"];
    trace
        .iter()
        .map(String::as_str)
        .filter(|l| {
            mid.is_some_and(|m| l.contains(m)) || l.contains("VIOLATION") || FAULTS.iter().any(|f| l.contains(f))
        })
        .collect()
}
