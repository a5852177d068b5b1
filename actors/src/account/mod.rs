//! The account: one actor per account, state folded from
//! `account/{account_id}`. The actor reaches the rest of the relay only
//! through [`Env`] and [`Ports`]: it never calls back into whoever starts
//! it, and what it does besides writing comes back as the effects of its
//! decisions.

pub mod actor;
mod reads;
pub mod sweep;
mod upgrade;

// The rules live in the core crate; one file per method under `account::method`.
pub use relay_core::account::{command, decision, events, ledger, method, session, shared, state, timeline};
pub use relay_core::account::{Acceptance, Ctx, Reads};

pub use actor::{AccountActor, AccountCmd, Reply, Settlement};
pub use events::{AccountEvent, PushSubscription, Record};
pub use ledger::{Ledger, ReceiptEntry, SendEntry};
pub(crate) use reads::StoreReads;
pub use state::AccountState;
pub use upgrade::stored_layout;

use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::policy::Policy;
use crate::push::PushSink;
use crate::routes::RouteBook;
use crate::sessions::Sessions;
use crate::store::Store;
use std::sync::{Arc, OnceLock};

/// The shared handles an account reads and writes directly (cheap to clone).
#[derive(Clone)]
pub struct Env {
    pub store: Store,
    pub clock: SharedClock,
    pub policy: Arc<Policy>,
    /// Where an account's newest route goes when it writes one.
    pub routes: RouteBook,
    /// Session tokens: `session.open` stores one, a revoked device's end.
    pub sessions: Sessions,
    /// Connected devices, told of new records and statuses once durable.
    pub notifier: Notifier,
    /// The Web Push sender, once push is on.
    pub push: Arc<OnceLock<Arc<dyn PushSink>>>,
    /// The replicator, once the relay runs one.
    pub replica: Arc<OnceLock<Arc<dyn ReplicaSink>>>,
    pub metrics: Arc<Metrics>,
}

/// What an account tells whoever keeps the resident actors.
pub trait Ports: Send + Sync + 'static {
    /// Actor `addr` of `account_id` left memory: forget it, unless it was
    /// already replaced.
    fn passivated(&self, account_id: &str, addr: &actix::Addr<AccountActor>);
    /// A delivery this account began for its other home (written with its
    /// due entry) is due at `due_ms`.
    fn schedule(&self, stream: String, due_ms: relay_schemas::UnixMillis);
}

/// Who carries an account's news to its other home relay (`timeline.replicate`).
pub trait ReplicaSink: Send + Sync + 'static {
    /// `account_id` wrote events `partner` has not seen: have it pull.
    fn changed(&self, account_id: &str, partner: &str);
}

pub fn stream_id(account_id: &str) -> String {
    format!("account/{account_id}")
}
#[cfg(test)]
mod tests;
