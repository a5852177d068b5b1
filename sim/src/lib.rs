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
//!   made once per process;
//! - [`plant`]: the bugs planted on purpose.
//!
//! Modules import one way: `world` → `core` → `relay` → relay-core.
//!
//! What is simulated and what is not: `docs/simulation.md`.

pub mod check;
pub mod core;
pub mod fixtures;
pub mod plant;
pub mod relay;
pub mod world;

pub use check::{Coverage, Violation};
pub use plant::Plant;
pub use world::Run;

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
