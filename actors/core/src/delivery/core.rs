//! The pure core of one delivery (`delivery/{from}/{message_id}`): the
//! seed's error table, deadlines, the timetable, result confirmation and
//! target switching, as decide/apply.

use super::outcome::AttemptOutcome;
use super::timetable::next_attempt_ms;
use crate::policy::Policy;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{RelayRef, Route};
use relay_schemas::{DeliveryHandling, DeliveryStatus, ErrorCode, RelayError, Status, Wire};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryEvent {
    /// Written with the sender's acceptance, in the same batch. The
    /// deadline and params are fixed here and never change.
    Accepted {
        from: String,
        message_id: String,
        to: String,
        accepted_at: u64,
        deadline: u64,
        digest: String,
        params: Box<DeliverParams>,
        first_due_ms: u64,
    },
    /// The delivery targets the relays of this route revision from now on.
    RouteRefreshed {
        revision: u64,
        relays: Vec<RelayRef>,
    },
    /// An attempt at `targets` (relay ids; empty when no route was known).
    AttemptStarted {
        attempt: u32,
        targets: Vec<String>,
        revision: u64,
    },
    /// The attempt did not deliver; the next one is due at `next_due_ms`.
    /// `may_switch`: the target refused explicitly with a route error, or
    /// surely never saw the request, so a higher route revision may be
    /// followed; `refresh_route`: fetch the route bypassing caches first.
    AttemptFailed {
        attempt: u32,
        error: RelayError,
        next_due_ms: u64,
        may_switch: bool,
        refresh_route: bool,
    },
    Finished {
        status: DeliveryStatus,
    },
}

impl DeliveryEvent {
    pub const VERSION: u32 = 1;

    /// Whether this event ends the delivery.
    pub fn ends(&self) -> bool {
        matches!(self, DeliveryEvent::Finished { .. })
    }

    pub fn event_type(&self) -> &'static str {
        match self {
            DeliveryEvent::Accepted { .. } => "accepted",
            DeliveryEvent::RouteRefreshed { .. } => "route_refreshed",
            DeliveryEvent::AttemptStarted { .. } => "attempt_started",
            DeliveryEvent::AttemptFailed { .. } => "attempt_failed",
            DeliveryEvent::Finished { .. } => "finished",
        }
    }
}

/// The relays a delivery currently targets, and the route revision that
/// named them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub revision: u64,
    pub relays: Vec<RelayRef>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DeliveryState {
    pub from: String,
    pub message_id: String,
    pub to: String,
    pub accepted_at: u64,
    pub deadline: u64,
    pub digest: String,
    pub params: Option<DeliverParams>,
    pub attempts: u32,
    pub target: Option<Target>,
    /// The attempt started and not yet answered, if any.
    pub in_flight: Option<u32>,
    pub next_due_ms: Option<u64>,
    pub may_switch: bool,
    pub refresh_route: bool,
    pub finished: Option<DeliveryStatus>,
}

impl DeliveryState {
    pub fn apply(&mut self, event: &DeliveryEvent) {
        match event {
            DeliveryEvent::Accepted { from, message_id, to, accepted_at, deadline, digest, params, first_due_ms } => {
                self.from = from.clone();
                self.message_id = message_id.clone();
                self.to = to.clone();
                self.accepted_at = *accepted_at;
                self.deadline = *deadline;
                self.digest = digest.clone();
                self.params = Some((**params).clone());
                self.next_due_ms = Some(*first_due_ms);
            }
            DeliveryEvent::RouteRefreshed { revision, relays } => {
                self.target = Some(Target { revision: *revision, relays: relays.clone() });
            }
            DeliveryEvent::AttemptStarted { attempt, .. } => {
                self.attempts = *attempt;
                self.in_flight = Some(*attempt);
            }
            DeliveryEvent::AttemptFailed { next_due_ms, may_switch, refresh_route, .. } => {
                self.in_flight = None;
                self.next_due_ms = Some(*next_due_ms);
                self.may_switch = *may_switch;
                self.refresh_route = *refresh_route;
            }
            DeliveryEvent::Finished { status } => {
                self.in_flight = None;
                self.next_due_ms = None;
                self.finished = Some(status.clone());
            }
        }
    }

    pub fn status(&self) -> DeliveryStatus {
        self.finished.clone().unwrap_or_else(|| DeliveryStatus::delivering(self.accepted_at))
    }

    fn deadline_ms(&self) -> u64 {
        self.deadline.saturating_mul(1000)
    }

    fn expired(&self) -> DeliveryEvent {
        DeliveryEvent::Finished {
            status: DeliveryStatus::failed(
                self.accepted_at,
                RelayError::new(ErrorCode::MessageExpired, "delivery deadline reached"),
            ),
        }
    }

    /// Whether the next attempt should fetch the recipient's route from
    /// peers, bypassing the cache (after a route error, or with no target).
    pub fn wants_fresh_route(&self) -> bool {
        self.refresh_route || self.target.is_none()
    }
}

/// An attempt is due; `route` is the recipient's best known route now.
/// Starts the attempt, or ends the delivery at its deadline. The first
/// route names the target; later the target switches only when the last
/// answer allowed it and the route has a higher revision. An attempt left
/// in flight by a crash is confirmed by a new attempt with the same
/// unchanged params to the same target.
pub fn decide_due(s: &DeliveryState, now_ms: u64, route: Option<&Wire<Route>>) -> Vec<DeliveryEvent> {
    if s.finished.is_some() {
        return vec![];
    }
    if now_ms >= s.deadline_ms() {
        return vec![s.expired()];
    }
    let mut events = vec![];
    let switch = match (&s.target, route) {
        (None, Some(_)) => true,
        (Some(t), Some(r)) => s.may_switch && r.revision > t.revision,
        _ => false,
    };
    let mut target = s.target.clone();
    if let (true, Some(r)) = (switch, route) {
        let t = Target { revision: r.revision, relays: r.relays.clone() };
        events.push(DeliveryEvent::RouteRefreshed { revision: t.revision, relays: t.relays.clone() });
        target = Some(t);
    }
    let (targets, revision) = match &target {
        Some(t) => (t.relays.iter().map(|r| r.id.clone()).collect(), t.revision),
        None => (vec![], 0),
    };
    events.push(DeliveryEvent::AttemptStarted { attempt: s.attempts + 1, targets, revision });
    events
}

/// Whether a `message.send` is delivered before its acceptance is written:
/// the recipient's route names this relay alone, so the attempt is a call
/// into this process that ends at once (see [`final_status`]). A route
/// naming another relay too is delivered to both by a delivery stream.
pub fn delivered_here_first(route: Option<&Wire<Route>>, own_relay_id: &str) -> bool {
    route.is_some_and(|r| r.relays.len() == 1 && r.lists_relay(own_relay_id))
}

/// The final status an attempt's outcome settles at once, if any: the
/// target took it, or refused it for good (the seed's error table). Anything
/// else (a busy account, a retryable or route error, an unknown result) is
/// left to the timetable. [`decide_outcome`] starts with it, and the process
/// manager asks it of a local attempt made before acceptance.
pub fn final_status(outcome: &AttemptOutcome, accepted_at: u64) -> Option<DeliveryStatus> {
    match outcome {
        AttemptOutcome::Answered(st) if st.status == Status::TargetAccepted => {
            Some(DeliveryStatus::target_accepted(accepted_at))
        }
        AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::End => {
            Some(DeliveryStatus::failed(accepted_at, e.clone()))
        }
        AttemptOutcome::Unrecognized(e) => Some(DeliveryStatus::failed(accepted_at, e.clone())),
        _ => None,
    }
}

/// One outcome for an attempt at every relay of the route (1 or 2, tried in
/// parallel): the first acceptance wins; otherwise the outcome that most
/// constrains what happens next. An unknown result outranks a final
/// rejection by the other relay: that relay may hold the message, so the
/// delivery must confirm with it rather than end `failed`.
pub fn combine(outcomes: Vec<AttemptOutcome>) -> AttemptOutcome {
    fn rank(o: &AttemptOutcome) -> u8 {
        match o {
            AttemptOutcome::Answered(s) if s.status == Status::TargetAccepted => 0,
            AttemptOutcome::Unknown(_) => 1,
            AttemptOutcome::Answered(_) => 1,
            AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::End => 2,
            AttemptOutcome::Unrecognized(_) => 3,
            AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::Retry => 4,
            AttemptOutcome::Rejected(_) => 5,
            AttemptOutcome::NotAttempted(_) => 6,
        }
    }
    outcomes.into_iter().min_by_key(rank).unwrap_or_else(|| {
        AttemptOutcome::NotAttempted(RelayError::new(ErrorCode::RouteNotFound, "no route known for the recipient"))
    })
}

/// The answer to attempt `attempt`, by the seed's error table. Late answers
/// (to an older attempt, or after the end) change nothing.
pub fn decide_outcome(
    s: &DeliveryState,
    attempt: u32,
    outcome: AttemptOutcome,
    now_ms: u64,
    policy: &Policy,
) -> Vec<DeliveryEvent> {
    if s.finished.is_some() || s.in_flight != Some(attempt) {
        return vec![];
    }
    if let Some(status) = final_status(&outcome, s.accepted_at) {
        return vec![DeliveryEvent::Finished { status }];
    }
    let (error, may_switch, refresh_route) = match outcome {
        AttemptOutcome::Answered(st) => {
            (RelayError::new(ErrorCode::BadGateway, format!("target answered status {:?}", st.status)), false, false)
        }
        AttemptOutcome::Rejected(e) if e.code.delivery_handling() == DeliveryHandling::RefreshRouteAndRetry => {
            (e, true, true)
        }
        // (Final rejections and unrecognized answers ended above.)
        AttemptOutcome::Rejected(e) | AttemptOutcome::Unrecognized(e) | AttemptOutcome::Unknown(e) => (e, false, false),
        // Never seen by the target: re-read the route, and follow a higher
        // revision if there is one.
        AttemptOutcome::NotAttempted(e) => (e, true, true),
    };
    let not_before_ms =
        match (error.code, error.data.as_ref().and_then(|d| d.get("retry_after")).and_then(|v| v.as_u64())) {
            (ErrorCode::RateLimited, Some(secs)) => now_ms.saturating_add(secs.saturating_mul(1000)),
            _ => 0,
        };
    let accepted_ms = s.accepted_at.saturating_mul(1000);
    match next_attempt_ms(policy, accepted_ms, now_ms, not_before_ms, s.deadline_ms()) {
        Some(next_due_ms) => {
            vec![DeliveryEvent::AttemptFailed { attempt, error, next_due_ms, may_switch, refresh_route }]
        }
        None => vec![s.expired()],
    }
}

/// The sender's other home relay reports the message `target_accepted`
/// (SHiNE schedule): this relay's delivery ends the same way.
pub fn decide_peer_confirmed(s: &DeliveryState) -> Vec<DeliveryEvent> {
    if s.finished.is_some() {
        return vec![];
    }
    vec![DeliveryEvent::Finished { status: DeliveryStatus::target_accepted(s.accepted_at) }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::client::Account;

    fn params() -> DeliverParams {
        serde_json::from_str(
            r#"{"envelope":{"message_id":"m","from":"a","from_device_id":"d","to":"b","created_at":1,"ciphertext":"AA","signature":"s"},
                "recipient_boxes":[{"device_id":"d","box":"AA"}],
                "sender_device_certificate":{"account_id":"a","account_key":"k","device_id":"d","device_key":"k","box_key":"k","issued_at":1,"signature":"s"}}"#,
        )
        .unwrap()
    }

    fn route(revision: u64, relays: &[&str]) -> Wire<Route> {
        let relays: Vec<(&str, &str)> = relays.iter().map(|r| (*r, "http://127.0.0.1:1")).collect();
        Wire::from_value(&Account::from_seed([5; 32]).route(revision, &relays, 1)).unwrap()
    }

    /// given(accepted at t=1000 s, deadline +90 min)
    fn accepted() -> DeliveryState {
        let mut s = DeliveryState::default();
        s.apply(&DeliveryEvent::Accepted {
            from: "a".into(),
            message_id: "m".into(),
            to: "b".into(),
            accepted_at: 1000,
            deadline: 1000 + 5400,
            digest: "d".into(),
            params: Box::new(params()),
            first_due_ms: 1_000_000,
        });
        s
    }

    fn apply_all(s: &mut DeliveryState, evs: &[DeliveryEvent]) {
        evs.iter().for_each(|e| s.apply(e));
    }

    /// when(due) with `r` as the best known route.
    fn start_with(s: &mut DeliveryState, now_ms: u64, r: &Wire<Route>) -> u32 {
        let ev = decide_due(s, now_ms, Some(r));
        assert!(matches!(ev.last(), Some(DeliveryEvent::AttemptStarted { .. })), "{ev:?}");
        apply_all(s, &ev);
        s.attempts
    }

    fn start(s: &mut DeliveryState, now_ms: u64) -> u32 {
        start_with(s, now_ms, &route(1, &["relay-b"]))
    }

    /// when(outcome) then apply the decided events.
    fn step(s: &mut DeliveryState, attempt: u32, outcome: AttemptOutcome, now_ms: u64, p: &Policy) {
        let ev = decide_outcome(s, attempt, outcome, now_ms, p);
        apply_all(s, &ev);
    }

    fn rejected(code: ErrorCode) -> AttemptOutcome {
        AttemptOutcome::Rejected(RelayError::new(code, "x"))
    }

    fn targets(s: &DeliveryState) -> Vec<String> {
        s.target.as_ref().unwrap().relays.iter().map(|r| r.id.clone()).collect()
    }

    #[test]
    fn target_accepted_is_terminal_with_the_source_accepted_at() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        step(&mut s, n, AttemptOutcome::Answered(DeliveryStatus::target_accepted(77)), 1_000_100, &p);
        assert_eq!(s.status(), DeliveryStatus::target_accepted(1000));
    }

    #[test]
    fn retryable_codes_keep_delivering_and_schedule_the_next_slot() {
        let p = Policy::with_relay_id("r");
        for code in
            [ErrorCode::InternalError, ErrorCode::BadGateway, ErrorCode::TemporarilyUnavailable, ErrorCode::RateLimited]
        {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            let ev = decide_outcome(&s, n, rejected(code), 1_000_100, &p);
            assert!(
                matches!(
                    ev[..],
                    [DeliveryEvent::AttemptFailed {
                        next_due_ms: 1_030_000,
                        may_switch: false,
                        refresh_route: false,
                        ..
                    }]
                ),
                "{code}: {ev:?}"
            );
            apply_all(&mut s, &ev);
            assert_eq!(s.status().status, Status::Delivering);
        }
    }

    #[test]
    fn route_errors_refresh_the_route_bypassing_caches_and_retry() {
        let p = Policy::with_relay_id("r");
        for code in [
            ErrorCode::RouteStale,
            ErrorCode::TargetNotLocal,
            ErrorCode::RouteNotFound,
            ErrorCode::NotFound,
            ErrorCode::InvalidState,
        ] {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            step(&mut s, n, rejected(code), 1_000_100, &p);
            assert_eq!(s.status().status, Status::Delivering, "{code}");
            assert!(s.wants_fresh_route() && s.may_switch, "{code}");
        }
    }

    #[test]
    fn defined_errors_end_the_delivery_with_that_error() {
        let p = Policy::with_relay_id("r");
        for code in [
            ErrorCode::DeviceUnknown,
            ErrorCode::ClockSkew,
            ErrorCode::Forbidden,
            ErrorCode::InvalidParams,
            ErrorCode::InvalidSignature,
            ErrorCode::StateConflict,
            ErrorCode::PayloadTooLarge,
            ErrorCode::MessageExpired,
            ErrorCode::Unauthorized,
        ] {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            step(&mut s, n, rejected(code), 1_000_100, &p);
            let st = s.status();
            assert_eq!(st.status, Status::Failed);
            assert_eq!(st.error.unwrap().code, code);
        }
    }

    #[test]
    fn unrecognized_remote_code_ends_with_bad_gateway() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::from_remote("no_such_code", "?", None);
        step(&mut s, n, AttemptOutcome::Unrecognized(e), 1_000_100, &p);
        assert_eq!(s.status().status, Status::Failed);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::BadGateway);
    }

    #[test]
    fn deadline_reached_before_completion_fails_with_message_expired() {
        let mut s = accepted();
        let ev = decide_due(&s, (1000 + 5400) * 1000, Some(&route(1, &["relay-b"])));
        apply_all(&mut s, &ev);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn last_attempt_failing_with_no_slot_left_fails_with_message_expired() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000 + 3_600_000);
        step(&mut s, n, rejected(ErrorCode::TemporarilyUnavailable), 1_000_000 + 3_600_500, &p);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn terminal_state_never_changes_and_late_responses_are_ignored() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        step(&mut s, n, rejected(ErrorCode::DeviceUnknown), 1_000_100, &p);
        let before = s.status();
        let late = AttemptOutcome::Answered(DeliveryStatus::target_accepted(5));
        assert!(decide_outcome(&s, n, late, 1_000_200, &p).is_empty());
        assert!(decide_due(&s, 1_000_300, Some(&route(1, &["relay-b"]))).is_empty());
        assert!(decide_peer_confirmed(&s).is_empty());
        assert_eq!(s.status(), before);
    }

    #[test]
    fn answer_to_an_older_attempt_is_ignored() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let first = start(&mut s, 1_000_000);
        step(&mut s, first, rejected(ErrorCode::InternalError), 1_000_100, &p);
        let _second = start(&mut s, 1_030_000);
        let late = AttemptOutcome::Answered(DeliveryStatus::target_accepted(5));
        assert!(decide_outcome(&s, first, late, 1_030_100, &p).is_empty());
    }

    #[test]
    fn rate_limited_retry_after_delays_the_next_attempt() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::new(ErrorCode::RateLimited, "wait").with_data(serde_json::json!({"retry_after": 120}));
        let ev = decide_outcome(&s, n, AttemptOutcome::Rejected(e), 1_000_000, &p);
        assert!(matches!(ev[..], [DeliveryEvent::AttemptFailed { next_due_ms: 1_120_000, .. }]), "{ev:?}");
    }

    #[test]
    fn rate_limited_wait_past_the_deadline_ends_with_message_expired() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::new(ErrorCode::RateLimited, "wait").with_data(serde_json::json!({"retry_after": 99999}));
        step(&mut s, n, AttemptOutcome::Rejected(e), 1_000_000, &p);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn retries_retain_the_original_params_unchanged() {
        let s = accepted();
        let p = s.params.as_ref().unwrap();
        assert_eq!(p.envelope.raw().get(), params().envelope.raw().get());
    }

    #[test]
    fn unknown_result_is_confirmed_with_the_same_target_even_if_a_newer_route_exists() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(1, &["relay-b"]));
        step(&mut s, n, AttemptOutcome::Unknown(RelayError::unavailable("timeout")), 1_000_100, &p);
        start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-b"]);
    }

    #[test]
    fn explicit_route_error_switches_only_to_a_higher_revision() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(3, &["relay-b"]));
        step(&mut s, n, rejected(ErrorCode::RouteStale), 1_000_100, &p);
        // A route of the same or a lower revision does not move the target.
        let n = start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-b"]);
        step(&mut s, n, rejected(ErrorCode::TargetNotLocal), 1_030_100, &p);
        start_with(&mut s, 1_300_000, &route(4, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-c"]);
    }

    #[test]
    fn receipt_known_not_attempted_may_switch_to_a_higher_revision() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(1, &["relay-b"]));
        step(&mut s, n, AttemptOutcome::NotAttempted(RelayError::unavailable("refused")), 1_000_100, &p);
        start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-c"]);
    }

    #[test]
    fn retryable_error_keeps_the_target() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start_with(&mut s, 1_000_000, &route(1, &["relay-b"]));
        step(&mut s, n, rejected(ErrorCode::InternalError), 1_000_100, &p);
        start_with(&mut s, 1_030_000, &route(2, &["relay-c"]));
        assert_eq!(targets(&s), vec!["relay-b"]);
    }

    #[test]
    fn no_route_known_is_an_attempt_without_target_that_retries() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let ev = decide_due(&s, 1_000_000, None);
        assert!(matches!(&ev[..], [DeliveryEvent::AttemptStarted { targets, .. }] if targets.is_empty()));
        apply_all(&mut s, &ev);
        step(&mut s, 1, combine(vec![]), 1_000_100, &p);
        assert_eq!(s.status().status, Status::Delivering);
        assert!(s.wants_fresh_route());
    }

    #[test]
    fn with_two_relays_the_first_acceptance_wins() {
        let accepted = AttemptOutcome::Answered(DeliveryStatus::target_accepted(1));
        let down = AttemptOutcome::Unknown(RelayError::unavailable("timeout"));
        assert!(matches!(combine(vec![down.clone(), accepted.clone()]), AttemptOutcome::Answered(_)));
        assert!(matches!(combine(vec![rejected(ErrorCode::DeviceUnknown), accepted]), AttemptOutcome::Answered(_)));
        // No acceptance: an unknown result keeps the same targets (confirmation),
        // even against a final rejection by the other relay.
        assert!(matches!(combine(vec![rejected(ErrorCode::RouteStale), down.clone()]), AttemptOutcome::Unknown(_)));
        assert!(matches!(combine(vec![rejected(ErrorCode::DeviceUnknown), down]), AttemptOutcome::Unknown(_)));
        let refused = AttemptOutcome::NotAttempted(RelayError::unavailable("refused"));
        assert!(matches!(combine(vec![rejected(ErrorCode::DeviceUnknown), refused]), AttemptOutcome::Rejected(_)));
    }

    #[test]
    fn peer_confirmation_ends_the_delivery_target_accepted() {
        let mut s = accepted();
        let ev = decide_peer_confirmed(&s);
        apply_all(&mut s, &ev);
        assert_eq!(s.status(), DeliveryStatus::target_accepted(1000));
    }
}
