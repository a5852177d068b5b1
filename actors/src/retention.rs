//! The retention sweep's shell (PROTOCOL §10): what is past its promised
//! retention is deleted on the scheduler's timer, a bounded amount per
//! turn; the rules are in `relay_core::retention`.

/// Writes a signed checkpoint of the whole store (PROTOCOL §10): the sweep
/// asks for one before it prunes anything, so every pruned event was
/// covered by a checkpoint its peers could witness. Blocking: the sweep
/// calls it off the event loop.
pub trait Checkpointer: Send + Sync + 'static {
    fn checkpoint(&self) -> Result<(), String>;
}
