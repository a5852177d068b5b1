//! The account: one actor per account, state folded from
//! `account/{account_id}`. The actor reaches the rest of the relay only
//! through [`Env`] and [`Ports`]: it never calls back into whoever starts
//! it, and what it does besides writing comes back as the effects of its
//! decisions.

pub(crate) mod actor;
pub mod sweep;
mod upgrade;

pub(crate) use actor::StoreReads;
pub use actor::{stream_id, AccountActor, AccountCmd, Env, Ports, ReplicaSink, Reply, Settlement};
pub use upgrade::stored_layout;

#[cfg(test)]
mod tests;
