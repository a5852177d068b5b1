//! Crash torture (harness: `tests/it/common/torture.rs`): a seeded mixed load
//! through real relays while they are stopped at random moments and
//! restarted; nothing accepted may be lost or delivered twice.
//!
//! - `crash_torture_short_seeded` (CI): 150 messages, 6 SIGKILLs, 2 relays;
//! - `crash_torture_long` (ignored): 5,000 messages, 60 SIGKILLs, 3 relays:
//!   `cargo test --release --test it torture:: -- --ignored --nocapture`;
//! - `graceful_sigterm_of_the_source_under_load_loses_and_duplicates_nothing`;
//! - `torture_two_home_accounts_random_sigkills_lose_and_duplicate_nothing`
//!   (CI): every account with two home relays (3 relays), 120 messages, 6
//!   SIGKILLs of any relay; both homes must end the same;
//! - `crash_torture_with_short_retention_loses_nothing_within_retention_and_deletes_nothing_early`
//!   (CI): retention 20 s, a sweep every second, 160 messages spread over
//!   30 s, 8 SIGKILLs; nothing goes before its `retention_until`,
//!   everything within a bounded wait after it, nothing twice.
//!
//! `TORTURE_SEED`, `TORTURE_MESSAGES` and `TORTURE_KILLS` override the
//! seeded torture tests' parameters (a failing run prints them).

use crate::common;

use common::torture::{run, Params, Stop};

fn check(report: &common::torture::Report) {
    eprintln!("{report}");
    assert!(
        report.violations.is_empty(),
        "{} invariant violations (seed {:#x}; rerun with TORTURE_SEED={:#x}):\n{}",
        report.violations.len(),
        report.seed,
        report.seed,
        report.violations.iter().take(50).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(report.kill_events, report.kill_log.len());
}

/// Seed: "Concurrent requests, lost responses, and relay restarts do not
/// alter these requirements" and "The source's responsibility continues
/// until a terminal state or delivery deadline and survives relay
/// restarts". SIGKILL of source and destination relays at random moments
/// under a concurrent mixed load; every lost answer retried unchanged.
#[actix_rt::test]
async fn crash_torture_short_seeded() {
    let p = Params::ci().with_env();
    let kills = p.kills;
    let report = run(p).await;
    check(&report);
    assert_eq!(report.kill_events, kills);
}

/// The long version (see docs/operate/fault-testing.md).
#[actix_rt::test]
#[ignore = "long: cargo test --release --test it torture:: -- --ignored --nocapture"]
async fn crash_torture_long() {
    let p = Params::long().with_env();
    let kills = p.kills;
    let report = run(p).await;
    check(&report);
    assert_eq!(report.kill_events, kills);
}

/// SIGTERM of the source relay while concurrent senders are active: it
/// stops gracefully with exit status 0 (checked by the killer), restarts,
/// every unanswered send is retried with the identical request, and every
/// message is delivered exactly once.
#[actix_rt::test]
async fn graceful_sigterm_of_the_source_under_load_loses_and_duplicates_nothing() {
    let p = Params {
        messages: 120,
        kills: 3,
        stop: Stop::Term,
        victims: vec![0],
        senders_on: vec![0],
        senders: 8,
        resend_sample: 20,
        ..Params::ci()
    };
    let report = run(p).await;
    check(&report);
    assert_eq!(report.kill_events, 3);
    assert_eq!(report.accepted, 120, "every send answered 200");
}

/// Accounts with two home relays (a signed route naming both) under
/// SIGKILLs of any relay at random moments: each message sent at one of
/// the sender's homes (retries to the same relay), delivered to both homes
/// of the recipient; at each home every accepted message is held exactly
/// once, sequences are 1..=n, and both homes converge to the same records
/// in the same `(created_at, message_id)` order; every delivery (the
/// sender's other home's included) ends.
#[actix_rt::test]
async fn torture_two_home_accounts_random_sigkills_lose_and_duplicate_nothing() {
    let p = Params::ci_two_homes().with_env();
    let kills = p.kills;
    let report = run(p).await;
    check(&report);
    assert!(report.two_homes, "ran in two-home mode");
    assert_eq!(report.kill_events, kills);
}

/// PROTOCOL §10 *Retention* under SIGKILLs: what a relay promised to keep
/// is there until its `retention_until` (status with its `accepted_at`,
/// the recipient's record, the sender's `sent` record), checked from each
/// answer on during the load and after it; no record is made twice (a
/// re-send while retained answers the status, after the sweep
/// `message_expired`, and makes no record); once every message is past
/// its retention, every status answers `message_expired` and every
/// timeline is empty (bounded polling); the data dirs audit clean.
#[actix_rt::test]
async fn crash_torture_with_short_retention_loses_nothing_within_retention_and_deletes_nothing_early() {
    let p = Params::ci_retention().with_env();
    let (kills, expired_resends) = (p.kills, p.retention.as_ref().map_or(0, |r| r.expired_resends));
    let report = run(p).await;
    check(&report);
    assert_eq!(report.kill_events, kills);
    let r = report.retention.as_ref().expect("ran in retention mode");
    assert_eq!(r.messages_seen_whole, report.accepted, "every message seen whole within its retention");
    assert!(r.status_within_load > 0 && r.records_within_load > 0, "checked during the load: {r:?}");
    assert_eq!(r.statuses_deleted, report.accepted, "every status seen deleted: {r:?}");
    assert_eq!(r.resent_swept, expired_resends.min(report.accepted));
    assert_eq!(r.watermarks, report.accounts);
}
