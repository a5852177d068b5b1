//! The delivery aggregate against a model: random histories of commands
//! (attempts due with or without a route, answers to the attempt in flight
//! or to an older one, the other home's confirmation) at random times run
//! through `DeliveryState::decide` and `apply`, and after every command the
//! state must be what a plain model of the seed's rules says: a finished
//! delivery never changes, only the attempt in flight is answered, the
//! attempt count grows by one per attempt, no attempt starts at or after
//! the deadline and a retry is due strictly between now and the deadline,
//! the error table decides how an answer ends it, and the final status
//! keeps the source's `accepted_at`.

use super::aggregate::{DeliveryCmd, DeliveryCtx, DeliveryEvent, DeliveryState};
use super::outcome::AttemptOutcome;
use crate::aggregate::Aggregate;
use crate::policy::Policy;
use proptest::prelude::*;
use relay_schemas::client::Account;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{DeliveryStatus, Route, Status, Wire};
use relay_schemas::{DeliveryHandling, ErrorCode, RelayError, UnixMillis, UnixSecs};

const ACCEPTED_AT: u64 = 1_000;
/// The deadline: the default delivery age limit after acceptance (90 min).
const DEADLINE: u64 = ACCEPTED_AT + 5_400;

#[derive(Clone, Debug)]
enum Answer {
    Accepted,
    Delivering,
    Rejected(ErrorCode),
    RateLimited { retry_after: u64 },
    Unrecognized,
    Unknown,
    NotAttempted,
}

#[derive(Clone, Debug)]
enum Step {
    /// Time passes (ms).
    Wait(u64),
    /// The clock stands exactly at the deadline (the boundary a wait rarely hits).
    AtDeadline,
    /// An attempt is due; the best known route has this revision, if any.
    Due(Option<u64>),
    /// An answer to the attempt in flight, or to the one before it.
    Answer {
        stale: bool,
        answer: Answer,
    },
    PeerConfirmed,
}

fn answer() -> impl Strategy<Value = Answer> {
    let codes = prop::sample::select(vec![
        ErrorCode::Forbidden,
        ErrorCode::DeviceUnknown,
        ErrorCode::StateConflict,
        ErrorCode::TemporarilyUnavailable,
        ErrorCode::InternalError,
        ErrorCode::RouteStale,
        ErrorCode::TargetNotLocal,
        ErrorCode::NotFound,
    ]);
    prop_oneof![
        Just(Answer::Accepted),
        Just(Answer::Delivering),
        codes.prop_map(Answer::Rejected),
        (0u64..4_000).prop_map(|retry_after| Answer::RateLimited { retry_after }),
        Just(Answer::Unrecognized),
        Just(Answer::Unknown),
        Just(Answer::NotAttempted),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..1_800_000).prop_map(Step::Wait),
        1 => Just(Step::AtDeadline),
        3 => prop::option::of(1u64..4).prop_map(Step::Due),
        4 => (prop::bool::weighted(0.2), answer()).prop_map(|(stale, answer)| Step::Answer { stale, answer }),
        1 => Just(Step::PeerConfirmed),
    ]
}

fn params() -> DeliverParams {
    serde_json::from_str(
        r#"{"envelope":{"message_id":"m","from":"a","from_device_id":"d","to":"b","created_at":1,"ciphertext":"AA","signature":"s"},
            "recipient_boxes":[{"device_id":"d","box":"AA"}],
            "sender_device_certificate":{"account_id":"a","account_key":"k","device_id":"d","device_key":"k","box_key":"k","issued_at":1,"signature":"s"}}"#,
    )
    .unwrap()
}

fn route(revision: u64) -> Wire<Route> {
    Wire::from_value(&Account::from_seed([5; 32]).route(revision, &[("relay-b", "http://127.0.0.1:1")], 1)).unwrap()
}

fn outcome(answer: &Answer) -> AttemptOutcome {
    match answer {
        Answer::Accepted => AttemptOutcome::Answered(DeliveryStatus::target_accepted(ACCEPTED_AT + 7)),
        Answer::Delivering => AttemptOutcome::Answered(DeliveryStatus::delivering(ACCEPTED_AT + 7)),
        Answer::Rejected(code) => AttemptOutcome::Rejected(RelayError::new(*code, "no")),
        Answer::RateLimited { retry_after } => AttemptOutcome::Rejected(
            RelayError::new(ErrorCode::RateLimited, "wait")
                .with_data(serde_json::json!({ "retry_after": retry_after })),
        ),
        Answer::Unrecognized => AttemptOutcome::Unrecognized(RelayError::new(ErrorCode::BadGateway, "odd")),
        Answer::Unknown => AttemptOutcome::Unknown(RelayError::unavailable("timed out")),
        Answer::NotAttempted => AttemptOutcome::NotAttempted(RelayError::unavailable("refused")),
    }
}

/// What the seed's rules say of one delivery, kept apart from the core's
/// state: its attempts, the one in flight, its target's revision and
/// whether the last answer lets it switch, and how it ended.
#[derive(Debug, Default)]
struct Model {
    attempts: u32,
    in_flight: Option<u32>,
    target: Option<u64>,
    may_switch: bool,
    finished: Option<(Status, Option<ErrorCode>)>,
}

/// How an answer ends the delivery, if it does (the error table).
fn ends(answer: &Answer) -> Option<(Status, Option<ErrorCode>)> {
    match answer {
        Answer::Accepted => Some((Status::TargetAccepted, None)),
        Answer::Rejected(code) if code.delivery_handling() == DeliveryHandling::End => {
            Some((Status::Failed, Some(*code)))
        }
        Answer::Unrecognized => Some((Status::Failed, Some(ErrorCode::BadGateway))),
        _ => None,
    }
}

/// Whether an answer that does not end it lets the next attempt follow a
/// higher route revision (an explicit route error, or never attempted).
fn switches(answer: &Answer) -> bool {
    match answer {
        Answer::Rejected(code) => code.delivery_handling() == DeliveryHandling::RefreshRouteAndRetry,
        Answer::NotAttempted => true,
        _ => false,
    }
}

fn expired() -> Option<(Status, Option<ErrorCode>)> {
    Some((Status::Failed, Some(ErrorCode::MessageExpired)))
}

fn finished_of(s: &DeliveryState) -> Option<(Status, Option<ErrorCode>)> {
    s.finished.as_ref().map(|f| (f.status, f.error.as_ref().map(|e| e.code)))
}

/// Runs `steps` and checks the state against the model after each.
fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let policy = Policy::with_relay_id("relay-a");
    let (params, deadline_ms) = (params(), UnixSecs(DEADLINE).millis());
    let mut now = UnixSecs(ACCEPTED_AT).millis();
    let begin = DeliveryCmd::Accept {
        params: &params,
        digest: "d",
        accepted_at: UnixSecs(ACCEPTED_AT),
        deadline: UnixSecs(DEADLINE),
        route: None,
        first: None,
    };
    let mut s = super::aggregate::begin(&begin, DeliveryCtx { now_ms: now, policy: &policy }).unwrap().state;
    let mut m = Model::default();
    for step in steps {
        let ctx = DeliveryCtx { now_ms: now, policy: &policy };
        let (cmd_route, answered);
        let mut answered_attempt = 0;
        let cmd = match step {
            Step::Wait(ms) => {
                now = now.plus(*ms);
                continue;
            }
            Step::AtDeadline => {
                now = now.max(deadline_ms);
                continue;
            }
            Step::Due(revision) => {
                cmd_route = revision.map(route);
                DeliveryCmd::Due { route: cmd_route.as_ref() }
            }
            Step::Answer { stale, answer } => {
                answered_attempt = if *stale { m.attempts.saturating_sub(1) } else { m.attempts };
                answered = outcome(answer);
                DeliveryCmd::Outcome { attempt: answered_attempt, outcome: &answered }
            }
            Step::PeerConfirmed => DeliveryCmd::PeerConfirmed,
        };
        let events = s.decide(&cmd, ctx).map_err(|e| TestCaseError::fail(format!("{step:?} refused: {e}")))?.events;
        if m.finished.is_some() {
            prop_assert!(events.is_empty(), "a finished delivery changed on {step:?}: {events:?}");
        } else {
            match step {
                Step::Wait(_) | Step::AtDeadline => unreachable!("time passes without a command"),
                Step::Due(_) if now >= deadline_ms => m.finished = expired(),
                Step::Due(revision) => {
                    let switch = match (m.target, revision) {
                        (None, Some(_)) => true,
                        (Some(t), Some(r)) => m.may_switch && *r > t,
                        _ => false,
                    };
                    if switch {
                        m.target = *revision;
                    }
                    m.attempts += 1;
                    m.in_flight = Some(m.attempts);
                    prop_assert!(matches!(events.last(), Some(DeliveryEvent::AttemptStarted { .. })), "{events:?}");
                }
                Step::Answer { answer, .. } if m.in_flight == Some(answered_attempt) => {
                    m.in_flight = None;
                    if let Some(end) = ends(answer) {
                        m.finished = Some(end);
                    } else if let [DeliveryEvent::AttemptFailed { next_due_ms, may_switch, .. }] = &events[..] {
                        prop_assert!(*next_due_ms > now && *next_due_ms < deadline_ms, "due at {next_due_ms:?}");
                        prop_assert_eq!(*may_switch, switches(answer));
                        m.may_switch = switches(answer);
                    } else {
                        // No slot left before the deadline.
                        m.finished = expired();
                    }
                }
                Step::Answer { .. } => prop_assert!(events.is_empty(), "an answer to no attempt in flight: {events:?}"),
                Step::PeerConfirmed => m.finished = Some((Status::TargetAccepted, None)),
            }
            if m.finished.is_some() {
                m.in_flight = None;
            }
        }
        events.iter().for_each(|e| s.apply(e));
        prop_assert_eq!(s.attempts, m.attempts, "attempts after {:?}", step);
        prop_assert_eq!(s.in_flight, m.in_flight, "in flight after {:?}", step);
        prop_assert_eq!(s.target.as_ref().map(|t| t.revision), m.target, "target after {:?}", step);
        prop_assert_eq!(finished_of(&s), m.finished, "end after {:?}", step);
        if let Some(done) = &s.finished {
            prop_assert_eq!(done.accepted_at, ACCEPTED_AT, "the final status keeps the source's accepted_at");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_delivery_follows_the_model_of_the_seeds_rules_over_random_histories(
        steps in prop::collection::vec(step(), 1..40)
    ) {
        run(&steps)?;
    }
}

#[test]
fn a_delivery_begins_once() {
    let policy = Policy::with_relay_id("relay-a");
    let (params, mut s) = (params(), DeliveryState::default());
    let ctx = DeliveryCtx { now_ms: UnixMillis(ACCEPTED_AT * 1000), policy: &policy };
    let (accepted_at, deadline) = (UnixSecs(ACCEPTED_AT), UnixSecs(DEADLINE));
    let begin = DeliveryCmd::Forward { params: &params, digest: "d", accepted_at, deadline };
    for e in s.decide(&begin, ctx).unwrap().events {
        s.apply(&e);
    }
    assert_eq!(s.decide(&begin, ctx).unwrap_err().code, ErrorCode::InternalError);
}
