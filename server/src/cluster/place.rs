//! Where one core of a cluster of several shards stands ([`ShardPlace`]):
//! what the peer client needs to reach its sibling shards, apart from the
//! node that runs the cores (`super`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// A connection at a front waits this long for an owner to reach.
pub const FRONT_WAIT: Duration = Duration::from_secs(15);

/// How often a node reads who owns each shard.
pub(crate) const OWNER_POLL: Duration = Duration::from_millis(100);

/// The internal address of each shard's owner (index = shard; `None`
/// while a shard has no owner), as the lease bucket says.
pub(crate) type Owners = watch::Receiver<Arc<Vec<Option<SocketAddr>>>>;

/// Where one core of a cluster of several shards stands: its shard, and
/// where its siblings are served now.
#[derive(Clone)]
pub struct ShardPlace {
    pub index: u32,
    pub shards: u32,
    pub(crate) owners: Owners,
    /// TLS to a sibling's owner (`cluster.secret_file`), or plain HTTP.
    pub(crate) hop: Option<Arc<rustls::ClientConfig>>,
}

impl ShardPlace {
    /// Whether `account_id` lives in this core's shard.
    pub fn is_mine(&self, account_id: &str) -> bool {
        relay_core::shard::of(account_id, self.shards) == self.index
    }

    /// The shard `account_id` lives in.
    pub fn shard_of(&self, account_id: &str) -> u32 {
        relay_core::shard::of(account_id, self.shards)
    }

    /// The internal address of shard `k`'s owner, or `k` while it has none.
    pub fn owner(&self, k: u32) -> Result<SocketAddr, u32> {
        self.owners.borrow().get(k as usize).copied().flatten().ok_or(k)
    }

    /// The internal address of the owner of `account_id`'s shard, or that
    /// shard's number while it has none.
    pub fn owner_of(&self, account_id: &str) -> Result<SocketAddr, u32> {
        self.owner(self.shard_of(account_id))
    }
}
