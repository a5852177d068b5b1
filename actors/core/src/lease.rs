//! Shard ownership in cluster mode: who may serve a shard, decided from
//! what the lease (a key of a JetStream KV bucket whose entries expire
//! after `ttl`) last answered. Pure: the node's lease task asks [`next`]
//! what to do, does it, and reports the result to [`observe`].
//!
//! - A standby tries to create the key; creation succeeds only while the
//!   key is absent (never written, or expired because its owner stopped
//!   renewing). The revision that creation returns is the owner's
//!   **epoch**: it is written into the shard as a fence before the owner
//!   serves (`store::jetstream`), so a previous owner's next append fails.
//! - An owner renews every `ttl / 3`, expecting the revision it last
//!   wrote. A renewal refused (another node created the key after ours
//!   expired) means the lease is lost: the owner stops serving at once.
//! - An owner that cannot reach the lease for `ttl - margin` stops too,
//!   before the key can expire and a standby take over; fencing makes a
//!   late write fail anyway, this keeps the window small.
//! - Each shard's lease is in a bucket of its own, so that one
//!   nats-server lost (the leader of some buckets' streams) stops at most
//!   the shards whose buckets it led. The epoch is the creation revision
//!   counted above a cluster's `base` ([`epoch`]): a cluster started by a
//!   release that kept every lease in one bucket has fences with that
//!   bucket's revisions, which its new owners' epochs must exceed.
//! - Reads are not fenced by the stream, so an owner answers only while
//!   its own clock says it still holds the lease ([`answers_until`]): a
//!   process paused past its lease and woken answers nothing it read
//!   after that point, even before its lease task has run again.

/// What a node currently is for one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Standby,
    /// Holds the lease: `epoch` is the creation revision (the fence),
    /// `revision` the last one written, `renewed_at` (ms) its time.
    Owner {
        epoch: u64,
        revision: u64,
        renewed_at: u64,
    },
    /// Lost the lease; terminal for this process (it restarts as standby).
    Lost,
}

/// What the lease task should do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Try to create the key (standby).
    Acquire,
    /// Update the key, expecting `revision`.
    Renew { revision: u64 },
    /// Stop serving the shard: the lease is lost or could not be renewed.
    Stop,
    /// Nothing before `at` (ms).
    WaitUntil { at: u64 },
}

/// The lease's timing, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub ttl: u64,
    /// A standby retries creation this often.
    pub poll: u64,
}

impl Timing {
    pub fn renew_every(&self) -> u64 {
        self.ttl / 3
    }

    /// An owner that has not renewed for this long stops: a third of the
    /// ttl before the key can expire.
    pub fn give_up_after(&self) -> u64 {
        self.ttl - self.ttl / 3
    }
}

/// The epoch of a lease created at `revision` in its shard's bucket, in a
/// cluster whose epochs are counted above `base`: the revision the one
/// bucket of an earlier release had reached (above every epoch it gave,
/// so the fences it wrote never refuse the new owners), 0 for a cluster
/// started with a bucket per shard. Grows with the revision: each new
/// owner's fence is above its predecessors'.
pub fn epoch(base: u64, revision: u64) -> u64 {
    base + revision
}

/// What the lease answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Created (acquire) or updated (renew) at this revision.
    Written { revision: u64 },
    /// The key exists with another revision: someone else holds it.
    Refused,
    /// No answer (NATS unreachable, timeout).
    Unreachable,
}

/// The next step for `role` at `now` (ms). `last_try` is when a standby
/// last tried to acquire.
pub fn next(role: Role, now: u64, last_try: Option<u64>, t: Timing) -> Step {
    match role {
        Role::Lost => Step::Stop,
        Role::Standby => match last_try {
            Some(at) if now < at + t.poll => Step::WaitUntil { at: at + t.poll },
            _ => Step::Acquire,
        },
        Role::Owner { revision, renewed_at, .. } => {
            if now >= renewed_at + t.give_up_after() {
                Step::Stop
            } else if now >= renewed_at + t.renew_every() {
                Step::Renew { revision }
            } else {
                Step::WaitUntil { at: renewed_at + t.renew_every() }
            }
        }
    }
}

/// Until when (ms) `role` may answer requests: an owner up to the moment
/// it would stop for want of a renewal (`next` says [`Step::Stop`] from
/// then), which is before its key can expire and a standby take over; a
/// standby or a lost owner never (0).
pub fn answers_until(role: Role, t: Timing) -> u64 {
    match role {
        Role::Owner { renewed_at, .. } => renewed_at + t.give_up_after(),
        Role::Standby | Role::Lost => 0,
    }
}

/// Whether an answer read at `now` (ms) may be given, the owner's lease
/// good `until` ([`answers_until`]). Checked after the read: an answer
/// read while the lease held precedes any write by a next owner, even if
/// it reaches the client later.
pub fn may_answer(until: u64, now: u64) -> bool {
    now < until
}

/// The role after `step` got `answer` at `now` (ms). `sent_at` is when the
/// request was sent: a renewal counts from then, since the key's ttl runs
/// from the server's write, which is not earlier.
pub fn observe(role: Role, step: Step, answer: Answer, sent_at: u64) -> Role {
    match (role, step, answer) {
        (Role::Standby, Step::Acquire, Answer::Written { revision }) => {
            Role::Owner { epoch: revision, revision, renewed_at: sent_at }
        }
        (Role::Standby, _, _) => Role::Standby,
        (Role::Owner { epoch, .. }, Step::Renew { .. }, Answer::Written { revision }) => {
            Role::Owner { epoch, revision, renewed_at: sent_at }
        }
        (Role::Owner { .. }, Step::Renew { .. }, Answer::Refused) => Role::Lost,
        (Role::Owner { .. }, Step::Stop, _) => Role::Lost,
        (role, _, _) => role,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing { ttl: 3000, poll: 250 };

    #[test]
    fn a_standby_becomes_owner_with_the_creation_revision_as_its_epoch() {
        assert_eq!(next(Role::Standby, 0, None, T), Step::Acquire);
        let role = observe(Role::Standby, Step::Acquire, Answer::Written { revision: 41 }, 10);
        assert_eq!(role, Role::Owner { epoch: 41, revision: 41, renewed_at: 10 });
    }

    #[test]
    fn an_epoch_from_a_shards_own_bucket_is_above_every_epoch_of_the_one_bucket_it_replaces() {
        // The one bucket had reached revision 500: its fences carry at most 500.
        let base = 500;
        assert!(epoch(base, 1) > 500, "the first owner of the new bucket fences above the old ones");
        assert!(epoch(base, 8) > epoch(base, 3), "later owners above earlier ones");
        assert_eq!(epoch(0, 3), 3, "a cluster started with a bucket per shard: the revision");
    }

    #[test]
    fn a_standby_refused_retries_after_the_poll_interval() {
        let role = observe(Role::Standby, Step::Acquire, Answer::Refused, 100);
        assert_eq!(role, Role::Standby);
        assert_eq!(next(role, 200, Some(100), T), Step::WaitUntil { at: 350 });
        assert_eq!(next(role, 350, Some(100), T), Step::Acquire);
    }

    #[test]
    fn an_owner_renews_every_third_of_the_ttl_expecting_its_last_revision_and_keeps_its_epoch() {
        let owner = Role::Owner { epoch: 7, revision: 9, renewed_at: 1000 };
        assert_eq!(next(owner, 1500, None, T), Step::WaitUntil { at: 2000 });
        assert_eq!(next(owner, 2000, None, T), Step::Renew { revision: 9 });
        let renewed = observe(owner, Step::Renew { revision: 9 }, Answer::Written { revision: 12 }, 2000);
        assert_eq!(renewed, Role::Owner { epoch: 7, revision: 12, renewed_at: 2000 });
    }

    #[test]
    fn an_owner_whose_renewal_is_refused_has_lost_the_lease_and_stops() {
        let owner = Role::Owner { epoch: 7, revision: 9, renewed_at: 1000 };
        let lost = observe(owner, Step::Renew { revision: 9 }, Answer::Refused, 2000);
        assert_eq!(lost, Role::Lost);
        assert_eq!(next(lost, 2001, None, T), Step::Stop);
    }

    #[test]
    fn an_owner_that_cannot_renew_stops_before_its_key_can_expire() {
        let owner = Role::Owner { epoch: 7, revision: 9, renewed_at: 1000 };
        let still = observe(owner, Step::Renew { revision: 9 }, Answer::Unreachable, 2000);
        assert_eq!(still, owner, "an unanswered renewal changes nothing yet");
        assert_eq!(next(still, 2999, None, T), Step::Renew { revision: 9 });
        // Stops at 1000 + 2000, a third of the ttl before the key expires at 4000.
        assert_eq!(next(still, 3000, None, T), Step::Stop);
        assert!(1000 + T.give_up_after() < 1000 + T.ttl);
    }

    #[test]
    fn an_owner_answers_only_until_it_would_stop_for_want_of_a_renewal_and_a_standby_never() {
        let owner = Role::Owner { epoch: 7, revision: 9, renewed_at: 1000 };
        let until = answers_until(owner, T);
        assert!(may_answer(until, 2999));
        // A process paused here and woken at 3000 or later answers nothing:
        // from then on `next` stops it, and the key may expire at 4000.
        assert!(!may_answer(until, 3000));
        assert_eq!(next(owner, 3000, None, T), Step::Stop);
        assert!(until < 1000 + T.ttl, "answers end before a standby can take over");
        // A renewal moves the bound; a renewal sent before a pause counts from its sending.
        let renewed = observe(owner, Step::Renew { revision: 9 }, Answer::Written { revision: 12 }, 2000);
        assert!(may_answer(answers_until(renewed, T), 3999));
        assert!(!may_answer(answers_until(renewed, T), 4000));
        for role in [Role::Standby, Role::Lost] {
            assert!(!may_answer(answers_until(role, T), 0), "{role:?}");
        }
    }
}
