//! The pure core of one delivery (`delivery/{from}/{message_id}`): the
//! seed's error table, deadlines and the timetable, as decide/apply.

use super::timetable::next_attempt_ms;
use crate::policy::Policy;
use relay_schemas::methods::DeliverParams;
use relay_schemas::{DeliveryHandling, DeliveryStatus, ErrorCode, RelayError, Status};
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
        params: DeliverParams,
        first_due_ms: u64,
    },
    AttemptStarted {
        attempt: u32,
        target: String,
    },
    /// The attempt did not deliver; the next one is due at `next_due_ms`.
    AttemptFailed {
        attempt: u32,
        error: RelayError,
        next_due_ms: u64,
    },
    Finished {
        status: DeliveryStatus,
    },
}

impl DeliveryEvent {
    pub const VERSION: u32 = 1;

    pub fn event_type(&self) -> &'static str {
        match self {
            DeliveryEvent::Accepted { .. } => "accepted",
            DeliveryEvent::AttemptStarted { .. } => "attempt_started",
            DeliveryEvent::AttemptFailed { .. } => "attempt_failed",
            DeliveryEvent::Finished { .. } => "finished",
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct DeliveryState {
    pub from: String,
    pub message_id: String,
    pub to: String,
    pub accepted_at: u64,
    pub deadline: u64,
    pub digest: String,
    pub params: Option<DeliverParams>,
    pub attempts: u32,
    /// The attempt started and not yet answered, if any.
    pub in_flight: Option<u32>,
    pub next_due_ms: Option<u64>,
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
                self.params = Some(params.clone());
                self.next_due_ms = Some(*first_due_ms);
            }
            DeliveryEvent::AttemptStarted { attempt, .. } => {
                self.attempts = *attempt;
                self.in_flight = Some(*attempt);
            }
            DeliveryEvent::AttemptFailed { next_due_ms, .. } => {
                self.in_flight = None;
                self.next_due_ms = Some(*next_due_ms);
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
}

/// An attempt is due. Starts it, or ends the delivery at its deadline.
/// An attempt left in flight by a crash is confirmed by a new attempt with
/// the same unchanged params to the same target (result confirmation).
pub fn decide_due(s: &DeliveryState, now_ms: u64, target: &str) -> Vec<DeliveryEvent> {
    if s.finished.is_some() {
        return vec![];
    }
    if now_ms >= s.deadline_ms() {
        return vec![s.expired()];
    }
    vec![DeliveryEvent::AttemptStarted { attempt: s.attempts + 1, target: target.into() }]
}

/// The answer to attempt `attempt`, by the seed's error table. Late answers
/// (to an older attempt, or after the end) change nothing.
pub fn decide_outcome(
    s: &DeliveryState,
    attempt: u32,
    outcome: Result<DeliveryStatus, RelayError>,
    now_ms: u64,
    policy: &Policy,
) -> Vec<DeliveryEvent> {
    if s.finished.is_some() || s.in_flight != Some(attempt) {
        return vec![];
    }
    let error = match outcome {
        Ok(st) if st.status == Status::TargetAccepted => {
            return vec![DeliveryEvent::Finished { status: DeliveryStatus::target_accepted(s.accepted_at) }];
        }
        Ok(st) => RelayError::new(ErrorCode::BadGateway, format!("target answered status {:?}", st.status)),
        Err(e) => e,
    };
    let not_before_ms = match (&error.code, error.data.as_ref().and_then(|d| d.get("retry_after")).and_then(|v| v.as_u64())) {
        (ErrorCode::RateLimited, Some(secs)) => now_ms.saturating_add(secs.saturating_mul(1000)),
        _ => 0,
    };
    match error.code.delivery_handling() {
        DeliveryHandling::End => {
            vec![DeliveryEvent::Finished { status: DeliveryStatus::failed(s.accepted_at, error) }]
        }
        DeliveryHandling::Retry | DeliveryHandling::RefreshRouteAndRetry => {
            let accepted_ms = s.accepted_at.saturating_mul(1000);
            match next_attempt_ms(policy, accepted_ms, now_ms, not_before_ms, s.deadline_ms()) {
                Some(next_due_ms) => vec![DeliveryEvent::AttemptFailed { attempt, error, next_due_ms }],
                None => vec![s.expired()],
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::Wire;

    fn params() -> DeliverParams {
        serde_json::from_str(
            r#"{"envelope":{"message_id":"m","from":"a","from_device_id":"d","to":"b","created_at":1,"ciphertext":"AA","signature":"s"},
                "recipient_boxes":[{"device_id":"d","box":"AA"}],
                "sender_device_certificate":{"account_id":"a","account_key":"k","device_id":"d","device_key":"k","box_key":"k","issued_at":1,"signature":"s"}}"#,
        )
        .unwrap()
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
            params: params(),
            first_due_ms: 1_000_000,
        });
        s
    }

    fn start(s: &mut DeliveryState, now_ms: u64) -> u32 {
        let ev = decide_due(s, now_ms, "relay-b");
        assert!(matches!(ev[..], [DeliveryEvent::AttemptStarted { .. }]), "{ev:?}");
        s.apply(&ev[0]);
        s.attempts
    }

    fn err(code: ErrorCode) -> Result<DeliveryStatus, RelayError> {
        Err(RelayError::new(code, "x"))
    }

    fn apply_all(s: &mut DeliveryState, evs: &[DeliveryEvent]) {
        evs.iter().for_each(|e| s.apply(e));
    }

    /// when(outcome) then apply the decided events.
    fn step(s: &mut DeliveryState, attempt: u32, outcome: Result<DeliveryStatus, RelayError>, now_ms: u64, p: &Policy) {
        let ev = decide_outcome(s, attempt, outcome, now_ms, p);
        apply_all(s, &ev);
    }

    #[test]
    fn target_accepted_is_terminal_with_the_source_accepted_at() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let ev = decide_outcome(&s, n, Ok(DeliveryStatus::target_accepted(77)), 1_000_100, &p);
        apply_all(&mut s, &ev);
        assert_eq!(s.status(), DeliveryStatus::target_accepted(1000));
    }

    #[test]
    fn retryable_codes_keep_delivering_and_schedule_the_next_slot() {
        let p = Policy::with_relay_id("r");
        for code in [ErrorCode::InternalError, ErrorCode::BadGateway, ErrorCode::TemporarilyUnavailable, ErrorCode::RateLimited] {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            let ev = decide_outcome(&s, n, err(code), 1_000_100, &p);
            assert!(matches!(ev[..], [DeliveryEvent::AttemptFailed { next_due_ms: 1_030_000, .. }]), "{code}: {ev:?}");
            apply_all(&mut s, &ev);
            assert_eq!(s.status().status, Status::Delivering);
        }
    }

    #[test]
    fn route_errors_retry_after_a_route_refresh() {
        let p = Policy::with_relay_id("r");
        for code in [ErrorCode::RouteStale, ErrorCode::TargetNotLocal, ErrorCode::RouteNotFound, ErrorCode::NotFound, ErrorCode::InvalidState] {
            let mut s = accepted();
            let n = start(&mut s, 1_000_000);
            let ev = decide_outcome(&s, n, err(code), 1_000_100, &p);
            assert!(matches!(ev[..], [DeliveryEvent::AttemptFailed { .. }]), "{code}");
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
            step(&mut s, n, err(code), 1_000_100, &p);
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
        // The transport maps unknown codes: from_remote + remote_handling.
        assert_eq!(RelayError::remote_handling("no_such_code"), DeliveryHandling::End);
        let e = RelayError::from_remote("no_such_code", "?", None);
        let ev = vec![DeliveryEvent::Finished { status: DeliveryStatus::failed(s.accepted_at, e) }];
        apply_all(&mut s, &ev);
        assert!(decide_outcome(&s, n, err(ErrorCode::InternalError), 1_000_100, &p).is_empty());
        assert_eq!(s.status().error.unwrap().code, ErrorCode::BadGateway);
    }

    #[test]
    fn deadline_reached_before_completion_fails_with_message_expired() {
        let mut s = accepted();
        let ev = decide_due(&s, (1000 + 5400) * 1000, "relay-b");
        apply_all(&mut s, &ev);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn last_attempt_failing_with_no_slot_left_fails_with_message_expired() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000 + 3_600_000);
        step(&mut s, n, err(ErrorCode::TemporarilyUnavailable), 1_000_000 + 3_600_500, &p);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn terminal_state_never_changes_and_late_responses_are_ignored() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        step(&mut s, n, err(ErrorCode::DeviceUnknown), 1_000_100, &p);
        let before = s.status();
        assert!(decide_outcome(&s, n, Ok(DeliveryStatus::target_accepted(5)), 1_000_200, &p).is_empty());
        assert!(decide_due(&s, 1_000_300, "relay-b").is_empty());
        assert_eq!(s.status(), before);
    }

    #[test]
    fn answer_to_an_older_attempt_is_ignored() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let first = start(&mut s, 1_000_000);
        step(&mut s, first, err(ErrorCode::InternalError), 1_000_100, &p);
        let _second = start(&mut s, 1_030_000);
        assert!(decide_outcome(&s, first, Ok(DeliveryStatus::target_accepted(5)), 1_030_100, &p).is_empty());
    }

    #[test]
    fn rate_limited_retry_after_delays_the_next_attempt() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::new(ErrorCode::RateLimited, "wait").with_data(serde_json::json!({"retry_after": 120}));
        let ev = decide_outcome(&s, n, Err(e), 1_000_000, &p);
        assert!(matches!(ev[..], [DeliveryEvent::AttemptFailed { next_due_ms: 1_120_000, .. }]), "{ev:?}");
    }

    #[test]
    fn rate_limited_wait_past_the_deadline_ends_with_message_expired() {
        let p = Policy::with_relay_id("r");
        let mut s = accepted();
        let n = start(&mut s, 1_000_000);
        let e = RelayError::new(ErrorCode::RateLimited, "wait").with_data(serde_json::json!({"retry_after": 99999}));
        step(&mut s, n, Err(e), 1_000_000, &p);
        assert_eq!(s.status().error.unwrap().code, ErrorCode::MessageExpired);
    }

    #[test]
    fn params_are_kept_unchanged_for_retries() {
        let s = accepted();
        let p = s.params.as_ref().unwrap();
        assert_eq!(Wire::raw(&p.envelope).get(), params().envelope.raw().get());
    }
}
