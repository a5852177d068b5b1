//! Which shard of a cluster an account lives in (cluster mode with
//! `cluster.shards` > 1), and how a session token names its shard so that
//! any node's front can route a request without asking anyone.
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

#[cfg(test)]
mod tests {
    use super::*;

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
