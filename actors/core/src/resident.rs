//! Which resident account actors leave memory: an idle one on its own
//! ([`idle_leaves`]), and past `Policy::max_resident_accounts` the least
//! recently used.
//!
//! Every request stamps its account with the next value of one counter,
//! so stamps order the residents by last use. Past the cap, eviction
//! takes the resident down to the cap and [`SLACK`] of it below, so the
//! pass over all residents it costs is paid once per that many loads,
//! not on every load.

/// Whether an account actor idle for `idle_ms` leaves memory, with
/// `passivate_after_ms` configured: once idle that long, unless session
/// challenges are outstanding (they live only in the actor; it stays
/// until they expire).
pub fn idle_leaves(idle_ms: u64, passivate_after_ms: u64, challenges_outstanding: bool) -> bool {
    idle_ms >= passivate_after_ms && !challenges_outstanding
}

/// Below the cap an eviction leaves this share of it free (1/64).
pub const SLACK: usize = 64;

/// How many of `resident` actors leave when the cap is `cap`: none at or
/// under it, else down to `cap - cap / SLACK`.
pub fn to_evict(resident: usize, cap: usize) -> usize {
    if resident <= cap {
        return 0;
    }
    resident - cap + cap / SLACK
}

/// The stamp at or under which the `n` least recently used are, from the
/// residents' last-use stamps (reordered): the `n`-th smallest. `None`
/// when `n` is 0; every stamp when `n` covers them all.
pub fn lru_cutoff(stamps: &mut [u64], n: usize) -> Option<u64> {
    if n == 0 || stamps.is_empty() {
        return None;
    }
    let k = n.min(stamps.len()) - 1;
    let (_, nth, _) = stamps.select_nth_unstable(k);
    Some(*nth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_account_leaves_memory_once_idle_long_enough_unless_challenges_are_outstanding() {
        assert!(!idle_leaves(999, 1_000, false));
        assert!(idle_leaves(1_000, 1_000, false));
        assert!(!idle_leaves(5_000, 1_000, true), "a challenge lives only in the actor");
    }

    #[test]
    fn no_actor_leaves_at_or_under_the_cap() {
        assert_eq!(to_evict(0, 8), 0);
        assert_eq!(to_evict(8, 8), 0);
    }

    #[test]
    fn eviction_takes_the_resident_below_the_cap_by_its_slack() {
        assert_eq!(to_evict(9, 8), 1, "a small cap: down to the cap");
        assert_eq!(to_evict(100_001, 100_000), 1 + 100_000 / 64);
        assert_eq!(100_001 - to_evict(100_001, 100_000), 100_000 - 1562);
    }

    #[test]
    fn the_least_recently_used_leave_first() {
        // Stamps of ten residents, used in this (shuffled) order.
        let stamps = [40, 3, 77, 12, 5, 90, 61, 8, 33, 21];
        let mut s = stamps;
        let cut = lru_cutoff(&mut s, 4).unwrap();
        let leaving: Vec<u64> = stamps.iter().copied().filter(|&t| t <= cut).collect();
        assert_eq!(leaving, vec![3, 12, 5, 8]);
        assert_eq!(lru_cutoff(&mut s, 0), None);
        assert_eq!(lru_cutoff(&mut s, 99), Some(90), "more than there are: all of them");
        assert_eq!(lru_cutoff(&mut [], 3), None);
    }
}
