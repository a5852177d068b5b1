//! The retry timetable (PROTOCOL §6): attempts at fixed offsets from
//! acceptance, then every `retry_then_every`, only before the deadline.

use crate::policy::Policy;
use relay_schemas::UnixMillis;

/// The offset of slot `k` (0-based) from acceptance, in milliseconds.
pub fn slot_offset_ms(policy: &Policy, k: usize) -> u64 {
    let table = &policy.retry_timetable_ms;
    match table.get(k) {
        Some(&off) => off,
        None => {
            let last = table.last().copied().unwrap_or(0);
            let extra = (k + 1 - table.len()) as u64;
            last.saturating_add(extra.saturating_mul(policy.retry_then_every_ms.max(1)))
        }
    }
}

/// When the next attempt after a failure at `now_ms` is due: the first
/// timetable slot strictly after `now_ms` (never an immediate loop), no
/// earlier than `not_before_ms` (a `rate_limited` wait), and strictly before
/// the deadline. `None` when no attempt is left before the deadline.
pub fn next_attempt_ms(
    policy: &Policy,
    accepted_at_ms: UnixMillis,
    now_ms: UnixMillis,
    not_before_ms: UnixMillis,
    deadline_ms: UnixMillis,
) -> Option<UnixMillis> {
    let mut k = 0;
    let due = loop {
        let at = accepted_at_ms.plus(slot_offset_ms(policy, k));
        if at > now_ms {
            break at;
        }
        if at >= deadline_ms {
            return None;
        }
        k += 1;
    };
    let due = due.max(not_before_ms);
    (due < deadline_ms).then_some(due)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `next_attempt_ms` on plain milliseconds.
    fn next(p: &Policy, accepted: u64, now: u64, not_before: u64, deadline: u64) -> Option<u64> {
        let ms = UnixMillis;
        next_attempt_ms(p, ms(accepted), ms(now), ms(not_before), ms(deadline)).map(|m| m.0)
    }

    fn policy() -> Policy {
        Policy::with_relay_id("r")
    }

    const MIN: u64 = 60_000;

    #[test]
    fn default_timetable_is_immediately_30s_5m_25m_1h_then_hourly() {
        let p = policy();
        let offsets: Vec<u64> = (0..7).map(|k| slot_offset_ms(&p, k)).collect();
        assert_eq!(offsets, vec![0, 30_000, 5 * MIN, 25 * MIN, 60 * MIN, 120 * MIN, 180 * MIN]);
    }

    #[test]
    fn retry_goes_to_the_next_slot_after_now_never_an_immediate_loop() {
        let p = policy();
        // First attempt at acceptance failed at +0.2 s: next at +30 s.
        assert_eq!(next(&p, 0, 200, 0, 90 * MIN), Some(30_000));
        // A failure exactly at a slot moves to the following one.
        assert_eq!(next(&p, 0, 30_000, 0, 90 * MIN), Some(5 * MIN));
    }

    #[test]
    fn no_attempt_at_or_after_the_deadline() {
        let p = policy();
        // Default deadline 90 min: the 1 h attempt is the last one.
        assert_eq!(next(&p, 0, 25 * MIN + 1, 0, 90 * MIN), Some(60 * MIN));
        assert_eq!(next(&p, 0, 60 * MIN + 1, 0, 90 * MIN), None);
        assert_eq!(next(&p, 0, 1, 0, 30_000), None);
    }

    #[test]
    fn rate_limited_wait_is_honoured_but_never_past_the_deadline() {
        let p = policy();
        assert_eq!(next(&p, 0, 1_000, 100_000, 90 * MIN), Some(100_000));
        assert_eq!(next(&p, 0, 1_000, 90 * MIN, 90 * MIN), None);
    }
}
