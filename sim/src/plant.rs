//! The bugs planted on purpose, each caught by an invariant
//! (`sim/tests/sim.rs`).

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
