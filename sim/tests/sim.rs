//! The simulator's own promises: a seed replays bit for bit, today's rules
//! pass a band of seeds, every planted bug is caught within 1,000 seeds,
//! and the runs reach the hard states.

use relay_sim::check::inv;
use relay_sim::{minimal_trace, run, Coverage, Plant};

/// Messages per seed in these tests: enough traffic for every fault to
/// meet deliveries, small enough for a debug build (every message is
/// signed and verified as a relay does).
const MESSAGES: usize = 100;

#[test]
fn the_same_seed_replays_the_identical_trace_and_other_seeds_differ() {
    let a = run(7, MESSAGES, None, true);
    let b = run(7, MESSAGES, None, true);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.trace, b.trace, "a replay is line for line the same");
    assert_eq!((a.events, a.coverage.clone()), (b.events, b.coverage.clone()));
    let c = run(8, MESSAGES, None, true);
    assert_ne!(a.trace_hash, c.trace_hash);
    // Keeping the trace does not change the run.
    assert_eq!(run(7, MESSAGES, None, false).trace_hash, a.trace_hash);
}

#[test]
fn a_failing_seed_replays_its_failure_and_minimal_trace_identically() {
    let first = run(0, MESSAGES, Some(Plant::ForgetDeadline), true);
    let again = run(0, MESSAGES, Some(Plant::ForgetDeadline), true);
    let v = first.violation.clone().expect("the planted bug is caught on seed 0");
    assert_eq!(again.violation, Some(v.clone()));
    assert_eq!(first.trace_hash, again.trace_hash);
    let short = minimal_trace(&first.trace, v.mid.as_deref());
    assert_eq!(short, minimal_trace(&again.trace, v.mid.as_deref()));
    assert!(short.len() < first.trace.len());
    assert!(short.last().is_some_and(|l| l.contains("VIOLATION")), "{short:?}");
    assert!(short.iter().any(|l| l.contains("restart")), "the crash behind it is in the story: {short:?}");
}

/// CI's band of seeds: today's rules break no invariant. 150 seeds of 100
/// messages (about a minute of CPU in a debug build), bounded: each seed is
/// a bounded simulated time.
#[test]
fn todays_rules_hold_on_a_band_of_seeds() {
    let mut failed = vec![];
    let mut coverage = Coverage::default();
    for seed in 0..150 {
        let r = run(seed, MESSAGES, None, false);
        coverage.add(&r.coverage);
        assert!(r.acked > 0 && r.delivered > 0, "seed {seed} moved no message");
        if let Some(v) = r.violation {
            failed.push(format!("seed {seed}: {v}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
    // The runs reach the states that are hard to reach by luck.
    let c = &coverage;
    let hard = [
        ("crash with an attempt in flight", c.crash_with_attempt_in_flight),
        ("power cut losing a group", c.power_cut_losing_a_group),
        ("late reply after a final status", c.late_reply_after_final_status),
        ("route change mid-delivery", c.route_change_mid_delivery),
        ("partner home apart", c.partner_home_apart),
        ("deadline expiry", c.deadline_expiry),
        ("ended by the other home's status", c.peer_confirmed),
        ("clock jumps", c.clock_jumps),
        ("receipt before its acceptance", c.receipt_before_acceptance),
        ("forwarded deliveries (other home)", c.forwarded_deliveries),
        ("swept at the end of retention", c.swept),
    ];
    for (name, n) in hard {
        assert!(n > 0, "no run reached: {name}\n{coverage}");
    }
}

/// The first seed below 1,000 on which `plant` breaks an invariant, and
/// which one.
fn caught(plant: Plant) -> (u64, &'static str) {
    (0..1000)
        .find_map(|seed| run(seed, MESSAGES, Some(plant), false).violation.map(|v| (seed, v.invariant)))
        .unwrap_or_else(|| panic!("{} not caught in 1,000 seeds", plant.name()))
}

#[test]
fn planted_ack_before_the_barrier_is_caught() {
    assert_eq!(caught(Plant::AckBeforeBarrier).1, inv::ACKED_LOST);
}

#[test]
fn planted_retry_with_a_new_message_id_is_caught() {
    assert_eq!(caught(Plant::RetryNewId).1, inv::DELIVERED_TWICE);
}

#[test]
fn planted_switch_to_a_lower_route_revision_is_caught() {
    let (_, invariant) = caught(Plant::LowerRevision);
    assert!([inv::TARGET_REVISION, inv::LIVENESS].contains(&invariant), "{invariant}");
}

#[test]
fn planted_replicated_item_applied_twice_is_caught() {
    assert_eq!(caught(Plant::ReplicateTwice).1, inv::DELIVERED_TWICE);
}

#[test]
fn planted_deadline_forgotten_after_restart_is_caught() {
    assert_eq!(caught(Plant::ForgetDeadline).1, inv::DEADLINE_FIXED);
}

#[test]
fn planted_delivery_after_revocation_is_caught() {
    assert_eq!(caught(Plant::DeliverAfterRevocation).1, inv::REVOKED);
}

#[test]
fn planted_sweep_before_the_end_of_retention_is_caught() {
    assert_eq!(caught(Plant::SweepEarly).1, inv::RETENTION);
}

#[test]
fn planted_visibility_recomputed_after_restart_is_caught() {
    assert_eq!(caught(Plant::RecomputeVisibility).1, inv::VISIBILITY);
}

#[test]
fn planted_restart_forgetting_the_chain_head_is_caught() {
    assert_eq!(caught(Plant::ForgetChainHead).1, inv::CHAIN);
}

/// `relay-sim --seed S` on a failing seed: it says so, prints the seed's
/// replay command and minimal trace, exits non-zero, and prints the same
/// bytes every time.
#[test]
fn the_binary_replays_a_failing_seed_byte_for_byte() {
    let replay = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_relay-sim"))
            .args(["--seed", "0", "--messages", "100", "--plant", "forget-deadline"])
            .output()
            .expect("relay-sim runs");
        assert!(!out.status.success(), "a failing seed exits non-zero");
        String::from_utf8(out.stdout).expect("utf-8")
    };
    let first = replay();
    assert!(first.contains("FAILED seed 0: "), "{first}");
    assert!(first.contains(inv::DEADLINE_FIXED), "{first}");
    assert!(first.contains("relay-sim --seed 0 --messages 100 --plant forget-deadline"), "{first}");
    assert!(first.contains("trace hash "), "{first}");
    assert_eq!(first, replay());
}
