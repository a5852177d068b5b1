//! Which shard of a cluster an account lives in (cluster mode with
//! `cluster.shards` > 1), how a session token names its shard so that
//! any node's front can route a request without asking anyone, and how the
//! nodes share the shards out.
//!
//! The shard of an account is fixed by its id and the shard count: the
//! count cannot change once a cluster holds data (a different count would
//! put accounts in streams that do not hold their events).

/// The shard `account_id` lives in, of `shards` (≥ 1).
pub fn of(account_id: &str, shards: u32) -> u32 {
    let h = blake3::hash(account_id.as_bytes());
    let first = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
    (first % u64::from(shards.max(1))) as u32
}

/// What a session token issued by shard `shard`'s owner starts with. The
/// token's random part is base64url, which has no `.`.
pub fn token_prefix(shard: u32) -> String {
    format!("s{shard}.")
}

/// The shard a session token was issued by, if it names one.
pub fn of_token(token: &str) -> Option<u32> {
    let (shard, _) = token.strip_prefix('s')?.split_once('.')?;
    if shard.is_empty() || !shard.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    shard.parse().ok()
}

/// How long (ms) a node serving `held` shards waits before it takes a free
/// one, when `live` nodes share `shards`: under its fair share (shards
/// over live nodes, rounded up) less than half a ttl, the less the fewer
/// it serves; at or over it a whole ttl. So the least loaded take free
/// shards first, and someone always takes one.
pub fn patience_ms(held: usize, live: usize, shards: u32, ttl_ms: u64) -> u64 {
    let fair = (shards as usize).div_ceil(live.max(1)).max(1);
    if held < fair {
        ttl_ms * held as u64 / (2 * fair as u64)
    } else {
        ttl_ms
    }
}

/// Whether a node serving `mine` shards should hand one over, given how
/// many each live node serves (its own count among them or not): when it
/// serves two more than the least loaded. One more is as even as shards
/// that do not divide by the nodes get, so hand-overs stop there.
pub fn should_hand_over(mine: usize, live: impl IntoIterator<Item = usize>) -> bool {
    live.into_iter().min().is_some_and(|least| mine >= least + 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_loaded_node_under_its_fair_share_takes_a_free_shard_first() {
        // 4 shards over 3 live nodes: a fair share is 2.
        assert_eq!(patience_ms(0, 3, 4, 2000), 0);
        assert_eq!(patience_ms(1, 3, 4, 2000), 500);
        assert_eq!(patience_ms(2, 3, 4, 2000), 2000);
        assert_eq!(patience_ms(7, 3, 4, 2000), 2000, "over its share, a node still takes one, last");
        // Under its share a node never waits as long as one at it.
        for held in 0..11 {
            assert!(patience_ms(held, 3, 32, 2000) < 1000, "{held}");
            assert!(patience_ms(held, 3, 32, 2000) <= patience_ms(held + 1, 3, 32, 2000));
        }
    }

    #[test]
    fn a_node_two_shards_over_the_least_loaded_hands_one_over_and_one_over_does_not() {
        assert!(should_hand_over(4, [4, 0, 0]));
        assert!(should_hand_over(3, [3, 1, 1]));
        assert!(!should_hand_over(2, [2, 1, 1]));
        assert!(!should_hand_over(0, []), "no live node known: nothing to compare");
    }

    #[test]
    fn hand_overs_to_the_least_loaded_end_with_shards_spread_within_one() {
        for (shards, nodes) in [(4usize, 3usize), (32, 3), (5, 5), (9, 2), (64, 7)] {
            // Everything on the first node (the others started later).
            let mut load = vec![0usize; nodes];
            load[0] = shards;
            let mut moves = 0;
            while let Some(from) = (0..nodes).find(|&n| should_hand_over(load[n], load.iter().copied())) {
                let to = (0..nodes).min_by_key(|&n| (patience_ms(load[n], nodes, shards as u32, 1000), load[n]));
                load[from] -= 1;
                load[to.unwrap()] += 1;
                moves += 1;
                assert!(moves <= shards, "{shards} shards over {nodes} nodes do not settle: {load:?}");
            }
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            assert!(max - min <= 1, "{shards} over {nodes}: {load:?}");
            assert_eq!(load.iter().sum::<usize>(), shards);
        }
    }

    #[test]
    fn an_account_has_one_shard_for_a_given_count_and_accounts_spread_over_all() {
        let ids: Vec<String> = (0..400u32).map(hex_id).collect();
        for id in &ids {
            assert_eq!(of(id, 4), of(id, 4));
            assert_eq!(of(id, 1), 0);
        }
        let mut counts = [0usize; 4];
        ids.iter().for_each(|id| counts[of(id, 4) as usize] += 1);
        assert!(counts.iter().all(|&n| n > 60), "{counts:?}");
    }

    #[test]
    fn a_token_names_the_shard_that_issued_it_and_nothing_else_does() {
        let token = format!("{}{}", token_prefix(17), "AbC-_x");
        assert_eq!(of_token(&token), Some(17));
        for other in ["AbC-_x", "s.x", "sx.y", "s+1.x", "s1", ""] {
            assert_eq!(of_token(other), None, "{other}");
        }
    }

    fn hex_id(i: u32) -> String {
        blake3::hash(&i.to_le_bytes()).to_hex().to_string()
    }
}
